//! The cellog node: the server side of a cell.
//!
//! - [`node`]: a running node: storage, Raft, the client API, mail and the Raft transport on their addresses, health,
//!   reflection and metrics, graceful stop.
//! - [`service`]: the client API (`cellog.v1.Cellog`) over a node: writes proposed to the cell, reads after a barrier.
//! - [`mail_cell`]: the node's cell as sealed mail ([`cellog_mail`]) reaches it.
//! - [`mirror`]: the mirror driver: while the node leads, it copies each mirror's source from another cell.
//! - [`transport`]: Raft between nodes over gRPC (`cellog.raft.v1.Raft`), checksummed.
//! - [`convert`] and [`status`]: wire types to core types, and rejections and failed proposals to gRPC statuses.
//! - [`metrics`]: Prometheus metrics, and a store wrapper timing fsyncs.
//! - `http` (not in simulation): the HTTP port: metrics, the client API over JSON with its OpenAPI document, live
//!   tails over server-sent events and WebSocket, and the web console.
//!
//! What this crate is not: it decides nothing about messages (the core does), does not replicate (Raft does), and
//! holds no client (`cellog-client`) and no command line (`cellog-cli`).

#![allow(clippy::result_large_err, reason = "tonic's Status is large, and it is what every call returns")]

pub mod auth;
#[cfg(not(madsim))]
mod budget;
pub mod convert;
#[cfg(not(madsim))]
pub mod http;
pub mod limits;
mod listen;
pub mod mail_cell;
pub mod metrics;
pub mod mirror;
pub mod node;
mod ops;
pub mod service;
pub mod status;
pub mod tls;
pub mod transport;

pub use limits::Limits;
pub use node::{NodeConfig, NodeError, Peer, RaftTiming, RunningNode};

//! The cellog node, its client library, and the `cellog` command.
//!
//! - [`node`]: a running node: storage, Raft, the client API and the Raft transport on their addresses, health,
//!   reflection and metrics, graceful stop.
//! - [`service`]: the client API (`cellog.v1.Cellog`) over a node: writes proposed to the cell, reads after a barrier.
//! - [`transport`]: Raft between nodes over gRPC (`cellog.raft.v1.Raft`), checksummed.
//! - [`client`]: the client library: leader discovery, safe retries, pipelined batch publish.
//! - [`convert`] and [`status`]: wire types to core types, and errors to gRPC statuses with details.
//! - [`mail`]: sealed mail between cells: outbox, delivery with retries, inbox, provenance ledger.
//! - [`metrics`]: Prometheus metrics, and a store wrapper timing fsyncs.
//!
//! What this crate is not: it decides nothing about messages (the core does) and does not replicate (Raft does).

#![allow(clippy::result_large_err, reason = "tonic's Status is large, and it is what every call returns")]

pub mod client;
pub mod convert;
mod listen;
pub mod mail;
pub mod metrics;
pub mod node;
pub mod service;
pub mod status;
pub mod transport;

pub use cellog_proto::v1 as proto;
pub use client::{BatchResult, Client, ClientError, ClientOptions};
pub use mail::{MailConfig, Mailroom, RetryPolicy};
pub use node::{NodeConfig, NodeError, Peer, RaftTiming, RunningNode};

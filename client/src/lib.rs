//! The cellog client library: talks to any node of a cell, follows the leader, and retries what is safe to retry.
//!
//! - [`client`]: [`Client`], one connection to a cell, with a method per call of the client API and of sealed mail
//!   (`cellog.v1.Mail`) over the same connections; beside it, in private modules, `route` (which node a call goes
//!   to, leader discovery, a deposed leader noticed while a call waits, safe retries), `batch` (pipelined publish) and
//!   `options` ([`ClientOptions`]).
//! - [`status`]: the error codec both sides speak: a failure's stable name, retry advice and leader address carried in
//!   a gRPC status.
//! - [`limits`]: what the wire carries at most.
//! - [`token`]: API tokens: the credential a call carries and the hash a cell keeps.
//! - [`group`]: [`GroupMember`], a consumer group's member: heartbeats, assigned and revoked partitions, releases.
//! - [`cells`]: [`Cells`], many cells: each stream's calls routed to its cell through the directory, routes kept and
//!   learned again on `MOVED`, and a stream's move from one cell to another.
//!
//! It depends on the wire protocol alone (no storage, no Raft), so a tool that only talks to a cell builds quickly.

#![allow(clippy::result_large_err, reason = "tonic's Status is large, and it is what every call returns")]

mod batch;
pub mod cells;
pub mod client;
mod error;
mod governance;
pub mod group;
pub mod limits;
mod options;
mod route;
pub mod status;
pub mod token;

pub use cellog_proto::v1 as proto;
pub use cells::{Cells, Moved};
pub use client::{
    BatchResult, Client, ClientError, ClientOptions, ClientTls, DISCOVERY_INTERVAL, SUSPECT_AFTER, item_error, node_api,
};
pub use group::{GroupMember, MemberOptions, Rebalance};

/// A plain ack (applied) of each message `deliveries` handed over, in their order.
pub fn acks_of(deliveries: &[proto::Delivery]) -> Vec<proto::AckItem> {
    deliveries
        .iter()
        .filter_map(|delivery| delivery.message.as_ref())
        .map(|m| proto::AckItem { partition: m.partition, seq: m.seq, ..proto::AckItem::default() })
        .collect()
}

//! The cellog wire protocols, generated from `proto/` (the same code runs over real gRPC and in simulation):
//!
//! - [`v1`]: the client API, `cellog.v1.Cellog`, and sealed mail between cells, `cellog.v1.Mail`.
//! - [`raft`]: the transport between the nodes of a cell, `cellog.raft.v1.Raft`.
//!
//! [`FILE_DESCRIPTOR_SET`] describes both, for gRPC reflection and the HTTP API's OpenAPI document. The messages of
//! [`v1`] are also `serde` types in the protobuf JSON mapping (the `.proto` field names, 64-bit integers as strings,
//! bytes as base64, enums by name, every field written), for the node's HTTP API.

#![allow(missing_docs, clippy::all, reason = "generated code")]

/// The client API.
pub mod v1 {
    tonic::include_proto!("cellog.v1");
    include!(concat!(env!("OUT_DIR"), "/cellog.v1.serde.rs"));
}

/// The transport between the nodes of a cell.
pub mod raft {
    tonic::include_proto!("cellog.raft.v1");
}

/// The encoded descriptors of every message and service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cellog_descriptor.bin"));

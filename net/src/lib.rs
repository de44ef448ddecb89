//! The network face of cellog: tonic services (client API and Raft transport), the node runtime, the client library
//! and the `cellog` binary.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

//! The protobuf definitions of cellog's client API (`cellog.v1`) and Raft transport, and the code generated from them.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

//! Replication of a cellog cell with openraft: the type config, the log store, the state-machine adapter that feeds
//! committed entries to `cellog-core`, snapshots, and the `Storage` trait with its RocksDB and simulated-disk
//! implementations.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

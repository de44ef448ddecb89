//! The deterministic simulation harness: several cellog nodes running the production node code over madsim's network
//! with simulated disks that survive restarts.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

//! Seeded fault schedules (the nemesis), workloads, history checkers and the seed-sweep runner.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

//! Named simulation scenarios whose normalized traces are kept as insta snapshots for review.
//!
//! This crate is not built yet: it holds no code, and nothing depends on it.

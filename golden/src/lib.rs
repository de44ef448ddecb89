//! Golden traces: named scenarios of a simulated cell, each run at a fixed seed, whose traces are kept as insta
//! snapshots under `golden/snapshots/` and reviewed with `cargo insta review`; and [`view`], which draws a trace as a
//! space-time diagram to open in a browser.
//!
//! The scenarios exist only under `--cfg madsim`; the view is plain text processing and builds everywhere.

#[cfg(madsim)]
pub mod scenarios;
pub mod view;

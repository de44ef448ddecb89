//! The core's integration tests: one binary, so that a build links once, with a module per area and a shared
//! vocabulary for driving a cell (`common`).

#[allow(dead_code)]
mod common;

mod auth;
mod bodies;
mod caps;
mod consumers;
mod groups;
mod mirror;
mod model;
mod model_removal;
mod pins;
mod placement;
mod publish;
mod quotas;
mod retention;
mod snapshot;
mod streams;
mod tenant;
mod tidy;
mod transactions;

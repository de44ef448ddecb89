//! The client commands, one module per command group, and the client they share.

use std::time::Duration;

use cellog_client::{Client, ClientOptions};

use crate::Connect;

pub mod cluster;
pub mod consumer;
#[cfg(feature = "node")]
pub mod keys;
pub mod mail;
pub mod peer;
pub mod publish;
pub mod stream;
pub mod txn;

/// A client for `connect`.
pub fn client(connect: &Connect) -> anyhow::Result<Client> {
    let options = ClientOptions { retry_for: Duration::from_secs(connect.timeout), ..ClientOptions::default() };
    Ok(Client::new(connect.server.clone(), options)?)
}

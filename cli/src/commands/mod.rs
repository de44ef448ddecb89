//! The client commands, one module per command group, and the client they share.

use std::time::Duration;

use anyhow::Context;
use cellog_client::{Client, ClientOptions};

use crate::Connect;

pub mod auth;
pub mod cluster;
pub mod consumer;
#[cfg(feature = "node")]
pub mod keys;
pub mod mail;
pub mod peer;
pub mod publish;
pub mod stream;
pub mod txn;

/// Where `cellog dev` keeps its cell's root token, read by client commands when no token is given and it exists.
pub const DEV_TOKEN_FILE: &str = ".cellog-dev/root.token";

/// The token `connect` names: given, or read from its file (or the dev cell's, if there is one).
pub fn token(connect: &Connect) -> anyhow::Result<Option<String>> {
    if let Some(token) = &connect.token {
        return Ok(Some(token.clone()));
    }
    let path = match &connect.token_file {
        Some(path) => path.clone(),
        None => {
            let dev = std::path::PathBuf::from(DEV_TOKEN_FILE);
            if !dev.exists() {
                return Ok(None);
            }
            dev
        }
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading the token in {}", path.display()))?;
    Ok(Some(text.trim().to_string()))
}

/// A client for `connect`.
pub fn client(connect: &Connect) -> anyhow::Result<Client> {
    let options = ClientOptions {
        retry_for: Duration::from_secs(connect.timeout),
        token: token(connect)?,
        ..ClientOptions::default()
    };
    Ok(Client::new(connect.server.clone(), options)?)
}

//! The client commands, one module per command group, and the client they share.

use std::time::Duration;

use anyhow::Context;
use cellog_client::{Client, ClientOptions, ClientTls};

use crate::Connect;

pub mod auth;
pub mod cells;
#[cfg(feature = "node")]
pub mod certs;
pub mod cluster;
pub mod consumer;
pub mod group;
#[cfg(feature = "node")]
pub mod keys;
pub mod mail;
pub mod peer;
pub mod publish;
pub mod quota;
pub mod route;
pub mod stream;
pub mod txn;

/// Where `cellog dev` keeps its cell's root token, read by client commands when no token is given and it exists.
pub const DEV_TOKEN_FILE: &str = ".cellog-dev/root.token";

/// Where `cellog dev` lists the client address of every node it runs (of the directory and of each cell beside it),
/// one per line.
pub const DEV_SERVERS_FILE: &str = ".cellog-dev/client-addrs";

/// Whether `connect` talks to the local dev cells: the default servers, or only addresses `cellog dev` listed (and a
/// directory given is one of them too). Then the dev cells' token and CA are the defaults; another server is never
/// offered the dev token.
fn talks_to_dev(connect: &Connect) -> bool {
    let listed = std::fs::read_to_string(DEV_SERVERS_FILE).unwrap_or_default();
    names_dev_servers(&connect.server, &listed)
        && (connect.directory.is_empty() || names_dev_servers(&connect.directory, &listed))
}

/// Whether `servers` are the dev cell's default servers, or each one of `listed` (addresses, one per line).
fn names_dev_servers(servers: &[String], listed: &str) -> bool {
    let listed = || listed.lines().map(str::trim);
    servers.join(",") == crate::DEV_SERVERS
        || (!servers.is_empty() && servers.iter().all(|server| listed().any(|addr| addr == server)))
}

/// The token `connect` names: given, or read from its file (or the dev cell's, if there is one).
pub fn token(connect: &Connect) -> anyhow::Result<Option<String>> {
    if let Some(token) = &connect.token {
        return Ok(Some(token.clone()));
    }
    let path = match &connect.token_file {
        Some(path) => path.clone(),
        None => {
            let dev = std::path::PathBuf::from(DEV_TOKEN_FILE);
            // A caller that authenticates by certificate sends no token unless told to.
            if !dev.exists() || connect.cert.is_some() || !talks_to_dev(connect) {
                return Ok(None);
            }
            dev
        }
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading the token in {}", path.display()))?;
    Ok(Some(text.trim().to_string()))
}

/// Where `cellog dev` keeps its cell's CA certificate, used by client commands when no CA is given and it exists.
pub const DEV_CA_FILE: &str = ".cellog-dev/certs/ca.pem";

/// The TLS `connect` names: the CA given (or the dev cell's, if there is one), and a client certificate if given.
pub fn tls(connect: &Connect) -> anyhow::Result<Option<ClientTls>> {
    let read = |path: &std::path::Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let ca = match &connect.ca {
        Some(path) => path.clone(),
        None => {
            let dev = std::path::PathBuf::from(DEV_CA_FILE);
            if !dev.exists() || !talks_to_dev(connect) {
                if connect.cert.is_some() {
                    anyhow::bail!("a client certificate needs the cell CA's certificate (--ca)");
                }
                return Ok(None);
            }
            dev
        }
    };
    let identity = match (&connect.cert, &connect.key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    Ok(Some(ClientTls { ca_pem: read(&ca)?, identity }))
}

/// A client for `connect`.
pub fn client(connect: &Connect) -> anyhow::Result<Client> {
    client_of(connect, connect.server.clone())
}

/// A client of the directory `connect` names: `--directory`; the dev cell (the directory `cellog dev` runs) when
/// `--server` names nodes of the dev cells; otherwise `--server`'s cell.
pub fn directory(connect: &Connect) -> anyhow::Result<Client> {
    let servers = if !connect.directory.is_empty() {
        connect.directory.clone()
    } else if talks_to_dev(connect) {
        crate::DEV_SERVERS.split(',').map(String::from).collect()
    } else {
        connect.server.clone()
    };
    client_of(connect, servers)
}

/// A client of the nodes at `servers` with `connect`'s credential and TLS (those of the dev cell when `connect` names
/// its servers, whichever of them `servers` is).
pub fn client_of(connect: &Connect, servers: Vec<String>) -> anyhow::Result<Client> {
    Ok(Client::new(servers, options(connect)?)?)
}

/// The client options `connect` names: its timeout, credential and TLS.
pub fn options(connect: &Connect) -> anyhow::Result<ClientOptions> {
    Ok(ClientOptions {
        retry_for: Duration::from_secs(connect.timeout),
        token: token(connect)?,
        tls: tls(connect)?,
        ..ClientOptions::default()
    })
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

#[cfg(test)]
mod tests {
    use super::names_dev_servers;

    #[test]
    fn the_dev_credentials_go_only_to_servers_cellog_dev_listed() {
        let listed = "127.0.0.1:7401\n127.0.0.1:7402\n127.0.0.1:7403\n127.0.0.1:7411\n127.0.0.1:7412\n127.0.0.1:7413\n";
        let servers = |text: &str| text.split(',').map(String::from).collect::<Vec<_>>();
        assert!(names_dev_servers(&servers(crate::DEV_SERVERS), ""), "the default servers are the dev cell's");
        assert!(names_dev_servers(&servers("127.0.0.1:7411"), listed), "a node of dev-1");
        assert!(names_dev_servers(&servers("127.0.0.1:7412,127.0.0.1:7401"), listed), "nodes of two dev cells");
        assert!(!names_dev_servers(&servers("127.0.0.1:7411"), ""), "nothing listed: no dev cells beside");
        assert!(!names_dev_servers(&servers("127.0.0.1:7411,db.example.com:7400"), listed), "one server is not dev");
        assert!(!names_dev_servers(&servers("127.0.0.1:741"), listed), "whole addresses only");
        assert!(!names_dev_servers(&[], listed));
    }
}

//! `cellog auth`: principals, their grants and API tokens. Every call runs as the principal of the token it carries;
//! managing principals and tokens needs the cluster-admin grant.

use anyhow::Context;
use cellog_client::proto as v1;
use cellog_client::token;
use clap::Subcommand;
use rand::RngCore;

use crate::Connect;
use crate::commands::client;
use crate::table::Table;

#[derive(Subcommand)]
pub enum AuthCommand {
    /// The principal the current token names, and its grants.
    Whoami {
        #[command(flatten)]
        connect: Connect,
    },
    /// Principals and their grants.
    #[command(subcommand)]
    Principal(PrincipalCommand),
    /// API tokens: made here (only the SHA-256 reaches the cell), shown once.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
pub enum PrincipalCommand {
    /// Create a principal, or replace an existing one's grants (its tokens stay).
    Put {
        /// Its name: NAME, or TENANT/NAME for a principal of a tenant, whose names (streams, subjects, consumers,
        /// transactional ids) and grants are all relative to its tenant and reach no other tenant's.
        name: String,
        /// A subject filter it may publish to (repeat).
        #[arg(long)]
        publish: Vec<String>,
        /// A subject filter it may read (repeat); a stream is readable when each filter it claims is covered.
        #[arg(long)]
        subscribe: Vec<String>,
        /// A consumer it may fetch from and acknowledge, STREAM/CONSUMER, either part `*` (repeat).
        #[arg(long)]
        consume: Vec<String>,
        /// May create, change and delete streams and consumers, register peers and recall messages.
        #[arg(long)]
        admin: bool,
        /// May change membership, principals, grants and tokens.
        #[arg(long)]
        cluster_admin: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Let a principal of the cell mirror these streams and no others (none: no longer any): register as their
    /// mirror, read them for it and report its progress. What a mirror's token needs of its source cell, in place of
    /// a cluster admin's.
    Mirror {
        name: String,
        /// The streams, as the cell stores them (`acme/orders` for a tenant's).
        streams: Vec<String>,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a principal and its tokens.
    Rm {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// List principals.
    Ls {
        #[command(flatten)]
        connect: Connect,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Make a token for a principal and print it (it is not shown again).
    New {
        principal: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Revoke a token: calls carrying it are refused from now on.
    Revoke {
        /// The token (or give its SHA-256 with --sha256).
        #[arg(id = "revoked", value_name = "TOKEN", required_unless_present = "sha256")]
        token: Option<String>,
        /// The token's SHA-256, in hex.
        #[arg(long, conflicts_with = "revoked")]
        sha256: Option<String>,
        #[command(flatten)]
        connect: Connect,
    },
}

fn describe(grants: &v1::Grants) -> String {
    let mut parts = Vec::new();
    for (what, list) in [("publish", &grants.publish), ("subscribe", &grants.subscribe), ("consume", &grants.consume)] {
        if !list.is_empty() {
            parts.push(format!("{what} {}", list.join(",")));
        }
    }
    if grants.admin {
        parts.push("admin".to_string());
    }
    if grants.cluster_admin {
        parts.push("cluster-admin".to_string());
    }
    if parts.is_empty() { "nothing".to_string() } else { parts.join("; ") }
}

pub async fn run(command: AuthCommand) -> anyhow::Result<()> {
    match command {
        AuthCommand::Whoami { connect } => {
            let me = client(&connect)?.who_am_i().await?;
            println!("{}: {}", me.name, describe(&me.grants.unwrap_or_default()));
        }
        AuthCommand::Principal(PrincipalCommand::Put {
            name,
            publish,
            subscribe,
            consume,
            admin,
            cluster_admin,
            connect,
        }) => {
            let grants = v1::Grants { publish, subscribe, consume, admin, cluster_admin };
            let created = client(&connect)?.put_principal(&name, grants.clone()).await?;
            let verb = if created { "created" } else { "updated" };
            println!("principal {name} {verb}: {}", describe(&grants));
        }
        AuthCommand::Principal(PrincipalCommand::Mirror { name, streams, connect }) => {
            client(&connect)?.grant_mirror(&name, &streams).await?;
            match streams.is_empty() {
                true => println!("principal {name} mirrors no stream"),
                false => println!("principal {name} may mirror {}", streams.join(", ")),
            }
        }
        AuthCommand::Principal(PrincipalCommand::Rm { name, connect }) => {
            client(&connect)?.delete_principal(&name).await?;
            println!("principal {name} deleted, with its tokens");
        }
        AuthCommand::Principal(PrincipalCommand::Ls { connect }) => {
            let mut table = Table::new(["PRINCIPAL", "TOKENS", "GRANTS", "MIRRORS"]).right([1]);
            for principal in client(&connect)?.list_principals().await? {
                let grants = describe(&principal.grants.unwrap_or_default());
                table.row([principal.name, principal.tokens.to_string(), grants, principal.mirror.join(",")]);
            }
            table.print(0);
        }
        AuthCommand::Token(TokenCommand::New { principal, connect }) => {
            let mut bytes = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut bytes);
            let made = token::from_random(bytes);
            client(&connect)?.add_token(&principal, token::hash(&made)).await?;
            eprintln!("a token of {principal} (it is not shown again; the cell keeps only its SHA-256):");
            println!("{made}");
        }
        AuthCommand::Token(TokenCommand::Revoke { token: given, sha256, connect }) => {
            let hash = match (given, sha256) {
                (Some(given), _) => token::hash(&given),
                (None, Some(hex_text)) => {
                    let bytes = hex::decode(hex_text.trim()).context("--sha256 is not hex")?;
                    bytes.try_into().map_err(|_| anyhow::anyhow!("--sha256 is 32 bytes (64 hex digits)"))?
                }
                (None, None) => anyhow::bail!("give the token, or its SHA-256 with --sha256"),
            };
            client(&connect)?.revoke_token(hash).await?;
            println!("token {} revoked", hex::encode(&hash[..8]));
        }
    }
    Ok(())
}

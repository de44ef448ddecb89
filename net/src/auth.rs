//! Who calls: the credential a call carries, as the [`Actor`] its commands run as. The node only establishes who the
//! caller claims to be (a token's hash, or a principal it vouches for); the cell decides what that principal may do,
//! and a read is authorized against this node's replica the same way.

use cellog_client::status::failed;
use cellog_client::token::{self, AUTHORIZATION, BEARER};
use cellog_core::{Actor, ROOT, TokenHash};
use tonic::{Request, Status};

/// How a node treats callers.
#[derive(Clone, Debug, Default)]
pub struct Callers {
    /// Calls without a credential run as the root principal. For a node whose callers are all trusted (a test, a
    /// node reached only through a trusted network); never the default.
    pub insecure: bool,
    /// With TLS on, the cell whose principals client certificates name (`cellog://CELL/principal/NAME`); the node
    /// sets it.
    pub cell: Option<String>,
}

fn unauthenticated(message: impl Into<String>) -> Status {
    failed(tonic::Code::Unauthenticated, "UNAUTHENTICATED", message.into())
}

impl Callers {
    /// The actor a call runs as: the bearer of its token, or, without a credential, the root principal when the node
    /// is insecure. A malformed credential, or none on a secure node, is `UNAUTHENTICATED`.
    pub fn actor<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        if let Some(value) = request.metadata().get(AUTHORIZATION) {
            let value = value.to_str().map_err(|_| unauthenticated("the authorization header is not ASCII"))?;
            let token = value
                .strip_prefix(BEARER)
                .ok_or_else(|| unauthenticated(format!("expected `{AUTHORIZATION}: {BEARER}TOKEN`")))?;
            token::check(token).map_err(unauthenticated)?;
            return Ok(Actor::Token(TokenHash(token::hash(token))));
        }
        #[cfg(not(madsim))]
        if let Some(cell) = &self.cell
            && let Some(certs) = request.peer_certs()
            && let Some(cert) = certs.first()
        {
            // The chain was verified against the cell's CA by the TLS handshake: the node vouches for the name.
            return match crate::tls::principal_of(cert) {
                Some((their_cell, principal)) if their_cell == *cell => Ok(Actor::Vouched(principal)),
                Some((their_cell, _)) => Err(unauthenticated(format!(
                    "the client certificate names a principal of cell {their_cell:?}, not {cell:?}"
                ))),
                None => {
                    Err(unauthenticated("the client certificate names no principal (cellog://CELL/principal/NAME)"))
                }
            };
        }
        if self.insecure {
            return Ok(Actor::Vouched(ROOT.to_string()));
        }
        Err(unauthenticated(format!(
            "the call carries no credential; send `{AUTHORIZATION}: {BEARER}TOKEN` (cellog --token or CELLOG_TOKEN)"
        )))
    }
}

//! How a client behaves: its options, and the intervals it keeps by default.

use std::time::Duration;

/// How a client behaves. (`Debug` shows whether it has a token, never the token.)
#[derive(Clone)]
pub struct ClientOptions {
    /// How long one call keeps retrying before it gives up.
    pub retry_for: Duration,
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
    /// First pause between attempts; doubles up to a second.
    pub backoff: Duration,
    /// After a node failed to answer, ask the next node that does for the cell's members and remember their
    /// addresses, so that a client outlives the nodes it was given. Off for a client meant for one node only.
    pub discover: bool,
    /// When an attempt has waited this long for its node, and as often again until it ends, ask every known node
    /// who leads: a leader that stopped answering (paused, cut off from its peers but not from the client) holds a
    /// call until `attempt_timeout` otherwise, long after the cell elected another. The attempt is given up once its
    /// node is silent or names itself leader while another node names a different leader at a later term; it is
    /// retried there when it is safe to repeat, and answered as of unknown outcome when it is not. A node that says
    /// it does not lead (a follower serving a read itself) is never given up on. `None`: wait for `attempt_timeout`.
    /// Needs `discover`.
    pub suspect_after: Option<Duration>,
    /// How often a client that is being answered asks for the cell's members anyway. A client learns a new node
    /// only from a node it knows: if every node it knows leaves the cell within this interval, it is stranded.
    pub discover_every: Duration,
    /// Retry a call the cell refused to slow its caller down (`RATE_LIMITED`, `STORAGE_FULL`) after the pause it
    /// advises, until `retry_for` runs out. Off, such a refusal is returned at once, for a caller that sheds load
    /// itself.
    pub retry_backpressure: bool,
    /// The API token every call carries (`authorization: Bearer TOKEN`), if any. Without one, only a node that serves
    /// callers without credentials (`--insecure`) answers.
    pub token: Option<String>,
    /// TLS toward the cell's nodes; `None`: plaintext.
    pub tls: Option<ClientTls>,
}

/// TLS toward a cell: the cell CA's certificate to verify nodes with, and optionally a client certificate naming the
/// caller's principal (`cellog://CELL/principal/NAME`, made by `cellog certs issue client`), all PEM. (`Debug` shows
/// whether it has an identity, never its key.)
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The cell CA's certificate.
    pub ca_pem: Vec<u8>,
    /// The caller's certificate and key, if it authenticates by certificate.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ClientOptions {
            retry_for,
            attempt_timeout,
            backoff,
            discover,
            suspect_after,
            discover_every,
            retry_backpressure,
            token,
            tls,
        } = self;
        f.debug_struct("ClientOptions")
            .field("retry_for", retry_for)
            .field("attempt_timeout", attempt_timeout)
            .field("backoff", backoff)
            .field("discover", discover)
            .field("suspect_after", suspect_after)
            .field("discover_every", discover_every)
            .field("retry_backpressure", retry_backpressure)
            .field("token", &crate::token::redacted(token))
            .field("tls", tls)
            .finish()
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("identity", &crate::token::redacted(&self.identity))
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            retry_for: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(50),
            discover: true,
            suspect_after: Some(SUSPECT_AFTER),
            discover_every: DISCOVERY_INTERVAL,
            retry_backpressure: true,
            token: None,
            tls: None,
        }
    }
}

/// How often a client asks the cell for its members, so that it learns of nodes added since it was made.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);

/// How long an attempt waits on its node before the client asks the others who leads (see
/// [`ClientOptions::suspect_after`]): shorter than the shortest election timeout (350 ms by default), so that a new
/// leader is found within one interval of its election.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    /// `Debug` output of options shows that a token and a key are there, never what they are.
    #[test]
    fn debug_output_shows_no_secret() {
        let options = ClientOptions {
            token: Some("cellog_the-token-itself-0123456789abcdef".to_string()),
            tls: Some(ClientTls {
                ca_pem: b"the CA".to_vec(),
                identity: Some((b"the certificate".to_vec(), b"the private key".to_vec())),
            }),
            ..ClientOptions::default()
        };
        let shown = format!("{options:?} {options:#?}");
        for secret in ["the-token-itself", "private key", "112, 114, 105"] {
            assert!(!shown.contains(secret), "{secret:?} in {shown}");
        }
        assert!(shown.contains("token: Some(\"<redacted>\")"), "{shown}");
    }
}

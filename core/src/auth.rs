//! Who may do what: principals, their API tokens and grants, and the decision for each command a principal sends.
//!
//! A node authenticates a caller (an API token it hashes, or a principal it vouches for after verifying a client
//! certificate) and proposes the caller's command wrapped in [`crate::Command::As`] with that [`Actor`]. The cell
//! resolves the actor against its own state and decides, so every replica makes the same decision at the same point in
//! the log, and a token revoked by an earlier entry no longer works for any later one. A bare command (not wrapped) is
//! the node's own: ticks, mail, bootstrap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{NameKind, Rejection};
pub use crate::headers::{NODE_HEADER_PREFIX, SENDER_HEADER, is_node_header};
use crate::snapshot::v4;
use crate::subject::{
    TENANT_SEPARATOR, filter_covers, filter_matches, filters_overlap, scoped_name, scoped_subject, tenant_of,
    validate_filter, validate_name, validate_scoped_name,
};
use crate::time::Millis;

/// The principal every cell starts with: every grant, and the only one that cannot be deleted or narrowed, so that a
/// cell can always be administered. It has no token until one is added (by the node at bootstrap, or by itself).
pub const ROOT: &str = "root";
/// Most principals a cell holds.
pub const MAX_PRINCIPALS: usize = 1024;
/// Most entries of one grant list (publish, subscribe or consume).
pub const MAX_GRANT_ENTRIES: usize = 64;
/// Most tokens one principal holds at once.
pub const MAX_TOKENS_PER_PRINCIPAL: usize = 16;

/// The SHA-256 of an API token. The cell keeps only these; the token itself is shown once, when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TokenHash(pub [u8; 32]);

impl std::fmt::Display for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The first eight bytes name a token in messages and listings without giving away the rest of the hash.
        f.write_str(&hex::encode(&self.0[..8]))
    }
}

/// Who a command runs as, as the node that proposed it established.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Actor {
    /// The bearer of an API token, by the token's hash: the cell finds the principal holding it.
    Token(TokenHash),
    /// A principal the proposing node vouches for: named by a client certificate it verified, or the root principal of
    /// a node that serves callers without credentials (`--insecure`).
    Vouched(String),
    /// A principal named by a client certificate the proposing node verified, with the certificate's serial: refused
    /// once the cell has revoked that certificate, however long it has left.
    Certified {
        /// The principal the certificate names.
        principal: String,
        /// The certificate's serial number, as its DER encodes it.
        serial: Vec<u8>,
    },
}

/// Longest certificate serial number (RFC 5280 allows 20 octets).
pub const MAX_SERIAL_BYTES: usize = 20;
/// Most revoked certificates a cell remembers at once. A revocation is forgotten once its certificate has ended, when
/// no verifier would take the certificate anyway.
pub const MAX_REVOKED_CERTIFICATES: usize = 10_000;

/// A revoked certificate: what it named, and when it ends (after which the cell forgets the revocation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoked {
    /// What the certificate names (a principal's or a node's URI), for listings.
    pub subject: String,
    /// When the certificate ends.
    pub until: Millis,
}

/// What a principal may do besides what every principal may (nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grants {
    /// Subject filters it may publish to.
    pub publish: Vec<String>,
    /// Subject filters it may read: a stream is readable when every subject filter the stream claims is covered by one
    /// of these.
    pub subscribe: Vec<String>,
    /// Consumers it may fetch from, acknowledge and commit: `STREAM/CONSUMER`, either part `*` for any.
    pub consume: Vec<String>,
    /// Create, change and delete streams and consumers, register peers and report their progress, recall messages.
    pub admin: bool,
    /// Change the cell's membership, principals, grants and tokens.
    pub cluster_admin: bool,
}

impl Grants {
    /// Every grant: the root principal's.
    pub fn all() -> Self {
        Grants {
            publish: vec![">".to_string()],
            subscribe: vec![">".to_string()],
            consume: vec!["*/*".to_string()],
            admin: true,
            cluster_admin: true,
        }
    }

    /// Checks the lists: valid filters and consumer patterns, at most [`MAX_GRANT_ENTRIES`] each.
    pub fn validate(&self) -> Result<(), Rejection> {
        for (what, list) in [("publish", &self.publish), ("subscribe", &self.subscribe), ("consume", &self.consume)] {
            if list.len() > MAX_GRANT_ENTRIES {
                return Err(Rejection::InvalidConfig {
                    reason: format!("{} {what} grants; the limit is {MAX_GRANT_ENTRIES}", list.len()),
                });
            }
        }
        for filter in self.publish.iter().chain(&self.subscribe) {
            validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason })?;
        }
        for pattern in &self.consume {
            let bad = |reason: String| Rejection::InvalidConfig {
                reason: format!("consume grant {pattern:?}: {reason}; expected STREAM/CONSUMER, either part '*'"),
            };
            let (stream, consumer) = pattern.rsplit_once('/').ok_or_else(|| bad("no '/'".to_string()))?;
            // The stream part: `*` (any of the scope's streams), `NAME`, or a tenant's `TENANT/NAME`, `TENANT/*`.
            let stream_name = match stream.rsplit_once(TENANT_SEPARATOR) {
                Some((tenant, "*")) => {
                    validate_name(tenant).map_err(|reason| bad(format!("tenant {tenant:?} {reason}")))?;
                    None
                }
                _ if stream == "*" => None,
                _ => Some(stream),
            };
            if let Some(stream) = stream_name {
                validate_scoped_name(stream).map_err(|reason| bad(format!("{stream:?} {reason}")))?;
            }
            if consumer != "*" {
                validate_name(consumer).map_err(|reason| bad(format!("{consumer:?} {reason}")))?;
            }
        }
        Ok(())
    }

    /// What these grants, written in `tenant`'s terms, allow in stored names (see [`crate::tenant`]): subjects under
    /// the tenant's scope token, consumers of the tenant's streams, no cluster admin.
    pub fn in_tenant(&self, tenant: &str) -> Grants {
        let consume = self
            .consume
            .iter()
            .map(|pattern| match pattern.split_once(TENANT_SEPARATOR) {
                Some((stream, consumer)) => format!("{}{TENANT_SEPARATOR}{consumer}", scoped_name(tenant, stream)),
                None => pattern.clone(),
            })
            .collect();
        Grants {
            publish: self.publish.iter().map(|filter| scoped_subject(tenant, filter)).collect(),
            subscribe: self.subscribe.iter().map(|filter| scoped_subject(tenant, filter)).collect(),
            consume,
            admin: self.admin,
            // Membership, principals and tokens are the cell's, not a tenant's.
            cluster_admin: false,
        }
    }

    /// Whether it may publish to `subject`.
    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.iter().any(|filter| filter_matches(filter, subject))
    }

    /// Whether it may read a stream claiming `subjects`.
    pub fn may_read(&self, subjects: &[String]) -> bool {
        subjects.iter().all(|claimed| self.subscribe.iter().any(|granted| filter_covers(granted, claimed)))
    }

    /// Whether it may publish anywhere in a stream claiming `subjects`.
    pub fn may_write(&self, subjects: &[String]) -> bool {
        subjects.iter().all(|claimed| self.publish.iter().any(|granted| filter_covers(granted, claimed)))
    }

    /// Whether it may use consumer `consumer` of `stream`.
    pub fn may_consume(&self, stream: &str, consumer: &str) -> bool {
        self.consume.iter().any(|pattern| {
            pattern
                .rsplit_once('/')
                .is_some_and(|(s, c)| stream_pattern_matches(s, stream) && (c == "*" || c == consumer))
        })
    }
}

/// Whether a consume grant's stream part names `stream`: itself, or `*` for any stream of the pattern's scope (`*` the
/// cell's own streams, `TENANT/*` a tenant's).
fn stream_pattern_matches(pattern: &str, stream: &str) -> bool {
    if pattern == stream {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(scope) if scope.is_empty() || scope.ends_with(TENANT_SEPARATOR) => {
            stream.strip_prefix(scope).is_some_and(|rest| !rest.contains(TENANT_SEPARATOR))
        }
        _ => false,
    }
}

/// A principal: its grants and the hashes of its live tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// What it may do, in its own scope's terms (see [`crate::tenant`]).
    pub grants: Grants,
    /// Its tokens' hashes.
    pub tokens: BTreeSet<TokenHash>,
    /// The streams it may mirror, in stored names ([`Access::Mirror`]): a grant of its own, so that a mirror needs no
    /// more of its source cell than to read the one stream it copies.
    pub mirror: BTreeSet<String>,
    /// What its grants allow in stored names: derived from its name and grants, not encoded.
    #[serde(skip)]
    stored: Option<Grants>,
}

impl Principal {
    /// A principal named `name` (its tenant is part of its name).
    pub fn new(name: &str, grants: Grants, tokens: BTreeSet<TokenHash>) -> Self {
        let stored = tenant_of(name).map(|tenant| grants.in_tenant(tenant));
        Principal { grants, tokens, mirror: BTreeSet::new(), stored }
    }

    /// What its grants allow, in stored names.
    pub fn effective(&self) -> &Grants {
        self.stored.as_ref().unwrap_or(&self.grants)
    }
}

/// What an authorization needs, named in a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access<'a> {
    /// Publish to a subject.
    Publish(&'a str),
    /// Read a stream that claims these subject filters.
    Read {
        /// The stream.
        stream: &'a str,
        /// Its subject filters.
        subjects: &'a [String],
    },
    /// Publish anywhere in a stream that claims these subject filters (sealed mail, whose subjects the node makes).
    Write {
        /// The stream.
        stream: &'a str,
        /// Its subject filters.
        subjects: &'a [String],
    },
    /// Use a consumer.
    Consume {
        /// The stream.
        stream: &'a str,
        /// The consumer.
        consumer: &'a str,
    },
    /// Publish anything at all (a transactional producer's registration).
    AnyPublish,
    /// Administer streams, consumers and peers.
    Admin,
    /// Administer the cell: membership, principals, grants, tokens.
    ClusterAdmin,
    /// Mirror a stream (stored name): a principal's mirror grant, or cluster admin.
    Mirror(&'a str),
}

impl Access<'_> {
    /// The grant that allows it, as a refusal names it.
    pub fn describe(&self) -> String {
        match self {
            Access::Publish(subject) => format!("publish on {subject:?}"),
            Access::Read { stream, subjects } => format!("subscribe covering {subjects:?} (stream {stream:?})"),
            Access::Write { stream, subjects } => format!("publish covering {subjects:?} (stream {stream:?})"),
            Access::Consume { stream, consumer } => format!("consume {stream}/{consumer}"),
            Access::AnyPublish => "a publish grant".to_string(),
            Access::Admin => "admin".to_string(),
            Access::ClusterAdmin => "cluster admin".to_string(),
            Access::Mirror(stream) => format!("a mirror grant on stream {stream:?} (or cluster admin)"),
        }
    }

    fn allowed_by(&self, grants: &Grants) -> bool {
        match *self {
            Access::Publish(subject) => grants.may_publish(subject),
            Access::Read { subjects, .. } => grants.may_read(subjects),
            Access::Write { subjects, .. } => grants.may_write(subjects),
            Access::Consume { stream, consumer } => grants.may_consume(stream, consumer),
            Access::AnyPublish => !grants.publish.is_empty(),
            Access::Admin => grants.admin,
            Access::ClusterAdmin | Access::Mirror(_) => grants.cluster_admin,
        }
    }
}

/// The cell's principals, and which principal registered each transactional producer (only that principal may drive
/// its transactions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Auth {
    principals: BTreeMap<Arc<str>, Principal>,
    producer_owners: BTreeMap<u64, Arc<str>>,
    /// Subject filters only the node may publish to (its own streams: sealed mail, results, provenance), whatever a
    /// principal's grants say.
    reserved: BTreeSet<String>,
    /// Revoked certificates by serial: a call presenting one is refused.
    revoked: BTreeMap<Vec<u8>, Revoked>,
    /// Which principal holds a token: derived from `principals`, not encoded, rebuilt on decode.
    #[serde(skip)]
    by_token: BTreeMap<TokenHash, Arc<str>>,
}

impl Default for Auth {
    fn default() -> Self {
        let root = Principal::new(ROOT, Grants::all(), BTreeSet::new());
        Auth {
            principals: BTreeMap::from([(Arc::from(ROOT), root)]),
            producer_owners: BTreeMap::new(),
            reserved: BTreeSet::new(),
            revoked: BTreeMap::new(),
            by_token: BTreeMap::new(),
        }
    }
}

fn check_principal_name(name: &str) -> Result<(), Rejection> {
    validate_scoped_name(name).map_err(|reason| Rejection::InvalidName {
        kind: NameKind::Principal,
        name: name.to_string(),
        reason,
    })
}

impl Auth {
    /// From decoded parts; the token index is rebuilt.
    pub(crate) fn from_parts(
        principals: BTreeMap<Arc<str>, Principal>,
        producer_owners: BTreeMap<u64, Arc<str>>,
        reserved: BTreeSet<String>,
    ) -> Self {
        let by_token = principals
            .iter()
            .flat_map(|(name, principal)| principal.tokens.iter().map(move |token| (*token, name.clone())))
            .collect();
        Auth { principals, producer_owners, reserved, revoked: BTreeMap::new(), by_token }
    }

    /// Puts back the revoked certificates a snapshot held.
    pub(crate) fn restore_revoked(&mut self, revoked: BTreeMap<Vec<u8>, Revoked>) {
        self.revoked = revoked;
    }

    /// The revoked certificates the cell remembers, by serial.
    pub fn revoked(&self) -> &BTreeMap<Vec<u8>, Revoked> {
        &self.revoked
    }

    /// Revokes the certificate with `serial`, which names `subject` and ends at `until`; forgets revocations whose
    /// certificates ended by `at`. Returns whether it was new.
    pub(crate) fn revoke_certificate(
        &mut self,
        serial: &[u8],
        subject: &str,
        until: Millis,
        at: Millis,
    ) -> Result<bool, Rejection> {
        self.revoked.retain(|_, revoked| revoked.until > at);
        if self.revoked.contains_key(serial) {
            return Ok(false);
        }
        if self.revoked.len() >= MAX_REVOKED_CERTIFICATES {
            return Err(Rejection::Invalid {
                reason: format!(
                    "the cell remembers at most {MAX_REVOKED_CERTIFICATES} revoked certificates until they end; \
                     issue shorter-lived certificates"
                ),
            });
        }
        self.revoked.insert(serial.to_vec(), Revoked { subject: subject.to_string(), until });
        Ok(true)
    }

    /// Whether `filter` itself is reserved.
    pub fn is_reserved(&self, filter: &str) -> bool {
        self.reserved.contains(filter)
    }

    /// The reserved filter `subject` falls under, if any.
    pub fn reserved_for(&self, subject: &str) -> Option<&str> {
        self.reserved.iter().find(|filter| filter_matches(filter, subject)).map(String::as_str)
    }

    /// The reserved filter a stream claiming `subjects` overlaps, if any.
    pub fn reserved_overlap(&self, subjects: &[String]) -> Option<&str> {
        self.reserved
            .iter()
            .find(|filter| subjects.iter().any(|claimed| filters_overlap(filter, claimed)))
            .map(String::as_str)
    }

    /// Reserves `filter` for the node. Returns whether it was new.
    pub(crate) fn reserve(&mut self, filter: &str) -> Result<bool, Rejection> {
        validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.to_string(), reason })?;
        if !self.reserved.contains(filter) && self.reserved.len() >= MAX_GRANT_ENTRIES {
            return Err(Rejection::Invalid { reason: format!("at most {MAX_GRANT_ENTRIES} reserved subject filters") });
        }
        Ok(self.reserved.insert(filter.to_string()))
    }

    /// Its principals, in name order.
    pub fn principals(&self) -> &BTreeMap<Arc<str>, Principal> {
        &self.principals
    }

    /// The principal an actor is, or why it is not one.
    pub fn authenticate(&self, actor: &Actor) -> Result<Arc<str>, Rejection> {
        match actor {
            Actor::Token(hash) => self
                .by_token
                .get(hash)
                .cloned()
                .ok_or_else(|| Rejection::Unauthenticated { reason: "the token is unknown or revoked".to_string() }),
            Actor::Vouched(name) => self.named(name),
            Actor::Certified { principal, serial } => {
                if self.revoked.contains_key(serial) {
                    return Err(Rejection::Unauthenticated {
                        reason: format!(
                            "the client certificate of {principal:?} (serial {}) is revoked",
                            hex::encode(serial)
                        ),
                    });
                }
                self.named(principal)
            }
        }
    }

    fn named(&self, name: &str) -> Result<Arc<str>, Rejection> {
        self.principals
            .get_key_value(name)
            .map(|(name, _)| name.clone())
            .ok_or_else(|| Rejection::Unauthenticated { reason: format!("no principal {name:?} in this cell") })
    }

    /// The principal holding `token`, if one does.
    pub fn holder(&self, token: &TokenHash) -> Option<&Arc<str>> {
        self.by_token.get(token)
    }

    /// Refuses `access` unless `principal`'s grants allow it.
    pub fn authorize(&self, principal: &str, access: &Access<'_>) -> Result<(), Rejection> {
        let allowed = self.principals.get(principal).is_some_and(|p| {
            access.allowed_by(p.effective()) || matches!(access, Access::Mirror(stream) if p.mirror.contains(*stream))
        });
        if allowed {
            Ok(())
        } else {
            Err(Rejection::PermissionDenied { principal: principal.to_string(), needs: access.describe() })
        }
    }

    /// Refuses a transaction command of `producer_id` unless `principal` registered it. A producer registered by the
    /// node (or before principals existed) has no owner and is open to any principal that may publish.
    pub fn authorize_producer(&self, principal: &str, producer_id: u64) -> Result<(), Rejection> {
        match self.producer_owners.get(&producer_id) {
            Some(owner) if **owner == *principal => Ok(()),
            Some(_) => Err(Rejection::PermissionDenied {
                principal: principal.to_string(),
                needs: format!("ownership of producer {producer_id} (another principal registered it)"),
            }),
            None => self.authorize(principal, &Access::AnyPublish),
        }
    }

    /// Records that `principal` registered `producer_id` (again: the last registration owns it).
    pub(crate) fn own_producer(&mut self, producer_id: u64, principal: Arc<str>) {
        self.producer_owners.insert(producer_id, principal);
    }

    /// Forgets who registered a producer the cell no longer holds.
    pub(crate) fn forget_producer(&mut self, producer_id: u64) {
        self.producer_owners.remove(&producer_id);
    }

    /// Creates or replaces a principal's grants; its tokens stay. Returns whether it was created.
    pub(crate) fn put_principal(&mut self, name: &str, grants: Grants) -> Result<bool, Rejection> {
        check_principal_name(name)?;
        grants.validate()?;
        if name == ROOT {
            return Err(Rejection::Invalid { reason: format!("the {ROOT} principal's grants are fixed") });
        }
        if tenant_of(name).is_some() && grants.cluster_admin {
            return Err(Rejection::InvalidConfig {
                reason: format!(
                    "{name:?} is a tenant's principal; cluster admin (membership, principals, tokens) is the cell's"
                ),
            });
        }
        if let Some(principal) = self.principals.get_mut(name) {
            let mirror = std::mem::take(&mut principal.mirror);
            *principal = Principal::new(name, grants, std::mem::take(&mut principal.tokens));
            principal.mirror = mirror;
            return Ok(false);
        }
        if self.principals.len() >= MAX_PRINCIPALS {
            return Err(Rejection::Invalid { reason: format!("a cell has at most {MAX_PRINCIPALS} principals") });
        }
        self.principals.insert(Arc::from(name), Principal::new(name, grants, BTreeSet::new()));
        Ok(true)
    }

    /// Deletes a principal and its tokens; the producers it registered become ownerless only by name (a principal of
    /// the same name made later owns them again).
    pub(crate) fn delete_principal(&mut self, name: &str) -> Result<(), Rejection> {
        if name == ROOT {
            return Err(Rejection::Invalid { reason: format!("the {ROOT} principal cannot be deleted") });
        }
        let principal =
            self.principals.remove(name).ok_or_else(|| Rejection::PrincipalNotFound { principal: name.to_string() })?;
        for token in principal.tokens {
            self.by_token.remove(&token);
        }
        Ok(())
    }

    /// Gives `principal` a token (by hash). A hash another principal holds is refused; the same principal's again is
    /// a success.
    pub(crate) fn add_token(&mut self, principal: &str, token: TokenHash) -> Result<(), Rejection> {
        if let Some(holder) = self.by_token.get(&token) {
            if **holder == *principal {
                return Ok(());
            }
            return Err(Rejection::Invalid { reason: format!("token {token} belongs to another principal") });
        }
        let entry = self
            .principals
            .get_mut(principal)
            .ok_or_else(|| Rejection::PrincipalNotFound { principal: principal.to_string() })?;
        if entry.tokens.len() >= MAX_TOKENS_PER_PRINCIPAL {
            return Err(Rejection::Invalid {
                reason: format!("a principal holds at most {MAX_TOKENS_PER_PRINCIPAL} tokens; revoke one first"),
            });
        }
        entry.tokens.insert(token);
        let (name, _) = self.principals.get_key_value(principal).expect("just found");
        self.by_token.insert(token, name.clone());
        Ok(())
    }

    /// Replaces the streams `principal` may mirror.
    pub(crate) fn grant_mirror(&mut self, principal: &str, streams: &[String]) -> Result<(), Rejection> {
        if streams.len() > MAX_GRANT_ENTRIES {
            return Err(Rejection::InvalidConfig {
                reason: format!("{} mirror grants; the limit is {MAX_GRANT_ENTRIES}", streams.len()),
            });
        }
        for stream in streams {
            crate::subject::validate_scoped_name(stream).map_err(|reason| Rejection::InvalidName {
                kind: NameKind::Stream,
                name: stream.clone(),
                reason,
            })?;
        }
        if tenant_of(principal).is_some() && !streams.is_empty() {
            return Err(Rejection::InvalidConfig {
                reason: format!("{principal:?} is a tenant's principal; mirrors, and what they read, are the cell's"),
            });
        }
        let entry = self
            .principals
            .get_mut(principal)
            .ok_or_else(|| Rejection::PrincipalNotFound { principal: principal.to_string() })?;
        entry.mirror = streams.iter().cloned().collect();
        Ok(())
    }

    /// Restores `principal`'s mirror grant from a snapshot.
    pub(crate) fn restore_mirror(&mut self, principal: &str, streams: BTreeSet<String>) {
        if let Some(entry) = self.principals.get_mut(principal) {
            entry.mirror = streams;
        }
    }

    /// The streams `principal` may mirror, if it exists.
    pub fn mirror_grants(&self, principal: &str) -> Option<&BTreeSet<String>> {
        self.principals.get(principal).map(|p| &p.mirror)
    }

    /// Revokes a token. Returns the principal that held it.
    pub(crate) fn revoke_token(&mut self, token: TokenHash) -> Result<Arc<str>, Rejection> {
        let holder = self
            .by_token
            .remove(&token)
            .ok_or_else(|| Rejection::Invalid { reason: format!("no principal holds token {token}") })?;
        if let Some(principal) = self.principals.get_mut(&holder) {
            principal.tokens.remove(&token);
        }
        Ok(holder)
    }
}

impl From<v4::Grants> for Grants {
    fn from(grants: v4::Grants) -> Self {
        let v4::Grants { publish, subscribe, consume, admin, cluster_admin } = grants;
        Grants { publish, subscribe, consume, admin, cluster_admin }
    }
}

impl From<v4::Auth> for Auth {
    fn from(auth: v4::Auth) -> Self {
        let principals = auth
            .principals
            .into_iter()
            .map(|(name, principal)| {
                let tokens = principal.tokens.into_iter().map(|token| TokenHash(token.0)).collect();
                let principal = Principal::new(&name, principal.grants.into(), tokens);
                (name, principal)
            })
            .collect();
        Auth::from_parts(principals, auth.producer_owners, auth.reserved)
    }
}

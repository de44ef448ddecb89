//! Who calls: the credential a call carries, as the [`Actor`] its commands run as. The node only establishes who the
//! caller claims to be (a token's hash, or a principal it vouches for); the cell decides what that principal may do,
//! and a read is authorized against this node's replica the same way. The node also limits how many commands each
//! principal sends it ([`PrincipalRate`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_client::status::failed;
use cellog_client::token::{self, AUTHORIZATION, BEARER};
use cellog_core::{Actor, ROOT, TokenHash};
use tokio::time::Instant;
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
    /// How many commands each principal but root may send this node, if limited.
    pub rate: Option<PrincipalRate>,
    /// The hash of a token that reads `/metrics` and nothing else (a Prometheus server's), if the node has one; a
    /// cluster admin's token reads it too.
    pub scrape_token: Option<TokenHash>,
}

/// How many commands a principal may send one node: a token bucket of `burst` refilled at `per_second`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrincipalRate {
    /// Commands per second, sustained.
    pub per_second: u32,
    /// Commands at once, after a quiet spell.
    pub burst: u32,
}

impl PrincipalRate {
    /// What `cellog node` limits each principal to unless told otherwise: well above what one client needs, well
    /// below what lets one client take a cell from everyone else.
    pub const DEFAULT: PrincipalRate = PrincipalRate { per_second: 20_000, burst: 40_000 };
}

/// The rates a node holds its callers to, each a token bucket: each principal's, each tenant's (all its principals
/// together), the cell's (every caller together, through this node), and each subject's publishes (per tenant, so one
/// hot subject cannot take a tenant's whole rate). Root is held to none: the operator must always reach the cell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    /// Each principal's, if limited.
    pub principal: Option<PrincipalRate>,
    /// Each tenant's, if limited.
    pub tenant: Option<PrincipalRate>,
    /// Every caller's together, if limited.
    pub cell: Option<PrincipalRate>,
    /// Each subject's publishes (every principal of a tenant publishing to it together), if limited.
    pub subject: Option<PrincipalRate>,
}

/// The buckets of this node's callers. Admission control, not authorization: it guards this node's resources, so it
/// is the node's own (the leader's counts, as the leader proposes), and the cell's decisions do not depend on it.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    rates: Rates,
    buckets: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    principals: BTreeMap<Arc<str>, Bucket>,
    tenants: BTreeMap<String, Bucket>,
    cell: Option<Bucket>,
    /// By tenant and subject, `TENANT/SUBJECT` (a subject has no `/`).
    subjects: BTreeMap<String, Bucket>,
}

/// The buckets a command is taken from, named in a refusal.
#[derive(Clone, Copy)]
enum Level {
    Principal,
    Tenant,
    Cell,
    Subject,
}

/// Subjects whose buckets are kept at once; past it, the idle ones are forgotten (a forgotten bucket is a full one).
const MAX_SUBJECT_BUCKETS: usize = 100_000;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// The bucket as it is `now`, refilled at `rate` since it was last looked at.
    fn refilled(slot: &mut Option<Bucket>, rate: PrincipalRate, now: Instant) -> &mut Bucket {
        let burst = f64::from(rate.burst);
        let bucket = slot.get_or_insert(Bucket { tokens: burst, at: now });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * f64::from(rate.per_second)).min(burst);
        bucket.at = now;
        bucket
    }

    /// How long until it holds a whole token, in milliseconds (at least 1).
    fn wait_ms(&self, rate: PrincipalRate) -> u64 {
        (((1.0 - self.tokens) / f64::from(rate.per_second)) * 1000.0).ceil().max(1.0) as u64
    }
}

/// Buckets not touched for this long are full again and are forgotten, so the map holds recent callers only.
const IDLE: Duration = Duration::from_secs(60);

fn limited(rate: Option<PrincipalRate>) -> Option<PrincipalRate> {
    rate.filter(|rate| rate.per_second > 0 && rate.burst > 0)
}

impl Limiter {
    pub(crate) fn new(rates: Rates) -> Self {
        let rates = Rates {
            principal: limited(rates.principal),
            tenant: limited(rates.tenant),
            cell: limited(rates.cell),
            subject: limited(rates.subject),
        };
        Limiter { rates, buckets: Mutex::default() }
    }

    /// Takes one command's token for `principal` from its own bucket, its tenant's and the cell's, or none of them and
    /// says which is empty (`RESOURCE_EXHAUSTED RATE_LIMITED`, with when to retry). Root is not limited: the operator
    /// must always reach the cell.
    pub(crate) fn take(&self, principal: &Arc<str>) -> Result<(), Status> {
        self.take_for(principal, None)
    }

    /// [`Limiter::take`] for a command that publishes to `subject`: its subject's bucket too, all or none.
    #[allow(clippy::disallowed_methods, reason = "a node-local admission limit, on the runtime's clock")]
    pub(crate) fn take_for(&self, principal: &Arc<str>, subject: Option<&str>) -> Result<(), Status> {
        let Rates { principal: own, tenant, cell, subject: per_subject } = self.rates;
        let per_subject = per_subject.filter(|_| subject.is_some());
        if (own.is_none() && tenant.is_none() && cell.is_none() && per_subject.is_none()) || **principal == *ROOT {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let buckets = &mut *buckets;
        if buckets.principals.len() > 2 * cellog_core::auth::MAX_PRINCIPALS {
            buckets.principals.retain(|_, bucket| now.duration_since(bucket.at) < IDLE);
        }
        if buckets.tenants.len() > 2 * cellog_core::auth::MAX_PRINCIPALS {
            buckets.tenants.retain(|_, bucket| now.duration_since(bucket.at) < IDLE);
        }
        if buckets.subjects.len() > MAX_SUBJECT_BUCKETS {
            buckets.subjects.retain(|_, bucket| now.duration_since(bucket.at) < IDLE);
        }
        let tenant_name = cellog_core::subject::tenant_of(principal);
        let subject_key = per_subject.and(subject).map(|subject| format!("{}/{subject}", tenant_name.unwrap_or("")));
        // Each bucket that applies, taken out of its map while it is looked at, and put back after.
        let mut own_slot = own.map(|_| buckets.principals.remove(principal));
        let mut tenant_slot = tenant.zip(tenant_name).map(|(_, name)| buckets.tenants.remove(name));
        let mut cell_slot = cell.map(|_| buckets.cell.take());
        let mut subject_slot = subject_key.as_ref().map(|key| buckets.subjects.remove(key));
        let mut empty = None;
        // Which bucket ran out is named only when one did: no text is made for an admitted command.
        let levels = [
            (own, own_slot.as_mut(), Level::Principal),
            (tenant, tenant_slot.as_mut(), Level::Tenant),
            (cell, cell_slot.as_mut(), Level::Cell),
            (per_subject, subject_slot.as_mut(), Level::Subject),
        ];
        let mut looked = Vec::new();
        for (rate, slot, who) in levels {
            let (Some(rate), Some(slot)) = (rate, slot) else { continue };
            let bucket = Bucket::refilled(slot, rate, now);
            if bucket.tokens < 1.0 && empty.is_none() {
                empty = Some((who, rate, bucket.wait_ms(rate)));
            }
            looked.push(slot);
        }
        if empty.is_none() {
            for bucket in looked.into_iter().flatten() {
                bucket.tokens -= 1.0;
            }
        }
        if let Some(Some(bucket)) = own_slot {
            buckets.principals.insert(principal.clone(), bucket);
        }
        if let (Some(Some(bucket)), Some(name)) = (tenant_slot, tenant_name) {
            buckets.tenants.insert(name.to_string(), bucket);
        }
        if let Some(bucket) = cell_slot {
            buckets.cell = bucket;
        }
        if let (Some(Some(bucket)), Some(key)) = (subject_slot, subject_key)
            && buckets.subjects.len() < MAX_SUBJECT_BUCKETS
        {
            buckets.subjects.insert(key, bucket);
        }
        let Some((level, rate, retry_after_ms)) = empty else { return Ok(()) };
        let who = match level {
            Level::Principal => format!("principal {principal:?}"),
            Level::Tenant => format!("tenant {:?}", tenant_name.unwrap_or_default()),
            Level::Cell => "the cell".to_string(),
            Level::Subject => format!("subject {:?}", subject.unwrap_or_default()),
        };
        let message = format!(
            "{who} is over its rate of {} commands per second (burst {}) on this node; retry after {retry_after_ms} ms",
            rate.per_second, rate.burst
        );
        Err(cellog_client::status::status(
            tonic::Code::ResourceExhausted,
            cellog_proto::v1::ErrorDetail {
                reason: "RATE_LIMITED".to_string(),
                message,
                retry_after_ms,
                ..Default::default()
            },
        ))
    }
}

fn unauthenticated(message: impl Into<String>) -> Status {
    failed(tonic::Code::Unauthenticated, "UNAUTHENTICATED", message.into())
}

impl Callers {
    /// The actor a call runs as: the bearer of its token, or, without a credential, the root principal when the node
    /// is insecure. A malformed credential, or none on a secure node, is `UNAUTHENTICATED`.
    pub fn actor<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        if let Some(Admitted(actor)) = request.extensions().get::<Admitted>() {
            return Ok(actor.clone());
        }
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
            let named = crate::tls::Named::read(cert)
                .ok_or_else(|| unauthenticated("the client certificate does not parse"))?;
            return match named.principal() {
                Some((their_cell, principal)) if their_cell == *cell => {
                    Ok(Actor::Certified { principal, serial: named.serial().to_vec() })
                }
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

/// The client port's door for the cell's API, run on a call's headers before its message is decoded:
/// the credential must name a principal of this node's replica (a known token, a certificate's principal, or root on
/// an insecure node). A stranger's call costs the node its headers and one lookup, never the decoding of up to its
/// message limit. (Health and reflection, which hold no data, are not behind it, nor is sealed mail, which another
/// cell delivers on an envelope's signature.) What the principal may do is
/// decided later, by the cell.
#[cfg(not(madsim))]
pub(crate) struct ClientDoor<S> {
    node: Arc<cellog_raft::CellNode<S>>,
    callers: Callers,
}

#[cfg(not(madsim))]
impl<S> Clone for ClientDoor<S> {
    fn clone(&self) -> Self {
        ClientDoor { node: self.node.clone(), callers: self.callers.clone() }
    }
}

#[cfg(not(madsim))]
impl<S: cellog_raft::storage::Storage + Clone> ClientDoor<S> {
    /// The door of `node`'s client port for `callers`.
    pub(crate) fn new(node: Arc<cellog_raft::CellNode<S>>, callers: Callers) -> Self {
        ClientDoor { node, callers }
    }
}

#[cfg(not(madsim))]
impl<S: cellog_raft::storage::Storage + Clone> tonic::service::Interceptor for ClientDoor<S> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let actor = self.callers.actor(&request)?;
        // Against the node's copy of the credentials, not the replica: a door never waits on applying.
        self.node.authenticate(&actor).map_err(|rejection| crate::status::from_rejection(&rejection))?;
        // The handler takes the actor from here rather than parsing and hashing the credential again.
        request.extensions_mut().insert(Admitted(actor));
        Ok(request)
    }
}

/// The actor a door admitted a call as.
#[derive(Clone, Debug)]
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) struct Admitted(pub(crate) Actor);

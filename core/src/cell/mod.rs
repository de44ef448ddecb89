//! The cell: every stream, consumer and producer of one Raft group, and the single entry point that changes them.
//!
//! One `Cell` type, one `impl` block per concern: [`limits`] (what a command may ask for at all), [`timers`],
//! [`publish`] (publishing and recall), [`streams`] (streams, retention, peers and pins), [`consumers`] (consumers,
//! fetches and acks), [`transaction`] (transactional producers), [`groups`] (consumer groups), [`placement`] (the
//! directory and streams' ownership epochs), [`ingest`] (a moving stream's or a mirror's messages copied in),
//! [`mirror`] (mirrors and the recall logs their sources keep) and [`views`] (what hosts read). Each block's
//! methods are visible to the others and to nothing outside the cell; [`Cell::apply`] is the only way in.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::auth::Auth;
use crate::body::BodyRef;
use crate::command::Command;
use crate::dedup::IdKey;
use crate::effect::{BodyOp, Effects, Transition};
use crate::error::Rejection;
use crate::group::Group;
use crate::mirror::Mirroring;
use crate::outcome::{AckAnswer, Outcome};
use crate::placement::{Directory, Ownership};
use crate::quota::QuotaBook;
use crate::route::Router;
use crate::snapshot::{v3, v4, v5, v6, v7, v8, v9, v10, v11, v12};
use crate::stream::Stream;
use crate::time::Millis;
use ledger::Ledger;

mod auth;
mod consumers;
mod groups;
mod ingest;
mod ledger;
mod limits;
mod mirror;
mod placement;
mod publish;
mod quotas;
mod streams;
mod timers;
pub(crate) mod transaction;
mod views;

pub use limits::{
    MAX_COMMAND_BYTES, MAX_CONSUMERS_PER_STREAM, MAX_DEDUP_IDS, MAX_FETCH, MAX_GROUP_MEMBERS, MAX_HEADER_BYTES,
    MAX_ID_BYTES, MAX_INGEST_GAP, MAX_INGEST_MESSAGES, MAX_KEY_BYTES, MAX_OPEN_TRANSACTIONS, MAX_PEERS_PER_STREAM,
    MAX_PRODUCERS, MAX_READ, MAX_RESPONSE_BYTES, MAX_SESSION_TIMEOUT_MS, MAX_STREAMS, MIN_SESSION_TIMEOUT_MS,
    PRODUCER_IDLE_MS,
};
pub use mirror::MirrorRead;
pub use streams::PIN_HEADER;
use timers::Timers;
use transaction::Producer;

/// A stored message: (stream, partition, seq).
type MessageRef = (Arc<str>, u32, u64);

/// The replicated state machine of one cell.
///
/// # Driving it
/// The host (the Raft state-machine adapter, a test, a simulation) owns a `Cell` and:
/// 1. applies every committed command in log order with [`Cell::apply`], passing the time the leader stamped on it
///    (`max(previous stamp, leader clock)`); the outcome goes back to whoever proposed the command;
/// 2. drains [`Cell::drain_work`] after each apply (before the next: `apply` asserts it), and stores, copies and
///    releases bodies as it says, in the same storage batch as the entry; a host that traces turns
///    [`Cell::trace_transitions`] on and drains [`Cell::drain_transitions`] too;
/// 3. watches [`Cell::next_deadline`]: once the leader's clock passes it, the leader proposes [`Command::Tick`].
///
/// Every command first fires the timers due at its time, so the state is a pure function of the sequence of
/// `(at, command)` pairs: replicas that apply the same log hold the same state ([`Cell::digest`] compares them).
///
/// The cell reads no clock, spawns nothing, draws no random numbers and does no IO; it holds no body bytes once
/// `apply` returns (see [`crate::body`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cell {
    last_at: Millis,
    n_applied: u64,
    streams: BTreeMap<Arc<str>, Stream>,
    stream_names: BTreeMap<u64, Arc<str>>,
    next_stream_id: u64,
    producers: BTreeMap<u64, Producer>,
    transactional_ids: BTreeMap<Arc<str>, u64>,
    next_producer_id: u64,
    timers: Timers,
    /// Pinning messages and the message each pins. See [`PIN_HEADER`].
    pinned_by: BTreeMap<MessageRef, MessageRef>,
    /// The key the next stored body gets (see [`crate::body`]).
    next_body: u64,
    /// Principals, their tokens and grants, and who registered each transactional producer.
    auth: Auth,
    /// Consumer groups by (stream, group); each consumes through the stream's consumer of the group's name.
    groups: BTreeMap<(Arc<str>, Arc<str>), Group>,
    /// The directory's records of cells and placements (empty unless this cell is a deployment's directory).
    directory: Directory,
    /// The ownership of each stream name a move named, kept after the stream is deleted (so that a stream created
    /// again under a moved name stays fenced); a name not here is owned at epoch 0.
    ownership: BTreeMap<Arc<str>, Ownership>,
    /// This cell's mirrors of other cells' streams, and the recall logs of its streams that other cells mirror.
    mirroring: Mirroring,
    /// What each tenant, and the cell as a whole, may hold (see [`crate::quota`]).
    quotas: QuotaBook,
    /// What each tenant and the cell hold, kept while any quota is set (none costs a publish nothing): derived from
    /// the streams, not encoded, rebuilt on decode.
    #[serde(skip)]
    ledger: Option<Ledger>,
    /// Which stream claims a subject: derived from the streams' configs, not encoded, rebuilt on decode
    /// ([`Cell::rebuild_derived`]).
    #[serde(skip)]
    router: Router,
    /// No producer expires before this time (a lower bound, rebuilt on decode): idle producers are looked for only
    /// once it has come. Derived, so replicas may hold different bounds; which producers expire when does not depend
    /// on it.
    #[serde(skip)]
    producers_expire_from: ExpiryBound,
    /// No group member's session ends before this time (a lower bound, rebuilt on decode), as for producers.
    #[serde(skip)]
    members_expire_from: ExpiryBound,
    /// The key of the streams' message-id indexes ([`Cell::key_ids`]). Not state, as for the bounds above.
    #[serde(skip)]
    id_key: HostKey,
    /// Transient: not part of the state, not in snapshots, not compared.
    #[serde(skip)]
    effects: Effects,
}

impl Default for Cell {
    fn default() -> Self {
        Cell::new()
    }
}

/// A lower bound on the next producer expiry ([`Cell::expire_idle_producers`]). Not state: two cells that hold the same
/// state are equal whatever bounds they hold.
#[derive(Clone, Copy, Debug, Eq)]
struct ExpiryBound(Millis);

impl PartialEq for ExpiryBound {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The key a host handed the cell for its message-id indexes. Not state: two cells that hold the same state are equal
/// whatever keys they hold.
#[derive(Clone, Copy, Debug, Default)]
struct HostKey(IdKey);

impl PartialEq for HostKey {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for HostKey {}

fn stream_in<'a>(streams: &'a mut BTreeMap<Arc<str>, Stream>, name: &str) -> Result<&'a mut Stream, Rejection> {
    streams.get_mut(name).ok_or_else(|| Rejection::StreamNotFound { stream: name.to_string() })
}

impl Cell {
    /// An empty cell.
    pub fn new() -> Self {
        Cell {
            last_at: Millis::ZERO,
            n_applied: 0,
            streams: BTreeMap::new(),
            stream_names: BTreeMap::new(),
            next_stream_id: 1,
            producers: BTreeMap::new(),
            transactional_ids: BTreeMap::new(),
            next_producer_id: 1,
            timers: Timers::default(),
            pinned_by: BTreeMap::new(),
            next_body: 1,
            auth: Auth::default(),
            groups: BTreeMap::new(),
            directory: Directory::default(),
            ownership: BTreeMap::new(),
            mirroring: Mirroring::default(),
            quotas: QuotaBook::default(),
            ledger: None,
            router: Router::default(),
            producers_expire_from: ExpiryBound(Millis::MAX),
            members_expire_from: ExpiryBound(Millis::MAX),
            id_key: HostKey::default(),
            effects: Effects::default(),
        }
    }

    /// The state a version 3 snapshot holds, without what is derived from it: [`Cell::rebuild_derived`] follows.
    pub(crate) fn from_v3(cell: v3::Cell) -> Self {
        let last_at: Millis = cell.last_at.into();
        Cell {
            last_at,
            n_applied: cell.n_applied,
            streams: cell.streams.into_iter().map(|(name, stream)| (name, stream.into())).collect(),
            stream_names: cell.stream_names,
            next_stream_id: cell.next_stream_id,
            producers: cell
                .producers
                .into_iter()
                .map(|(id, producer)| (id, Producer::from_v3(producer, last_at)))
                .collect(),
            transactional_ids: cell.transactional_ids,
            next_producer_id: cell.next_producer_id,
            timers: cell.timers.into(),
            pinned_by: cell.pinned_by,
            next_body: cell.next_body,
            auth: Auth::default(),
            groups: BTreeMap::new(),
            directory: Directory::default(),
            ownership: BTreeMap::new(),
            mirroring: Mirroring::default(),
            quotas: QuotaBook::default(),
            ledger: None,
            router: Router::default(),
            producers_expire_from: ExpiryBound(Millis::MAX),
            members_expire_from: ExpiryBound(Millis::MAX),
            id_key: HostKey::default(),
            effects: Effects::default(),
        }
    }

    /// The state a version 4 snapshot holds: version 3's and the principals.
    pub(crate) fn from_v4(cell: v4::Cell) -> Self {
        let (state, auth) = cell.split();
        Cell { auth: auth.into(), ..Cell::from_v3(state) }
    }

    /// The state a version 5 snapshot holds: version 4's, and when each producer was last active.
    pub(crate) fn from_v5(cell: v5::Cell) -> Self {
        let (state, last_active) = cell.split();
        let mut cell = Cell::from_v4(state);
        for (id, at) in last_active {
            if let Some(producer) = cell.producers.get_mut(&id) {
                producer.last_active = at.into();
            }
        }
        cell
    }

    pub(crate) fn from_v6(cell: v6::Cell) -> Self {
        let (state, staged_bodies) = cell.split();
        let mut cell = Cell::from_v5(state);
        for (id, bodies) in staged_bodies {
            let staged = cell.producers.get_mut(&id).and_then(|producer| producer.transaction.as_mut());
            for (message, body) in staged.into_iter().flat_map(|transaction| &mut transaction.staged).zip(bodies) {
                message.body = body.map(BodyRef::from);
            }
        }
        cell
    }

    /// The state a version 7 snapshot holds: version 6's and the consumer groups.
    pub(crate) fn from_v7(cell: v7::Cell) -> Self {
        let (state, groups) = cell.split();
        let groups = groups.into_iter().map(|(key, group)| (key, group.into())).collect();
        Cell { groups, ..Cell::from_v6(state) }
    }

    /// The state a version 8 snapshot holds: version 7's, the directory's records and streams' ownership.
    pub(crate) fn from_v8(cell: v8::Cell) -> Self {
        let (state, directory, ownership) = cell.split();
        Cell {
            directory: directory.into(),
            ownership: ownership.into_iter().map(|(name, o)| (name, o.into())).collect(),
            ..Cell::from_v7(state)
        }
    }

    /// The state a version 9 snapshot holds: version 8's, the mirrors and the recall logs.
    pub(crate) fn from_v9(cell: v9::Cell) -> Self {
        let (state, mirroring) = cell.split();
        Cell { mirroring: mirroring.into(), ..Cell::from_v8(state) }
    }

    /// The state a version 10 snapshot holds: version 9's, the revoked certificates and the quotas.
    pub(crate) fn from_v10(cell: v10::Cell) -> Self {
        let (state, revoked, quotas) = cell.split();
        let mut cell = Cell { quotas: quotas.into(), ..Cell::from_v9(state) };
        cell.auth.restore_revoked(revoked.into_iter().map(|(serial, r)| (serial, r.into())).collect());
        cell
    }

    /// The state a version 11 snapshot holds: version 10's and each principal's mirror grant.
    pub(crate) fn from_v11(cell: v11::Cell) -> Self {
        let (state, mirror_grants) = cell.split();
        let mut cell = Cell::from_v10(state);
        for (principal, streams) in mirror_grants {
            cell.auth.restore_mirror(&principal, streams);
        }
        cell
    }

    /// The state a version 12 snapshot holds: version 11's, its quotas with the caps on deliveries.
    pub(crate) fn from_v12(cell: v12::Cell) -> Self {
        let (state, quotas) = cell.split();
        Cell { quotas, ..Cell::from_v11(state) }
    }

    /// Rebuilds what is derived from the state and not encoded (the subject router), after decoding.
    pub(crate) fn rebuild_derived(&mut self) {
        let mut router = Router::default();
        for (name, stream) in &self.streams {
            for filter in &stream.config().subjects {
                router.insert(filter, name);
            }
        }
        self.router = router;
        self.ledger = self.quotas.is_limited().then(|| Ledger::of(&self.streams));
        self.producers_expire_from = ExpiryBound(self.earliest_producer_expiry());
        self.members_expire_from = ExpiryBound(self.earliest_member_expiry());
    }

    /// Every stored body the state refers to, in key order: the retained messages' (recalled messages have none) and
    /// the staged messages' of open transactions.
    pub fn body_refs(&self) -> Vec<BodyRef> {
        let mut refs: Vec<BodyRef> = self.streams.values().flat_map(Stream::bodies).collect();
        refs.extend(self.producers.values().flat_map(Producer::staged_bodies));
        refs.sort_by_key(|body| body.key);
        refs
    }

    fn stream(&self, name: &str) -> Result<&Stream, Rejection> {
        self.streams.get(name).ok_or_else(|| Rejection::StreamNotFound { stream: name.to_string() })
    }

    /// Keys the hash of every stream's message-id index, now and for streams created later (see [`IdKey`]). A host
    /// calls it with a key of its own drawing after it makes or restores a cell; it changes no state and nothing the
    /// cell answers.
    pub fn key_ids(&mut self, key: IdKey) {
        self.id_key = HostKey(key);
        for stream in self.streams.values_mut() {
            stream.key_ids(key);
        }
    }

    /// Takes the storage work queued by the commands applied so far: the host does it, in order, in the same storage
    /// batch as the entry (see [`crate::body`]).
    pub fn drain_work(&mut self) -> std::vec::Drain<'_, BodyOp> {
        self.effects.drain_work()
    }

    /// Takes the transitions queued by the commands applied so far (none unless [`Cell::trace_transitions`]).
    pub fn drain_transitions(&mut self) -> std::vec::Drain<'_, Transition> {
        self.effects.drain_transitions()
    }

    /// Whether applies build [`Transition`]s for the host to trace (off in a new or restored cell): a host's setting,
    /// not state, so replicas may differ and nothing else an apply does depends on it.
    pub fn trace_transitions(&mut self, traced: bool) {
        self.effects.set_traced(traced);
    }

    /// Whether applies build [`Transition`]s.
    pub fn traces_transitions(&self) -> bool {
        self.effects.traced()
    }

    /// This cell without its dedup indexes (a planted bug's snapshot).
    #[cfg(madsim)]
    pub(crate) fn without_dedup(&self) -> Cell {
        let mut cell = self.clone();
        for stream in cell.streams.values_mut() {
            stream.forget_dedup();
        }
        cell
    }

    /// Drops every consumer (a planted bug's snapshot install).
    #[cfg(madsim)]
    pub fn forget_consumers(&mut self) {
        for stream in self.streams.values_mut() {
            stream.forget_consumers();
        }
    }

    /// Applies one command at the leader-stamped time `at`. Timers due at `at` fire first. A rejection changes
    /// nothing the command asked for, with one exception: a refused commit aborts the transaction and moves the
    /// producer to its next epoch (the refusal says so). Timers that fired stay fired: they depend on time alone.
    ///
    /// # Panics
    /// If the effects of an earlier apply were not drained: a host that forgets them loses body writes.
    pub fn apply(&mut self, at: Millis, command: Command) -> Result<Outcome, Rejection> {
        assert!(
            self.effects.queued() == 0,
            "the host must drain the work and transitions of every apply before the next; {} are queued",
            self.effects.queued()
        );
        // The leader stamps monotonic times; a replica clamps rather than trusting that, so state never sees time
        // go backwards.
        #[cfg(madsim)]
        let at = if cellog_planted::active(cellog_planted::Mutant::LeaderTimeNotMonotonic) {
            at
        } else {
            at.max(self.last_at)
        };
        #[cfg(not(madsim))]
        let at = at.max(self.last_at);
        self.last_at = at;
        self.n_applied += 1;
        self.fire_timers(at);
        self.expire_idle_producers(at);
        self.expire_group_members(at);
        let producer = command.producer();
        // The checks that need no state come first, exactly as a host makes them before proposing. A match rather than
        // `and_then`, whose closure would take the command (256 bytes) by a copy.
        let result = match command.check() {
            Ok(()) => self.dispatch(at, command),
            Err(rejection) => Err(rejection),
        };
        if result.is_ok() {
            self.touch_producer(at, producer, &result);
        }
        if !self.pinned_by.is_empty() {
            self.release_pins(at, 0);
        }
        if let Some(ledger) = &mut self.ledger {
            ledger.follow(self.effects.changed_streams(), &self.streams);
        }
        self.effects.end_apply();
        result
    }

    /// Runs a checked command. Inlined into `apply`, so that the command moves into it without a copy.
    #[inline]
    fn dispatch(&mut self, at: Millis, command: Command) -> Result<Outcome, Rejection> {
        match command {
            Command::CreateStream { name, config } => self.create_stream(at, name, config),
            Command::UpdateStream { name, config } => self.update_stream(at, &name, config),
            Command::DeleteStream { name } => self.delete_stream(at, &name),
            Command::Publish(request) => self.publish(at, request),
            Command::Recall { stream, partition, seq } => self.recall(at, &stream, partition, seq),
            Command::CreateConsumer { stream, name, config } => self.create_consumer(at, &stream, name, config),
            Command::DeleteConsumer { stream, name } => self.delete_consumer(&stream, &name),
            Command::Fetch { stream, consumer, member, max } => {
                self.refuse_group_consumer(&stream, &consumer)?;
                Ok(Outcome::Fetched(self.fetch(at, &stream, &consumer, &member, max, None)?))
            }
            Command::Ack { stream, consumer, partition, seq, kind } => {
                self.refuse_group_consumer(&stream, &consumer)?;
                let AckAnswer { state, already_done } = self.ack(at, &stream, &consumer, partition, seq, kind)?;
                Ok(Outcome::Acked { state, already_done })
            }
            Command::CommitCursor { stream, consumer, partition, next_seq } => {
                self.refuse_group_consumer(&stream, &consumer)?;
                self.commit_cursor(&stream, &consumer, partition, next_seq)
            }
            Command::InitProducer { transactional_id, transaction_timeout_ms } => {
                self.init_producer(transactional_id, transaction_timeout_ms)
            }
            Command::BeginTransaction(r) => self.begin_transaction(at, r),
            Command::PrepareTransaction(r) => self.prepare_transaction(r),
            Command::CommitTransaction(r) => self.commit_transaction(at, r),
            #[cfg(madsim)]
            Command::AbortTransaction(r) if cellog_planted::active(cellog_planted::Mutant::AbortShowsStaged) => {
                match self.commit_transaction(at, r)? {
                    Outcome::TransactionCommitted { next, .. } => Ok(Outcome::TransactionAborted { next }),
                    other => Ok(other),
                }
            }
            Command::AbortTransaction(r) => self.abort_transaction(r),
            Command::GrantMirror { principal, streams } => self.grant_mirror(&principal, &streams),
            Command::RegisterPeer { stream, peer } => self.register_peer(&stream, peer),
            Command::PeerProgress { stream, peer, partition, received_seq } => {
                self.peer_progress(at, &stream, &peer, partition, received_seq)
            }
            Command::As { actor, command } => self.run_as(at, &actor, *command),
            Command::PutPrincipal { name, grants } => self.put_principal(&name, grants),
            Command::DeletePrincipal { name } => self.delete_principal(&name),
            Command::AddToken { principal, token } => self.add_token(&principal, token),
            Command::RevokeToken { token } => self.revoke_token(token),
            Command::RevokeCertificate { serial, subject, until_ms } => Ok(Outcome::CertificateRevoked {
                revoked: self.auth.revoke_certificate(&serial, &subject, Millis(until_ms), at)?,
            }),
            Command::SetQuotas { tenant, quotas } => self.set_quotas(tenant.as_deref(), quotas),
            Command::ReserveSubjects { filter } => {
                Ok(Outcome::SubjectsReserved { reserved: self.auth.reserve(&filter)? })
            }
            Command::UnregisterPeer { stream, peer } => self.unregister_peer(at, &stream, &peer),
            Command::Tick => Ok(Outcome::Ticked),
            Command::UpdateConsumer { stream, name, config } => self.update_consumer(&stream, &name, config),
            Command::JoinGroup { stream, group, member, strategy, session_timeout_ms, config } => {
                self.join_group(at, &stream, &group, &member, strategy, session_timeout_ms, config)
            }
            Command::Heartbeat { stream, group, member, generation, released } => {
                self.heartbeat(at, &stream, &group, &member, generation, &released)
            }
            Command::LeaveGroup { stream, group, member } => self.leave_group(&stream, &group, &member),
            Command::MemberFetch { stream, group, member, generation, max } => {
                self.member_fetch(at, &stream, &group, &member, generation, max)
            }
            Command::MemberAck { stream, group, member, generation, partition, seq, kind } => {
                self.check_member_owns(&stream, &group, &member, generation, partition)?;
                let AckAnswer { state, already_done } = self.ack(at, &stream, &group, partition, seq, kind)?;
                Ok(Outcome::Acked { state, already_done })
            }
            Command::Acks { stream, consumer, member, items } => {
                self.ack_each(at, &stream, &consumer, member.as_ref(), items)
            }
            Command::MemberCommit { stream, group, member, generation, partition, next_seq } => {
                self.check_member_owns(&stream, &group, &member, generation, partition)?;
                self.commit_cursor(&stream, &group, partition, next_seq)
            }
            Command::PutCell { cell, addresses } => self.put_cell(&cell, addresses),
            Command::PlaceStream { stream, cell } => self.place_stream(&stream, &cell),
            Command::MoveStream { stream, to, epoch } => self.move_stream(&stream, &to, epoch),
            Command::FinishMove { stream, epoch } => self.finish_move(&stream, epoch),
            Command::Unplace { stream } => self.unplace(&stream),
            Command::FenceStream { stream, epoch, to } => self.fence_stream(&stream, epoch, &to),
            Command::ReceiveStream { stream, epoch, from, config } => {
                self.receive_stream(at, &stream, epoch, &from, config)
            }
            Command::AcceptStream { stream, epoch, through } => self.accept_stream(&stream, epoch, &through),
            Command::Ingest { stream, epoch, messages, through } => {
                self.check_receiving(&stream, epoch)?;
                self.ingest(at, &stream, messages, &through)
            }
            Command::CreateMirror { name, config, source } => self.create_mirror(at, name, config, source),
            Command::MirrorIngest { stream, messages, through, recalls, recalls_through } => {
                self.mirror_ingest(at, &stream, messages, &through, &recalls, recalls_through)
            }
            Command::RegisterMirror { stream, peer } => self.register_mirror(&stream, peer),
            Command::MirrorProgress { stream, peer, received, recalls_applied } => {
                self.mirror_progress(at, &stream, &peer, &received, recalls_applied)
            }
        }
    }
}

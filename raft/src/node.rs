//! A node of a cell: its Raft instance over its own storage, the replica it applies to, and the repair gate that
//! keeps a node which lost log entries from voting or campaigning until it holds them again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot, watch};

use bytes::Bytes;
use cellog_core::{Command, Millis, Record, StateDigest};
use openraft::Config;
use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};

use crate::apply_control::{ApplyControl, Applying, Halted};
use crate::bodies::{BodyError, StoredBodies};
use crate::body_repair::{self, BodiesAnswer, BodiesRequest, PeerBodies, Repairs};
use crate::clock::{CellClock, Clock};
use crate::identity::{CellId, CellIdentity};
use crate::log_store::{LogSizes, read_meta};
use crate::proposals::{PROPOSAL_QUEUE, Proposal, pack_proposals};
use crate::recovery::{Recovery, clear_repair_target, open_stores};
use crate::state_machine::{Interrupted, Replica, read_replica};
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};
use crate::transition;
use crate::types::{NodeAddrs, NodeId, ProposeError, Raft, TypeConfig};

/// A leader appends a `Tick` after this long without any entry (in cell milliseconds). It keeps cell time close to the
/// leader's clock, and it gives a node repairing a damaged log the entry past its old end that it waits for before it
/// may vote again, even when no client writes.
pub const IDLE_TICK_MS: u64 = 2_000;
/// How often a node looks for a new snapshot, to keep the log behind it within its byte budget.
const KEEP_LOG_POLL: Duration = Duration::from_millis(200);
/// Longest a node waits before looking at the cell's next deadline again.
const TICK_POLL: Duration = Duration::from_millis(100);

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its storage could not be opened or verified.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// openraft refused to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The store belongs to another cell of the same name.
    #[error("the store belongs to cell id {stored}; this node was started as a node of cell id {given}")]
    WrongCellId {
        /// The id the store holds.
        stored: CellId,
        /// The id the node was given.
        given: CellId,
    },
}

/// A running node.
pub struct CellNode<S> {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) replica: Arc<Mutex<Replica>>,
    /// The serials of the certificates the applied state revokes.
    credentials: crate::state_machine::Credentials,
    pub(crate) recovery: Recovery,
    pub(crate) bodies: Arc<StoredBodies<S>>,
    storage: S,
    repairing: Arc<AtomicBool>,
    /// One past the highest commit index a leader told this node while it repaired (0: none yet).
    learned_commit: Arc<AtomicU64>,
    pub(crate) clock: Arc<CellClock>,
    stopped: Arc<AtomicBool>,
    pub(crate) proposals: mpsc::Sender<Proposal>,
    /// Most bytes of log kept behind the snapshot ([`KEEP_LOG_BYTES`] unless set).
    keep_log_bytes: Arc<AtomicU64>,
    /// Bytes of log after the snapshot that make the next one ([`SNAPSHOT_EVERY_BYTES`] unless set).
    snapshot_every_bytes: Arc<AtomicU64>,
    /// The stored snapshot's size in bytes (0: none).
    snapshot_bytes: Arc<AtomicU64>,
    /// The cell's name and id, shared with the node's network.
    identity: CellIdentity,
    /// Notified after every batch of entries applied and every snapshot installed.
    applied: Arc<Notify>,
    /// Set once the node's watchdog (the [`tick`] task), or applying as it panics, saw that it cannot go on (see
    /// [`CellNode::fatal`]).
    fatal_seen: Arc<watch::Sender<bool>>,
    /// Where applying halted, as the operator asked, once it did.
    halted: Halted,
    /// The entry being applied: what a panic interrupted.
    applying: Applying,
    /// How the founder asks the other founders whether they hold anything ([`crate::founding`]).
    pub(crate) ask_founding: Option<Arc<dyn crate::founding::AskFounding>>,
    /// The free-disk watermark: a write that grows the store is refused while its device has less free (0: none).
    min_free_bytes: AtomicU64,
    /// The free bytes last read from the store, and when (read again after [`FREE_BYTES_EVERY`]).
    free_seen: Mutex<Option<(tokio::time::Instant, Option<u64>)>>,
    /// The peers whose disks said they are below their watermarks (see [`crate::room::PeersLow`]).
    peers_low: crate::room::PeersLow,
}

/// How long a reading of the store's free bytes serves the watermark's checks: proposals come faster than a
/// `statvfs` is worth.
pub const FREE_BYTES_EVERY: Duration = Duration::from_millis(250);

/// Most bytes of log entries a node keeps behind its snapshot, whatever the count openraft's config allows: entries are
/// up to about 13 MiB each, so a count alone could keep gigabytes. A follower further behind gets the snapshot.
pub const KEEP_LOG_BYTES: u64 = 256 * 1024 * 1024;

/// Bytes of log entries after its snapshot that make a node take the next one, whatever openraft's count of entries
/// says: a restart replays every command after the snapshot, and an entry packs up to [`MAX_BATCH`] of them, so a
/// count alone let a restart under load replay millions of publishes (over a minute, measured) before the node could
/// serve. 64 MiB replays in about a second.
pub const SNAPSHOT_EVERY_BYTES: u64 = 64 * 1024 * 1024;

/// How many times its last snapshot's size of log a node writes before the next snapshot, when that is more than
/// [`SNAPSHOT_EVERY_BYTES`]. A snapshot encodes the whole state, which grows with the messages the cell retains, and
/// nothing is applied while it is encoded: at a fixed budget, snapshots took a quarter of an R1 node's CPU over a
/// million pipelined 256-byte publishes, more than writing the log did. Twice the snapshot bounds that work to half
/// the bytes logged, and a restart replays at most twice the snapshot it loads.
pub const SNAPSHOT_GROWTH: u64 = 2;

/// Bytes of log after the snapshot that make the next one: `every`, or [`SNAPSHOT_GROWTH`] times the snapshot's
/// `snapshot_bytes` if that is more.
fn snapshot_budget(every: u64, snapshot_bytes: u64) -> u64 {
    every.max(snapshot_bytes.saturating_mul(SNAPSHOT_GROWTH))
}

/// Polls between asking for a snapshot and asking again if none came (a build that failed, or one openraft dropped).
const SNAPSHOT_ASK_AGAIN_POLLS: u32 = 50;

/// What a node knows of itself beyond its storage when it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Past {
    /// Nothing: a new node, or one whose storage says it all.
    #[default]
    Unknown,
    /// It was a member of the cell (its identity says so). If its storage is empty, it lost its disk: it may have
    /// acknowledged entries it no longer has, so it neither votes nor campaigns until it holds the log up to a commit
    /// index it learned from a leader.
    Member,
    /// It is one of the cell's founders, and nothing says whether it was a member: if its storage is empty it may be
    /// new, or have lost its disk together with what said it was a member. It repairs as a [`Past::Member`] does,
    /// unless the cell's founder finds every founder holding nothing and tells it to vote (see [`crate::founding`]).
    Founding,
}

/// A repair target that is not known yet: the node learns it from a leader (see [`Past::Member`]).
const TARGET_FROM_LEADER: u64 = u64::MAX;
/// The index a repairing node's log must reach before it may vote again: the commit index a current leader told it,
/// and at least its own `target` (one past what it held) when it knows one. `None` until a leader has told it one: a
/// target of its own alone is not enough, since what it held is what damage (a misdirected write, a lost suffix) may
/// have hidden from it.
fn repair_goal(target: u64, learned: Option<u64>) -> Option<u64> {
    match target {
        TARGET_FROM_LEADER => learned,
        known => learned.map(|learned| learned.max(known)),
    }
}

/// How often a repairing node looks at its log and what it learned.
const REPAIR_POLL: Duration = Duration::from_millis(50);

impl<S: Storage + Clone> CellNode<S> {
    /// Opens the node's storage (verifying and repairing it) and starts Raft on it.
    pub async fn start<N>(
        id: NodeId,
        config: Arc<Config>,
        storage: S,
        network: N,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError>
    where
        N: RaftNetworkFactory<TypeConfig> + PeerBodies,
    {
        let identity = CellIdentity::new(config.cluster_name.as_str());
        Self::start_with(id, config, storage, network, clock, Past::Unknown, identity, ApplyControl::default()).await
    }

    /// [`CellNode::start`], knowing what the node was (a member whose storage is empty lost its disk, and repairs, no
    /// vote and no campaign, until its log reaches a commit index a leader tells it) and sharing `identity` with the
    /// node's network. The cell id the store holds is `identity`'s from the start. Entries are applied as `control`
    /// says (see [`crate::apply_control`]).
    #[allow(clippy::too_many_arguments, reason = "each is a separate part the host provides")]
    pub async fn start_with<N>(
        id: NodeId,
        config: Arc<Config>,
        storage: S,
        network: N,
        clock: Arc<dyn Clock>,
        past: Past,
        identity: CellIdentity,
        control: ApplyControl,
    ) -> Result<Self, StartError>
    where
        N: RaftNetworkFactory<TypeConfig> + PeerBodies,
    {
        // The format first, so that the mark below does not make a new store look like an old, unmarked one.
        let format = crate::format::check_format(&storage)?;
        if past != Past::Unknown && crate::format::holds_nothing_but_its_mark(&storage)? {
            if past == Past::Member {
                tracing::warn!(target: transition::TARGET, "lost disk: repairing from a leader before voting");
            } else {
                tracing::info!(
                    "an empty store: voting once the cell's founder finds every founder empty, or once repaired"
                );
            }
            let mut batch = Batch::new();
            let target = postcard::to_stdvec(&TARGET_FROM_LEADER).expect("encoding into memory does not fail");
            batch.put(Space::Meta, MetaKey::RepairTarget as u64, &target);
            storage.write(batch)?;
            storage.sync()?;
        }
        let (log_store, state_machine, mut recovery) = open_stores(storage.clone())?;
        if let Some(index) = control.halt_at {
            tracing::warn!(index, "applying stops at entry {index}, as asked (--halt-apply-at)");
        }
        for (index, term) in &control.skip {
            tracing::warn!(index, term, "entry {index} (term {term}) is passed over, as asked (--skip-entry)");
        }
        let state_machine = state_machine.with_control(control);
        let (halted, applying) = (state_machine.halted(), state_machine.applying());
        match (read_meta::<_, CellId>(&storage, MetaKey::CellId)?, identity.id()) {
            (Some(stored), Some(given)) if stored != given => return Err(StartError::WrongCellId { stored, given }),
            (Some(stored), _) => {
                identity.learn(stored);
            }
            // Known from elsewhere (the data directory's identity, over a lost disk): the store keeps it too.
            (None, Some(given)) => write_cell_id(&storage, given)?,
            (None, None) => {}
        }
        recovery.format_migrated_from = recovery.format_migrated_from.or(format.migrated_from);
        let replica = state_machine.replica();
        let credentials = state_machine.credentials();
        let bodies = state_machine.bodies();
        let applied = state_machine.applied();
        let fatal_seen = state_machine.fatal_seen();
        let snapshot_bytes = state_machine.snapshot_bytes();
        // A repairing node must not campaign, from its very first election timeout on.
        let config = match recovery.repair_target {
            Some(_) => Arc::new(Config { enable_elect: false, ..(*config).clone() }),
            None => config,
        };
        let log_sizes = log_store.sizes();
        let fetch = network.fetch_bodies();
        let ask_founding = network.ask_founding();
        let peers_low = network.peers_low();
        let raft = Raft::new(id, config, network, log_store, state_machine)
            .await
            .map_err(|error| StartError::Raft(error.to_string()))?;
        let (damage, queue) = mpsc::channel(body_repair::QUEUE);
        let repairs = Repairs {
            me: id,
            raft: raft.clone(),
            fetch,
            storage: storage.clone(),
            bodies: Arc::downgrade(&bodies),
            replica: replica.clone(),
        };
        bodies.repair_through(
            damage,
            Box::new(move || {
                tokio::spawn(repairs.run(queue));
            }),
        );
        let repairing = Arc::new(AtomicBool::new(false));
        let learned_commit = Arc::new(AtomicU64::new(0));
        let stopped = Arc::new(AtomicBool::new(false));
        if let Some(target) = recovery.repair_target {
            if target == TARGET_FROM_LEADER && past == Past::Founding {
                tracing::info!(
                    "repairing until a leader's commit index, or until the founder finds every founder empty"
                );
            } else if target == TARGET_FROM_LEADER {
                tracing::info!(target: transition::TARGET, "repairing until a leader's commit index");
            } else {
                tracing::info!(target: transition::TARGET, until = target, "repairing");
            }
            repairing.store(true, Ordering::Release);
            let (raft, storage, repairing) = (raft.clone(), storage.clone(), repairing.clone());
            let (learned_commit, stopped) = (learned_commit.clone(), stopped.clone());
            tokio::spawn(async move {
                loop {
                    // Told to vote by the cell's founder, it repairs no more (see `crate::founding`).
                    if stopped.load(Ordering::Acquire)
                        || !repairing.load(Ordering::Acquire)
                        || raft.metrics().borrow().running_state.is_err()
                    {
                        return;
                    }
                    let goal = repair_goal(target, learned_commit.load(Ordering::Acquire).checked_sub(1));
                    let held = raft.metrics().borrow().last_log_index;
                    if let (Some(goal), Some(held)) = (goal, held)
                        && held >= goal
                    {
                        break;
                    }
                    tokio::time::sleep(REPAIR_POLL).await;
                }
                if !stopped.load(Ordering::Acquire)
                    && repairing.load(Ordering::Acquire)
                    && clear_repair_target(&storage).is_ok()
                {
                    tracing::info!(target: transition::TARGET, "repaired");
                    repairing.store(false, Ordering::Release);
                    raft.runtime_config().elect(true);
                }
            });
        }
        let keep_log_bytes = Arc::new(AtomicU64::new(KEEP_LOG_BYTES));
        let snapshot_every_bytes = Arc::new(AtomicU64::new(SNAPSHOT_EVERY_BYTES));
        let budgets = LogBudgets {
            keep: keep_log_bytes.clone(),
            snapshot_every: snapshot_every_bytes.clone(),
            snapshot_bytes: snapshot_bytes.clone(),
        };
        tokio::spawn(keep_log_within(raft.clone(), log_sizes, budgets, stopped.clone()));
        let (proposals, queue) = mpsc::channel(PROPOSAL_QUEUE);
        let clock = Arc::new(CellClock::new(clock));
        let watchdog = Watchdog { replica: replica.clone(), seen: fatal_seen.clone(), halted: halted.clone() };
        tokio::spawn(tick(raft.clone(), watchdog, clock.clone(), stopped.clone(), proposals.clone()));
        #[cfg(madsim)]
        tokio::spawn(pack_proposals(raft.clone(), queue, replica.clone()));
        #[cfg(not(madsim))]
        tokio::spawn(pack_proposals(raft.clone(), queue));
        Ok(CellNode {
            id,
            raft,
            replica,
            credentials,
            recovery,
            bodies,
            storage,
            repairing,
            learned_commit,
            clock,
            stopped,
            proposals,
            min_free_bytes: AtomicU64::new(0),
            free_seen: Mutex::new(None),
            peers_low,
            keep_log_bytes,
            snapshot_every_bytes,
            snapshot_bytes,
            identity,
            fatal_seen,
            applied,
            halted,
            applying,
            ask_founding,
        })
    }

    /// Notified (`notify_waiters`) after every batch of entries this node applies and every snapshot it installs. To
    /// wait for the replica to change from what it was read as, make and enable a `Notified` before reading it.
    pub fn applied(&self) -> &Notify {
        &self.applied
    }

    /// The cell's name and id as this node knows them.
    pub fn identity(&self) -> &CellIdentity {
        &self.identity
    }

    /// Stores `id` as the cell's id and takes it (unless another is known).
    pub(crate) fn store_cell_id(&self, id: CellId) -> Result<(), StorageError> {
        write_cell_id(&self.storage, id)?;
        self.identity.learn(id);
        Ok(())
    }

    /// Sets the most bytes of log this node keeps behind its snapshot (from the next snapshot on).
    pub fn set_keep_log_bytes(&self, bytes: u64) {
        self.keep_log_bytes.store(bytes, Ordering::Release);
    }

    /// The size in bytes of the snapshot this node stores (0: none yet).
    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_bytes.load(Ordering::Acquire)
    }

    /// Sets how many bytes of log after the snapshot make this node take the next one (or [`SNAPSHOT_GROWTH`] times
    /// the snapshot's size, if that is more).
    pub fn set_snapshot_every_bytes(&self, bytes: u64) {
        self.snapshot_every_bytes.store(bytes, Ordering::Release);
    }

    /// This node's clock as the cell stamps entries: never earlier than the cell's last stamp.
    pub fn now(&self) -> Millis {
        let last_at = self.replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).cell.last_at();
        self.clock.now(last_at)
    }

    /// Sets the free-disk watermark: while the store's device has fewer than `bytes` free, a write that grows the
    /// store is refused ([`ProposeError::StorageFull`]) and nothing else is (0: no watermark).
    pub fn set_min_free_bytes(&self, bytes: u64) {
        self.min_free_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Refuses a write that grows the store while this node's device is below the watermark, or while too few voters
    /// have room for a quorum: the peers below theirs take no entries, so a write the rest cannot commit would wait
    /// on them.
    pub(crate) fn check_room(&self) -> Result<(), ProposeError> {
        let own = self.below_watermark();
        if let Some((free, min)) = own {
            return Err(ProposeError::StorageFull { free, min });
        }
        let peers = self.peers_low.now();
        if peers.is_empty() {
            return Ok(());
        }
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let low: Vec<NodeId> = voters.iter().copied().filter(|voter| peers.contains(voter)).collect();
        if voters.len() - low.len() < voters.len() / 2 + 1 {
            return Err(ProposeError::QuorumStorageFull { low });
        }
        Ok(())
    }

    /// This node's free bytes and watermark while its device is below it.
    #[allow(clippy::disallowed_methods, reason = "a node-local admission check, on the runtime's clock")]
    pub(crate) fn below_watermark(&self) -> Option<(u64, u64)> {
        let min = self.min_free_bytes.load(Ordering::Relaxed);
        if min == 0 {
            return None;
        }
        let now = tokio::time::Instant::now();
        let mut seen = self.free_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let free = match *seen {
            Some((at, free)) if now.duration_since(at) < FREE_BYTES_EVERY => free,
            _ => {
                let free = self.storage.free_bytes();
                *seen = Some((now, free));
                free
            }
        };
        match free {
            Some(free) if free < min => Some((free, min)),
            _ => None,
        }
    }

    /// Where this node stopped applying entries, as its operator asked (see [`crate::apply_control`]), once it did.
    pub fn halted_at(&self) -> Option<u64> {
        self.halted.at()
    }

    /// Refuses what needs the replica to keep up with the log, once applying halted.
    pub(crate) fn check_applying(&self) -> Result<(), ProposeError> {
        match self.halted.at() {
            Some(index) => Err(ProposeError::ApplyHalted { index }),
            None => Ok(()),
        }
    }

    /// Whether this node leads the cell now (as far as it knows).
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state.is_leader()
    }

    /// Whether the node is still getting back log entries it lost, and so must not vote or campaign.
    pub fn is_repairing(&self) -> bool {
        self.repairing.load(Ordering::Acquire)
    }

    /// Ends repairing before a leader has caught the node up: only when it holds nothing and no node of the cell
    /// holds anything either (see [`crate::founding`]).
    pub(crate) fn stop_repairing(&self, why: &str) -> Result<(), StorageError> {
        if self.repairing.swap(false, Ordering::AcqRel) {
            clear_repair_target(&self.storage)?;
            tracing::info!("voting: {why}");
            self.raft.runtime_config().elect(true);
        }
        Ok(())
    }

    /// The term this node knows (0 until an election).
    pub(crate) fn current_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Whether the node was asked to stop.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Takes log entries (or a heartbeat) from a leader. A repairing node learns the leader's commit index from it:
    /// the index its log must reach before it may vote again, when it lost its disk.
    pub async fn append_entries(
        &self,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        // Learned only from entries Raft took, and only when the leader's commit index is of its own term: a leader
        // that has committed in its term holds everything committed before it.
        let learnable = request.leader_commit.filter(|commit| commit.leader_id.term == request.vote.leader_id().term);
        let response = self.raft.append_entries(request).await;
        if self.is_repairing()
            && let (Some(commit), Ok(AppendEntriesResponse::Success)) = (learnable, &response)
        {
            self.learned_commit.fetch_max(commit.index.saturating_add(1), Ordering::AcqRel);
        }
        response
    }

    /// Answers a vote request as Raft decides, except while repairing: then refused, unless the node knows the log it
    /// held ([`Recovery::vote_floor`]) and the candidate's log reaches it, the rule Raft applies to a log it holds.
    pub async fn vote(&self, request: VoteRequest<NodeId>) -> Result<VoteResponse<NodeId>, RaftError<NodeId>> {
        let reaches_floor = self.recovery.vote_floor.is_some_and(|floor| request.last_log_id >= Some(floor));
        if self.is_repairing() && !reaches_floor {
            let metrics = self.raft.metrics().borrow().clone();
            return Ok(VoteResponse::new(metrics.vote, None, false));
        }
        self.raft.vote(request).await
    }

    /// Founds the cell with `members` (this node among them) unless this node's storage already belongs to a cell.
    /// Another founder getting there first is not an error: this node learns the membership from it.
    pub async fn found(&self, members: BTreeMap<NodeId, NodeAddrs>) -> Result<(), StartError> {
        if self.raft.is_initialized().await.map_err(|error| StartError::Raft(error.to_string()))? {
            return Ok(());
        }
        if self.identity.id().is_none() {
            let id = CellId(crate::runtime::random_u128());
            self.store_cell_id(id)?;
            transition::cell_id(id, "made");
        }
        let cell_id = self.identity.id().map(|id| id.to_string());
        tracing::info!(members = ?members.keys().collect::<Vec<_>>(), ?cell_id, "founding the cell");
        if let Err(error) = self.raft.initialize(members).await {
            tracing::info!(%error, "the cell was already founded");
        }
        Ok(())
    }

    /// The leader as this node knows it, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, NodeAddrs)> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&leader).cloned()?;
        Some((leader, node))
    }

    /// Waits until this node knows it leads and has applied everything committed before the call, so that a read of
    /// its replica afterwards sees every write acknowledged before it (a linearizable read).
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        // A halted node's replica stops short of what it has committed: no read from it sees every write.
        self.check_applying()?;
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                Err(ProposeError::NotLeader { leader: forward.leader_id.zip(forward.leader_node) })
            }
            Err(error) => Err(ProposeError::Raft(error.to_string())),
        }
    }

    /// A record's payload for an answer: its body read from this node's storage and verified (empty for a
    /// tombstone). Called after the apply or read that produced the record, outside the replica's lock. A body that
    /// does not verify is never served, and is repaired from a peer (see [`crate::body_repair`]); one that is missing
    /// because retention removed its message since the record was taken is reported as such.
    pub fn payload(&self, stream: &str, record: &Record) -> Result<Bytes, BodyError> {
        crate::state_machine::payload(&self.bodies, &self.replica, stream, record)
    }

    /// The payloads of `records` of one stream, each as [`CellNode::payload`] gives it, their bodies read in one
    /// batched read (a fetch's or a read's many messages cost one lookup, not one each).
    pub fn payloads(&self, stream: &str, records: &[&Record]) -> Vec<Result<Bytes, BodyError>> {
        crate::state_machine::payloads(&self.bodies, &self.replica, stream, records)
    }

    /// Answers a peer that asks for bodies its disk damaged: this node's copy of each, where it verifies against the
    /// peer's reference (see [`crate::body_repair`]).
    pub fn answer_bodies(&self, request: &BodiesRequest) -> BodiesAnswer {
        body_repair::answer(&self.bodies, request)
    }

    /// The digest of the applied state and the index it was taken at.
    pub fn digest(&self) -> Result<(Option<u64>, StateDigest), Interrupted> {
        let replica = self.replica()?;
        Ok((replica.last_applied.map(|log_id| log_id.index), replica.cell.digest()))
    }

    /// The same, with the digest of each part of the state ([`cellog_core::Cell::digest_parts`]), all at one index.
    #[allow(clippy::type_complexity, reason = "three views of one state, taken under one lock")]
    pub fn digest_parts(&self) -> Result<(Option<u64>, StateDigest, Vec<(String, StateDigest)>), Interrupted> {
        let replica = self.replica()?;
        let index = replica.last_applied.map(|log_id| log_id.index);
        Ok((index, replica.cell.digest(), replica.cell.digest_parts()))
    }

    /// Why this node cannot go on, if it cannot: a panic interrupted applying entries (its replica may hold part of
    /// one), or Raft stopped on a fatal error (a storage write or fsync that fails poisons the store, and openraft
    /// stops on the error). `None` while the node runs, and after a shutdown it was asked for.
    pub fn fatal(&self) -> Option<String> {
        if self.replica.is_poisoned() {
            return Some(match self.applying.get() {
                Some(log_id) => format!("{}: {}", Interrupted, crate::apply_control::panicked_at(&log_id)),
                None => Interrupted.to_string(),
            });
        }
        // Raft first, then whether a shutdown was asked for: a shutdown sets `stopped` before it stops Raft.
        let metrics = self.raft.metrics();
        // Raft's core drops its metrics when it ends without an error of its own to report (it panicked).
        let ended = metrics.has_changed().is_err();
        let reason = match &metrics.borrow().running_state {
            Ok(()) if ended => Some("raft stopped".to_string()),
            Ok(()) => None,
            Err(fatal) => Some(format!("raft stopped: {fatal}")),
        };
        reason.filter(|_| !self.stopped.load(Ordering::Acquire))
    }

    /// Resolves with the reason once this node cannot go on (see [`CellNode::fatal`]); never after a shutdown it was
    /// asked for. The host stops serving and exits, so that a supervisor restarts it into recovery.
    pub async fn wait_fatal(&self) -> String {
        // No poll of its own: the watchdog looks anyway, and a waiter here wakes only when it saw something. The
        // sender lives as long as `self`, so the wait ends only when it was set.
        let mut seen = self.fatal_seen.subscribe();
        let _ = seen.wait_for(|seen| *seen).await;
        match self.fatal() {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// Its id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// What it has applied, locked for reading (briefly: applying waits for it). Refused once a panic interrupted
    /// applying: what the replica holds then may be half of an entry, and is never served.
    pub fn replica(&self) -> Result<MutexGuard<'_, Replica>, Interrupted> {
        read_replica(&self.replica)
    }

    /// Whether the applied state revokes the certificate with `serial`. Never waits on applying: a door asks it on
    /// every call.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.credentials.is_revoked(serial)
    }

    /// The principal `actor` is, as the applied state would authenticate it. Never waits on applying: a door asks it
    /// before a call's message is read.
    pub fn authenticate(&self, actor: &cellog_core::Actor) -> Result<Arc<str>, cellog_core::Rejection> {
        self.credentials.authenticate(actor)
    }

    /// What opening its storage found and repaired.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Its message bodies.
    pub fn bodies(&self) -> &Arc<StoredBodies<S>> {
        &self.bodies
    }

    /// openraft's handle, for tests that drive Raft directly. Hosts use this type's own methods.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The node's storage.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Stops Raft. The storage stays as it is.
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let _ = self.raft.shutdown().await;
    }
}

/// Writes and syncs the cell's id.
fn write_cell_id<S: Storage>(storage: &S, id: CellId) -> Result<(), StorageError> {
    let mut batch = Batch::new();
    batch.put(
        Space::Meta,
        MetaKey::CellId as u64,
        &postcard::to_stdvec(&id).expect("encoding into memory does not fail"),
    );
    storage.write(batch)?;
    storage.sync()
}

/// The byte budgets of a node's log, each settable while it runs.
struct LogBudgets {
    /// Most bytes kept behind the snapshot.
    keep: Arc<AtomicU64>,
    /// Bytes after the snapshot that make the next one, at least.
    snapshot_every: Arc<AtomicU64>,
    /// The stored snapshot's size: the next one waits for [`SNAPSHOT_GROWTH`] times as much log.
    snapshot_bytes: Arc<AtomicU64>,
}

/// Keeps the log within its byte budgets. When the entries applied since the snapshot pass `snapshot_every` bytes, and
/// [`SNAPSHOT_GROWTH`] times the snapshot's size, asks openraft for a snapshot (its own policy counts entries only).
/// When a snapshot leaves more than `keep` bytes behind it, asks openraft to purge up to where what stays fits
/// (openraft waits until no follower is being sent what it purges).
async fn keep_log_within(raft: Raft, sizes: LogSizes, budgets: LogBudgets, stopped: Arc<AtomicBool>) {
    let mut looked_at = None;
    // The snapshot this node had when it last asked for one, and the polls since.
    let mut asked: Option<(Option<u64>, u32)> = None;
    while !stopped.load(Ordering::Acquire) && raft.metrics().borrow().running_state.is_ok() {
        let (snapshot, applied) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (metrics.snapshot.map(|id| id.index), metrics.last_applied.map(|id| id.index))
        };
        let waiting = match &mut asked {
            Some((when, polls)) if *when == snapshot && *polls < SNAPSHOT_ASK_AGAIN_POLLS => {
                *polls += 1;
                true
            }
            _ => false,
        };
        if !waiting && let Some(applied) = applied {
            let since = snapshot.map_or(0, |snapshot| snapshot + 1);
            let every = snapshot_budget(
                budgets.snapshot_every.load(Ordering::Acquire),
                budgets.snapshot_bytes.load(Ordering::Acquire),
            );
            if sizes.bytes_between(since, applied) > every {
                asked = Some((snapshot, 0));
                transition::snapshot_asked_for(applied, every);
                if raft.trigger().snapshot().await.is_err() {
                    return;
                }
            }
        }
        let budget = budgets.keep.load(Ordering::Acquire);
        if let Some(snapshot) = snapshot
            && looked_at != Some((snapshot, budget))
        {
            looked_at = Some((snapshot, budget));
            if let Some(up_to) = sizes.purge_for(snapshot, budget) {
                transition::kept_log_over_budget(up_to, budget);
                if raft.trigger().purge_log(up_to).await.is_err() {
                    return;
                }
            }
        }
        // Polled on the runtime's clock rather than woken by every change of Raft's metrics: snapshots are rare.
        tokio::time::sleep(KEEP_LOG_POLL).await;
    }
}

/// What the [`tick`] task watches for, every time it wakes: a panic that interrupted applying (the replica is
/// poisoned) or Raft stopped on a fatal error. It looks at both anyway, so the node needs no poll of its own for them.
struct Watchdog {
    replica: Arc<Mutex<Replica>>,
    seen: Arc<watch::Sender<bool>>,
    /// Where applying halted: a halted leader proposes no ticks, which would only lengthen a log it does not apply.
    halted: Halted,
}

/// A panic in the watching task itself (it holds the replica at times) ends the watch: it raises the alarm as it goes.
impl Drop for Watchdog {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.seen.send_replace(true);
        }
    }
}

impl Watchdog {
    /// Whether the node cannot go on; the first time, wakes [`CellNode::wait_fatal`].
    fn looks(&self, raft: &Raft) -> bool {
        let metrics = raft.metrics();
        let fatal =
            self.replica.is_poisoned() || metrics.has_changed().is_err() || metrics.borrow().running_state.is_err();
        if fatal {
            self.seen.send_replace(true);
        }
        fatal
    }
}

/// While this node leads, proposes a `Tick` whenever the cell's next deadline has passed on its clock, so that
/// redelivery, transaction timeouts and retention are replicated decisions, and after [`IDLE_TICK_MS`] without one.
async fn tick(
    raft: Raft,
    watchdog: Watchdog,
    clock: Arc<CellClock>,
    stopped: Arc<AtomicBool>,
    proposals: mpsc::Sender<Proposal>,
) {
    let mut observer = transition::Observer::default();
    let replica = watchdog.replica.clone();
    while !stopped.load(Ordering::Acquire) {
        observer.look(&raft);
        if watchdog.looks(&raft) {
            return;
        }
        if watchdog.halted.at().is_some() {
            tokio::time::sleep(TICK_POLL).await;
            continue;
        }
        let (deadline, last_at) = {
            let replica = replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            (replica.cell.next_deadline(), replica.cell.last_at())
        };
        let now = clock.now(last_at);
        let idle_until = Millis(last_at.0.saturating_add(IDLE_TICK_MS));
        let deadline = Some(deadline.map_or(idle_until, |deadline| deadline.min(idle_until)));
        let due = deadline.is_some_and(|deadline| deadline <= now);
        if !due || !raft.metrics().borrow().state.is_leader() {
            let wait = deadline.map_or(TICK_POLL, |d| Duration::from_millis(d.since(now)).min(TICK_POLL));
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            continue;
        }
        // Through the proposal queue, like every command, so that entries' times never go backwards.
        let (reply, answer) = oneshot::channel();
        let proposal = Proposal::one(now.max(last_at), Command::Tick, Command::Tick.encoded_size(), reply);
        if proposals.send(proposal).await.is_err() {
            // The packer is gone: a last look, so that a node that cannot go on says so.
            watchdog.looks(&raft);
            return;
        }
        if !matches!(answer.await, Ok(Ok(_))) {
            tokio::time::sleep(TICK_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_budget_grows_with_the_snapshot() {
        assert_eq!(snapshot_budget(64, 0), 64, "no snapshot yet");
        assert_eq!(snapshot_budget(64, 32), 64);
        assert_eq!(snapshot_budget(64, 33), 66, "twice the snapshot once that is more");
        assert_eq!(snapshot_budget(64, u64::MAX), u64::MAX);
    }

    #[test]
    fn repair_ends_at_a_leaders_commit_index_and_never_before_the_nodes_own_target() {
        let cases = [
            // (target, learned commit index, goal)
            (50, None, None),
            (50, Some(80), Some(80)),
            (50, Some(30), Some(50)),
            (TARGET_FROM_LEADER, None, None),
            (TARGET_FROM_LEADER, Some(80), Some(80)),
        ];
        for (target, learned, goal) in cases {
            assert_eq!(repair_goal(target, learned), goal, "target {target}, learned {learned:?}");
        }
    }
}

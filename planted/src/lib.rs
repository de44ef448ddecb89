//! Planted bugs, to measure whether the simulator finds what it should: each is a small, named wrong turn in the
//! production code (in `core`, `raft` or `net`), compiled only into simulation builds (`--cfg madsim`) and off unless a
//! sweep switches it on (`ci/chaos --mutant NAME`). Production builds depend on neither this crate nor any of the
//! wrong turns: the crates that hold one name this crate only under `[target.'cfg(madsim)'.dependencies]`.
//!
//! A crate of its own so that the state machine does not name raft-level bugs (ack before fsync, purge past durable
//! state), and the chaos runner switches bugs without reaching into `core`.

use std::sync::atomic::{AtomicU32, Ordering};

/// A planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "kebab-case")]
pub enum Mutant {
    /// An append is acknowledged without being synced (ack before fsync).
    AckBeforeFsync,
    /// A producer one epoch behind is not fenced (epoch check off by one).
    EpochOffByOne,
    /// A committed transaction's messages are appended twice (commit marker applied twice).
    CommitAppliedTwice,
    /// An acknowledged delivery stays pending, so it comes back after its ack wait (redelivery after ack).
    RedeliveryAfterAck,
    /// A stored record's checksum is not compared on read (crc not checked on read).
    CrcNotChecked,
    /// A snapshot leaves out the dedup index (dedup index missing from snapshots).
    DedupNotInSnapshot,
    /// A log purge deletes every committed entry, not only those a durable snapshot covers (purge past durable
    /// state).
    PurgePastDurable,
    /// Retention removes messages a registered peer has not received (retention ignores peer watermark).
    RetentionIgnoresPeerWatermark,
    /// A leader deposed while committing applies the writes to its own state and acknowledges them (stale leader
    /// serves a write).
    StaleLeaderWrite,
    /// A node installing a snapshot drops the consumers in it (snapshot install skips consumers).
    SnapshotSkipsConsumers,
    /// A delayed message is handed out before its time (delayed message visible early).
    DelayedVisibleEarly,
    /// The leader stamps its raw wall clock on entries and replicas take the stamp as it is (leader time not
    /// monotonic).
    LeaderTimeNotMonotonic,
    /// A repeated message id is not looked up in the dedup index: the repeat is appended again (dedup ignored).
    DedupIgnored,
    /// A consumer's cursor steps over the message after one whose sequence ends in 6: it is never handed out (fetch
    /// skips a message).
    FetchSkipsMessage,
    /// An explicit abort commits the open transaction and answers that it aborted (abort shows staged messages).
    AbortShowsStaged,
    /// A peer's progress report is recorded one past what it received, so retention removes a message it has not
    /// received (peer progress overstated).
    PeerProgressOverstated,
    /// A publish refused because the stream is full (retention may not make room) is appended anyway, and answered
    /// as refused (refused publish stored).
    RefusedPublishStored,
    /// A commit appends its staged messages in reverse order, each still answered at its staging position (commit
    /// reverses order).
    CommitReversesOrder,
    /// A nack forgets the delivery as an ack does: the message is never handed out again (nack forgets message).
    NackForgets,
    /// An expired ack deadline does not make the delivery ready again: a message a consumer ignored never comes
    /// back (ack wait never expires).
    AckWaitNeverExpires,
    /// A publish is not checked against the principal's publish grants: a principal may publish anywhere (grant check
    /// skipped).
    GrantCheckSkipped,
    /// A principal's message carrying a header named like the node's (`Cellog-*` in another case) is taken: a forged
    /// sender is stored beside the stamped one (node header accepted).
    NodeHeaderAccepted,
    /// A group member's ack or commit is not checked against what it owns: an earlier incarnation's ack, or one for a
    /// partition that moved, lands (stale generation acked).
    StaleGenerationAcked,
    /// A partition a group member gives up keeps its unacknowledged deliveries pending with their old holder: the
    /// new owner is handed newer messages first, and the old ones come back only after their ack wait (handover
    /// skips unacknowledged).
    HandoverSkipsUnacked,
    /// A cell fenced at a stream's new ownership epoch goes on taking writes to it, at the epoch it no longer holds:
    /// two cells accept writes in one epoch, and what the old owner takes after its fence is never carried over (old
    /// owner accepts writes).
    OldOwnerAcceptsWrites,
    /// A mirror catching up by snapshot copies the chunks of the source's stream but the second one's messages: the
    /// range is passed over as if the source held nothing there, and the mirror has a gap its source has not
    /// (mirror snapshot skips a range).
    MirrorSnapshotSkipsRange,
    /// A snapshot lets the log behind it go without copying out the bodies the node kept in it: a message whose body
    /// only the log held has none once the log is purged (in-log body not copied).
    InLogNotCopied,
    /// The producer's first message, when its publish is applied at a cell time of 7 modulo 20 milliseconds (about
    /// 1 run in 20), is acknowledged but not kept: the canary, which shows the sweep reports failures at about the
    /// rate it should (a rate of 1 in 20 shows within 100 seeds; 1 in 100 would often show none).
    Canary,
}

/// A poisoned command: not a bug the sweep must find but a fault a scenario plants, a publish whose apply panics on
/// every replica, to show the operator's way past it (`cellog node --halt-apply-at`, `--skip-entry`).
pub mod poison {
    use std::sync::Mutex;

    static SUBJECT: Mutex<Option<String>> = Mutex::new(None);

    /// Makes applying a publish to `subject` panic, or (`None`) no publish.
    pub fn set(subject: Option<&str>) {
        *SUBJECT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = subject.map(str::to_string);
    }

    /// Whether applying a publish to `subject` panics.
    pub fn hits(subject: &str) -> bool {
        SUBJECT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_deref() == Some(subject)
    }
}

/// The switched-on mutant, as its index plus one (0: none).
static ACTIVE: AtomicU32 = AtomicU32::new(0);

/// Switches `mutant` on (and every other off), or all off.
pub fn set(mutant: Option<Mutant>) {
    let index = mutant.map_or(0, |m| m as u32 + 1);
    ACTIVE.store(index, Ordering::SeqCst);
}

/// Whether `mutant` is on.
pub fn active(mutant: Mutant) -> bool {
    ACTIVE.load(Ordering::Relaxed) == mutant as u32 + 1
}

/// The mutant switched on, if any.
pub fn current() -> Option<Mutant> {
    use strum::IntoEnumIterator;
    Mutant::iter().find(|mutant| active(*mutant))
}

//! The history of a run: every client operation as an invocation and a completion, in the time of whoever ran it
//! (simulated time in simulation, the clock of the test host for real processes).
//!
//! A completion is `ok` with what the cell answered, `fail` when the cell refused the operation (it did not happen),
//! or `unknown` when it may or may not have happened (a timeout, a broken connection, leadership moving mid-commit).
//! Checkers must treat an unknown operation as possibly applied, never as failed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Publish one message with an id (inside a transaction when `txn` names the producer and epoch).
    Publish {
        /// Its id.
        msg_id: String,
        /// Its subject.
        subject: String,
        /// The transactional producer and epoch, if any.
        txn: Option<(u64, u32)>,
        /// How long after it is stored the message becomes deliverable, if it is delayed.
        delay_ms: Option<u64>,
        /// Its body's fingerprint.
        payload: Fingerprint,
    },
    /// Fetch up to `max` messages for a consumer.
    Fetch {
        /// The consumer.
        consumer: String,
        /// How many at most.
        max: u32,
    },
    /// Acknowledge (`ack`, `nack` or `term`) one delivery.
    Ack {
        /// The consumer.
        consumer: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// Which acknowledgement.
        kind: &'static str,
    },
    /// Read committed messages from a partition.
    Read {
        /// The stream.
        stream: String,
        /// The partition.
        partition: u32,
        /// From this sequence.
        from: u64,
    },
    /// Tell the cell that a peer has received a partition up to a sequence.
    PeerProgress {
        /// The stream.
        stream: String,
        /// The peer.
        peer: String,
        /// The partition.
        partition: u32,
        /// The last sequence received.
        received_seq: u64,
    },
    /// Register (or re-register, fencing the older instance) a transactional producer.
    InitProducer {
        /// Its transactional id.
        transactional_id: String,
    },
    /// A transaction step: begin, prepare, commit or abort.
    Txn {
        /// Which step.
        step: &'static str,
        /// The producer.
        producer_id: u64,
        /// Its epoch.
        epoch: u32,
    },
    /// Join a consumer group as a member (a new incarnation when it already was one).
    JoinGroup {
        /// The group.
        group: String,
        /// The member.
        member: String,
    },
    /// Fetch as a member of a consumer group, knowing a generation.
    MemberFetch {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation it names.
        generation: u64,
    },
    /// Acknowledge one delivery as a member of a consumer group, naming a generation.
    MemberAck {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation it names.
        generation: u64,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
}

/// One message as a client saw it: where, which id, how many deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
    /// Its message id.
    pub msg_id: Option<String>,
    /// Deliveries to this consumer so far (0 for a read).
    pub delivery_count: u32,
    /// Its body's fingerprint, when the answer carried the body.
    pub payload: Option<Fingerprint>,
}

/// A body's fingerprint: its CRC-32C. A history keeps fingerprints rather than bodies so that it stays small whatever
/// the payloads; a fingerprint tells one body from another that a flipped bit or a misplaced write made of it, which
/// is all the checkers ask of it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub u32);

impl Fingerprint {
    /// The fingerprint of `body`.
    pub fn of(body: &[u8]) -> Fingerprint {
        Fingerprint(crc32c::crc32c(body))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// What the cell answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A message landed (or had landed, for a duplicate) here.
    Published {
        /// The stream.
        stream: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// A repeat of an earlier message id.
        duplicate: bool,
    },
    /// Staged in a transaction.
    Staged,
    /// Messages fetched or read.
    Messages(Vec<Seen>),
    /// A producer's id and epoch.
    Producer {
        /// Its id.
        producer_id: u64,
        /// Its epoch.
        epoch: u32,
    },
    /// Done, nothing to report.
    Done,
    /// A group member's assignment: the group's generation and the partitions it may fetch from.
    Assignment {
        /// The group's generation.
        generation: u64,
        /// Its partitions.
        partitions: Vec<u32>,
    },
    /// Messages handed to a group member, and the group's generation when they were.
    MemberMessages {
        /// The group's generation.
        generation: u64,
        /// The messages.
        seen: Vec<Seen>,
    },
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// It happened; the cell's answer.
    Ok(Value),
    /// The cell refused it: it did not happen (the error's reason).
    Fail(String),
    /// It may or may not have happened (the error).
    Unknown(String),
}

/// An operation's id in the history.
pub type OpId = u64;

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Simulated milliseconds since the history began.
    pub at_ms: u64,
    /// The client process.
    pub process: String,
    /// The operation.
    pub op_id: OpId,
    /// Invocation or completion.
    pub kind: EventKind,
}

/// Invocation or completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The client asked.
    Invoke(Op),
    /// The client got its answer (or gave up).
    Complete(Completion),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = Duration::from_millis(self.at_ms).as_secs_f64();
        match &self.kind {
            EventKind::Invoke(op) => write!(f, "{seconds:>9.3} {:<10} #{} invoke {op:?}", self.process, self.op_id),
            EventKind::Complete(done) => {
                write!(f, "{seconds:>9.3} {:<10} #{} {done:?}", self.process, self.op_id)
            }
        }
    }
}

/// One operation: who asked what, when, and how it ended (if it did).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client process.
    pub process: String,
    /// What it asked.
    pub op: Op,
    /// When it asked, in milliseconds since the history began.
    pub invoked_ms: u64,
    /// When and how it ended, if it did.
    pub completed: Option<(u64, Completion)>,
}

impl Operation {
    /// How it ended, if it did.
    pub fn done(&self) -> Option<&Completion> {
        self.completed.as_ref().map(|(_, done)| done)
    }

    /// What the cell answered, if it succeeded.
    pub fn ok(&self) -> Option<&Value> {
        match self.done() {
            Some(Completion::Ok(value)) => Some(value),
            _ => None,
        }
    }

    /// Whether the cell refused it: it did not happen.
    pub fn refused(&self) -> bool {
        matches!(self.done(), Some(Completion::Fail(_)))
    }
}

/// The operations of `events`, in the order they were invoked, each with its completion.
pub fn operations(events: &[Event]) -> Vec<Operation> {
    let mut completions: BTreeMap<OpId, (u64, Completion)> = BTreeMap::new();
    for event in events {
        if let EventKind::Complete(done) = &event.kind {
            completions.insert(event.op_id, (event.at_ms, done.clone()));
        }
    }
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Invoke(op) => Some(Operation {
                process: event.process.clone(),
                op: op.clone(),
                invoked_ms: event.at_ms,
                completed: completions.get(&event.op_id).cloned(),
            }),
            EventKind::Complete(_) => None,
        })
        .collect()
}

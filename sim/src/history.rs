//! The history of a run: every client operation as an invocation and a completion, in simulated time.
//!
//! A completion is `ok` with what the cell answered, `fail` when the cell refused the operation (it did not happen),
//! or `unknown` when it may or may not have happened (a timeout, a broken connection, leadership moving mid-commit).
//! Checkers must treat an unknown operation as possibly applied, never as failed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cellog_client::ClientError;

use crate::trace::simulated_elapsed;

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

impl Completion {
    /// The completion of a call that returned `result`.
    pub fn of(result: Result<Value, &ClientError>) -> Completion {
        match result {
            Ok(value) => Completion::Ok(value),
            Err(error) if error.outcome_unknown() => Completion::Unknown(error.to_string()),
            Err(error) => Completion::Fail(error.reason().unwrap_or("CLIENT").to_string()),
        }
    }
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

#[derive(Debug)]
struct Log {
    events: Vec<Event>,
    next_op: OpId,
}

/// The shared history of a run; clones record into the same one.
#[derive(Clone, Debug)]
pub struct History {
    log: Arc<Mutex<Log>>,
    start: Duration,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history, timed from now.
    pub fn new() -> History {
        History { log: Arc::new(Mutex::new(Log { events: Vec::new(), next_op: 0 })), start: simulated_elapsed() }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(simulated_elapsed().saturating_sub(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that `process` asked for `op`.
    pub fn invoke(&self, process: &str, op: Op) -> OpId {
        let at_ms = self.now_ms();
        let mut log = self.lock();
        let op_id = log.next_op;
        log.next_op += 1;
        log.events.push(Event { at_ms, process: process.to_string(), op_id, kind: EventKind::Invoke(op) });
        op_id
    }

    /// Records how operation `op_id` of `process` ended.
    pub fn complete(&self, process: &str, op_id: OpId, completion: Completion) {
        let at_ms = self.now_ms();
        let event = Event { at_ms, process: process.to_string(), op_id, kind: EventKind::Complete(completion) };
        self.lock().events.push(event);
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Each operation with its completion (`None` while it has none).
    pub fn operations(&self) -> Vec<(String, Op, Option<Completion>)> {
        let log = self.lock();
        let mut completions: BTreeMap<OpId, Completion> = BTreeMap::new();
        for event in &log.events {
            if let EventKind::Complete(done) = &event.kind {
                completions.insert(event.op_id, done.clone());
            }
        }
        log.events
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::Invoke(op) => {
                    Some((event.process.clone(), op.clone(), completions.get(&event.op_id).cloned()))
                }
                EventKind::Complete(_) => None,
            })
            .collect()
    }

    /// Every message id whose publish (outside a transaction) was acknowledged, with where it landed.
    ///
    /// # Panics
    /// When one id was acknowledged at two places: a duplicate the cell let through.
    pub fn acknowledged(&self) -> BTreeMap<String, (u32, u64)> {
        self.acknowledged_where(|_| true)
    }

    /// The same, for the messages of one stream.
    pub fn acknowledged_in(&self, stream: &str) -> BTreeMap<String, (u32, u64)> {
        self.acknowledged_where(|name| name == stream)
    }

    fn acknowledged_where(&self, stream_matches: impl Fn(&str) -> bool) -> BTreeMap<String, (u32, u64)> {
        let mut acked = BTreeMap::new();
        for (_, op, done) in self.operations() {
            if let (
                Op::Publish { msg_id, txn: None, .. },
                Some(Completion::Ok(Value::Published { stream, partition, seq, .. })),
            ) = (op, done)
                && stream_matches(&stream)
                && let Some(first) = acked.insert(msg_id.clone(), (partition, seq))
            {
                assert_eq!(first, (partition, seq), "{msg_id} was acknowledged at two places");
            }
        }
        acked
    }

    /// The message ids consumer `consumer` was handed by successful fetches.
    pub fn delivered(&self, consumer: &str) -> BTreeSet<String> {
        let mut delivered = BTreeSet::new();
        for (_, op, done) in self.operations() {
            if let (Op::Fetch { consumer: name, .. }, Some(Completion::Ok(Value::Messages(seen)))) = (op, done)
                && name == consumer
            {
                delivered.extend(seen.into_iter().filter_map(|message| message.msg_id));
            }
        }
        delivered
    }

    /// The first message consumer `consumer` was handed again after an ack of it had succeeded, if any, as
    /// `(partition, seq)`: a redelivery after a committed ack.
    pub fn redelivered_after_ack(&self, consumer: &str) -> Option<(u32, u64)> {
        let mut acked = BTreeSet::new();
        for (_, op, done) in self.operations() {
            match (op, done) {
                (Op::Fetch { consumer: name, .. }, Some(Completion::Ok(Value::Messages(seen)))) if name == consumer => {
                    if let Some(again) = seen.iter().find(|m| acked.contains(&(m.partition, m.seq))) {
                        return Some((again.partition, again.seq));
                    }
                }
                (Op::Ack { consumer: name, partition, seq, kind: "ack" }, Some(Completion::Ok(_)))
                    if name == consumer =>
                {
                    acked.insert((partition, seq));
                }
                _ => {}
            }
        }
        None
    }

    /// The history as text, one event per line.
    pub fn render(&self) -> String {
        self.lock().events.iter().map(|event| format!("{event}\n")).collect()
    }
}

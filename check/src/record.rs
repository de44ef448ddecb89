//! Recording a history as a run goes: clients invoke and complete operations into one shared [`History`], timed by
//! whatever clock the run keeps.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::history::{Completion, Event, EventKind, Op, OpId, Operation, Value, operations};

/// The completion of a client call that returned `result`: refused when the error says the cell refused it,
/// unknown when it may or may not have happened.
#[cfg(feature = "client")]
pub fn completion(result: Result<Value, &cellog_client::ClientError>) -> Completion {
    match result {
        Ok(value) => Completion::Ok(value),
        Err(error) if error.outcome_unknown() => Completion::Unknown(error.to_string()),
        Err(error) => Completion::Fail(error.reason().unwrap_or("CLIENT").to_string()),
    }
}

/// Messages as a node holds them, by id (a message without one under `<no id P/S>`), each with where it is, its
/// body and its stamp.
#[cfg(feature = "client")]
pub fn by_id(messages: impl IntoIterator<Item = cellog_client::proto::Message>) -> crate::evidence::Stored {
    let mut stored = crate::evidence::Stored::new();
    for message in messages {
        let key = message.msg_id.unwrap_or_else(|| format!("<no id {}/{}>", message.partition, message.seq));
        let held = crate::evidence::Held {
            partition: message.partition,
            seq: message.seq,
            body: message.payload,
            stored_at_ms: message.stored_at_ms,
        };
        stored.entry(key).or_default().push(held);
    }
    stored
}

#[derive(Debug)]
struct Log {
    events: Vec<Event>,
    next_op: OpId,
}

/// The clock a history is timed by: the time since some fixed start (simulated time in simulation, a monotonic
/// clock for real processes).
pub type Clock = Arc<dyn Fn() -> Duration + Send + Sync>;

/// The shared history of a run; clones record into the same one.
#[derive(Clone)]
pub struct History {
    log: Arc<Mutex<Log>>,
    clock: Clock,
    start: Duration,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("log", &self.log).field("start", &self.start).finish_non_exhaustive()
    }
}

impl History {
    /// An empty history, timed by `clock` from now.
    pub fn new(clock: Clock) -> History {
        let start = clock();
        History { log: Arc::new(Mutex::new(Log { events: Vec::new(), next_op: 0 })), clock, start }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from((self.clock)().saturating_sub(self.start).as_millis()).unwrap_or(u64::MAX)
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

    /// Each operation with its completion (`None` while it has none), in the order they were invoked.
    pub fn operations(&self) -> Vec<Operation> {
        operations(&self.lock().events)
    }

    /// Every message id whose publish (outside a transaction) was acknowledged, with where it first landed. (An id
    /// acknowledged at two places is a duplicate; the duplicate checker names it.)
    pub fn acknowledged(&self) -> BTreeMap<String, (u32, u64)> {
        self.acknowledged_where(|_| true)
    }

    /// The same, for the messages of one stream.
    pub fn acknowledged_in(&self, stream: &str) -> BTreeMap<String, (u32, u64)> {
        self.acknowledged_where(|name| name == stream)
    }

    fn acknowledged_where(&self, stream_matches: impl Fn(&str) -> bool) -> BTreeMap<String, (u32, u64)> {
        let mut acked = BTreeMap::new();
        for operation in self.operations() {
            if let (Op::Publish { msg_id, txn: None, .. }, Some(Value::Published { stream, partition, seq, .. })) =
                (&operation.op, operation.ok())
                && stream_matches(stream)
            {
                acked.entry(msg_id.clone()).or_insert((*partition, *seq));
            }
        }
        acked
    }

    /// The history as text, one event per line.
    pub fn render(&self) -> String {
        self.lock().events.iter().map(|event| format!("{event}\n")).collect()
    }
}

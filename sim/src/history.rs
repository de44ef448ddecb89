//! The history of a run, recorded in simulated time as its clients call the cell; the types of a history and its
//! checkers are `cellog-check`'s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cellog_client::ClientError;

use crate::trace::simulated_elapsed;

pub use cellog_check::history::{Completion, Event, EventKind, Op, OpId, Operation, Seen, Value};

/// The completion of a call that returned `result`: refused when the error says the cell refused it, unknown when it
/// may or may not have happened.
pub fn completion(result: Result<Value, &ClientError>) -> Completion {
    match result {
        Ok(value) => Completion::Ok(value),
        Err(error) if error.outcome_unknown() => Completion::Unknown(error.to_string()),
        Err(error) => Completion::Fail(error.reason().unwrap_or("CLIENT").to_string()),
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

    /// Each operation with its completion (`None` while it has none), in the order they were invoked.
    pub fn operations(&self) -> Vec<Operation> {
        cellog_check::history::operations(&self.lock().events)
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
        for operation in self.operations() {
            if let (Op::Publish { msg_id, txn: None, .. }, Some(Value::Published { stream, partition, seq, .. })) =
                (&operation.op, operation.ok())
                && stream_matches(stream)
                && let Some(first) = acked.insert(msg_id.clone(), (*partition, *seq))
            {
                assert_eq!(first, (*partition, *seq), "{msg_id} was acknowledged at two places");
            }
        }
        acked
    }

    /// The history as text, one event per line.
    pub fn render(&self) -> String {
        self.lock().events.iter().map(|event| format!("{event}\n")).collect()
    }
}

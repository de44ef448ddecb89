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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::history::Fingerprint;

    /// A history whose clock moves 10 ms at every reading, from 1 s.
    fn history() -> History {
        let ticks = Arc::new(AtomicU64::new(100));
        History::new(Arc::new(move || Duration::from_millis(ticks.fetch_add(1, Ordering::Relaxed) * 10)))
    }

    fn publish(msg_id: &str, txn: Option<(u64, u32)>) -> Op {
        Op::Publish { msg_id: msg_id.into(), subject: "s".into(), txn, delay_ms: None, payload: Fingerprint::of(b"x") }
    }

    fn published(stream: &str, seq: u64) -> Completion {
        Completion::Ok(Value::Published { stream: stream.into(), partition: 0, seq, duplicate: false })
    }

    #[test]
    fn events_are_timed_from_the_start_by_the_clock() {
        let h = history();
        let id = h.invoke("p", publish("a", None));
        h.complete("p", id, published("orders", 1));
        let times: Vec<u64> = h.events().iter().map(|event| event.at_ms).collect();
        assert_eq!(times, [10, 20], "each reading of the clock, less the one at the start");
    }

    #[test]
    fn acknowledged_holds_each_id_published_outside_a_transaction_where_it_first_landed() {
        let h = history();
        let cases = [
            ("a", None, Some(published("orders", 1))),
            ("b", None, Some(published("audit", 1))),
            ("a", None, Some(published("orders", 2))),
            ("staged", Some((1, 0)), Some(published("orders", 3))),
            ("refused", None, Some(Completion::Fail("STORAGE_FULL".into()))),
            ("unknown", None, Some(Completion::Unknown("timeout".into()))),
            ("open", None, None),
        ];
        for (msg_id, txn, completion) in cases {
            let id = h.invoke("p", publish(msg_id, txn));
            if let Some(completion) = completion {
                h.complete("p", id, completion);
            }
        }
        let all: Vec<(String, (u32, u64))> = h.acknowledged().into_iter().collect();
        assert_eq!(all, [("a".to_string(), (0, 1)), ("b".to_string(), (0, 1))]);
        let orders: Vec<String> = h.acknowledged_in("orders").into_keys().collect();
        assert_eq!(orders, ["a"]);
        assert!(h.acknowledged_in("nowhere").is_empty());
    }

    #[cfg(feature = "client")]
    #[test]
    fn a_call_is_refused_only_when_the_cell_said_so() {
        use cellog_client::{ClientError, item_error, proto};
        // gRPC codes by number: 4 DEADLINE_EXCEEDED, 5 NOT_FOUND, 9 FAILED_PRECONDITION.
        let status = |code: i32, reason: &str| {
            item_error(proto::Error {
                code,
                detail: Some(proto::ErrorDetail { reason: reason.into(), ..Default::default() }),
            })
        };
        assert_eq!(completion(Err(&status(5, "STREAM_NOT_FOUND"))), Completion::Fail("STREAM_NOT_FOUND".into()));
        assert!(matches!(completion(Err(&status(4, ""))), Completion::Unknown(_)), "a timeout may have happened");
        let after = ClientError::Indefinite { last: Box::new(status(9, "UNKNOWN_MEMBER")) };
        assert!(matches!(completion(Err(&after)), Completion::Unknown(_)), "an earlier attempt may have landed");
        assert_eq!(completion(Ok(Value::Done)), Completion::Ok(Value::Done));
    }
}

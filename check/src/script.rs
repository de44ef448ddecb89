//! Hand-written histories: a script of client calls and of what the nodes hold, made into [`Evidence`]. The
//! checkers' own tests are written in it, and so can any test that wants to show a checker a history by hand.
//!
//! ```
//! use cellog_check::script::Script;
//!
//! let mut script = Script::default();
//! script.publish(0, "producer", "m-1").published(5, "orders", 0, 1);
//! script.hold(1, "orders", "m-1", 0, 1, 5);
//! assert!(cellog_check::check_all(&script.evidence()).is_empty());
//! ```

use bytes::Bytes;

use crate::evidence::{Evidence, Held, NodeId};
use crate::history::{Completion, Event, EventKind, Fingerprint, Op, OpId, Seen, Value, operations};

/// A publish of `msg_id` whose body is the id's bytes.
fn publish_op(msg_id: &str, subject: &str, txn: Option<(u64, u32)>, delay_ms: Option<u64>) -> Op {
    let payload = Fingerprint::of(msg_id.as_bytes());
    Op::Publish { msg_id: msg_id.to_string(), subject: subject.to_string(), txn, delay_ms, payload }
}

/// What a client saw of `(partition, seq, msg_id, delivery_count)`, each body its id's bytes.
fn seen(messages: &[(u32, u64, &str, u32)]) -> Vec<Seen> {
    messages
        .iter()
        .map(|&(partition, seq, msg_id, delivery_count)| Seen {
            partition,
            seq,
            msg_id: Some(msg_id.to_string()),
            delivery_count,
            payload: Some(Fingerprint::of(msg_id.as_bytes())),
        })
        .collect()
}

/// A history being written, with what the nodes hold and what the workload promised.
#[derive(Clone, Debug, Default)]
pub struct Script {
    events: Vec<Event>,
    next_op: OpId,
    evidence: Evidence,
}

/// A call just invoked: say how it ended, or drop it to leave it without a completion.
#[must_use = "a call says how it ended, or is dropped on purpose to stay open"]
pub struct Call<'a> {
    script: &'a mut Script,
    op_id: OpId,
    process: String,
}

impl Call<'_> {
    fn complete(self, at_ms: u64, completion: Completion) {
        let event = Event { at_ms, process: self.process, op_id: self.op_id, kind: EventKind::Complete(completion) };
        self.script.events.push(event);
    }

    /// It succeeded at `at_ms` with `value`.
    pub fn ok(self, at_ms: u64, value: Value) {
        self.complete(at_ms, Completion::Ok(value));
    }

    /// It succeeded at `at_ms`, with nothing to report.
    pub fn done(self, at_ms: u64) {
        self.ok(at_ms, Value::Done);
    }

    /// A publish landed at `stream`/`partition`/`seq`.
    pub fn published(self, at_ms: u64, stream: &str, partition: u32, seq: u64) {
        self.ok(at_ms, Value::Published { stream: stream.to_string(), partition, seq, duplicate: false });
    }

    /// A publish was staged in a transaction.
    pub fn staged(self, at_ms: u64) {
        self.ok(at_ms, Value::Staged);
    }

    /// A fetch or read handed out `(partition, seq, msg_id, delivery_count)`, each body its id's bytes.
    pub fn messages(self, at_ms: u64, messages: &[(u32, u64, &str, u32)]) {
        self.ok(at_ms, Value::Messages(seen(messages)));
    }

    /// A fetch or read handed out one message, `msg_id` at `partition`/`seq`, with `body`.
    pub fn message_with_body(self, at_ms: u64, (partition, seq, msg_id): (u32, u64, &str), body: &[u8]) {
        let seen = Seen {
            partition,
            seq,
            msg_id: Some(msg_id.to_string()),
            delivery_count: 0,
            payload: Some(Fingerprint::of(body)),
        };
        self.ok(at_ms, Value::Messages(vec![seen]));
    }

    /// A producer was registered as `producer_id` at `epoch`.
    pub fn producer(self, at_ms: u64, producer_id: u64, epoch: u32) {
        self.ok(at_ms, Value::Producer { producer_id, epoch });
    }

    /// A group member's join or heartbeat was answered with `partitions` at `generation`.
    pub fn assigned(self, at_ms: u64, generation: u64, partitions: &[u32]) {
        self.ok(at_ms, Value::Assignment { generation, partitions: partitions.to_vec() });
    }

    /// A member's fetch answered at `generation` handed out `(partition, seq, msg_id, delivery_count)`.
    pub fn member_messages(self, at_ms: u64, generation: u64, messages: &[(u32, u64, &str, u32)]) {
        self.ok(at_ms, Value::MemberMessages { generation, seen: seen(messages) });
    }

    /// The cell refused it: it did not happen.
    pub fn fail(self, at_ms: u64) {
        self.complete(at_ms, Completion::Fail("REFUSED".to_string()));
    }

    /// It may or may not have happened.
    pub fn unknown(self, at_ms: u64) {
        self.complete(at_ms, Completion::Unknown("timed out".to_string()));
    }
}

impl Script {
    /// `process` asks for `op` at `at_ms`.
    pub fn call(&mut self, at_ms: u64, process: &str, op: Op) -> Call<'_> {
        let op_id = self.next_op;
        self.next_op += 1;
        self.events.push(Event { at_ms, process: process.to_string(), op_id, kind: EventKind::Invoke(op) });
        Call { script: self, op_id, process: process.to_string() }
    }

    /// A publish of `msg_id` (its body the id's bytes), outside a transaction.
    pub fn publish(&mut self, at_ms: u64, process: &str, msg_id: &str) -> Call<'_> {
        self.call(at_ms, process, publish_op(msg_id, "s", None, None))
    }

    /// A publish of `msg_id` to `subject`, outside a transaction.
    pub fn publish_to(&mut self, at_ms: u64, process: &str, msg_id: &str, subject: &str) -> Call<'_> {
        self.call(at_ms, process, publish_op(msg_id, subject, None, None))
    }

    /// A publish of `msg_id` delayed by `delay_ms`.
    pub fn publish_delayed(&mut self, at_ms: u64, process: &str, msg_id: &str, delay_ms: u64) -> Call<'_> {
        self.call(at_ms, process, publish_op(msg_id, "s", None, Some(delay_ms)))
    }

    /// A publish of `msg_id` staged in a transaction of `producer` (id, epoch).
    pub fn stage(&mut self, at_ms: u64, process: &str, msg_id: &str, producer: (u64, u32)) -> Call<'_> {
        self.call(at_ms, process, publish_op(msg_id, "s", Some(producer), None))
    }

    /// A transaction step (`begin`, `prepare`, `commit`, `abort`) of `producer` (id, epoch).
    pub fn txn(&mut self, at_ms: u64, process: &str, step: &'static str, producer: (u64, u32)) -> Call<'_> {
        self.call(at_ms, process, Op::Txn { step, producer_id: producer.0, epoch: producer.1 })
    }

    /// A registration of transactional id `transactional_id`.
    pub fn init(&mut self, at_ms: u64, process: &str, transactional_id: &str) -> Call<'_> {
        self.call(at_ms, process, Op::InitProducer { transactional_id: transactional_id.to_string() })
    }

    /// A fetch for `consumer` (by a process of the same name).
    pub fn fetch(&mut self, at_ms: u64, consumer: &str) -> Call<'_> {
        self.call(at_ms, consumer, Op::Fetch { consumer: consumer.to_string(), max: 16 })
    }

    /// An ack (`ack`, `nack` or `term`) by `consumer` of `partition`/`seq`.
    pub fn ack(&mut self, at_ms: u64, consumer: &str, kind: &'static str, partition: u32, seq: u64) -> Call<'_> {
        self.call(at_ms, consumer, Op::Ack { consumer: consumer.to_string(), partition, seq, kind })
    }

    /// `process` joins `group` as `member`.
    pub fn join(&mut self, at_ms: u64, process: &str, group: &str, member: &str) -> Call<'_> {
        self.call(at_ms, process, Op::JoinGroup { group: group.to_string(), member: member.to_string() })
    }

    /// `process` fetches as `member` of `group`, naming `generation`.
    pub fn member_fetch(
        &mut self,
        at_ms: u64,
        process: &str,
        (group, member): (&str, &str),
        generation: u64,
    ) -> Call<'_> {
        let op = Op::MemberFetch { group: group.to_string(), member: member.to_string(), generation };
        self.call(at_ms, process, op)
    }

    /// `process` acks `partition`/`seq` as `member` of `group`, naming `generation`.
    pub fn member_ack(
        &mut self,
        at_ms: u64,
        process: &str,
        (group, member): (&str, &str),
        generation: u64,
        (partition, seq): (u32, u64),
    ) -> Call<'_> {
        let op = Op::MemberAck { group: group.to_string(), member: member.to_string(), generation, partition, seq };
        self.call(at_ms, process, op)
    }

    /// A read of `stream`/`partition` from `from`.
    pub fn read(&mut self, at_ms: u64, process: &str, stream: &str, partition: u32, from: u64) -> Call<'_> {
        self.call(at_ms, process, Op::Read { stream: stream.to_string(), partition, from })
    }

    /// A report that peer `process` received `stream`/`partition` up to `received_seq`.
    pub fn progress(&mut self, at_ms: u64, process: &str, stream: &str, partition: u32, received_seq: u64) -> Call<'_> {
        let op = Op::PeerProgress { stream: stream.to_string(), peer: process.to_string(), partition, received_seq };
        self.call(at_ms, process, op)
    }

    /// Node `node` holds `msg_id` (its body the id's bytes) at `stream`/`partition`/`seq`, stored at cell time
    /// `stored_at_ms`.
    pub fn hold(&mut self, node: NodeId, stream: &str, msg_id: &str, partition: u32, seq: u64, stored_at_ms: u64) {
        self.hold_body(node, stream, msg_id, (partition, seq, stored_at_ms), Bytes::from(msg_id.to_string()));
    }

    /// The same, with a body of its own.
    pub fn hold_body(&mut self, node: NodeId, stream: &str, msg_id: &str, at: (u32, u64, u64), body: Bytes) {
        let (partition, seq, stored_at_ms) = at;
        let copies = self.nodes(stream).entry(node).or_default().entry(msg_id.to_string()).or_default();
        copies.push(Held { partition, seq, body, stored_at_ms });
    }

    /// Node `node` is read at the end and holds nothing (yet) in `stream`.
    pub fn node(&mut self, node: NodeId, stream: &str) {
        self.nodes(stream).entry(node).or_default();
    }

    fn nodes(&mut self, stream: &str) -> &mut std::collections::BTreeMap<NodeId, crate::evidence::Stored> {
        self.evidence.held.entry(stream.to_string()).or_default()
    }

    /// Node `node` applied up to `applied_index`, where its state's parts have these digests.
    pub fn state(&mut self, node: NodeId, applied_index: u64, parts: &[(&str, &str)]) {
        let parts = parts.iter().map(|(part, digest)| (part.to_string(), digest.to_string())).collect();
        self.evidence.states.insert(node, crate::evidence::NodeState { applied_index, parts });
    }

    /// Node `node` was read during the run at `applied_index`, where its state's parts had these digests.
    pub fn sample(&mut self, node: NodeId, applied_index: u64, parts: &[(&str, &str)]) {
        let parts = parts.iter().map(|(part, digest)| (part.to_string(), digest.to_string())).collect();
        self.evidence.samples.push((node, crate::evidence::NodeState { applied_index, parts }));
    }

    /// `consumer` must be handed every acknowledged message of `stream`.
    pub fn durable(&mut self, stream: &str, consumer: &str) {
        self.evidence.duties.consumers.insert(stream.to_string(), consumer.to_string());
    }

    /// `consumer` of `stream` went on until nothing came back: it must end up acking every acknowledged message.
    pub fn drained(&mut self, stream: &str, consumer: &str) {
        self.durable(stream, consumer);
        self.evidence.duties.drained.insert(consumer.to_string());
    }

    /// `process` is a registered peer of `stream`, whose retention removes what the peer received.
    pub fn peer(&mut self, stream: &str, process: &str) {
        self.evidence.duties.peers.insert(stream.to_string(), process.to_string());
        self.evidence.duties.trimmed.insert(stream.to_string());
    }

    /// `mirror` follows `source`.
    pub fn mirror(&mut self, mirror: &str, source: &str) {
        self.evidence.duties.mirrors.insert(mirror.to_string(), source.to_string());
    }

    /// `process` runs as a principal that may publish to `filters` only.
    pub fn publisher(&mut self, process: &str, filters: &[&str]) {
        let filters = filters.iter().map(|filter| filter.to_string()).collect();
        self.evidence.duties.publishers.insert(process.to_string(), filters);
    }

    /// `msg_id` was published carrying a header that is the node's.
    pub fn forged(&mut self, msg_id: &str) {
        self.evidence.duties.forged.insert(msg_id.to_string());
    }

    /// The evidence written so far.
    pub fn evidence(&self) -> Evidence {
        Evidence { operations: operations(&self.events), ..self.evidence.clone() }
    }
}

//! A small vocabulary for driving a cell in tests: a clock the test moves by hand, and shorthands for the commands.

use bytes::Bytes;
use cellog_core::subject::partition_for_key;
use cellog_core::{
    AckKind, Cell, Command, ConsumerConfig, Delivery, MemoryBodies, Millis, Outcome, ProducerRef, PublishAck,
    PublishRequest, Record, Rejection, RemovalReason, StreamConfig, Transition,
};

/// A cell, the time the next command is stamped with, the transitions drained so far, and the bodies that body work
/// keeps, as a host keeps them.
pub struct Harness {
    pub cell: Cell,
    pub now: Millis,
    pub effects: Vec<Transition>,
    pub bodies: MemoryBodies,
    /// Whether the cell builds transitions (as a host that traces), which the tests compare.
    pub traced: bool,
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Harness {
            cell: Cell::new(),
            now: Millis(1_000),
            effects: Vec::new(),
            bodies: MemoryBodies::default(),
            traced: true,
        }
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, ms: u64) {
        self.now = self.now.plus(ms);
    }

    /// Applies a command at the current time and drains it: body work into the bodies, transitions kept.
    pub fn apply(&mut self, command: Command) -> Result<Outcome, Rejection> {
        // A cell restored in a test's place traces too.
        self.cell.trace_transitions(self.traced);
        let outcome = self.cell.apply(self.now, command);
        for work in self.cell.drain_work() {
            self.bodies.apply(&work);
        }
        self.effects.extend(self.cell.drain_transitions());
        outcome
    }

    /// A record's payload as the host reads it (empty for a tombstone); panics when it does not verify.
    pub fn payload(&self, record: &Record) -> Bytes {
        self.bodies.payload(record).unwrap_or_else(|reason| panic!("{}/{}: {reason}", record.partition, record.seq))
    }

    /// The payload of a delivery as text (panics on a tombstone).
    pub fn text(&self, delivery: &Delivery) -> String {
        assert!(!matches!(delivery.record.body, cellog_core::Body::Tombstone { .. }), "a tombstone has no text");
        String::from_utf8_lossy(&self.payload(&delivery.record)).into_owned()
    }

    /// Applies a command that must succeed.
    pub fn ok(&mut self, command: Command) -> Outcome {
        let description = format!("{command:?}");
        self.apply(command).unwrap_or_else(|rejection| panic!("{description} was rejected: {rejection}"))
    }

    /// Takes the effects drained so far.
    pub fn take_effects(&mut self) -> Vec<Transition> {
        std::mem::take(&mut self.effects)
    }

    pub fn tick(&mut self) {
        self.ok(Command::Tick);
    }

    pub fn create_stream(&mut self, name: &str, config: StreamConfig) {
        self.ok(Command::CreateStream { name: name.to_string(), config });
    }

    /// A stream claiming `<name>.>` with the default config.
    pub fn simple_stream(&mut self, name: &str) {
        self.create_stream(name, StreamConfig::with_subjects([format!("{name}.>")]));
    }

    pub fn create_consumer(&mut self, stream: &str, name: &str, config: ConsumerConfig) {
        self.ok(Command::CreateConsumer { stream: stream.to_string(), name: name.to_string(), config });
    }

    pub fn publish_request(&mut self, request: PublishRequest) -> Result<PublishAck, Rejection> {
        match self.apply(Command::Publish(request))? {
            Outcome::Published(ack) => Ok(ack),
            other => panic!("a publish answered {other:?}"),
        }
    }

    pub fn publish(&mut self, subject: &str, payload: &str) -> Result<PublishAck, Rejection> {
        self.publish_request(PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes())))
    }

    pub fn publish_id(&mut self, subject: &str, payload: &str, msg_id: &str) -> Result<PublishAck, Rejection> {
        self.publish_request(PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes())).with_id(msg_id))
    }

    pub fn fetch_as(&mut self, stream: &str, consumer: &str, member: &str, max: u32) -> Vec<Delivery> {
        match self.ok(Command::Fetch {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            member: member.to_string(),
            max,
        }) {
            Outcome::Fetched(deliveries) => deliveries,
            other => panic!("a fetch answered {other:?}"),
        }
    }

    pub fn fetch(&mut self, stream: &str, consumer: &str, max: u32) -> Vec<Delivery> {
        self.fetch_as(stream, consumer, "m1", max)
    }

    pub fn ack(
        &mut self,
        stream: &str,
        consumer: &str,
        partition: u32,
        seq: u64,
        kind: AckKind,
    ) -> Result<Outcome, Rejection> {
        self.apply(Command::Ack { stream: stream.to_string(), consumer: consumer.to_string(), partition, seq, kind })
    }

    pub fn init_producer(&mut self, transactional_id: &str) -> ProducerRef {
        match self.ok(Command::InitProducer {
            transactional_id: transactional_id.to_string(),
            transaction_timeout_ms: 60_000,
        }) {
            Outcome::ProducerInitialized(r) => r,
            other => panic!("init_producer answered {other:?}"),
        }
    }
}

/// A stream config claiming `subjects`, everything else default.
pub fn config(subjects: &[&str]) -> StreamConfig {
    StreamConfig::with_subjects(subjects.iter().copied())
}

/// A publish with a partitioning key.
pub fn keyed(subject: &str, key: &str, payload: &str) -> PublishRequest {
    PublishRequest {
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        ..PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes()))
    }
}

/// The first key of the form `k<n>` that hashes onto `partition` of `n_partitions`.
pub fn key_for(partition: u32, n_partitions: u32) -> String {
    (0..)
        .map(|n| format!("k{n}"))
        .find(|key| partition_for_key(key.as_bytes(), n_partitions) == partition)
        .expect("some key lands on every partition")
}

/// The removals among the drained effects, as (partition, seq, reason).
pub fn removals(h: &mut Harness) -> Vec<(u32, u64, RemovalReason)> {
    h.take_effects()
        .into_iter()
        .filter_map(|effect| match effect {
            Transition::Removed { partition, seq, reason, .. } => Some((partition, seq, reason)),
            _ => None,
        })
        .collect()
}

/// How many messages a stream retains.
/// A token's hash, from one byte.
pub fn token(n: u8) -> cellog_core::TokenHash {
    cellog_core::TokenHash([n; 32])
}

/// `command` run as the bearer of `token(n)`.
pub fn as_token(n: u8, command: Command) -> Command {
    Command::As { actor: cellog_core::Actor::Token(token(n)), command: Box::new(command) }
}

/// Every part of the state but the cell's counters (the applied count moves for a refusal too): what a refusal must
/// leave unchanged.
pub fn state_parts(cell: &Cell) -> Vec<(String, cellog_core::StateDigest)> {
    cell.digest_parts().into_iter().filter(|(name, _)| name != "cell").collect()
}

pub fn n_messages(h: &Harness, stream: &str) -> u64 {
    h.cell.stream_info(stream).unwrap().n_messages
}

/// What holds of a cell's stored state after every step of a model test: the host keeps exactly the bodies the state
/// refers to (every removal let go of its body), the snapshot restores to the same cell with no effects pending, and
/// what this build writes is what the frozen types of its version read and write again.
pub fn stored_state_holds(cell: &Cell, bodies: &MemoryBodies) -> Result<(), String> {
    if bodies.len() != cell.body_refs().len() {
        return Err(format!("{} bodies stored, {} referred to", bodies.len(), cell.body_refs().len()));
    }
    if !cell.ledger_agrees() {
        return Err("the ledger of what the cell holds differs from a count of its streams".to_string());
    }
    let snapshot = cell.snapshot();
    let mut restored = Cell::restore(&snapshot).map_err(|error| format!("the snapshot does not restore: {error}"))?;
    if restored != *cell {
        return Err("restore(snapshot(cell)) differs from cell".to_string());
    }
    if restored.drain_work().count() != 0 {
        return Err("a restored cell has effects pending".to_string());
    }
    let again = Cell::reencode_snapshot(&snapshot).map_err(|error| format!("the snapshot does not decode: {error}"))?;
    if again != snapshot {
        return Err("the encoding no longer matches the frozen types of its version: add a version".to_string());
    }
    Ok(())
}

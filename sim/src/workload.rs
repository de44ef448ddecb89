//! Workload clients: the real client library, recording every operation it makes in the run's [`History`].
//!
//! - [`Producer`]: publishes messages with ids, pipelined; the client retries through failovers, and message ids keep
//!   retries from landing twice.
//! - [`Consumer`]: a durable or work-queue consumer that fetches, then acks, nacks or ignores each delivery, as its
//!   random stream decides.
//! - [`TxnProducer`]: a transactional producer; two with one transactional id make the older a zombie to be fenced.
//! - [`GroupWorker`]: a consumer group's member that joins, heartbeats, fetches and acks; one that joins again
//!   leaves its earlier incarnation fenced.
//! - [`Mirror`]: a registered peer of a stream that copies it slowly and reports how far it got, holding retention
//!   back.

use std::collections::BTreeMap;

use cellog_client::proto as v1;
use cellog_client::{Cells, Client, ClientError, item_error};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[cfg(madsim)]
use crate::cluster::Cluster;
use crate::history::{Completion, Fingerprint, History, Op, OpId, Seen, Value, completion};

/// Where a workload client runs: the client library it calls the cell with, and the history it records into. A
/// simulated cluster gives one (`&Cluster` converts); so does a test of real processes.
#[derive(Clone)]
pub struct Caller {
    /// The client library.
    pub client: Client,
    /// The run's history.
    pub history: History,
}

#[cfg(madsim)]
impl From<&Cluster> for Caller {
    fn from(cluster: &Cluster) -> Caller {
        Caller { client: cluster.client(), history: cluster.history().clone() }
    }
}

/// What a client saw of `deliveries`.
fn seen(deliveries: &[v1::Delivery]) -> Vec<Seen> {
    deliveries
        .iter()
        .filter_map(|delivery| {
            let message = delivery.message.as_ref()?;
            Some(Seen {
                partition: message.partition,
                seq: message.seq,
                msg_id: message.msg_id.clone(),
                delivery_count: delivery.delivery_count,
                payload: Some(Fingerprint::of(&message.payload)),
            })
        })
        .collect()
}

fn published(ack: &v1::PublishAck) -> Value {
    Value::Published { stream: ack.stream.clone(), partition: ack.partition, seq: ack.seq, duplicate: ack.duplicate }
}

/// Publishes messages with ids.
#[derive(Clone)]
pub struct Producer {
    process: String,
    client: Client,
    history: History,
    /// Sends this percentage of messages twice, and the draws that decide which.
    duplicates: Option<(u32, ChaCha8Rng)>,
}

impl Producer {
    /// A producer named `process` in the history.
    pub fn new(on: impl Into<Caller>, process: &str) -> Producer {
        let Caller { client, history } = on.into();
        Producer { process: process.to_string(), client, history, duplicates: None }
    }

    /// Sends `percent` of its messages a second time right after the first, as a request duplicated on its way
    /// would arrive. (madsim's connections are reliable and ordered, as TCP is, so duplication is made here.)
    pub fn with_duplicates(mut self, percent: u32, rng: ChaCha8Rng) -> Producer {
        self.duplicates = Some((percent, rng));
        self
    }

    fn invoke(&self, request: &v1::PublishRequest) -> OpId {
        let txn = request.transaction.map(|producer| (producer.producer_id, producer.epoch));
        let op = Op::Publish {
            msg_id: request.msg_id.clone().unwrap_or_default(),
            subject: request.subject.clone(),
            txn,
            delay_ms: request.deliver_after_ms.filter(|&delay| delay > 0),
            payload: Fingerprint::of(&request.payload),
        };
        self.history.invoke(&self.process, op)
    }

    /// Publishes `requests` with up to `window` unanswered; returns where each acknowledged one landed, by id.
    pub async fn publish(&mut self, requests: Vec<v1::PublishRequest>, window: usize) -> BTreeMap<String, (u32, u64)> {
        let requests = match &mut self.duplicates {
            Some((percent, rng)) => requests
                .into_iter()
                .flat_map(|request| {
                    let copies = if rng.gen_range(0..100) < *percent { 2 } else { 1 };
                    std::iter::repeat_n(request, copies)
                })
                .collect(),
            None => requests,
        };
        let ops: Vec<(OpId, Option<String>)> =
            requests.iter().map(|request| (self.invoke(request), request.msg_id.clone())).collect();
        let results = self.client.publish_batch(requests, window).await;
        let mut acked = BTreeMap::new();
        for ((op_id, msg_id), result) in ops.into_iter().zip(results) {
            if let (Ok(ack), Some(msg_id)) = (&result.result, msg_id) {
                acked.insert(msg_id, (ack.partition, ack.seq));
            }
            self.history.complete(&self.process, op_id, completion(result.result.as_ref().map(published)));
        }
        acked
    }

    /// Publishes one message to `stream` on whichever cell owns it, following moves (see [`Cells`]), and waits for
    /// its answer.
    pub async fn publish_routed(
        &self,
        cells: &Cells,
        stream: &str,
        request: v1::PublishRequest,
    ) -> Result<v1::PublishAck, ClientError> {
        let op_id = self.invoke(&request);
        let result = cells.publish(stream, request).await;
        self.history.complete(&self.process, op_id, completion(result.as_ref().map(published)));
        result
    }

    /// Publishes one message and waits for its answer.
    pub async fn publish_one(&self, request: v1::PublishRequest) -> Result<v1::PublishAck, ClientError> {
        let op_id = self.invoke(&request);
        let result = self.client.publish(request).await;
        let value = result.as_ref().map(|ack| if ack.staged_index.is_some() { Value::Staged } else { published(ack) });
        self.history.complete(&self.process, op_id, completion(value));
        result
    }
}

/// What a consumer does with each delivery, in percent (the rest it ignores, to be redelivered after its ack wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Behaviour {
    /// Acknowledged as applied.
    pub ack_percent: u32,
    /// Refused, to be redelivered soon.
    pub nack_percent: u32,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour { ack_percent: 80, nack_percent: 10 }
    }
}

/// A consumer (durable, or one member of a work queue) that fetches and answers deliveries.
pub struct Consumer {
    process: String,
    client: Client,
    history: History,
    stream: String,
    consumer: String,
    behaviour: Behaviour,
    rng: ChaCha8Rng,
}

impl Consumer {
    /// Member `process` of consumer `consumer` on `stream`, answering as `behaviour` says with draws from `rng`.
    pub fn new(
        on: impl Into<Caller>,
        process: &str,
        (stream, consumer): (&str, &str),
        behaviour: Behaviour,
        rng: ChaCha8Rng,
    ) -> Consumer {
        let Caller { client, history } = on.into();
        Consumer {
            process: process.to_string(),
            client,
            history,
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            behaviour,
            rng,
        }
    }

    /// Fetches up to `max` deliveries and answers each; returns how many came.
    pub async fn round(&mut self, max: u32) -> usize {
        let op_id = self.history.invoke(&self.process, Op::Fetch { consumer: self.consumer.clone(), max });
        let fetched = self.client.fetch(&self.stream, &self.consumer, &self.process, max).await;
        let value = fetched.as_ref().map(|deliveries| Value::Messages(seen(deliveries)));
        self.history.complete(&self.process, op_id, completion(value));
        let Ok(deliveries) = fetched else { return 0 };
        let mut acks = Vec::new();
        for message in deliveries.iter().filter_map(|delivery| delivery.message.as_ref()) {
            let draw = self.rng.gen_range(0..100);
            let (kind, name) = if draw < self.behaviour.ack_percent {
                (v1::AckKind::AckApplied, "ack")
            } else if draw < self.behaviour.ack_percent + self.behaviour.nack_percent {
                (v1::AckKind::AckNack, "nack")
            } else {
                continue;
            };
            let item = v1::AckItem { partition: message.partition, seq: message.seq, kind: kind.into(), delay_ms: 100 };
            let op =
                Op::Ack { consumer: self.consumer.clone(), partition: message.partition, seq: message.seq, kind: name };
            acks.push((self.history.invoke(&self.process, op), item));
        }
        if acks.is_empty() {
            return deliveries.len();
        }
        let (ops, items): (Vec<OpId>, Vec<v1::AckItem>) = acks.into_iter().unzip();
        match self.client.ack(&self.stream, &self.consumer, items).await {
            Ok(results) => {
                for (op_id, result) in ops.into_iter().zip(results) {
                    let completion = match result.result {
                        Some(v1::ack_result::Result::Error(error)) => completion(Err(&item_error(error))),
                        _ => Completion::Ok(Value::Done),
                    };
                    self.history.complete(&self.process, op_id, completion);
                }
            }
            Err(error) => {
                for op_id in ops {
                    self.history.complete(&self.process, op_id, completion(Err(&error)));
                }
            }
        }
        deliveries.len()
    }
}

/// A member of a consumer group (cooperative sticky): joins, heartbeats releasing what it is told to give up, fetches
/// and acks everything it is handed, and joins again when the cell forgot it. Its joins, fetches and acks are
/// recorded; its heartbeats are not (no checker reads them).
pub struct GroupWorker {
    process: String,
    client: Client,
    history: History,
    stream: String,
    group: String,
    member: String,
    /// The generation it acts at (0 before it joined).
    pub generation: u64,
}

impl GroupWorker {
    /// Process `process` of the history, member `member` of `group` on `stream`.
    pub fn new(on: impl Into<Caller>, process: &str, (stream, group): (&str, &str), member: &str) -> GroupWorker {
        let Caller { client, history } = on.into();
        GroupWorker {
            process: process.to_string(),
            client,
            history,
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation: 0,
        }
    }

    /// Joins (again: a new incarnation). Returns whether it did.
    pub async fn join(&mut self) -> bool {
        let op = Op::JoinGroup { group: self.group.clone(), member: self.member.clone() };
        let op_id = self.history.invoke(&self.process, op);
        let request = v1::JoinGroupRequest {
            stream: self.stream.clone(),
            group: self.group.clone(),
            member: self.member.clone(),
            strategy: v1::GroupStrategy::StrategyCooperativeSticky.into(),
            session_timeout_ms: 5_000,
            config: Some(v1::ConsumerConfig { ack_wait_ms: Some(1_000), ..v1::ConsumerConfig::default() }),
        };
        let joined = self.client.join_group(request).await;
        let value = joined.as_ref().map(|assignment| Value::Assignment {
            generation: assignment.generation,
            partitions: assignment.partitions.clone(),
        });
        self.history.complete(&self.process, op_id, completion(value));
        match joined {
            Ok(assignment) => {
                self.generation = assignment.generation;
                true
            }
            Err(_) => false,
        }
    }

    /// Heartbeats, giving up what it is told to revoke; forgets its generation when the cell forgot it.
    async fn heartbeat(&mut self) {
        let (stream, group, member) = (&self.stream, &self.group, &self.member);
        let mut answer = self.client.heartbeat(stream, group, member, self.generation, Vec::new()).await;
        if let Ok(assignment) = &answer
            && !assignment.revoking.is_empty()
        {
            let revoking = assignment.revoking.clone();
            answer = self.client.heartbeat(stream, group, member, assignment.generation, revoking).await;
        }
        match answer {
            Ok(assignment) => self.generation = assignment.generation,
            Err(error) if error.reason() == Some("UNKNOWN_MEMBER") => self.generation = 0,
            Err(_) => {}
        }
    }

    /// Fetches up to `max` deliveries (recorded); returns their positions.
    pub async fn fetch(&mut self, max: u32) -> Vec<(u32, u64)> {
        let op =
            Op::MemberFetch { group: self.group.clone(), member: self.member.clone(), generation: self.generation };
        let op_id = self.history.invoke(&self.process, op);
        let fetched = self.client.member_fetch(&self.stream, &self.group, &self.member, self.generation, max).await;
        let value = fetched
            .as_ref()
            .map(|answer| Value::MemberMessages { generation: answer.generation, seen: seen(&answer.deliveries) });
        self.history.complete(&self.process, op_id, completion(value));
        let Ok(answer) = fetched else { return Vec::new() };
        answer.deliveries.iter().filter_map(|d| d.message.as_ref()).map(|m| (m.partition, m.seq)).collect()
    }

    /// Acks `(partition, seq)` naming `generation` (recorded).
    pub async fn ack(&self, generation: u64, (partition, seq): (u32, u64)) {
        let op = Op::MemberAck { group: self.group.clone(), member: self.member.clone(), generation, partition, seq };
        let op_id = self.history.invoke(&self.process, op);
        let item = v1::AckItem { partition, seq, ..v1::AckItem::default() };
        let answered = self.client.member_ack(&self.stream, &self.group, &self.member, generation, vec![item]).await;
        let completion = match answered {
            Ok(results) => match results.into_iter().next().and_then(|result| result.result) {
                Some(v1::ack_result::Result::Error(error)) => completion(Err(&item_error(error))),
                _ => Completion::Ok(Value::Done),
            },
            Err(error) => completion(Err(&error)),
        };
        self.history.complete(&self.process, op_id, completion);
    }

    /// One round: join if it has to, heartbeat, fetch up to `max` and ack everything handed. Returns how many came.
    pub async fn round(&mut self, max: u32) -> usize {
        if self.generation == 0 && !self.join().await {
            return 0;
        }
        self.heartbeat().await;
        if self.generation == 0 {
            return 0;
        }
        let handed = self.fetch(max).await;
        for position in &handed {
            self.ack(self.generation, *position).await;
        }
        handed.len()
    }
}

/// A transactional producer: one instance of a transactional id.
pub struct TxnProducer {
    process: String,
    client: Client,
    history: History,
    transactional_id: String,
    /// Its producer id and epoch, once initialized.
    pub producer: Option<v1::ProducerRef>,
}

impl TxnProducer {
    /// An instance of `transactional_id`, named `process` in the history.
    pub fn new(on: impl Into<Caller>, process: &str, transactional_id: &str) -> TxnProducer {
        let Caller { client, history } = on.into();
        TxnProducer {
            process: process.to_string(),
            client,
            history,
            transactional_id: transactional_id.to_string(),
            producer: None,
        }
    }

    /// Registers this instance, fencing every older one of its transactional id.
    pub async fn init(&mut self) -> Result<v1::ProducerRef, ClientError> {
        let op = Op::InitProducer { transactional_id: self.transactional_id.clone() };
        let op_id = self.history.invoke(&self.process, op);
        let result = self.client.init_producer(&self.transactional_id, 0).await;
        let value = result.as_ref().map(|p| Value::Producer { producer_id: p.producer_id, epoch: p.epoch });
        self.history.complete(&self.process, op_id, completion(value));
        if let Ok(producer) = &result {
            self.producer = Some(*producer);
        }
        result
    }

    fn current(&self) -> v1::ProducerRef {
        self.producer.expect("init first")
    }

    async fn step(&mut self, step: &'static str) -> Result<v1::TransactionResponse, ClientError> {
        let producer = self.current();
        let op = Op::Txn { step, producer_id: producer.producer_id, epoch: producer.epoch };
        let op_id = self.history.invoke(&self.process, op);
        let result = match step {
            "begin" => self.client.begin(producer).await,
            "prepare" => self.client.prepare(producer).await,
            "commit" => self.client.commit(producer).await,
            _ => self.client.abort(producer).await,
        };
        let value = result.as_ref().map(|response| match step {
            "commit" => Value::Messages(
                response
                    .messages
                    .iter()
                    .map(|ack| Seen {
                        partition: ack.partition,
                        seq: ack.seq,
                        msg_id: None,
                        delivery_count: 0,
                        payload: None,
                    })
                    .collect(),
            ),
            _ => Value::Done,
        });
        self.history.complete(&self.process, op_id, completion(value));
        // A transaction's end bumps the epoch: the next transaction uses the new one.
        if let Ok(response) = &result
            && let Some(next) = response.next
        {
            self.producer = Some(next);
        }
        result
    }

    /// Opens a transaction.
    pub async fn begin(&mut self) -> Result<v1::TransactionResponse, ClientError> {
        self.step("begin").await
    }

    /// Stages one message in the open transaction.
    pub async fn publish(&mut self, mut request: v1::PublishRequest) -> Result<v1::PublishAck, ClientError> {
        request.transaction = Some(self.current());
        let producer = Producer {
            process: self.process.clone(),
            client: self.client.clone(),
            history: self.history.clone(),
            duplicates: None,
        };
        producer.publish_one(request).await
    }

    /// Prepares the open transaction.
    pub async fn prepare(&mut self) -> Result<v1::TransactionResponse, ClientError> {
        self.step("prepare").await
    }

    /// Commits it: every staged message becomes visible at once.
    pub async fn commit(&mut self) -> Result<v1::TransactionResponse, ClientError> {
        self.step("commit").await
    }

    /// Aborts it.
    pub async fn abort(&mut self) -> Result<v1::TransactionResponse, ClientError> {
        self.step("abort").await
    }
}

/// A registered peer of a stream (a mirror, another cell): it reads the stream from the leader, a little at a time,
/// and reports how far it got. Retention must never remove a message it has not received, so each read must go on
/// exactly where the previous one ended.
pub struct Mirror {
    process: String,
    client: Client,
    history: History,
    stream: String,
    /// What it has received, per partition (the last sequence).
    pub received: Vec<u64>,
}

impl Mirror {
    /// Peer `process` of `stream`, with `partitions` partitions, nothing received yet. Register it first.
    pub fn new(on: impl Into<Caller>, process: &str, stream: &str, partitions: u32) -> Mirror {
        let Caller { client, history } = on.into();
        Mirror {
            process: process.to_string(),
            client,
            history,
            stream: stream.to_string(),
            received: vec![0; partitions as usize],
        }
    }

    /// Reads up to `max` messages of each partition past what it has received, then reports its progress; returns how
    /// many messages came.
    pub async fn round(&mut self, max: u32) -> usize {
        let mut got = 0;
        for partition in 0..u32::try_from(self.received.len()).expect("few partitions") {
            let from = self.received[partition as usize] + 1;
            let op = Op::Read { stream: self.stream.clone(), partition, from };
            let op_id = self.history.invoke(&self.process, op);
            let read = self.client.read(&self.stream, partition, from, max, false).await;
            let value = read.as_ref().map(|response| {
                Value::Messages(
                    response
                        .messages
                        .iter()
                        .map(|m| Seen {
                            partition,
                            seq: m.seq,
                            msg_id: m.msg_id.clone(),
                            delivery_count: 0,
                            payload: Some(Fingerprint::of(&m.payload)),
                        })
                        .collect(),
                )
            });
            self.history.complete(&self.process, op_id, completion(value));
            let Ok(response) = read else { continue };
            let Some(last) = response.messages.last().map(|m| m.seq) else { continue };
            got += response.messages.len();
            self.received[partition as usize] = last;
            let op = Op::PeerProgress {
                stream: self.stream.clone(),
                peer: self.process.clone(),
                partition,
                received_seq: last,
            };
            let op_id = self.history.invoke(&self.process, op);
            let reported = self.client.peer_progress(&self.stream, &self.process, partition, last).await;
            self.history.complete(&self.process, op_id, completion(reported.as_ref().map(|()| Value::Done)));
        }
        got
    }
}

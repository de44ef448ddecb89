//! Transactional producers: epochs that fence older instances, and transactions whose staged messages stay
//! invisible (and out of reach of retention) until a commit appends them all at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::Cell;
use super::limits::{MAX_DEDUP_IDS, MAX_OPEN_TRANSACTIONS, MAX_PRODUCERS, PRODUCER_IDLE_MS, invalid};
use super::publish::{append_message, store_body};
use super::timers::Timer;
use crate::body::BodyRef;
use crate::command::ProducerRef;
use crate::command::PublishRequest;
use crate::effect::{BodyOp, Effects, Transition};
use crate::error::{Cap, Quota, Rejection};
use crate::outcome::{AbortReason, Outcome, PublishAck};
use crate::partition::Message;
use crate::snapshot::v3;
use crate::stream::{Incoming, RoomMode, Tally};
use crate::time::Millis;

/// Most messages one transaction may stage.
pub const MAX_TRANSACTION_MESSAGES: u64 = 10_000;
/// Most payload bytes one transaction may stage (64 MiB).
pub const MAX_TRANSACTION_BYTES: u64 = 64 * 1024 * 1024;

/// A message waiting in a transaction, already routed and validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Staged {
    pub stream: Arc<str>,
    /// Which incarnation of the stream: a stream deleted and created again under the same name is another stream.
    pub stream_id: u64,
    pub partition: u32,
    pub size: u64,
    /// The request, its payload taken out into `body`.
    pub request: PublishRequest,
    /// Its payload, stored by the host when it was staged, so that open transactions cost the state a reference per
    /// message and not their bytes. `None` only for a message staged before bodies of staged messages were stored
    /// (a snapshot of version 5 or earlier), whose payload is still in `request`.
    pub body: Option<BodyRef>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum TransactionState {
    Open,
    Prepared,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Transaction {
    /// Numbers the producer's transactions, so a timer set for one never fires on the next.
    pub number: u64,
    pub state: TransactionState,
    pub begun_at: Millis,
    pub deadline: Millis,
    pub staged: Vec<Staged>,
    pub staged_bytes: u64,
}

/// How the producer's last transaction ended, kept so that a retried commit or abort (whose answer was lost)
/// gets the same answer instead of a bare `Fenced`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum TransactionEnd {
    Committed { epoch: u32, outcome: crate::outcome::Outcome },
    Aborted { epoch: u32, reason: AbortReason, detail: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Producer {
    pub transactional_id: Arc<str>,
    pub epoch: u32,
    pub timeout_ms: u64,
    pub transaction: Option<Transaction>,
    pub next_transaction_number: u64,
    pub last_end: Option<TransactionEnd>,
    /// When a command of it last succeeded: it expires [`PRODUCER_IDLE_MS`] later unless a transaction is open.
    pub last_active: Millis,
}

impl From<v3::Staged> for Staged {
    fn from(staged: v3::Staged) -> Self {
        Staged {
            stream: staged.stream,
            stream_id: staged.stream_id,
            partition: staged.partition,
            size: staged.size,
            request: staged.request.into(),
            body: None,
        }
    }
}

impl From<v3::TransactionState> for TransactionState {
    fn from(state: v3::TransactionState) -> Self {
        match state {
            v3::TransactionState::Open => TransactionState::Open,
            v3::TransactionState::Prepared => TransactionState::Prepared,
        }
    }
}

impl From<v3::Transaction> for Transaction {
    fn from(transaction: v3::Transaction) -> Self {
        Transaction {
            number: transaction.number,
            state: transaction.state.into(),
            begun_at: transaction.begun_at.into(),
            deadline: transaction.deadline.into(),
            staged: transaction.staged.into_iter().map(Staged::from).collect(),
            staged_bytes: transaction.staged_bytes,
        }
    }
}

impl From<v3::TransactionEnd> for TransactionEnd {
    fn from(end: v3::TransactionEnd) -> Self {
        match end {
            v3::TransactionEnd::Committed { epoch, outcome } => {
                TransactionEnd::Committed { epoch, outcome: outcome.into() }
            }
            v3::TransactionEnd::Aborted { epoch, reason, detail } => {
                TransactionEnd::Aborted { epoch, reason: reason.into(), detail }
            }
        }
    }
}

impl Producer {
    /// A producer of a version 3 or 4 state, which did not keep when each was last active: as of the state's time
    /// `last_at`, so that an upgraded cell gives every producer its whole idle time again.
    pub(crate) fn from_v3(producer: v3::Producer, last_at: Millis) -> Self {
        Producer {
            transactional_id: producer.transactional_id,
            epoch: producer.epoch,
            timeout_ms: producer.timeout_ms,
            transaction: producer.transaction.map(Transaction::from),
            next_transaction_number: producer.next_transaction_number,
            last_end: producer.last_end.map(TransactionEnd::from),
            last_active: last_at,
        }
    }

    /// The stored bodies of its open transaction's staged messages.
    pub(super) fn staged_bodies(&self) -> impl Iterator<Item = BodyRef> + '_ {
        self.transaction.iter().flat_map(|transaction| transaction.staged.iter().filter_map(|message| message.body))
    }

    /// The earliest it may expire: [`PRODUCER_IDLE_MS`] after it was last active, and not while a transaction is open
    /// (which its timeout ends by its deadline).
    fn expires_at(&self) -> Millis {
        let idle = self.last_active.plus(PRODUCER_IDLE_MS);
        self.transaction.as_ref().map_or(idle, |transaction| idle.max(transaction.deadline))
    }
}

/// Looks up a producer and checks its epoch.
pub(super) fn current_producer(
    producers: &mut BTreeMap<u64, Producer>,
    r: ProducerRef,
) -> Result<&mut Producer, Rejection> {
    let producer =
        producers.get_mut(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
    #[cfg(madsim)]
    if cellog_planted::active(cellog_planted::Mutant::EpochOffByOne) && r.epoch.checked_add(1) == Some(producer.epoch) {
        return Ok(producer);
    }
    if producer.epoch != r.epoch || producer.epoch == u32::MAX {
        return Err(Rejection::Fenced { current_epoch: producer.epoch });
    }
    Ok(producer)
}

/// Ends the producer's open transaction as aborted and moves it to its next epoch.
pub(super) fn abort_transaction(
    producer_id: u64,
    producer: &mut Producer,
    reason: AbortReason,
    detail: String,
    effects: &mut Effects,
) {
    if let Some(transaction) = producer.transaction.take() {
        release_staged(transaction.staged, effects);
        effects.note(|| Transition::TransactionAborted { producer_id, epoch: producer.epoch, reason });
        producer.last_end = Some(TransactionEnd::Aborted { epoch: producer.epoch, reason, detail });
        producer.epoch = producer.epoch.saturating_add(1);
    }
}

/// Releases the stored bodies of staged messages that will never be appended.
fn release_staged(staged: Vec<Staged>, effects: &mut Effects) {
    effects.extend_work(
        staged.into_iter().filter_map(|message| message.body).map(|body| BodyOp::BodyReleased { key: body.key }),
    );
}

impl Cell {
    /// The earliest time any producer could expire ([`Millis::MAX`] with none).
    pub(super) fn earliest_producer_expiry(&self) -> Millis {
        self.producers.values().map(Producer::expires_at).min().unwrap_or(Millis::MAX)
    }

    /// Forgets every producer idle for [`PRODUCER_IDLE_MS`] by `at` with no transaction open. Looks only once the
    /// derived lower bound has come, and then sets it to the exact earliest expiry of those left.
    pub(super) fn expire_idle_producers(&mut self, at: Millis) {
        if at < self.producers_expire_from.0 {
            return;
        }
        let expired: Vec<u64> = self
            .producers
            .iter()
            .filter(|(_, producer)| producer.transaction.is_none() && producer.expires_at() <= at)
            .map(|(&producer_id, _)| producer_id)
            .collect();
        for producer_id in expired {
            let producer = self.producers.remove(&producer_id).expect("listed above");
            if self.transactional_ids.get(&producer.transactional_id) == Some(&producer_id) {
                self.transactional_ids.remove(&producer.transactional_id);
            }
            self.auth.forget_producer(producer_id);
            self.effects
                .note(|| Transition::ProducerExpired { producer_id, transactional_id: producer.transactional_id });
        }
        // A producer with a transaction open past its idle time is looked at again a little later: its transaction
        // ends by its timeout, and it expires then.
        self.producers_expire_from.0 = self.earliest_producer_expiry().max(at.plus(1));
    }

    /// Marks the producer a successful command acted for as active at `at` (a registration's from its outcome).
    pub(super) fn touch_producer(&mut self, at: Millis, producer: Option<u64>, result: &Result<Outcome, Rejection>) {
        let registered = match result {
            Ok(Outcome::ProducerInitialized(r)) => Some(r.producer_id),
            _ => None,
        };
        let Some(producer) = producer.or(registered).and_then(|id| self.producers.get_mut(&id)) else { return };
        producer.last_active = at;
        self.producers_expire_from.0 = self.producers_expire_from.0.min(producer.expires_at());
    }

    /// A transaction timer fired: aborts the transaction if it is still the one the timer was set for.
    pub(super) fn fire_transaction_timeout(&mut self, producer_id: u64, number: u64) {
        let Some(producer) = self.producers.get_mut(&producer_id) else { return };
        if producer.transaction.as_ref().is_some_and(|t| t.number == number) {
            let detail = format!("open for longer than its timeout of {} ms", producer.timeout_ms);
            abort_transaction(producer_id, producer, AbortReason::Timeout, detail, &mut self.effects);
        }
    }

    pub(super) fn init_producer(&mut self, transactional_id: String, timeout_ms: u64) -> Result<Outcome, Rejection> {
        if let Some(&producer_id) = self.transactional_ids.get(transactional_id.as_str()) {
            let producer = self.producers.get_mut(&producer_id).expect("transactional_ids and producers agree");
            abort_transaction(
                producer_id,
                producer,
                AbortReason::Fenced,
                "a newer instance of the producer was initialized".to_string(),
                &mut self.effects,
            );
            if producer.epoch < u32::MAX - 1 {
                producer.epoch += 1;
                producer.timeout_ms = timeout_ms;
                return Ok(Outcome::ProducerInitialized(ProducerRef { producer_id, epoch: producer.epoch }));
            }
            // Epochs are exhausted: retire the id (its instances are fenced for good) and start a new one.
            self.producers.remove(&producer_id);
        }
        if self.producers.len() >= MAX_PRODUCERS {
            return Err(Rejection::CapReached { cap: Cap::Producers, limit: MAX_PRODUCERS as u64 });
        }
        let producer_id = self.next_producer_id;
        self.next_producer_id += 1;
        let transactional_id: Arc<str> = Arc::from(transactional_id);
        self.transactional_ids.insert(transactional_id.clone(), producer_id);
        self.producers.insert(
            producer_id,
            Producer {
                transactional_id,
                epoch: 0,
                timeout_ms,
                transaction: None,
                next_transaction_number: 0,
                last_end: None,
                last_active: Millis::ZERO,
            },
        );
        Ok(Outcome::ProducerInitialized(ProducerRef { producer_id, epoch: 0 }))
    }

    pub(super) fn begin_transaction(&mut self, at: Millis, r: ProducerRef) -> Result<Outcome, Rejection> {
        let open = self.producers.values().filter(|producer| producer.transaction.is_some()).count();
        let producer = current_producer(&mut self.producers, r)?;
        if producer.transaction.is_some() {
            return Err(Rejection::TransactionState { reason: "a transaction is already open".to_string() });
        }
        if open >= MAX_OPEN_TRANSACTIONS {
            return Err(Rejection::CapReached { cap: Cap::OpenTransactions, limit: MAX_OPEN_TRANSACTIONS as u64 });
        }
        let number = producer.next_transaction_number;
        producer.next_transaction_number += 1;
        let deadline = at.plus(producer.timeout_ms);
        producer.transaction = Some(Transaction {
            number,
            state: TransactionState::Open,
            begun_at: at,
            deadline,
            staged: Vec::new(),
            staged_bytes: 0,
        });
        self.timers.set(at, deadline, Timer::Transaction { producer_id: r.producer_id, number });
        Ok(Outcome::TransactionBegun)
    }

    pub(super) fn stage(
        &mut self,
        name: Arc<str>,
        r: ProducerRef,
        request: PublishRequest,
        at: Millis,
    ) -> Result<Outcome, Rejection> {
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer.transaction.as_mut().ok_or_else(|| Rejection::TransactionState {
            reason: "no open transaction; begin one first".to_string(),
        })?;
        if transaction.state == TransactionState::Prepared {
            return Err(Rejection::TransactionState {
                reason: "the transaction is prepared and accepts no more messages".to_string(),
            });
        }
        if request.expected_last_seq.is_some() || request.expected_last_subject_seq.is_some() {
            return Err(invalid("conditional append is not available inside a transaction"));
        }
        let stream = self.streams.get_mut(&name).expect("routed to an existing stream");
        let payload_len = request.payload.len() as u64;
        if payload_len > u64::from(stream.config().max_payload_bytes) {
            return Err(Rejection::PayloadTooLarge {
                size: payload_len,
                max: stream.config().max_payload_bytes.into(),
            });
        }
        if let Some(msg_id) = &request.msg_id {
            if let Some(ack) = stream.duplicate_of(msg_id) {
                return Ok(Outcome::Published(ack));
            }
            if let Some(index) = transaction
                .staged
                .iter()
                .position(|s| s.stream == name && s.request.msg_id.as_deref() == Some(msg_id.as_str()))
            {
                return Ok(Outcome::Staged { index: index as u32, duplicate: true });
            }
            if stream.n_window_ids() >= MAX_DEDUP_IDS {
                return Err(Rejection::CapReached { cap: Cap::DedupIds, limit: MAX_DEDUP_IDS as u64 });
            }
        }
        let partition = stream.partition_of(&request.subject, request.key.as_ref());
        let size =
            Message::accounted_size(&request.subject, request.key.as_ref(), &request.headers, request.payload.len());
        stream.check_fits_at_all(&Incoming { subject: &request.subject, size })?;
        if transaction.staged.len() as u64 >= MAX_TRANSACTION_MESSAGES {
            return Err(Rejection::QuotaExceeded {
                quota: Quota::TransactionMessages,
                limit: MAX_TRANSACTION_MESSAGES,
            });
        }
        if transaction.staged_bytes + size > MAX_TRANSACTION_BYTES {
            return Err(Rejection::QuotaExceeded { quota: Quota::TransactionBytes, limit: MAX_TRANSACTION_BYTES });
        }
        stream.take_token(at)?;
        let index = transaction.staged.len() as u32;
        transaction.staged_bytes += size;
        let mut request = PublishRequest { transaction: None, ..request };
        let body = store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload));
        transaction.staged.push(Staged {
            stream_id: stream.id(),
            stream: name,
            partition,
            size,
            request,
            body: Some(body),
        });
        Ok(Outcome::Staged { index, duplicate: false })
    }

    /// Checks that every staged message can be appended now, all together: the streams exist and discard-new limits
    /// hold for the whole batch. Discard-old limits always make room (or wait for a peer without refusing).
    pub(super) fn check_staged(&self, staged: &[Staged]) -> Result<(), Rejection> {
        let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
        for message in staged {
            let stream = self.stream(&message.stream)?;
            if stream.id() != message.stream_id {
                // Deleted and created again since staging: not the stream the message was staged for.
                return Err(Rejection::StreamNotFound { stream: message.stream.to_string() });
            }
            // Fenced since staging: the stream's writes go to another cell now.
            self.writable(&message.stream)?;
            if message.request.msg_id.as_deref().is_some_and(|id| stream.remembers(id)) {
                continue;
            }
            let incoming = Incoming { subject: &message.request.subject, size: message.size };
            stream.check_fits_at_all(&incoming)?;
            let tally = tallies.entry(&message.stream).or_default();
            stream.check_discard_new(&incoming, tally)?;
            tally.n_messages += 1;
            tally.n_bytes += message.size;
            let subject = tally.subjects.entry(message.request.subject.clone()).or_default();
            subject.0 += 1;
            subject.1 += message.size;
        }
        // Counted as growth, whatever a discard-old stream would remove to make room: a quota that is nearly full
        // refuses a commit it might have taken.
        let Some(ledger) = &self.ledger else { return Ok(()) };
        let fresh = staged
            .iter()
            .filter(|m| !m.request.msg_id.as_deref().is_some_and(|id| self.streams[&m.stream].remembers(id)));
        super::ledger::check_batch(&self.quotas, ledger, fresh.map(|m| (&*m.stream, m.size)))
    }

    pub(super) fn prepare_transaction(&mut self, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer
            .transaction
            .as_ref()
            .ok_or_else(|| Rejection::TransactionState { reason: "no open transaction".to_string() })?;
        if transaction.state == TransactionState::Open {
            let staged = transaction.staged.clone();
            self.check_staged(&staged)?;
        }
        let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
        producer.transaction.as_mut().expect("checked above").state = TransactionState::Prepared;
        Ok(Outcome::TransactionPrepared)
    }

    /// The answer to a commit or abort whose epoch already ended: the same answer as the first time, so a retry after
    /// a lost response learns what happened. Anything else is fenced.
    pub(super) fn replay_end(&self, r: ProducerRef, wants_commit: bool) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        let fenced = Rejection::Fenced { current_epoch: producer.epoch };
        if r.epoch.checked_add(1) != Some(producer.epoch) {
            return Err(fenced);
        }
        match (&producer.last_end, wants_commit) {
            (Some(TransactionEnd::Committed { epoch, outcome }), true) if *epoch == r.epoch => Ok(outcome.clone()),
            (Some(TransactionEnd::Committed { epoch, .. }), false) if *epoch == r.epoch => {
                Err(Rejection::TransactionState { reason: "the transaction was already committed".to_string() })
            }
            (Some(TransactionEnd::Aborted { epoch, reason, .. }), false)
                if *epoch == r.epoch && *reason != AbortReason::Fenced =>
            {
                Ok(Outcome::TransactionAborted {
                    next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch },
                })
            }
            (Some(TransactionEnd::Aborted { epoch, reason, detail }), true)
                if *epoch == r.epoch && *reason != AbortReason::Fenced =>
            {
                Err(Rejection::TransactionAborted { reason: detail.clone() })
            }
            _ => Err(fenced),
        }
    }

    pub(super) fn commit_transaction(&mut self, at: Millis, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        if producer.epoch != r.epoch {
            return self.replay_end(r, true);
        }
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer
            .transaction
            .as_ref()
            .ok_or_else(|| Rejection::TransactionState { reason: "no open transaction".to_string() })?;
        let staged = transaction.staged.clone();
        if let Err(refusal) = self.check_staged(&staged) {
            let detail = format!("commit refused, nothing was appended: {refusal}");
            let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
            abort_transaction(r.producer_id, producer, AbortReason::CommitRefused, detail.clone(), &mut self.effects);
            return Err(Rejection::TransactionAborted { reason: detail });
        }
        let mut acks = Vec::with_capacity(staged.len());
        #[cfg(madsim)]
        let reversed = cellog_planted::active(cellog_planted::Mutant::CommitReversesOrder);
        #[cfg(madsim)]
        let staged = if reversed { staged.into_iter().rev().collect() } else { staged };
        for message in staged {
            let stream = self.streams.get_mut(&message.stream).expect("checked by check_staged");
            let request = message.request;
            if let Some(ack) = request.msg_id.as_deref().and_then(|id| stream.duplicate_of(id)) {
                self.effects.extend_work(message.body.map(|body| BodyOp::BodyReleased { key: body.key }));
                acks.push(ack);
                continue;
            }
            let incoming = Incoming { subject: &request.subject, size: message.size };
            let plan = stream.plan_room(&incoming, RoomMode::Lenient).expect("lenient planning never refuses");
            for (p, seq, reason) in plan {
                stream.remove(p, seq, reason, &mut self.effects);
            }
            #[cfg(madsim)]
            if cellog_planted::active(cellog_planted::Mutant::CommitAppliedTwice) {
                // A copy of the body when it is stored; the payload stored again when it is in the request.
                self.append_message(&message.stream, message.partition, request.clone(), message.body, at);
            }
            let seq = match message.body {
                Some(body) => {
                    let stream = self.streams.get_mut(&message.stream).expect("checked by check_staged");
                    append_message(stream, &mut self.timers, &mut self.effects, message.partition, request, body, at)
                }
                // Staged before bodies of staged messages were stored: its payload is in the request.
                None => self.append_message(&message.stream, message.partition, request, None, at),
            };
            acks.push(PublishAck {
                stream: message.stream.clone(),
                partition: message.partition,
                seq,
                duplicate: false,
                original: None,
            });
        }
        #[cfg(madsim)]
        if reversed {
            acks.reverse();
        }
        let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
        producer.transaction = None;
        producer.epoch = producer.epoch.saturating_add(1);
        let outcome = Outcome::TransactionCommitted {
            messages: acks,
            next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch },
        };
        producer.last_end = Some(TransactionEnd::Committed { epoch: r.epoch, outcome: outcome.clone() });
        let n_messages = match &outcome {
            Outcome::TransactionCommitted { messages, .. } => {
                messages.iter().filter(|ack| !ack.duplicate).count() as u32
            }
            _ => unreachable!("built above"),
        };
        self.effects.note(|| Transition::TransactionCommitted {
            producer_id: r.producer_id,
            epoch: r.epoch,
            n_messages,
        });
        Ok(outcome)
    }

    pub(super) fn abort_transaction(&mut self, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        if producer.epoch != r.epoch {
            return self.replay_end(r, false);
        }
        let producer = current_producer(&mut self.producers, r)?;
        if producer.transaction.is_none() {
            return Err(Rejection::TransactionState { reason: "no open transaction".to_string() });
        }
        abort_transaction(
            r.producer_id,
            producer,
            AbortReason::Requested,
            "aborted by the producer".to_string(),
            &mut self.effects,
        );
        Ok(Outcome::TransactionAborted { next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch } })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cell, Command, Millis, Outcome, ProducerRef};

    /// A transactional id's epochs run out one short of `u32::MAX`: the instance after that retires its producer
    /// (every instance of it fenced for good) and starts a new producer at epoch 0.
    #[test]
    fn a_producer_whose_epochs_run_out_starts_again_as_a_new_producer() {
        let mut cell = Cell::new();
        let init = |cell: &mut Cell, at| {
            let command = Command::InitProducer { transactional_id: "t".into(), transaction_timeout_ms: 1_000 };
            let outcome = cell.apply(Millis(at), command);
            cell.drain_work().for_each(drop);
            match outcome {
                Ok(Outcome::ProducerInitialized(producer)) => producer,
                other => panic!("{other:?}"),
            }
        };
        let first = init(&mut cell, 1);
        cell.producers.get_mut(&first.producer_id).expect("initialized").epoch = u32::MAX - 2;
        let last = init(&mut cell, 2);
        assert_eq!(last, ProducerRef { producer_id: first.producer_id, epoch: u32::MAX - 1 });
        let next = init(&mut cell, 3);
        assert_ne!(next.producer_id, first.producer_id);
        assert_eq!(next.epoch, 0);
    }
}

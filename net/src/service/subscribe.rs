//! Pushed subscriptions (`Subscribe`, `MemberSubscribe`): a feed that proposes a fetch only when the replica says one
//! would deliver, inside the subscriber's window and byte budget, and the acks that come back on it.

use std::sync::Arc;
use std::time::Duration;

use cellog_client::status::to_item_error;
use cellog_core::{
    AckAnswer, AckItem, Actor, Cell, Command, GroupMember, MAX_FETCH, Outcome, Record, Rejection, Scope, Work,
};
use cellog_proto::v1;
use cellog_raft::ProposeError;
use cellog_raft::storage::Storage;
use futures::StreamExt;
use tokio::sync::mpsc;
use tonic::{Response, Status};

use super::{CellogService, SKIP_EVERY, SUBSCRIPTION_BUFFER_BYTES, ServerStream, lock, unexpected};
use crate::convert;
use crate::limits::{too_many_for_principal, too_many_subscriptions};
use crate::status::{from_propose, from_rejection, invalid_argument};

/// The payload bytes a subscription holds for its subscriber, and a wake-up for its task when the subscriber takes
/// some.
#[derive(Default)]
pub(super) struct Buffered {
    bytes: std::sync::atomic::AtomicU64,
    taken: tokio::sync::Notify,
}

pub(super) fn payload_len(delivery: &v1::Delivery) -> u64 {
    delivery.message.as_ref().map_or(0, |message| message.payload.len() as u64)
}

impl<S: Storage + Clone> CellogService<S> {
    /// Deliveries with their payloads for the wire, their bodies read in one batched read under the stored name
    /// `stored`; one whose message was removed meanwhile is left out.
    pub(super) fn deliveries_to_wire(
        &self,
        stored: &str,
        deliveries: Vec<cellog_core::Delivery>,
    ) -> Result<Vec<v1::Delivery>, Status> {
        let records: Vec<&Record> = deliveries.iter().map(|delivery| &delivery.record).collect();
        let payloads = self.payloads(stored, &records);
        let mut wire = Vec::with_capacity(deliveries.len());
        for (delivery, payload) in deliveries.into_iter().zip(payloads) {
            if let Some(payload) = payload? {
                wire.push(convert::delivery_to_wire(delivery, payload));
            }
        }
        Ok(wire)
    }

    /// Pushes deliveries to a subscriber, at most `window` unacknowledged at once. Pushed, not polled: it proposes
    /// `fetch(room)` only when `probe` on this node's replica says one would deliver something, and otherwise waits
    /// for the replica to change (a publish, an ack, the leader's tick that makes a redelivery due) without writing
    /// anything to the log. It ends when `probe` says so (its third part), or refuses.
    #[allow(clippy::disallowed_methods, reason = "spaces a subscription's skip-only fetches on the runtime's clock")]
    pub(super) fn feed(
        &self,
        actor: Actor,
        principal: Arc<str>,
        stored: String,
        window: u32,
        probe: impl Fn(&Cell) -> Result<(Work, u32, bool), Rejection> + Send + 'static,
        fetch: impl Fn(u32) -> Command + Send + 'static,
    ) -> Result<Response<ServerStream<v1::Delivery>>, Status> {
        // Opening one costs a command of the principal's rate (its fetches are the node's, and cost none).
        self.limiter.take(&principal)?;
        // Held by the subscription's task, so released when it ends (its subscriber gone, or an error sent).
        let caps = &self.subscriptions_per_principal;
        let held = caps
            .try_open(&principal)
            .ok_or_else(|| too_many_for_principal("TOO_MANY_SUBSCRIPTIONS", "subscriptions", &principal, caps.max()))?;
        let permit = self
            .subscriptions
            .clone()
            .try_acquire_owned()
            .map_err(|_| too_many_subscriptions(self.max_subscriptions))?;
        let (sender, mut receiver) = mpsc::channel(usize::try_from(window).unwrap_or(256));
        let buffered = Arc::new(Buffered::default());
        let held_bytes = buffered.clone();
        let service = self.clone();
        tokio::spawn(async move {
            let (_permit, _held) = (permit, held);
            let mut skipped_at: Option<tokio::time::Instant> = None;
            loop {
                let applied = service.node.applied();
                let mut changed = std::pin::pin!(applied.notified());
                changed.as_mut().enable();
                let state = lock(&service.node).map(|replica| probe(&replica.cell));
                let (work, pending) = match state {
                    Ok(Ok((_, _, true))) => return,
                    Ok(Ok((work, pending, false))) => (work, pending),
                    Ok(Err(rejection)) => {
                        let rejection = Scope::of(&principal).rejection_out(rejection);
                        let _ = sender.send(Err(from_rejection(&rejection))).await;
                        return;
                    }
                    Err(status) => {
                        let _ = sender.send(Err(status)).await;
                        return;
                    }
                };
                let room = window.saturating_sub(pending);
                // A fetch that would only move the cursors over unmatched messages (so that the consumer's lag
                // reads true) waits its turn, so a filter on a busy stream does not propose one per applied batch.
                let skip_wait = skipped_at.map_or(Duration::ZERO, |at| SKIP_EVERY.saturating_sub(at.elapsed()));
                let go = room > 0 && (work == Work::Deliver || (work == Work::Skip && skip_wait.is_zero()));
                if !go {
                    let skip_later = room > 0 && work == Work::Skip;
                    tokio::select! {
                        biased;
                        () = sender.closed() => return,
                        () = &mut changed => {}
                        () = tokio::time::sleep(skip_wait), if skip_later => {}
                    }
                    continue;
                }
                // A subscriber that does not read holds up the fetching, not the node's memory.
                let mut taken = std::pin::pin!(held_bytes.taken.notified());
                taken.as_mut().enable();
                if held_bytes.bytes.load(std::sync::atomic::Ordering::Acquire) >= SUBSCRIPTION_BUFFER_BYTES {
                    tokio::select! {
                        biased;
                        () = sender.closed() => return,
                        () = &mut taken => {}
                    }
                    continue;
                }
                if work == Work::Skip {
                    skipped_at = Some(tokio::time::Instant::now());
                }
                let deliveries = match service.write(&actor, fetch(room)).await {
                    Ok(Outcome::Fetched(deliveries) | Outcome::MemberFetched { deliveries, .. }) => deliveries,
                    Ok(other) => {
                        let _ = sender.send(Err(unexpected(&other))).await;
                        return;
                    }
                    Err(status) => {
                        let _ = sender.send(Err(status)).await;
                        return;
                    }
                };
                let delivered = deliveries.len();
                let records: Vec<&Record> = deliveries.iter().map(|delivery| &delivery.record).collect();
                let payloads = service.payloads(&stored, &records);
                for (delivery, payload) in deliveries.into_iter().zip(payloads) {
                    // A body this node cannot read ends the stream with its error; the delivery comes again after
                    // its ack wait.
                    let item = match payload {
                        Ok(Some(payload)) => Ok(convert::delivery_to_wire(delivery, payload)),
                        Ok(None) => continue,
                        Err(status) => Err(status),
                    };
                    if let Ok(delivery) = &item {
                        held_bytes.bytes.fetch_add(payload_len(delivery), std::sync::atomic::Ordering::AcqRel);
                    }
                    let failed = item.is_err();
                    if sender.send(item).await.is_err() || failed {
                        return;
                    }
                }
                if delivered == 0 && work == Work::Deliver {
                    // Another member took it first (or it started a delayed message's wait): ask again only once
                    // something else is applied, so that nothing can make this loop propose fetch after fetch.
                    let mut next = std::pin::pin!(applied.notified());
                    tokio::select! {
                        biased;
                        () = sender.closed() => return,
                        () = &mut next => {}
                    }
                }
            }
        });
        let deliveries = futures::stream::poll_fn(move |context| receiver.poll_recv(context)).inspect(move |item| {
            if let Ok(delivery) = item {
                buffered.bytes.fetch_sub(payload_len(delivery), std::sync::atomic::Ordering::AcqRel);
                buffered.taken.notify_one();
            }
        });
        Ok(Response::new(Box::pin(deliveries)))
    }

    /// Answers the deliveries `items` of `consumer` as `actor` (as `member` of a group, when one is named): the items
    /// whose kind is known travel as one [`Command::Acks`], admitted and authorized once and carried in one entry, and
    /// each is answered on its own. One result per item, in order; a refusal of the whole command answers every item.
    #[allow(clippy::disallowed_methods, reason = "measures commit latency on the runtime's clock")]
    pub(super) async fn acks(
        &self,
        actor: &Actor,
        (stream, consumer): (String, String),
        member: Option<GroupMember>,
        items: &[v1::AckItem],
    ) -> Result<Response<v1::AckResponse>, Status> {
        if items.len() > MAX_FETCH as usize {
            return Err(invalid_argument(format!("at most {MAX_FETCH} acks per call")));
        }
        let converted: Vec<Result<AckItem, Status>> = items
            .iter()
            .map(|item| convert::ack_kind(item).map(|kind| AckItem { partition: item.partition, seq: item.seq, kind }))
            .collect();
        let known: Vec<AckItem> = converted.iter().filter_map(|item| item.as_ref().ok().copied()).collect();
        let n_known = known.len();
        let answers: Vec<Result<AckAnswer, Status>> = if known.is_empty() {
            Vec::new()
        } else {
            let whole = |status: Status| (0..n_known).map(|_| Err(status.clone())).collect();
            match self.admit(actor, Command::Acks { stream, consumer, member, items: known }) {
                Err(status) => whole(status),
                Ok(command) => {
                    let started = tokio::time::Instant::now();
                    let result = self.node.propose(command).await;
                    self.metrics.commit_latency.observe(started.elapsed().as_secs_f64());
                    match result {
                        // Nothing was handed to Raft: the whole call goes where the leader is.
                        Err(error @ ProposeError::NotLeader { .. }) => return Err(from_propose(error)),
                        result => match self.answered(result) {
                            Ok(Outcome::AckedEach(answers)) if answers.len() == n_known => answers
                                .into_iter()
                                .map(|answer| answer.map_err(|rejection| from_rejection(&rejection)))
                                .collect(),
                            Ok(other) => return Err(unexpected(&other)),
                            Err(status) => whole(status),
                        },
                    }
                }
            }
        };
        let mut answers = answers.into_iter();
        let results = converted
            .into_iter()
            .map(|item| match item.and_then(|_| answers.next().expect("an answer per known item")) {
                Ok(AckAnswer { state, already_done }) => {
                    self.metrics.acked.inc();
                    v1::AckResult {
                        result: Some(v1::ack_result::Result::State(convert::ack_state_to_wire(state) as i32)),
                        already_done,
                    }
                }
                Err(status) => v1::AckResult {
                    result: Some(v1::ack_result::Result::Error(to_item_error(&status))),
                    already_done: false,
                },
            })
            .collect();
        Ok(Response::new(v1::AckResponse { results }))
    }
}

//! The client API (`cellog.v1.Cellog`) of a node. Writes are proposed to the cell and answered when committed on a
//! quorum and applied; reads are answered by the leader after a read barrier (or by any node from its own replica,
//! when asked for a local read). A node that does not lead answers `UNAVAILABLE` with the leader's address.

use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use cellog_client::limits::MAX_PUBLISH_BATCH;
use cellog_client::status::{failed, to_item_error};
use cellog_core::mirror::MirrorSource;
use cellog_core::{
    Access, AckAnswer, AckItem, Actor, Cell, Command, GroupMember, MAX_FETCH, MAX_READ, MAX_RESPONSE_BYTES, MirrorRead,
    Outcome, Record, Rejection, Scope, Work,
};
use cellog_proto::v1::{self, cellog_server::Cellog};
use cellog_raft::storage::Storage;
use cellog_raft::{Admitted, Answer, BodyError, CellNode, Door, MembershipError, NodeAddrs, ProposeError, Replica};
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Callers, Limiter, Rates};
use crate::convert;
use crate::limits::{Limits, PerPrincipal, too_many_for_principal, too_many_subscriptions};
use crate::metrics::Metrics;
use crate::ops::Write;
use crate::status::{self, from_propose, from_rejection, invalid_argument, not_leader};

/// Most publishes of one batch call in flight at once; the caller's stream is read no further ahead than that.
pub const BATCH_WINDOW: usize = 4096;
/// Default window of a subscription.
pub const DEFAULT_SUBSCRIBE_WINDOW: u32 = 256;
/// Least time between two fetches of one subscription that would only move its consumer's cursors over messages its
/// filter does not match. A match more than a thousand unmatched messages past the cursor waits for such a fetch, so
/// a sparse filter on a busy stream is delivered within this, not at once.
pub const SKIP_EVERY: Duration = Duration::from_secs(1);
/// Member name used when a fetch names none.
pub const DEFAULT_MEMBER: &str = "default";
/// Most payload bytes a subscription holds fetched and not yet taken by its subscriber: past them it fetches no more
/// until the subscriber reads, whatever its window, so a slow subscriber with a wide window costs the node this much
/// at most (and the consumer's deliveries wait in the cell, not in the node's memory).
pub const SUBSCRIPTION_BUFFER_BYTES: u64 = 16 * 1024 * 1024;

/// The payload bytes a subscription holds for its subscriber, and a wake-up for its task when the subscriber takes
/// some.
#[derive(Default)]
struct Buffered {
    bytes: std::sync::atomic::AtomicU64,
    taken: tokio::sync::Notify,
}

fn payload_len(delivery: &v1::Delivery) -> u64 {
    delivery.message.as_ref().map_or(0, |message| message.payload.len() as u64)
}

mod governance;

type ServerStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The client API of one node.
pub struct CellogService<S> {
    node: Arc<CellNode<S>>,
    metrics: Arc<Metrics>,
    callers: Callers,
    limiter: Arc<Limiter>,
    /// A permit per open subscription.
    subscriptions: Arc<Semaphore>,
    max_subscriptions: usize,
    /// Each principal's open subscriptions.
    subscriptions_per_principal: Arc<PerPrincipal>,
}

impl<S> Clone for CellogService<S> {
    fn clone(&self) -> Self {
        CellogService {
            node: self.node.clone(),
            metrics: self.metrics.clone(),
            callers: self.callers.clone(),
            limiter: self.limiter.clone(),
            subscriptions: self.subscriptions.clone(),
            max_subscriptions: self.max_subscriptions,
            subscriptions_per_principal: self.subscriptions_per_principal.clone(),
        }
    }
}

fn unexpected(outcome: &Outcome) -> Status {
    Status::internal(format!("unexpected outcome {outcome:?}"))
}

/// This node's replica, or UNAVAILABLE once a panic interrupted applying (nothing is served from it then; the node
/// is stopping).
fn lock(node: &CellNode<impl Storage + Clone>) -> Result<MutexGuard<'_, Replica>, Status> {
    node.replica().map_err(crate::status::interrupted)
}

/// This node's door, or UNAVAILABLE once a panic interrupted applying.
fn lock_door(node: &CellNode<impl Storage + Clone>) -> Result<Door<'_>, Status> {
    node.door().map_err(crate::status::interrupted)
}

/// The answer to a proposal as a status.
pub(crate) fn answered(result: Result<Result<Outcome, Rejection>, ProposeError>) -> Result<Outcome, Status> {
    match result {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(rejection)) => Err(from_rejection(&rejection)),
        Err(error) => Err(from_propose(error)),
    }
}

/// Authenticates `actor` against `cell` and runs `authorize` for the principal it is.
fn authorized(
    cell: &Cell,
    actor: &Actor,
    authorize: impl FnOnce(&Cell, &str) -> Result<(), Rejection>,
) -> Result<(), Rejection> {
    let principal = cell.authenticate(actor)?;
    authorize(cell, &principal)
}

/// Any authenticated principal.
fn anyone(_: &Cell, _: &str) -> Result<(), Rejection> {
    Ok(())
}

fn admin(cell: &Cell, principal: &str) -> Result<(), Rejection> {
    cell.authorize(principal, &Access::Admin)
}

fn cluster_admin(cell: &Cell, principal: &str) -> Result<(), Rejection> {
    cell.authorize(principal, &Access::ClusterAdmin)
}

/// May see a stream's info: an admin, or a principal that may read it.
fn sees_stream<'a>(stream: &'a str) -> impl FnOnce(&Cell, &str) -> Result<(), Rejection> + 'a {
    move |cell, principal| {
        admin(cell, principal).or_else(|_| cell.authorize_read(principal, stream)).or_else(|refused| {
            // A mirror's principal sees the stream it mirrors (its probe of the source), and no other.
            cell.authorize_mirror(principal, stream).map_err(|_| refused)
        })
    }
}

/// May see a consumer: an admin, or a principal that may consume it.
fn sees_consumer<'a>(stream: &'a str, consumer: &'a str) -> impl FnOnce(&Cell, &str) -> Result<(), Rejection> + 'a {
    move |cell, principal| {
        admin(cell, principal).or_else(|_| cell.authorize(principal, &Access::Consume { stream, consumer }))
    }
}

/// The streams `actor` may see, as its scope names them (the streams of its scope; every one for an admin, else
/// those it may read), each with its consumers' infos as of the cell's time if `with_consumers`.
fn visible_streams(
    cell: &Cell,
    actor: &Actor,
    with_consumers: bool,
) -> Result<Vec<(cellog_core::StreamInfo, Vec<cellog_core::ConsumerInfo>)>, Rejection> {
    let principal = cell.authenticate(actor)?;
    let scope = Scope::of(&principal);
    let visible = |name: &str| scope.name_out(name).is_some() && sees_stream(name)(cell, &principal).is_ok();
    cell.stream_names()
        .iter()
        .filter(|name| visible(name))
        .map(|name| {
            let info = cell.stream_info(name)?;
            let consumers = info
                .consumers
                .iter()
                .filter(|_| with_consumers)
                .map(|consumer| {
                    cell.consumer_info(name, consumer, cell.last_at()).map(|info| scope.consumer_info_out(info))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((scope.stream_info_out(info), consumers))
        })
        .collect()
}

/// A payload read for an answer: `None` when retention removed the message since it was read (answered as if the
/// read came after the removal), `DATA_LOSS BODY_UNREADABLE` when this node's copy does not verify.
fn payload_answer(payload: Result<bytes::Bytes, BodyError>) -> Result<Option<bytes::Bytes>, Status> {
    match payload {
        Ok(payload) => Ok(Some(payload)),
        Err(BodyError::Removed { .. }) => Ok(None),
        Err(BodyError::Unreadable { partition, seq, reason }) => {
            Err(crate::status::body_unreadable(partition, seq, &reason))
        }
    }
}

/// A group's info as the caller's scope sees it.
fn group_out(stream: &str, scope: Scope<'_>, mut info: cellog_core::GroupInfo) -> v1::GroupInfo {
    info.consumer = scope.consumer_info_out(info.consumer);
    convert::group_info_to_wire(stream, info)
}

fn membership_error(error: MembershipError) -> Status {
    match error {
        MembershipError::NotLeader { leader } => not_leader(leader.as_ref()),
        MembershipError::Changing(message) => status::unavailable("MEMBERSHIP_CHANGING", message, 200),
        MembershipError::Refused(message) => failed(tonic::Code::FailedPrecondition, "MEMBERSHIP", message),
        MembershipError::Raft(message) => from_propose(ProposeError::Raft(message)),
    }
}

impl<S: Storage + Clone> CellogService<S> {
    /// The API of `node`, recording into `metrics`, treating callers as `callers` says.
    pub fn new(node: Arc<CellNode<S>>, metrics: Arc<Metrics>, callers: Callers, limits: &Limits) -> Self {
        let rates = Rates {
            principal: callers.rate,
            tenant: limits.tenant_rate,
            cell: limits.cell_rate,
            subject: limits.subject_rate,
        };
        let limiter = Arc::new(Limiter::new(rates));
        let subscriptions = Arc::new(Semaphore::new(limits.max_subscriptions));
        let subscriptions_per_principal = PerPrincipal::new(limits.max_subscriptions_per_principal);
        CellogService {
            node,
            metrics,
            callers,
            limiter,
            subscriptions,
            max_subscriptions: limits.max_subscriptions,
            subscriptions_per_principal,
        }
    }

    /// `command` run as `actor`, admitted by this node (see [`cellog_raft::door`]): refused if the replica does not
    /// find the actor's credential, its grants do not allow it, the cell would not take it, or the principal is over
    /// its rate. A command refused here never reaches the log (the cell decides again when it applies one that does).
    fn admit(&self, actor: &Actor, command: Command) -> Result<Admitted, Status> {
        let admitted = lock_door(&self.node)?.admit(actor, command);
        self.decided(admitted)
    }

    /// [`Self::admit`] for each of `commands` that is one (an item refused already stays so), through one opening of
    /// the door.
    fn admit_all(
        &self,
        actor: &Actor,
        commands: impl Iterator<Item = Result<Command, Status>>,
    ) -> Vec<Result<Admitted, Status>> {
        let decided: Vec<_> = match lock_door(&self.node) {
            Ok(door) => commands.map(|command| command.map(|command| door.admit(actor, command))).collect(),
            Err(status) => return commands.map(|_| Err(status.clone())).collect(),
        };
        decided.into_iter().map(|decided| decided.and_then(|admitted| self.decided(admitted))).collect()
    }

    /// An admitted command once its principal's rate allows it, or the refusal as a status (counting a cap the door
    /// refused it for: a key or an id over its cap is refused there, as the cell would).
    fn decided(&self, admitted: Result<Admitted, Rejection>) -> Result<Admitted, Status> {
        let admitted = admitted.map_err(|rejection| {
            self.count_cap(&rejection);
            from_rejection(&rejection)
        })?;
        if let Some(principal) = admitted.principal() {
            self.limiter.take_for(principal, admitted.subject())?;
        }
        Ok(admitted)
    }

    /// The answer to a proposal as a status, counting a cap the cell refused it for.
    fn answered(&self, result: Result<Result<Outcome, Rejection>, ProposeError>) -> Result<Outcome, Status> {
        if let Ok(Err(rejection)) = &result {
            self.count_cap(rejection);
        }
        answered(result)
    }

    /// Counts the cap `rejection` names, if it names one.
    fn count_cap(&self, rejection: &Rejection) {
        if let Rejection::CapReached { cap, .. } = rejection {
            self.metrics.cap_reached(*cap);
        }
    }

    /// Runs one write of the table in [`crate::ops`]: the caller's credential, then the command proposed as the caller,
    /// then the reply its outcome gives.
    async fn run<W: Write>(&self, request: Request<W>) -> Result<Response<W::Reply>, Status> {
        let actor = self.callers.actor(&request)?;
        let command = request.into_inner().command()?;
        let outcome = self.write(&actor, command).await?;
        W::reply(outcome).map(Response::new).map_err(|other| unexpected(&other))
    }

    /// Proposes a command as `actor` and waits for its outcome.
    #[allow(clippy::disallowed_methods, reason = "measures commit latency on the runtime's clock")]
    async fn write(&self, actor: &Actor, command: Command) -> Result<Outcome, Status> {
        let command = self.admit(actor, command)?;
        let started = tokio::time::Instant::now();
        let result = self.answered(self.node.propose(command).await);
        self.metrics.commit_latency.observe(started.elapsed().as_secs_f64());
        result
    }

    /// Answers from the leader's replica once it has applied every write acknowledged before the call, if `actor`
    /// passes `authorize` there (given the principal it is).
    async fn read<T>(
        &self,
        actor: &Actor,
        authorize: impl FnOnce(&Cell, &str) -> Result<(), Rejection>,
        read: impl FnOnce(&Cell) -> Result<T, Rejection>,
    ) -> Result<T, Status> {
        self.read_in(Scope::cell(), actor, authorize, read).await
    }

    /// The same for a caller in `scope`, whose refusal names what it named (the reading is done in stored names).
    async fn read_in<T>(
        &self,
        scope: Scope<'_>,
        actor: &Actor,
        authorize: impl FnOnce(&Cell, &str) -> Result<(), Rejection>,
        read: impl FnOnce(&Cell) -> Result<T, Rejection>,
    ) -> Result<T, Status> {
        // A read costs the leader a round of its cell (the barrier): it counts against the principal's rate as a
        // command does, before that round.
        let principal = self.principal(actor)?;
        self.limiter.take(&principal)?;
        self.node.read_barrier().await.map_err(from_propose)?;
        let replica = lock(&self.node)?;
        authorized(&replica.cell, actor, authorize)
            .and_then(|()| read(&replica.cell))
            .map_err(|rejection| from_rejection(&scope.rejection_out(rejection)))
    }

    /// The principal `actor` is on this node's replica: whose scope the call's names are in (see
    /// [`cellog_core::tenant`]).
    pub(crate) fn principal(&self, actor: &Actor) -> Result<Arc<str>, Status> {
        lock(&self.node)?.cell.authenticate(actor).map_err(|rejection| from_rejection(&rejection))
    }

    /// Refuses a call unless `actor` passes `authorize` on this node's replica (for what is not a command: a local
    /// read, a membership change).
    fn check(&self, actor: &Actor, authorize: impl FnOnce(&Cell, &str) -> Result<(), Rejection>) -> Result<(), Status> {
        let replica = lock(&self.node)?;
        authorized(&replica.cell, actor, authorize).map_err(|rejection| from_rejection(&rejection))
    }

    /// The payloads of `records` for an answer, read in one batched read from this node's storage after the apply or
    /// read, outside the replica's lock. Each is `None` when retention removed the message in between (it is
    /// answered as if the read came after the removal), `DATA_LOSS BODY_UNREADABLE` when this node's copy does not
    /// verify.
    pub(crate) fn payloads(&self, stream: &str, records: &[&Record]) -> Vec<Result<Option<bytes::Bytes>, Status>> {
        self.node.payloads(stream, records).into_iter().map(payload_answer).collect()
    }

    /// Deliveries with their payloads for the wire, their bodies read in one batched read under the stored name
    /// `stored`; one whose message was removed meanwhile is left out.
    fn deliveries_to_wire(
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
    fn feed(
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
    async fn acks(
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

    /// Takes one command's worth of `principal`'s rate on this node (a tail's opening, as a subscription's).
    #[cfg(not(madsim))]
    pub(crate) fn take_rate(&self, principal: &Arc<str>) -> Result<(), Status> {
        self.limiter.take(principal)
    }

    /// The node's status, without the state's digest.
    fn status(&self) -> Result<v1::ClusterStatusResponse, Status> {
        self.status_with(Digest::None)
    }

    /// The node's status, with as much of the state's digest as `digest` asks for. A digest encodes the whole state
    /// under the replica's lock, so only the calls that compare replicas ask for one.
    fn status_with(&self, digest: Digest) -> Result<v1::ClusterStatusResponse, Status> {
        let view = self.node.cluster_view();
        let (digest, parts) = match digest {
            Digest::None => (None, Vec::new()),
            Digest::Whole => (Some(self.node.digest().map_err(crate::status::interrupted)?.1), Vec::new()),
            Digest::Parts => {
                let (_, digest, parts) = self.node.digest_parts().map_err(crate::status::interrupted)?;
                (Some(digest), parts)
            }
        };
        let digest_parts =
            parts.into_iter().map(|(part, digest)| v1::DigestPart { part, digest: hex::encode(digest.0) }).collect();
        let nodes = view
            .members
            .into_iter()
            .map(|member| v1::NodeInfo {
                id: member.id,
                raft_addr: member.addrs.raft_addr,
                client_addr: member.addrs.client_addr,
                voter: member.voter,
                matched_index: member.matched_index,
            })
            .collect();
        let leader_addr = view.leader.as_ref().and_then(|(_, addrs)| addrs.as_ref());
        Ok(v1::ClusterStatusResponse {
            node_id: view.node_id,
            state: view.role,
            term: view.term,
            leader_id: view.leader.as_ref().map(|(id, _)| *id),
            leader_addr: leader_addr.map(|addrs| addrs.client_addr.clone()).unwrap_or_default(),
            last_log_index: view.last_log_index,
            applied_index: view.applied_index,
            nodes,
            repairing: view.repairing,
            apply_halted_at: view.apply_halted_at,
            state_digest: digest.map(|digest| hex::encode(digest.0)).unwrap_or_default(),
            digest_parts,
        })
    }

    async fn transaction<M>(
        &self,
        request: Request<M>,
        command: impl FnOnce(M) -> Command,
    ) -> Result<Response<v1::TransactionResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let response = match self.write(&actor, command(request.into_inner())).await? {
            Outcome::TransactionBegun | Outcome::TransactionPrepared => v1::TransactionResponse::default(),
            Outcome::TransactionCommitted { messages, next } => v1::TransactionResponse {
                messages: messages.iter().map(convert::publish_ack_to_wire).collect(),
                next: Some(convert::producer_to_wire(next)),
            },
            Outcome::TransactionAborted { next } => {
                v1::TransactionResponse { messages: Vec::new(), next: Some(convert::producer_to_wire(next)) }
            }
            other => return Err(unexpected(&other)),
        };
        Ok(Response::new(response))
    }

    /// Hands the admitted commands among `items` to Raft together, in order (see [`CellNode::submit_all`]), and returns
    /// one pending answer per item: a refused item answers its refusal. If nothing could be handed to Raft, every
    /// admitted item fails with the error, which is returned too.
    async fn submit_group(&self, items: Vec<Result<Admitted, Status>>) -> (Vec<Pending>, Option<ProposeError>) {
        let mut pending = Vec::with_capacity(items.len());
        let mut admitted = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Ok(command) => {
                    admitted.push(command);
                    pending.push(None);
                }
                Err(status) => pending.push(Some(Pending::Refused(status))),
            }
        }
        let n_admitted = admitted.len();
        let (answers, unqueued): (Vec<Pending>, _) = match self.node.submit_all(admitted).await {
            Ok(answers) => (answers.into_iter().map(Pending::Submitted).collect(), None),
            Err(error) => {
                let status = from_propose(error.clone());
                ((0..n_admitted).map(|_| Pending::Failed(status.clone())).collect(), Some(error))
            }
        };
        let mut answers = answers.into_iter();
        let pending = pending
            .into_iter()
            .map(|refused| refused.or_else(|| answers.next()).expect("an answer per admitted item"))
            .collect();
        (pending, unqueued)
    }

    /// Hands publishes of a batch to Raft as `actor`, together and in order, so that they share entries.
    async fn submit_publishes(&self, actor: &Actor, requests: Vec<v1::PublishRequest>) -> Vec<Pending> {
        let commands = requests.into_iter().map(|request| Ok(Command::Publish(convert::publish(request))));
        self.submit_group(self.admit_all(actor, commands)).await.0
    }

    /// Waits for publishes of a batch in order and answers each as its item.
    async fn publish_results(&self, pending: Vec<Pending>) -> Vec<v1::PublishResult> {
        let mut results = Vec::with_capacity(pending.len());
        for next in pending {
            results.push(self.publish_result(next).await);
        }
        results
    }

    /// Waits for one publish of a batch and answers it as its item.
    async fn publish_result(&self, pending: Pending) -> v1::PublishResult {
        let outcome = match pending {
            Pending::Submitted(answer) => self.answered(answer.wait().await),
            Pending::Refused(status) | Pending::Failed(status) => Err(status),
        };
        let result = match self.publish_answer(outcome) {
            Ok(ack) => v1::publish_result::Result::Ack(ack),
            Err(status) => v1::publish_result::Result::Error(to_item_error(&status)),
        };
        v1::PublishResult { result: Some(result) }
    }

    #[cfg(not(madsim))]
    /// Publishes `requests` as `actor` in their order, together as one `PublishBatch` request is, and answers each in
    /// place (the HTTP API's batch). If the node could not propose them, each answers that error.
    pub(crate) async fn publish_all(&self, actor: &Actor, requests: Vec<v1::PublishRequest>) -> Vec<v1::PublishResult> {
        let pending = self.submit_publishes(actor, requests).await;
        self.publish_results(pending).await
    }

    #[cfg(not(madsim))]
    /// What the console shows, from this node's replica without a read barrier (any node answers, as of what it
    /// applied): the streams `actor` may see with their consumers, and the node's view of the cell.
    pub(crate) fn overview(&self, actor: &Actor) -> Result<Overview, Status> {
        let streams = {
            let replica = lock(&self.node)?;
            let cell = &replica.cell;
            let principal = cell.authenticate(actor).map_err(|rejection| from_rejection(&rejection))?;
            let scope = Scope::of(&principal);
            let streams = visible_streams(cell, actor, true).map_err(|rejection| from_rejection(&rejection))?;
            let mut overview = Vec::with_capacity(streams.len());
            for (info, consumers) in streams {
                let named = info.name.to_string();
                let stored = scope.name_in(&named);
                // The groups the caller may see: those it may consume, or every one for an admin.
                let mut groups = Vec::new();
                for group in cell.group_names(&stored).map_err(|rejection| from_rejection(&rejection))? {
                    if sees_consumer(&stored, &group)(cell, &principal).is_ok() {
                        let group = cell.group_info(&stored, &group, cell.last_at());
                        groups.push(group_out(&named, scope, group.map_err(|rejection| from_rejection(&rejection))?));
                    }
                }
                let consumers =
                    consumers.into_iter().map(|consumer| convert::consumer_info_to_wire(&named, consumer)).collect();
                overview.push(StreamOverview { stream: convert::stream_info_to_wire(info), consumers, groups });
            }
            overview
        };
        Ok((streams, self.status()?))
    }

    #[cfg(not(madsim))]
    /// How this node treats callers (who a call's credential names).
    pub(crate) fn callers(&self) -> &Callers {
        &self.callers
    }

    #[cfg(not(madsim))]
    /// The node this API serves.
    pub(crate) fn node(&self) -> &Arc<CellNode<S>> {
        &self.node
    }

    fn publish_answer(&self, outcome: Result<Outcome, Status>) -> Result<v1::PublishAck, Status> {
        match outcome {
            Ok(Outcome::Published(ack)) => {
                self.metrics.published.inc();
                Ok(convert::publish_ack_to_wire(&ack))
            }
            Ok(Outcome::Staged { index, duplicate }) => {
                Ok(v1::PublishAck { duplicate, staged_index: Some(index), ..v1::PublishAck::default() })
            }
            Ok(other) => Err(unexpected(&other)),
            Err(status) => {
                self.metrics.publish_rejected.inc();
                Err(status)
            }
        }
    }
}

/// What the console shows: each visible stream, and the node's view of the cell.
#[cfg(not(madsim))]
pub(crate) type Overview = (Vec<StreamOverview>, v1::ClusterStatusResponse);

/// A stream as the console shows it: its info, its consumers, and its consumer groups.
#[cfg(not(madsim))]
pub(crate) struct StreamOverview {
    pub stream: v1::StreamInfo,
    pub consumers: Vec<v1::ConsumerInfo>,
    pub groups: Vec<v1::GroupInfo>,
}

/// How much of the applied state's digest a status gives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Digest {
    None,
    /// The whole state's.
    Whole,
    /// The whole state's and each part's.
    Parts,
}

/// One request of a `PublishBatch` call, handed to Raft and waiting to be answered.
enum Batch {
    /// Its messages, in order, and their room in the call's window.
    Submitted(Vec<Pending>, OwnedSemaphorePermit),
    /// The call ends here with this error.
    Ended(Status),
}

/// Waits for one submitted publish of a batch.
enum Pending {
    Submitted(Answer),
    /// Its principal may not publish it: refused alone, the batch goes on.
    Refused(Status),
    /// It could not be proposed: the batch ends here.
    Failed(Status),
}

#[tonic::async_trait]
impl<S: Storage + Clone> Cellog for CellogService<S> {
    async fn create_stream(
        &self,
        request: Request<v1::CreateStreamRequest>,
    ) -> Result<Response<v1::CreateStreamResponse>, Status> {
        self.run(request).await
    }

    async fn update_stream(
        &self,
        request: Request<v1::UpdateStreamRequest>,
    ) -> Result<Response<v1::UpdateStreamResponse>, Status> {
        self.run(request).await
    }

    async fn delete_stream(
        &self,
        request: Request<v1::DeleteStreamRequest>,
    ) -> Result<Response<v1::DeleteStreamResponse>, Status> {
        self.run(request).await
    }

    async fn list_streams(
        &self,
        request: Request<v1::ListStreamsRequest>,
    ) -> Result<Response<v1::ListStreamsResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let streams = self.read(&actor, anyone, |cell| visible_streams(cell, &actor, false)).await?;
        Ok(Response::new(v1::ListStreamsResponse {
            streams: streams.into_iter().map(|(info, _)| convert::stream_info_to_wire(info)).collect(),
        }))
    }

    async fn get_stream(&self, request: Request<v1::GetStreamRequest>) -> Result<Response<v1::StreamInfo>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let name = scope.name_in(&request.into_inner().name);
        let info = self.read_in(scope, &actor, sees_stream(&name), |cell| cell.stream_info(&name)).await?;
        Ok(Response::new(convert::stream_info_to_wire(scope.stream_info_out(info))))
    }

    async fn publish(&self, request: Request<v1::PublishRequest>) -> Result<Response<v1::PublishAck>, Status> {
        let actor = self.callers.actor(&request)?;
        let command = Command::Publish(convert::publish(request.into_inner()));
        let outcome = self.write(&actor, command).await;
        self.publish_answer(outcome).map(Response::new)
    }

    type PublishBatchStream = ServerStream<v1::PublishBatchResponse>;

    async fn publish_batch(
        &self,
        request: Request<Streaming<v1::PublishBatchRequest>>,
    ) -> Result<Response<Self::PublishBatchStream>, Status> {
        let actor = self.callers.actor(&request)?;
        let mut incoming = request.into_inner();
        // A permit per message submitted and not yet answered: the caller's stream is read no further ahead.
        let window = Arc::new(Semaphore::new(BATCH_WINDOW));
        let (batches, mut answers) = mpsc::channel::<Batch>(BATCH_WINDOW);
        let service = self.clone();
        // Submitting in arrival order keeps the log in the caller's order; answers are awaited in that order too.
        tokio::spawn(async move {
            loop {
                let next = match incoming.message().await {
                    Ok(Some(batch)) if batch.messages.len() > MAX_PUBLISH_BATCH => {
                        Batch::Ended(invalid_argument(format!(
                            "a PublishBatch request carries at most {MAX_PUBLISH_BATCH} messages, not {}",
                            batch.messages.len()
                        )))
                    }
                    Ok(Some(batch)) if batch.messages.is_empty() => continue,
                    Ok(Some(batch)) => {
                        let n = u32::try_from(batch.messages.len()).expect("bounded by MAX_PUBLISH_BATCH");
                        let Ok(permit) = window.clone().acquire_many_owned(n).await else { break };
                        Batch::Submitted(service.submit_publishes(&actor, batch.messages).await, permit)
                    }
                    Ok(None) => break,
                    Err(status) => Batch::Ended(invalid_argument(format!("the request stream broke: {status}"))),
                };
                // After messages that could not be proposed, the rest of the call is not tried; unless the disk was
                // full (RESOURCE_EXHAUSTED), which refuses each later message in place as well.
                let last = match &next {
                    Batch::Submitted(pending, _) => pending.iter().any(|next| {
                        matches!(next, Pending::Failed(status) if status.code() != tonic::Code::ResourceExhausted)
                    }),
                    Batch::Ended(_) => true,
                };
                if batches.send(next).await.is_err() || last {
                    break;
                }
            }
        });
        let service = self.clone();
        let results = futures::stream::poll_fn(move |context| answers.poll_recv(context)).then(move |batch| {
            let service = service.clone();
            async move {
                match batch {
                    Batch::Submitted(pending, permit) => {
                        let results = service.publish_results(pending).await;
                        drop(permit);
                        Ok(v1::PublishBatchResponse { results })
                    }
                    Batch::Ended(status) => Err(status),
                }
            }
        });
        Ok(Response::new(Box::pin(results)))
    }

    async fn read(&self, request: Request<v1::ReadRequest>) -> Result<Response<v1::ReadResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let mut request = request.into_inner();
        request.stream = scope.name_in(&request.stream);
        let max = match request.max {
            0 => 256,
            max => usize::try_from(max).unwrap_or(MAX_READ).min(MAX_READ),
        };
        let read = |cell: &Cell| cell.read_from(&request.stream, request.partition, request.from_seq, max);
        let authorize = |cell: &Cell, principal: &str| cell.authorize_read(principal, &request.stream);
        let records = if request.local {
            // A local read costs no barrier, but still a read of the replica: it counts against the rate as one.
            self.limiter.take(&principal)?;
            let replica = lock(&self.node)?;
            authorized(&replica.cell, &actor, authorize)
                .and_then(|()| read(&replica.cell))
                .map_err(|rejection| from_rejection(&scope.rejection_out(rejection)))?
        } else {
            self.read_in(scope, &actor, authorize, read).await?
        };
        let applied_index = lock(&self.node)?.last_applied.map_or(0, |log_id| log_id.index);
        let payloads = self.payloads(&request.stream, &records.iter().collect::<Vec<_>>());
        let mut messages = Vec::with_capacity(records.len());
        for (record, payload) in records.into_iter().zip(payloads) {
            // A message removed since it was read is one the read no longer finds.
            if let Some(payload) = payload? {
                messages.push(convert::record_to_wire(scope.record_out(record), payload));
            }
        }
        Ok(Response::new(v1::ReadResponse { messages, applied_index }))
    }

    async fn recall(&self, request: Request<v1::RecallRequest>) -> Result<Response<v1::RecallResponse>, Status> {
        self.run(request).await
    }

    async fn create_consumer(
        &self,
        request: Request<v1::CreateConsumerRequest>,
    ) -> Result<Response<v1::CreateConsumerResponse>, Status> {
        self.run(request).await
    }

    async fn update_consumer(
        &self,
        request: Request<v1::UpdateConsumerRequest>,
    ) -> Result<Response<v1::UpdateConsumerResponse>, Status> {
        self.run(request).await
    }

    async fn delete_consumer(
        &self,
        request: Request<v1::DeleteConsumerRequest>,
    ) -> Result<Response<v1::DeleteConsumerResponse>, Status> {
        self.run(request).await
    }

    async fn list_consumers(
        &self,
        request: Request<v1::ListConsumersRequest>,
    ) -> Result<Response<v1::ListConsumersResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let named = request.into_inner().stream;
        let stream = scope.name_in(&named);
        let consumers = self
            .read_in(scope, &actor, sees_stream(&stream), |cell| {
                let now = cell.last_at();
                let info = cell.stream_info(&stream)?;
                info.consumers.iter().map(|name| cell.consumer_info(&stream, name, now)).collect::<Result<Vec<_>, _>>()
            })
            .await?;
        Ok(Response::new(v1::ListConsumersResponse {
            consumers: consumers
                .into_iter()
                .map(|info| convert::consumer_info_to_wire(&named, scope.consumer_info_out(info)))
                .collect(),
        }))
    }

    async fn get_consumer(
        &self,
        request: Request<v1::GetConsumerRequest>,
    ) -> Result<Response<v1::ConsumerInfo>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let request = request.into_inner();
        let stream = scope.name_in(&request.stream);
        let info = self
            .read_in(scope, &actor, sees_consumer(&stream, &request.name), |cell| {
                cell.consumer_info(&stream, &request.name, cell.last_at())
            })
            .await?;
        Ok(Response::new(convert::consumer_info_to_wire(&request.stream, scope.consumer_info_out(info))))
    }

    async fn fetch(&self, request: Request<v1::FetchRequest>) -> Result<Response<v1::FetchResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let member = if request.member.is_empty() { DEFAULT_MEMBER.to_string() } else { request.member };
        let command = Command::Fetch {
            stream: request.stream.clone(),
            consumer: request.consumer,
            member,
            max: request.max.max(1),
        };
        let outcome = self.write(&actor, command).await?;
        // The deliveries come back in the caller's terms; the bodies are read under the stored name.
        let stored = Scope::of(&self.principal(&actor)?).name_in(&request.stream);
        match outcome {
            Outcome::Fetched(deliveries) => {
                Ok(Response::new(v1::FetchResponse { deliveries: self.deliveries_to_wire(&stored, deliveries)? }))
            }
            other => Err(unexpected(&other)),
        }
    }

    type SubscribeStream = ServerStream<v1::Delivery>;

    async fn subscribe(
        &self,
        request: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let window = match request.max_in_flight {
            0 => DEFAULT_SUBSCRIBE_WINDOW,
            window => window.min(MAX_FETCH),
        };
        let member = if request.member.is_empty() { DEFAULT_MEMBER.to_string() } else { request.member };
        // The fetches name the stream in the caller's terms (the cell translates them); this node reads the
        // consumer's state and the bodies under the stored name.
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let (stream, consumer) = (request.stream, request.consumer);
        let stored = scope.name_in(&stream);
        let (stored_name, consumer_name) = (stored.clone(), consumer.clone());
        // Fail at once on an unknown consumer or a node that does not lead.
        let may_consume = |cell: &Cell, principal: &str| {
            cell.authorize(principal, &Access::Consume { stream: &stored, consumer: &consumer })
        };
        self.read_in(scope, &actor, may_consume, |cell| cell.consumer_info(&stored, &consumer, cell.last_at())).await?;
        let probe = move |cell: &Cell| {
            cell.consumer_work(&stored_name, &consumer_name).map(|(work, pending)| (work, pending, false))
        };
        let fetch = move |room: u32| Command::Fetch {
            stream: stream.clone(),
            consumer: consumer.clone(),
            member: member.clone(),
            max: room,
        };
        self.feed(actor, principal, stored, window, probe, fetch)
    }

    async fn ack(&self, request: Request<v1::AckRequest>) -> Result<Response<v1::AckResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        self.acks(&actor, (request.stream, request.consumer), None, &request.acks).await
    }

    async fn commit_cursor(
        &self,
        request: Request<v1::CommitCursorRequest>,
    ) -> Result<Response<v1::CommitCursorResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::CommitCursor {
            stream: request.stream,
            consumer: request.consumer,
            partition: request.partition,
            next_seq: request.next_seq,
        };
        match self.write(&actor, command).await? {
            Outcome::CursorCommitted { next_seq } => Ok(Response::new(v1::CommitCursorResponse { next_seq })),
            other => Err(unexpected(&other)),
        }
    }

    async fn join_group(
        &self,
        request: Request<v1::JoinGroupRequest>,
    ) -> Result<Response<v1::GroupAssignment>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let session_timeout_ms = match request.session_timeout_ms {
            0 => convert::DEFAULT_SESSION_TIMEOUT_MS,
            timeout => timeout,
        };
        let command = Command::JoinGroup {
            stream: request.stream,
            group: request.group,
            member: request.member,
            strategy: convert::strategy(request.strategy)?,
            session_timeout_ms,
            config: convert::consumer_config(request.config)?,
        };
        match self.write(&actor, command).await? {
            Outcome::GroupAssignment(assignment) => Ok(Response::new(convert::assignment_to_wire(assignment))),
            other => Err(unexpected(&other)),
        }
    }

    async fn heartbeat(&self, request: Request<v1::HeartbeatRequest>) -> Result<Response<v1::GroupAssignment>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::Heartbeat {
            stream: request.stream,
            group: request.group,
            member: request.member,
            generation: request.generation,
            released: request.released,
        };
        match self.write(&actor, command).await? {
            Outcome::GroupAssignment(assignment) => Ok(Response::new(convert::assignment_to_wire(assignment))),
            other => Err(unexpected(&other)),
        }
    }

    async fn leave_group(
        &self,
        request: Request<v1::LeaveGroupRequest>,
    ) -> Result<Response<v1::LeaveGroupResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::LeaveGroup { stream: request.stream, group: request.group, member: request.member };
        match self.write(&actor, command).await? {
            Outcome::GroupLeft { was_member } => Ok(Response::new(v1::LeaveGroupResponse { was_member })),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_groups(
        &self,
        request: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let named = request.into_inner().stream;
        let stream = scope.name_in(&named);
        let groups = self
            .read_in(scope, &actor, sees_stream(&stream), |cell| {
                let now = cell.last_at();
                let names = cell.group_names(&stream)?;
                names.iter().map(|name| cell.group_info(&stream, name, now)).collect::<Result<Vec<_>, _>>()
            })
            .await?;
        Ok(Response::new(v1::ListGroupsResponse {
            groups: groups.into_iter().map(|info| group_out(&named, scope, info)).collect(),
        }))
    }

    async fn get_group(&self, request: Request<v1::GetGroupRequest>) -> Result<Response<v1::GroupInfo>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let request = request.into_inner();
        let stream = scope.name_in(&request.stream);
        let info = self
            .read_in(scope, &actor, sees_consumer(&stream, &request.group), |cell| {
                cell.group_info(&stream, &request.group, cell.last_at())
            })
            .await?;
        Ok(Response::new(group_out(&request.stream, scope, info)))
    }

    async fn member_fetch(
        &self,
        request: Request<v1::MemberFetchRequest>,
    ) -> Result<Response<v1::MemberFetchResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let stored = Scope::of(&self.principal(&actor)?).name_in(&request.stream);
        let command = Command::MemberFetch {
            stream: request.stream,
            group: request.group,
            member: request.member,
            generation: request.generation,
            max: request.max.max(1),
        };
        match self.write(&actor, command).await? {
            Outcome::MemberFetched { generation, deliveries } => Ok(Response::new(v1::MemberFetchResponse {
                generation,
                deliveries: self.deliveries_to_wire(&stored, deliveries)?,
            })),
            other => Err(unexpected(&other)),
        }
    }

    type MemberSubscribeStream = ServerStream<v1::Delivery>;

    async fn member_subscribe(
        &self,
        request: Request<v1::MemberSubscribeRequest>,
    ) -> Result<Response<Self::MemberSubscribeStream>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let window = match request.max_in_flight {
            0 => DEFAULT_SUBSCRIBE_WINDOW,
            window => window.min(MAX_FETCH),
        };
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let stored = scope.name_in(&request.stream);
        let (group, member, generation) = (request.group, request.member, request.generation);
        let may_consume = |cell: &Cell, principal: &str| {
            cell.authorize(principal, &Access::Consume { stream: &stored, consumer: &group })
        };
        // Fail at once on an unknown group or member, or a node that does not lead.
        self.read_in(scope, &actor, may_consume, |cell| cell.member_work(&stored, &group, &member, generation)).await?;
        let (stored_name, group_name, member_name) = (stored.clone(), group.clone(), member.clone());
        // Ends once the group moves past the generation the member subscribed with: its assignment may have changed.
        let probe = move |cell: &Cell| {
            cell.member_work(&stored_name, &group_name, &member_name, generation)
                .map(|(work, pending, current)| (work, pending, current != generation))
        };
        let stream = request.stream;
        let fetch = move |room: u32| Command::MemberFetch {
            stream: stream.clone(),
            group: group.clone(),
            member: member.clone(),
            generation,
            max: room,
        };
        self.feed(actor, principal, stored, window, probe, fetch)
    }

    async fn member_ack(&self, request: Request<v1::MemberAckRequest>) -> Result<Response<v1::AckResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let member = GroupMember { member: request.member, generation: request.generation };
        self.acks(&actor, (request.stream, request.group), Some(member), &request.acks).await
    }

    async fn member_commit(
        &self,
        request: Request<v1::MemberCommitRequest>,
    ) -> Result<Response<v1::CommitCursorResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::MemberCommit {
            stream: request.stream,
            group: request.group,
            member: request.member,
            generation: request.generation,
            partition: request.partition,
            next_seq: request.next_seq,
        };
        match self.write(&actor, command).await? {
            Outcome::CursorCommitted { next_seq } => Ok(Response::new(v1::CommitCursorResponse { next_seq })),
            other => Err(unexpected(&other)),
        }
    }

    async fn register_peer(
        &self,
        request: Request<v1::RegisterPeerRequest>,
    ) -> Result<Response<v1::RegisterPeerResponse>, Status> {
        self.run(request).await
    }

    async fn peer_progress(
        &self,
        request: Request<v1::PeerProgressRequest>,
    ) -> Result<Response<v1::PeerProgressResponse>, Status> {
        self.run(request).await
    }

    async fn unregister_peer(
        &self,
        request: Request<v1::UnregisterPeerRequest>,
    ) -> Result<Response<v1::UnregisterPeerResponse>, Status> {
        self.run(request).await
    }

    async fn init_producer(
        &self,
        request: Request<v1::InitProducerRequest>,
    ) -> Result<Response<v1::ProducerRef>, Status> {
        self.run(request).await
    }

    async fn begin_transaction(
        &self,
        request: Request<v1::ProducerRef>,
    ) -> Result<Response<v1::TransactionResponse>, Status> {
        self.transaction(request, |r| Command::BeginTransaction(convert::producer(r))).await
    }

    async fn prepare_transaction(
        &self,
        request: Request<v1::ProducerRef>,
    ) -> Result<Response<v1::TransactionResponse>, Status> {
        self.transaction(request, |r| Command::PrepareTransaction(convert::producer(r))).await
    }

    async fn commit_transaction(
        &self,
        request: Request<v1::ProducerRef>,
    ) -> Result<Response<v1::TransactionResponse>, Status> {
        self.transaction(request, |r| Command::CommitTransaction(convert::producer(r))).await
    }

    async fn abort_transaction(
        &self,
        request: Request<v1::ProducerRef>,
    ) -> Result<Response<v1::TransactionResponse>, Status> {
        self.transaction(request, |r| Command::AbortTransaction(convert::producer(r))).await
    }

    async fn cluster_status(
        &self,
        request: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let digest = match (request.digest_parts, request.state_digest) {
            (true, _) => Digest::Parts,
            (false, true) => Digest::Whole,
            (false, false) => Digest::None,
        };
        // A digest encodes the whole state under the replica's lock (applying waits), and the parts name every stream
        // and consumer of the cell, every tenant's included: cluster admin only. Anyone else learns the members'
        // client addresses (a client routes by them) but not the peer port's.
        let admin = self.check(&actor, cluster_admin);
        if digest != Digest::None {
            admin.clone()?;
        }
        self.check(&actor, anyone)?;
        let mut status = self.status_with(digest)?;
        if admin.is_err() {
            for node in &mut status.nodes {
                node.raft_addr.clear();
            }
        }
        Ok(Response::new(status))
    }

    async fn add_learner(
        &self,
        request: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        for (what, addr) in [("raft_addr", &request.raft_addr), ("client_addr", &request.client_addr)] {
            let port =
                addr.rsplit_once(':').filter(|(host, _)| !host.is_empty() && !host.contains(char::is_whitespace));
            if port.is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
                return Err(invalid_argument(format!("a learner's {what} is HOST:PORT, not {addr:?}")));
            }
        }
        self.check(&actor, cluster_admin)?;
        let node = NodeAddrs::new(request.raft_addr, request.client_addr);
        self.node.add_learner(request.node_id, node).await.map_err(membership_error)?;
        Ok(Response::new(self.status()?))
    }

    async fn promote(
        &self,
        request: Request<v1::PromoteRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        self.check(&actor, cluster_admin)?;
        self.node.promote(request.into_inner().node_id).await.map_err(membership_error)?;
        Ok(Response::new(self.status()?))
    }

    async fn remove_node(
        &self,
        request: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        self.check(&actor, cluster_admin)?;
        self.node.remove(request.into_inner().node_id).await.map_err(membership_error)?;
        Ok(Response::new(self.status()?))
    }

    async fn put_principal(
        &self,
        request: Request<v1::PutPrincipalRequest>,
    ) -> Result<Response<v1::PutPrincipalResponse>, Status> {
        self.run(request).await
    }

    async fn delete_principal(
        &self,
        request: Request<v1::DeletePrincipalRequest>,
    ) -> Result<Response<v1::DeletePrincipalResponse>, Status> {
        self.run(request).await
    }

    async fn list_principals(
        &self,
        request: Request<v1::ListPrincipalsRequest>,
    ) -> Result<Response<v1::ListPrincipalsResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let principals = self
            .read(&actor, cluster_admin, |cell| {
                Ok(cell.principals().into_iter().map(|principal| convert::principal_to_wire(cell, principal)).collect())
            })
            .await?;
        Ok(Response::new(v1::ListPrincipalsResponse { principals }))
    }

    async fn add_token(&self, request: Request<v1::AddTokenRequest>) -> Result<Response<v1::AddTokenResponse>, Status> {
        self.run(request).await
    }

    async fn revoke_token(
        &self,
        request: Request<v1::RevokeTokenRequest>,
    ) -> Result<Response<v1::RevokeTokenResponse>, Status> {
        self.run(request).await
    }

    async fn revoke_certificate(
        &self,
        request: Request<v1::RevokeCertificateRequest>,
    ) -> Result<Response<v1::RevokeCertificateResponse>, Status> {
        self.run(request).await
    }

    async fn list_revoked_certificates(
        &self,
        request: Request<v1::ListRevokedCertificatesRequest>,
    ) -> Result<Response<v1::ListRevokedCertificatesResponse>, Status> {
        self.list_revoked_certificates_op(request).await
    }

    async fn grant_mirror(
        &self,
        request: Request<v1::GrantMirrorRequest>,
    ) -> Result<Response<v1::GrantMirrorResponse>, Status> {
        self.run(request).await
    }

    async fn set_quotas(
        &self,
        request: Request<v1::SetQuotasRequest>,
    ) -> Result<Response<v1::SetQuotasResponse>, Status> {
        self.run(request).await
    }

    async fn list_quotas(
        &self,
        request: Request<v1::ListQuotasRequest>,
    ) -> Result<Response<v1::ListQuotasResponse>, Status> {
        self.list_quotas_op(request).await
    }

    async fn who_am_i(&self, request: Request<v1::WhoAmIRequest>) -> Result<Response<v1::Principal>, Status> {
        let actor = self.callers.actor(&request)?;
        let me = self
            .read(&actor, anyone, |cell| {
                let principal = cell.authenticate(&actor)?;
                cell.principals()
                    .into_iter()
                    .find(|(name, ..)| *name == principal)
                    .map(|me| convert::principal_to_wire(cell, me))
                    .ok_or(Rejection::PrincipalNotFound { principal: principal.to_string() })
            })
            .await?;
        Ok(Response::new(me))
    }

    async fn put_cell(&self, request: Request<v1::PutCellRequest>) -> Result<Response<v1::PutCellResponse>, Status> {
        self.run(request).await
    }

    async fn place_stream(&self, request: Request<v1::PlaceStreamRequest>) -> Result<Response<v1::Placement>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::PlaceStream { stream: request.stream.clone(), cell: request.cell };
        self.placed(&actor, &request.stream, command).await
    }

    async fn move_stream(&self, request: Request<v1::MoveStreamRequest>) -> Result<Response<v1::Placement>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::MoveStream { stream: request.stream.clone(), to: request.to, epoch: request.epoch };
        self.placed(&actor, &request.stream, command).await
    }

    async fn finish_move(&self, request: Request<v1::FinishMoveRequest>) -> Result<Response<v1::Placement>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::FinishMove { stream: request.stream.clone(), epoch: request.epoch };
        self.placed(&actor, &request.stream, command).await
    }

    async fn unplace_stream(
        &self,
        request: Request<v1::UnplaceStreamRequest>,
    ) -> Result<Response<v1::UnplaceStreamResponse>, Status> {
        self.run(request).await
    }

    async fn locate_stream(
        &self,
        request: Request<v1::LocateStreamRequest>,
    ) -> Result<Response<v1::StreamLocation>, Status> {
        let actor = self.callers.actor(&request)?;
        // A tenant's principal locates its own tenant's streams, by the names it uses for them: never another's.
        let principal = self.principal(&actor)?;
        let scope = Scope::of(&principal);
        let named = request.into_inner().stream;
        let stream = scope.name_in(&named);
        let location = self
            .read_in(scope, &actor, anyone, |cell| {
                let directory = cell.directory();
                let placement =
                    directory.placement(&stream).ok_or_else(|| Rejection::NotPlaced { stream: stream.clone() })?;
                let addresses = directory.cell(&placement.cell).map(<[String]>::to_vec).unwrap_or_default();
                Ok(v1::StreamLocation { placement: Some(convert::placement_to_wire(&named, placement)), addresses })
            })
            .await?;
        Ok(Response::new(location))
    }

    async fn list_cells(
        &self,
        request: Request<v1::ListCellsRequest>,
    ) -> Result<Response<v1::ListCellsResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let cells = self
            .read(&actor, anyone, |cell| {
                let cells = cell.directory().cells();
                Ok(cells
                    .map(|(cell, addresses)| v1::CellAddresses {
                        cell: cell.to_string(),
                        addresses: addresses.to_vec(),
                    })
                    .collect())
            })
            .await?;
        Ok(Response::new(v1::ListCellsResponse { cells }))
    }

    async fn fence_stream(
        &self,
        request: Request<v1::FenceStreamRequest>,
    ) -> Result<Response<v1::StreamOwnership>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::FenceStream { stream: request.stream.clone(), epoch: request.epoch, to: request.to };
        self.owned(&actor, &request.stream, command).await
    }

    async fn receive_stream(
        &self,
        request: Request<v1::ReceiveStreamRequest>,
    ) -> Result<Response<v1::StreamOwnership>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let config = request.config.map(|config| convert::stream_config(Some(config))).transpose()?;
        let command =
            Command::ReceiveStream { stream: request.stream.clone(), epoch: request.epoch, from: request.from, config };
        self.owned(&actor, &request.stream, command).await
    }

    async fn accept_stream(
        &self,
        request: Request<v1::AcceptStreamRequest>,
    ) -> Result<Response<v1::StreamOwnership>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command =
            Command::AcceptStream { stream: request.stream.clone(), epoch: request.epoch, through: request.through };
        self.owned(&actor, &request.stream, command).await
    }

    async fn ingest_messages(
        &self,
        request: Request<v1::IngestMessagesRequest>,
    ) -> Result<Response<v1::IngestMessagesResponse>, Status> {
        self.run(request).await
    }

    async fn get_ownership(
        &self,
        request: Request<v1::GetOwnershipRequest>,
    ) -> Result<Response<v1::StreamOwnership>, Status> {
        let actor = self.callers.actor(&request)?;
        let stream = request.into_inner().stream;
        let ownership = self
            .read(&actor, cluster_admin, |cell| {
                let last_seqs =
                    cell.stream_info(&stream).map(|info| info.partitions.iter().map(|p| p.high_watermark).collect());
                Ok(convert::ownership_to_wire(&stream, cell.ownership(&stream), last_seqs.unwrap_or_default()))
            })
            .await?;
        Ok(Response::new(ownership))
    }

    async fn create_mirror(
        &self,
        request: Request<v1::CreateMirrorRequest>,
    ) -> Result<Response<v1::CreateMirrorResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let config = convert::stream_config(request.config)?;
        let source = MirrorSource {
            cell: request.source_cell,
            stream: request.source_stream,
            addresses: request.source_addresses,
        };
        match self.write(&actor, Command::CreateMirror { name: request.name, config, source }).await? {
            Outcome::StreamCreated { created } => Ok(Response::new(v1::CreateMirrorResponse { created })),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_mirrors(
        &self,
        request: Request<v1::ListMirrorsRequest>,
    ) -> Result<Response<v1::ListMirrorsResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let figures = self.metrics.mirrors.figures();
        let mirrors = self
            .read(&actor, cluster_admin, |cell| {
                let mirrors = cell.mirrors().map(|(name, mirror)| {
                    let last_seqs =
                        cell.stream_info(name).map(|info| info.partitions.iter().map(|p| p.high_watermark).collect());
                    crate::mirror::mirror_to_wire(name, mirror, last_seqs.unwrap_or_default(), figures.get(&**name))
                });
                Ok(mirrors.collect())
            })
            .await?;
        Ok(Response::new(v1::ListMirrorsResponse { mirrors }))
    }

    async fn register_mirror(
        &self,
        request: Request<v1::RegisterMirrorRequest>,
    ) -> Result<Response<v1::RegisterMirrorResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        match self.write(&actor, Command::RegisterMirror { stream: request.stream, peer: request.peer }).await? {
            Outcome::PeerRegistered => Ok(Response::new(v1::RegisterMirrorResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    async fn mirror_read(
        &self,
        request: Request<v1::MirrorReadRequest>,
    ) -> Result<Response<v1::MirrorReadResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let max = match request.max {
            0 => 256,
            max => usize::try_from(max).unwrap_or(MAX_READ).min(MAX_READ),
        };
        let (stream, peer) = (&request.stream, &request.peer);
        let read = self
            .read(
                &actor,
                |cell, principal| cell.authorize_mirror(principal, stream),
                |cell| cell.mirror_read(stream, peer, &request.from, max, MAX_RESPONSE_BYTES, request.recalls_from),
            )
            .await?;
        let MirrorRead { records, mut scanned, last_seqs, recalls, recalls_next } = read;
        let payloads = self.payloads(stream, &records.iter().collect::<Vec<_>>());
        let mut messages = Vec::with_capacity(records.len());
        let mut cut = vec![false; scanned.len()];
        for (record, payload) in records.into_iter().zip(payloads) {
            let p = record.partition as usize;
            if cut[p] {
                continue;
            }
            match payload? {
                Some(payload) => messages.push(convert::record_to_wire(record, payload)),
                // Removed (recalled) since the read: the answer for its partition ends before it, and the next read
                // finds it recalled.
                None => {
                    cut[p] = true;
                    scanned[p] = record.seq - 1;
                }
            }
        }
        let recalls = recalls
            .into_iter()
            .map(|recall| v1::LoggedRecall { number: recall.number, partition: recall.partition, seq: recall.seq })
            .collect();
        Ok(Response::new(v1::MirrorReadResponse { messages, scanned, last_seqs, recalls, recalls_next }))
    }

    async fn mirror_progress(
        &self,
        request: Request<v1::MirrorProgressRequest>,
    ) -> Result<Response<v1::MirrorProgressResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let request = request.into_inner();
        let command = Command::MirrorProgress {
            stream: request.stream,
            peer: request.peer,
            received: request.received,
            recalls_applied: request.recalls_applied,
        };
        match self.write(&actor, command).await? {
            Outcome::PeerProgressed => Ok(Response::new(v1::MirrorProgressResponse {})),
            other => Err(unexpected(&other)),
        }
    }
}

impl<S: Storage + Clone> CellogService<S> {
    /// Proposes a directory command answered with a placement.
    async fn placed(&self, actor: &Actor, stream: &str, command: Command) -> Result<Response<v1::Placement>, Status> {
        match self.write(actor, command).await? {
            Outcome::Placed(placement) => Ok(Response::new(convert::placement_to_wire(stream, &placement))),
            other => Err(unexpected(&other)),
        }
    }

    /// Proposes an ownership command answered with the stream's ownership here.
    async fn owned(
        &self,
        actor: &Actor,
        stream: &str,
        command: Command,
    ) -> Result<Response<v1::StreamOwnership>, Status> {
        match self.write(actor, command).await? {
            Outcome::Ownership { ownership, last_seqs } => {
                Ok(Response::new(convert::ownership_to_wire(stream, &ownership, last_seqs)))
            }
            other => Err(unexpected(&other)),
        }
    }
}

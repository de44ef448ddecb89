//! The client API (`cellog.v1.Cellog`) of a node. Writes are proposed to the cell and answered when committed on a
//! quorum and applied; reads are answered by the leader after a read barrier (or by any node from its own replica,
//! when asked for a local read). A node that does not lead answers `UNAVAILABLE` with the leader's address.

use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use cellog_client::limits::MAX_PUBLISH_BATCH;
use cellog_client::status::failed;
use cellog_core::{
    Access, Actor, Cell, Command, GroupMember, MAX_FETCH, MAX_READ, MAX_RESPONSE_BYTES, MirrorRead, Outcome, Record,
    Rejection, Scope,
};
use cellog_proto::v1::{self, cellog_server::Cellog};
use cellog_raft::storage::Storage;
use cellog_raft::{Admitted, BodyError, CellNode, Door, MembershipError, NodeAddrs, ProposeError, Replica};
use futures::{Stream, StreamExt};
use tokio::sync::{Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Callers, Limiter, Rates};
use crate::convert;
use crate::limits::{Limits, PerPrincipal};
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

mod cluster_status;
mod governance;
mod publish;
mod subscribe;

use cluster_status::Digest;
use publish::{Batch, Pending};

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

    /// Takes one command's worth of `principal`'s rate on this node (a tail's opening, as a subscription's).
    #[cfg(not(madsim))]
    pub(crate) fn take_rate(&self, principal: &Arc<str>) -> Result<(), Status> {
        self.limiter.take(principal)
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
        self.run(request).await
    }

    async fn join_group(
        &self,
        request: Request<v1::JoinGroupRequest>,
    ) -> Result<Response<v1::GroupAssignment>, Status> {
        self.run(request).await
    }

    async fn heartbeat(&self, request: Request<v1::HeartbeatRequest>) -> Result<Response<v1::GroupAssignment>, Status> {
        self.run(request).await
    }

    async fn leave_group(
        &self,
        request: Request<v1::LeaveGroupRequest>,
    ) -> Result<Response<v1::LeaveGroupResponse>, Status> {
        self.run(request).await
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
        self.run(request).await
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
        self.run(request).await
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
        self.run(request).await
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
        self.run(request).await
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

//! The client library: connects to any node of a cell, follows the leader, and retries what is safe to retry.
//!
//! What is retried: a call refused because the node does not lead (it never reached the log) goes to the named leader; a
//! node that is down or has no leader yet is retried on the next known node with backoff; a rate limit or a full
//! store is retried after the advised delay. A call whose outcome is unknown (the connection broke after it was
//! sent) is retried only when it is idempotent: a publish with a message id (the retry deduplicates to the original
//! sequence), a read, an ack. Everything else is returned as it came.
//!
//! This file holds [`Client`] and its calls, one method per RPC; where a call goes and how it is retried is in
//! `route.rs`, pipelined publishing in `batch.rs`, the options in `options.rs`.

#![allow(
    clippy::disallowed_methods,
    reason = "retry deadlines use the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cellog_proto::v1::{self, cellog_client::CellogClient};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request};

pub use crate::batch::BatchResult;
pub use crate::error::ClientError;
use crate::error::protocol_mismatch;
pub use crate::options::{ClientOptions, ClientTls, DISCOVERY_INTERVAL, SUSPECT_AFTER};
pub use crate::route::Client;
pub use crate::route::node_api;
use crate::route::{Route, cellog, connect};
use crate::status::from_item_error;
use crate::token;

/// The error one item of a batch answer (an ack, a publish of a batch) carries, as a [`ClientError`].
pub fn item_error(error: v1::Error) -> ClientError {
    from_item_error(error).into()
}

/// The items of an ack call's answer, each refusal settled as [`ClientError::settle`] does: when an earlier attempt
/// got no answer, an ack the answered attempt refused may have been applied by that one.
fn settle_items(mut results: Vec<v1::AckResult>, earlier_unknown: bool) -> Vec<v1::AckResult> {
    if earlier_unknown {
        for result in &mut results {
            if let Some(v1::ack_result::Result::Error(error)) = &mut result.result {
                let settled = ClientError::settle(item_error(error.clone()), true);
                if let ClientError::Indefinite { .. } = settled {
                    *error = outcome_unknown_item(&settled);
                }
            }
        }
    }
    results
}

/// An item error that says its outcome is unknown (`UNKNOWN`, `OUTCOME_UNKNOWN`), with why.
fn outcome_unknown_item(error: &ClientError) -> v1::Error {
    let detail = v1::ErrorDetail {
        reason: "OUTCOME_UNKNOWN".to_string(),
        message: error.to_string(),
        ..v1::ErrorDetail::default()
    };
    v1::Error { code: Code::Unknown as i32, detail: Some(detail) }
}

impl Client {
    /// A client of the cell whose nodes include `addrs` (`host:port`). Connections are made on first use.
    pub fn new(
        addrs: impl IntoIterator<Item = impl Into<String>>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let addrs: Vec<String> = addrs.into_iter().map(Into::into).collect();
        if addrs.is_empty() {
            return Err(ClientError::NoNodes);
        }
        for addr in &addrs {
            connect(addr, options.tls.as_ref())?;
        }
        let bearer = match &options.token {
            Some(token) => {
                token::check(token).map_err(|reason| ClientError::Credential { reason })?;
                let value = format!("{}{token}", token::BEARER);
                Some(value.parse().map_err(|_| ClientError::Credential { reason: "not a header value".to_string() })?)
            }
            None => None,
        };
        Ok(Client { route: Arc::new(Mutex::new(Route::new(addrs))), options, bearer })
    }

    /// Seals `payload` for `recipients` (cells) and stores it in this cell's outbox for delivery. An `envelope_id`
    /// makes a retry safe: the same id is stored once.
    pub async fn send_sealed(
        &self,
        recipients: &[String],
        payload: Bytes,
        envelope_id: Option<&str>,
    ) -> Result<v1::SendSealedResponse, ClientError> {
        let request = v1::SendSealedRequest {
            recipients: recipients.to_vec(),
            payload,
            envelope_id: envelope_id.unwrap_or_default().to_string(),
        };
        self.call_mail(envelope_id.is_some(), request, |mut c, r| async move { c.send_sealed(r).await }).await
    }

    /// Each recipient's result for an envelope this cell sent.
    pub async fn delivery_status(&self, envelope_id: &str) -> Result<v1::DeliveryStatusResponse, ClientError> {
        let request = v1::DeliveryStatusRequest { envelope_id: envelope_id.to_string() };
        self.call_mail(true, request, |mut c, r| async move { c.delivery_status(r).await }).await
    }

    /// Hands an envelope to this cell (cell to cell; a repeat is stored once).
    pub async fn deliver(&self, envelope: Bytes) -> Result<v1::DeliverResponse, ClientError> {
        let request = v1::DeliverRequest { envelope };
        self.call_mail(true, request, |mut c, r| async move { c.deliver(r).await }).await
    }

    /// This cell's inbox from `from_seq` on, opened.
    pub async fn read_mail(&self, from_seq: u64, max: u32) -> Result<Vec<v1::OpenedMail>, ClientError> {
        let request = v1::ReadMailRequest { from_seq, max };
        Ok(self.call_mail(true, request, |mut c, r| async move { c.read_mail(r).await }).await?.mail)
    }

    /// Replaces a stored message's payload with a tombstone (its id stays remembered).
    pub async fn recall(&self, stream: &str, partition: u32, seq: u64) -> Result<(), ClientError> {
        let request = v1::RecallRequest { stream: stream.to_string(), partition, seq };
        self.call(true, request, |mut c, r| async move { c.recall(r).await }).await?;
        Ok(())
    }

    /// Creates a stream (the same config again is a success with `created` false).
    pub async fn create_stream(&self, name: &str, config: v1::StreamConfig) -> Result<bool, ClientError> {
        let request = v1::CreateStreamRequest { name: name.to_string(), config: Some(config) };
        let response = self.call(true, request, |mut c, r| async move { c.create_stream(r).await }).await?;
        Ok(response.created)
    }

    /// Changes a stream's limits.
    pub async fn update_stream(&self, name: &str, config: v1::StreamConfig) -> Result<(), ClientError> {
        let request = v1::UpdateStreamRequest { name: name.to_string(), config: Some(config) };
        self.call(true, request, |mut c, r| async move { c.update_stream(r).await }).await?;
        Ok(())
    }

    /// Deletes a stream and everything in it.
    pub async fn delete_stream(&self, name: &str) -> Result<(), ClientError> {
        let request = v1::DeleteStreamRequest { name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_stream(r).await }).await?;
        Ok(())
    }

    /// Every stream.
    pub async fn list_streams(&self) -> Result<Vec<v1::StreamInfo>, ClientError> {
        let response =
            self.call(true, v1::ListStreamsRequest {}, |mut c, r| async move { c.list_streams(r).await }).await?;
        Ok(response.streams)
    }

    /// One stream.
    pub async fn stream_info(&self, name: &str) -> Result<v1::StreamInfo, ClientError> {
        let request = v1::GetStreamRequest { name: name.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_stream(r).await }).await
    }

    /// Publishes one message. With a message id it is retried through failovers and lands exactly once.
    pub async fn publish(&self, request: v1::PublishRequest) -> Result<v1::PublishAck, ClientError> {
        let idempotent = request.msg_id.is_some();
        self.call(idempotent, request, |mut c, r| async move { c.publish(r).await }).await
    }

    /// Reads stored messages of a partition from `from_seq` on; `local` reads this node's replica as it is.
    pub async fn read(
        &self,
        stream: &str,
        partition: u32,
        from_seq: u64,
        max: u32,
        local: bool,
    ) -> Result<v1::ReadResponse, ClientError> {
        let request = v1::ReadRequest { stream: stream.to_string(), partition, from_seq, max, local };
        if local {
            // A local read is about this node: never redirected.
            return Ok(self.current()?.read(self.request(request)).await?.into_inner());
        }
        self.call(true, request, |mut c, r| async move { c.read(r).await }).await
    }

    /// Creates a consumer (the same config again is a success with `created` false).
    pub async fn create_consumer(
        &self,
        stream: &str,
        name: &str,
        config: v1::ConsumerConfig,
    ) -> Result<bool, ClientError> {
        let request =
            v1::CreateConsumerRequest { stream: stream.to_string(), name: name.to_string(), config: Some(config) };
        let response = self.call(true, request, |mut c, r| async move { c.create_consumer(r).await }).await?;
        Ok(response.created)
    }

    /// Changes a consumer's ack wait, max deliver and max in flight (its filter and deliver policy are fixed).
    pub async fn update_consumer(
        &self,
        stream: &str,
        name: &str,
        config: v1::ConsumerConfig,
    ) -> Result<(), ClientError> {
        let request =
            v1::UpdateConsumerRequest { stream: stream.to_string(), name: name.to_string(), config: Some(config) };
        self.call(true, request, |mut c, r| async move { c.update_consumer(r).await }).await?;
        Ok(())
    }

    /// Deletes a consumer.
    pub async fn delete_consumer(&self, stream: &str, name: &str) -> Result<(), ClientError> {
        let request = v1::DeleteConsumerRequest { stream: stream.to_string(), name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_consumer(r).await }).await?;
        Ok(())
    }

    /// Creates principal `name` with `grants`, or replaces an existing one's grants (its tokens stay). Returns whether
    /// it was created.
    pub async fn put_principal(&self, name: &str, grants: v1::Grants) -> Result<bool, ClientError> {
        let request = v1::PutPrincipalRequest { name: name.to_string(), grants: Some(grants) };
        Ok(self.call(true, request, |mut c, r| async move { c.put_principal(r).await }).await?.created)
    }

    /// Deletes a principal and its tokens.
    pub async fn delete_principal(&self, name: &str) -> Result<(), ClientError> {
        let request = v1::DeletePrincipalRequest { name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_principal(r).await }).await?;
        Ok(())
    }

    /// The cell's principals, in name order.
    pub async fn list_principals(&self) -> Result<Vec<v1::Principal>, ClientError> {
        let request = v1::ListPrincipalsRequest {};
        Ok(self.call(true, request, |mut c, r| async move { c.list_principals(r).await }).await?.principals)
    }

    /// Gives `principal` the token whose SHA-256 is `token_sha256` (see [`crate::token::hash`]).
    pub async fn add_token(&self, principal: &str, token_sha256: [u8; 32]) -> Result<(), ClientError> {
        let request = v1::AddTokenRequest {
            principal: principal.to_string(),
            token_sha256: Bytes::copy_from_slice(&token_sha256),
        };
        self.call(true, request, |mut c, r| async move { c.add_token(r).await }).await?;
        Ok(())
    }

    /// Revokes the token whose SHA-256 is `token_sha256`.
    pub async fn revoke_token(&self, token_sha256: [u8; 32]) -> Result<(), ClientError> {
        let request = v1::RevokeTokenRequest { token_sha256: Bytes::copy_from_slice(&token_sha256) };
        self.call(false, request, |mut c, r| async move { c.revoke_token(r).await }).await?;
        Ok(())
    }

    /// The caller's principal and grants.
    pub async fn who_am_i(&self) -> Result<v1::Principal, ClientError> {
        self.call(true, v1::WhoAmIRequest {}, |mut c, r| async move { c.who_am_i(r).await }).await
    }

    /// Registers a peer of `stream` (a mirror, another cell): retention keeps what it has not received. Registering
    /// a registered peer changes nothing.
    pub async fn register_peer(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::RegisterPeerRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(true, request, |mut c, r| async move { c.register_peer(r).await }).await?;
        Ok(())
    }

    /// Records that `peer` has received `partition` of `stream` up to `received_seq` (the watermark never goes back,
    /// so a repeat is harmless).
    pub async fn peer_progress(
        &self,
        stream: &str,
        peer: &str,
        partition: u32,
        received_seq: u64,
    ) -> Result<(), ClientError> {
        let request =
            v1::PeerProgressRequest { stream: stream.to_string(), peer: peer.to_string(), partition, received_seq };
        self.call(true, request, |mut c, r| async move { c.peer_progress(r).await }).await?;
        Ok(())
    }

    /// Removes a peer; retention no longer waits for it.
    pub async fn unregister_peer(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::UnregisterPeerRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(false, request, |mut c, r| async move { c.unregister_peer(r).await }).await?;
        Ok(())
    }

    /// The directory records `cell` with its nodes' client addresses (replacing those it held); true when it is new.
    pub async fn put_cell(&self, cell: &str, addresses: Vec<String>) -> Result<bool, ClientError> {
        let request = v1::PutCellRequest { cell: cell.to_string(), addresses };
        Ok(self.call(true, request, |mut c, r| async move { c.put_cell(r).await }).await?.created)
    }

    /// Every cell the directory records, with its addresses.
    pub async fn list_cells(&self) -> Result<Vec<v1::CellAddresses>, ClientError> {
        Ok(self.call(true, v1::ListCellsRequest {}, |mut c, r| async move { c.list_cells(r).await }).await?.cells)
    }

    /// The directory places `stream` on `cell` at epoch 1 (the same placement again changes nothing).
    pub async fn place_stream(&self, stream: &str, cell: &str) -> Result<v1::Placement, ClientError> {
        let request = v1::PlaceStreamRequest { stream: stream.to_string(), cell: cell.to_string() };
        self.call(true, request, |mut c, r| async move { c.place_stream(r).await }).await
    }

    /// The directory records a move of `stream` to `to` at the epoch after `epoch`, if `epoch` is current (the same
    /// move again is answered alike).
    pub async fn move_placement(&self, stream: &str, to: &str, epoch: u64) -> Result<v1::Placement, ClientError> {
        let request = v1::MoveStreamRequest { stream: stream.to_string(), to: to.to_string(), epoch };
        self.call(true, request, |mut c, r| async move { c.move_stream(r).await }).await
    }

    /// The directory records the move of `stream` at `epoch` done.
    pub async fn finish_move(&self, stream: &str, epoch: u64) -> Result<v1::Placement, ClientError> {
        let request = v1::FinishMoveRequest { stream: stream.to_string(), epoch };
        self.call(true, request, |mut c, r| async move { c.finish_move(r).await }).await
    }

    /// Where `stream` lives, as the directory records it.
    pub async fn locate_stream(&self, stream: &str) -> Result<v1::StreamLocation, ClientError> {
        let request = v1::LocateStreamRequest { stream: stream.to_string() };
        self.call(true, request, |mut c, r| async move { c.locate_stream(r).await }).await
    }

    /// This cell stops taking writes to `stream` from `epoch` on (it moved to `to`); the answer holds where each
    /// partition ended.
    pub async fn fence_stream(&self, stream: &str, epoch: u64, to: &str) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::FenceStreamRequest { stream: stream.to_string(), epoch, to: to.to_string() };
        self.call(true, request, |mut c, r| async move { c.fence_stream(r).await }).await
    }

    /// `stream` moves to this cell at `epoch` from `from`: writes wait until it is accepted. With a `config`, a cell
    /// that does not hold the stream creates it in the same step.
    pub async fn receive_stream(
        &self,
        stream: &str,
        epoch: u64,
        from: &str,
        config: Option<v1::StreamConfig>,
    ) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::ReceiveStreamRequest { stream: stream.to_string(), epoch, from: from.to_string(), config };
        self.call(true, request, |mut c, r| async move { c.receive_stream(r).await }).await
    }

    /// Copies messages into `stream` moving here, at their positions (what is here already is passed over).
    pub async fn ingest(
        &self,
        stream: &str,
        epoch: u64,
        messages: Vec<v1::Message>,
        through: Vec<u64>,
    ) -> Result<v1::IngestMessagesResponse, ClientError> {
        let request = v1::IngestMessagesRequest { stream: stream.to_string(), epoch, messages, through };
        self.call(true, request, |mut c, r| async move { c.ingest_messages(r).await }).await
    }

    /// This cell takes writes to `stream` from `epoch` on, once it holds every partition `through` those positions.
    pub async fn accept_stream(
        &self,
        stream: &str,
        epoch: u64,
        through: Vec<u64>,
    ) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::AcceptStreamRequest { stream: stream.to_string(), epoch, through };
        self.call(true, request, |mut c, r| async move { c.accept_stream(r).await }).await
    }

    /// Creates `name` on this cell as a mirror of `source_stream` on `source_cell` (whose nodes `source_addresses`
    /// reach); answers whether it was created (false: the same mirror existed).
    pub async fn create_mirror(
        &self,
        name: &str,
        config: v1::StreamConfig,
        source_cell: &str,
        source_stream: &str,
        source_addresses: Vec<String>,
    ) -> Result<bool, ClientError> {
        let request = v1::CreateMirrorRequest {
            name: name.to_string(),
            config: Some(config),
            source_cell: source_cell.to_string(),
            source_stream: source_stream.to_string(),
            source_addresses,
        };
        let created: v1::CreateMirrorResponse =
            self.call(true, request, |mut c, r| async move { c.create_mirror(r).await }).await?;
        Ok(created.created)
    }

    /// This cell's mirrors and how far each is, as its leader sees them.
    pub async fn list_mirrors(&self) -> Result<Vec<v1::MirrorStatus>, ClientError> {
        let answer: v1::ListMirrorsResponse =
            self.call(true, v1::ListMirrorsRequest {}, |mut c, r| async move { c.list_mirrors(r).await }).await?;
        Ok(answer.mirrors)
    }

    /// On a mirror's source: registers the mirror `peer` of `stream`.
    pub async fn register_mirror(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::RegisterMirrorRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(true, request, |mut c, r| async move { c.register_mirror(r).await }).await?;
        Ok(())
    }

    /// On a mirror's source: one read for the mirror `peer` (see `MirrorRead`).
    pub async fn mirror_read(
        &self,
        stream: &str,
        peer: &str,
        from: Vec<u64>,
        max: u32,
        recalls_from: u64,
    ) -> Result<v1::MirrorReadResponse, ClientError> {
        let request =
            v1::MirrorReadRequest { stream: stream.to_string(), peer: peer.to_string(), from, max, recalls_from };
        self.call(true, request, |mut c, r| async move { c.mirror_read(r).await }).await
    }

    /// On a mirror's source: what the mirror `peer` holds and how many logged recalls it applied.
    pub async fn mirror_progress(
        &self,
        stream: &str,
        peer: &str,
        received: Vec<u64>,
        recalls_applied: u64,
    ) -> Result<(), ClientError> {
        let request =
            v1::MirrorProgressRequest { stream: stream.to_string(), peer: peer.to_string(), received, recalls_applied };
        self.call(true, request, |mut c, r| async move { c.mirror_progress(r).await }).await?;
        Ok(())
    }

    /// `stream`'s ownership as this cell sees it.
    pub async fn ownership(&self, stream: &str) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::GetOwnershipRequest { stream: stream.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_ownership(r).await }).await
    }

    /// Every consumer of a stream.
    pub async fn list_consumers(&self, stream: &str) -> Result<Vec<v1::ConsumerInfo>, ClientError> {
        let request = v1::ListConsumersRequest { stream: stream.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.list_consumers(r).await }).await?.consumers)
    }

    /// One consumer.
    pub async fn consumer_info(&self, stream: &str, name: &str) -> Result<v1::ConsumerInfo, ClientError> {
        let request = v1::GetConsumerRequest { stream: stream.to_string(), name: name.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_consumer(r).await }).await
    }

    /// Takes up to `max` deliveries for `member`. Not retried when its outcome is unknown: deliveries it may have
    /// made come back after their ack wait.
    pub async fn fetch(
        &self,
        stream: &str,
        consumer: &str,
        member: &str,
        max: u32,
    ) -> Result<Vec<v1::Delivery>, ClientError> {
        let request = v1::FetchRequest {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            member: member.to_string(),
            max,
        };
        Ok(self.call(false, request, |mut c, r| async move { c.fetch(r).await }).await?.deliveries)
    }

    /// Opens a push subscription at the leader.
    pub async fn subscribe(
        &self,
        stream: &str,
        consumer: &str,
        member: &str,
        max_in_flight: u32,
    ) -> Result<tonic::Streaming<v1::Delivery>, ClientError> {
        let request = v1::SubscribeRequest {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            member: member.to_string(),
            max_in_flight,
        };
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        loop {
            let status = match self.current()?.subscribe(self.credentials(Request::new(request.clone()))).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if !self.recover(&status, true, deadline, &mut backoff).await {
                return Err(status.into());
            }
        }
    }

    /// Answers deliveries; one result per item. Acks are idempotent, so they are retried through failovers.
    pub async fn ack(
        &self,
        stream: &str,
        consumer: &str,
        acks: Vec<v1::AckItem>,
    ) -> Result<Vec<v1::AckResult>, ClientError> {
        let request = v1::AckRequest { stream: stream.to_string(), consumer: consumer.to_string(), acks };
        let call = |mut c: CellogClient<Channel>, r| async move { c.ack(r).await };
        let (response, earlier_unknown) = self.call_tracked(cellog, true, request, call).await?;
        Ok(settle_items(response.results, earlier_unknown))
    }

    /// Joins a consumer group as `member` (a new incarnation if it was in it): its assignment. Not retried when its
    /// outcome is unknown: a join that landed unanswered is fenced by the next one.
    pub async fn join_group(&self, request: v1::JoinGroupRequest) -> Result<v1::GroupAssignment, ClientError> {
        self.call(false, request, |mut c, r| async move { c.join_group(r).await }).await
    }

    /// A member's heartbeat, releasing `released`: its assignment. Retried through failovers (a release repeated
    /// changes nothing more).
    pub async fn heartbeat(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        released: Vec<u32>,
    ) -> Result<v1::GroupAssignment, ClientError> {
        let request = v1::HeartbeatRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            released,
        };
        self.call(true, request, |mut c, r| async move { c.heartbeat(r).await }).await
    }

    /// Leaves a group: whether it was a member.
    pub async fn leave_group(&self, stream: &str, group: &str, member: &str) -> Result<bool, ClientError> {
        let request =
            v1::LeaveGroupRequest { stream: stream.to_string(), group: group.to_string(), member: member.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.leave_group(r).await }).await?.was_member)
    }

    /// A stream's consumer groups.
    pub async fn list_groups(&self, stream: &str) -> Result<Vec<v1::GroupInfo>, ClientError> {
        let request = v1::ListGroupsRequest { stream: stream.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.list_groups(r).await }).await?.groups)
    }

    /// One consumer group: members, generation, owners, lag.
    pub async fn group_info(&self, stream: &str, group: &str) -> Result<v1::GroupInfo, ClientError> {
        let request = v1::GetGroupRequest { stream: stream.to_string(), group: group.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_group(r).await }).await
    }

    /// Takes up to `max` deliveries for a member from the partitions it owns; the group's generation comes with them.
    /// Not retried when its outcome is unknown: deliveries it may have made come back after their ack wait.
    pub async fn member_fetch(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        max: u32,
    ) -> Result<v1::MemberFetchResponse, ClientError> {
        let request = v1::MemberFetchRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            max,
        };
        self.call(false, request, |mut c, r| async move { c.member_fetch(r).await }).await
    }

    /// Opens a member's push subscription at the leader; it ends when the group's generation moves.
    pub async fn member_subscribe(
        &self,
        request: v1::MemberSubscribeRequest,
    ) -> Result<tonic::Streaming<v1::Delivery>, ClientError> {
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        loop {
            let status = match self.current()?.member_subscribe(self.credentials(Request::new(request.clone()))).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if !self.recover(&status, true, deadline, &mut backoff).await {
                return Err(status.into());
            }
        }
    }

    /// Answers a member's deliveries; one result per item (NOT_OWNER for a partition it no longer owns since
    /// `generation`).
    pub async fn member_ack(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        acks: Vec<v1::AckItem>,
    ) -> Result<Vec<v1::AckResult>, ClientError> {
        let request = v1::MemberAckRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            acks,
        };
        let call = |mut c: CellogClient<Channel>, r| async move { c.member_ack(r).await };
        let (response, earlier_unknown) = self.call_tracked(cellog, true, request, call).await?;
        Ok(settle_items(response.results, earlier_unknown))
    }

    /// Commits a partition's position as a member: everything below `next_seq` is done.
    pub async fn member_commit(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        partition: u32,
        next_seq: u64,
    ) -> Result<u64, ClientError> {
        let request = v1::MemberCommitRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            partition,
            next_seq,
        };
        Ok(self.call(true, request, |mut c, r| async move { c.member_commit(r).await }).await?.next_seq)
    }

    /// Registers a transactional producer, fencing older instances.
    pub async fn init_producer(
        &self,
        transactional_id: &str,
        transaction_timeout_ms: u64,
    ) -> Result<v1::ProducerRef, ClientError> {
        let request =
            v1::InitProducerRequest { transactional_id: transactional_id.to_string(), transaction_timeout_ms };
        self.call(false, request, |mut c, r| async move { c.init_producer(r).await }).await
    }

    /// Opens a transaction.
    pub async fn begin(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(false, producer, |mut c, r| async move { c.begin_transaction(r).await }).await
    }

    /// Validates the open transaction.
    pub async fn prepare(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(false, producer, |mut c, r| async move { c.prepare_transaction(r).await }).await
    }

    /// Commits the transaction. A retried commit gets the first commit's answer, so it is retried through failovers.
    pub async fn commit(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(true, producer, |mut c, r| async move { c.commit_transaction(r).await }).await
    }

    /// Aborts the transaction (retried like a commit).
    pub async fn abort(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(true, producer, |mut c, r| async move { c.abort_transaction(r).await }).await
    }

    /// The status of the node the client talks to (not redirected): its role, term and indexes, the leader and the
    /// members, without the state's digest (`state_digest` is empty).
    pub async fn cluster_status(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest::default()).await
    }

    /// The same, with the digest of the node's applied state (`state_digest`), to compare replicas. The node encodes
    /// its whole state for it, and applies nothing meanwhile.
    pub async fn cluster_status_with_digest(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest { state_digest: true, ..Default::default() }).await
    }

    /// The same, with the digest of each part of the node's applied state as well (`digest_parts`), to find where two
    /// replicas differ.
    pub async fn cluster_status_with_parts(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest { state_digest: true, digest_parts: true }).await
    }

    async fn status_call(&self, request: v1::ClusterStatusRequest) -> Result<v1::ClusterStatusResponse, ClientError> {
        let request = self.request(request);
        let addr = self.current_addr();
        match self.current()?.cluster_status(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(protocol_mismatch(&status, &addr, self.options.tls.is_some())
                .unwrap_or_else(|| ClientError::from(status))),
        }
    }

    /// Adds a node as a learner and waits until it has caught up.
    pub async fn add_learner(
        &self,
        node_id: u64,
        raft_addr: &str,
        client_addr: &str,
    ) -> Result<v1::ClusterStatusResponse, ClientError> {
        let request =
            v1::AddLearnerRequest { node_id, raft_addr: raft_addr.to_string(), client_addr: client_addr.to_string() };
        self.call(true, request, |mut c, r| async move { c.add_learner(r).await }).await
    }

    /// Makes a learner a voter.
    pub async fn promote(&self, node_id: u64) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.call(true, v1::PromoteRequest { node_id }, |mut c, r| async move { c.promote(r).await }).await
    }

    /// Removes a node from the cell.
    pub async fn remove_node(&self, node_id: u64) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.call(true, v1::RemoveNodeRequest { node_id }, |mut c, r| async move { c.remove_node(r).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: Code, reason: &str) -> ClientError {
        ClientError::Status { code, detail: v1::ErrorDetail { reason: reason.to_string(), ..Default::default() } }
    }

    #[test]
    fn only_a_refusal_is_a_definite_failure() {
        assert!(!error(Code::Unavailable, "NOT_LEADER").outcome_unknown(), "refused before the log");
        assert!(error(Code::Unavailable, "LEADER_CHANGED").outcome_unknown(), "handed to Raft, may commit");
        assert!(error(Code::Unavailable, "").outcome_unknown(), "a broken connection");
        assert!(error(Code::DeadlineExceeded, "").outcome_unknown(), "a timeout");
        assert!(error(Code::Unknown, "OUTCOME_UNKNOWN").outcome_unknown());
        assert!(!error(Code::FailedPrecondition, "FENCED").outcome_unknown());
        assert!(!error(Code::Aborted, "TRANSACTION_ABORTED").outcome_unknown());
        assert!(!error(Code::NotFound, "STREAM_NOT_FOUND").outcome_unknown());
        assert!(!ClientError::NoNodes.outcome_unknown());
    }

    #[test]
    fn a_refusal_after_an_unanswered_attempt_leaves_the_outcome_unknown() {
        let not_leader = error(Code::Unavailable, "NOT_LEADER");
        assert!(!ClientError::settle(not_leader.clone(), false).outcome_unknown(), "nothing went out unanswered");
        let settled = ClientError::settle(not_leader, true);
        assert!(settled.outcome_unknown(), "an earlier attempt may have been applied: {settled}");
        assert_eq!(settled.reason(), Some("NOT_LEADER"));
        let limited = ClientError::settle(error(Code::ResourceExhausted, "RATE_LIMITED"), true);
        assert!(limited.outcome_unknown());
        // A verdict of the cell on the call itself stays one: a repeat is answered by the state it left.
        assert!(!ClientError::settle(error(Code::FailedPrecondition, "FENCED"), true).outcome_unknown());
        assert!(!ClientError::settle(error(Code::NotFound, "STREAM_NOT_FOUND"), true).outcome_unknown());
        // A member's standing that moved on in between is no verdict on an attempt that went before it.
        for reason in ["UNKNOWN_MEMBER", "NOT_OWNER"] {
            let moved = error(Code::FailedPrecondition, reason);
            assert!(!ClientError::settle(moved.clone(), false).outcome_unknown(), "{reason}, nothing unanswered");
            let settled = ClientError::settle(moved, true);
            assert!(settled.outcome_unknown(), "{reason} after an unanswered attempt: {settled}");
            assert_eq!(settled.reason(), Some(reason));
        }
    }

    #[test]
    fn an_ack_item_refused_after_an_unanswered_attempt_is_answered_as_unknown() {
        let refused = |reason: &str| v1::AckResult {
            result: Some(v1::ack_result::Result::Error(v1::Error {
                code: Code::FailedPrecondition as i32,
                detail: Some(v1::ErrorDetail { reason: reason.to_string(), ..Default::default() }),
            })),
            already_done: false,
        };
        let reason = |result: &v1::AckResult| match &result.result {
            Some(v1::ack_result::Result::Error(error)) => error.detail.as_ref().map(|d| d.reason.clone()),
            _ => None,
        };
        let answered = vec![refused("NOT_OWNER"), refused("NOT_DELIVERED")];
        let kept = settle_items(answered.clone(), false);
        assert_eq!(
            kept.iter().map(reason).collect::<Vec<_>>(),
            [Some("NOT_OWNER".into()), Some("NOT_DELIVERED".into())]
        );
        let settled = settle_items(answered, true);
        assert_eq!(
            settled.iter().map(reason).collect::<Vec<_>>(),
            [Some("OUTCOME_UNKNOWN".into()), Some("NOT_DELIVERED".into())],
            "a refusal that the state an earlier attempt left explains stays one"
        );
    }
}

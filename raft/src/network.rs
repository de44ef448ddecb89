//! Raft between the nodes of a cell, whatever carries it. openraft's messages leave as [`Frame`]s (postcard, a
//! crc32c, the cell's name and id) through a [`Link`] the transport provides, and a frame from a peer is answered by
//! [`CellNode::answer`]; a frame that fails its checksum or names another cell is refused, never applied. The
//! transport (gRPC in `cellog-net`, madsim's network in simulation) moves bytes and names no openraft type.
//!
//! A cell's id ([`CellId`]) is random, made by the node that founds the cell and stored in its meta space; every
//! other node learns it from the first entries or snapshot a leader sends it while it holds nothing, and stores it
//! before it takes them. Two cells that share a name (a default name, a cell wiped and founded again while an old node
//! still runs) refuse each other's messages: a node that knows its cell's id takes a leader's entries or snapshot only
//! under that id, and a vote or an answer under no other. A node whose store predates cell ids has none and keeps
//! checking the name alone; it never learns one, since it holds a log already.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use openraft::error::{NetworkError, PayloadTooLarge, RPCError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::body_repair::{BodiesAnswer, BodiesRequest, CALL_TIMEOUT, FetchBodies, PeerBodies};
use crate::founding::{ASK_TIMEOUT, AskFounding, FoundingAnswer, FoundingRequest};
pub use crate::identity::{CellId, CellIdentity};
use crate::node::CellNode;
pub use crate::room::PeersLow;
use crate::storage::{Space, Storage, StorageError};
use crate::types::{NodeAddrs, NodeId, TypeConfig};

/// Most bytes one framed Raft message may carry. A transport must carry at least this much (plus its own wrapping).
/// An `AppendEntries` over it goes as several smaller ones (openraft is told the payload is too large and retries
/// with fewer entries); one entry alone never comes near it (see `cellog_core::MAX_COMMAND_BYTES`).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Most bytes of commands one `AppendEntries` carries, unless its first entry alone has more. openraft gives up on an
/// `AppendEntries` not answered within a heartbeat interval, and a follower answers once it has written and synced the
/// entries: up to 64 MiB (16 entries of 4 MiB) took a follower longer than that on a disk of a few hundred MB/s shared
/// by a cell's three nodes, and each was sent again and again. 4 MiB is written and synced in tens of milliseconds
/// by a disk that writes 100 MiB a second.
pub const MAX_APPEND_BYTES: usize = 4 * 1024 * 1024;

/// How many of `entries`, from the first, carry at most `budget` bytes of commands together: at least one.
fn entries_within(entries: &[crate::types::Entry], budget: usize) -> usize {
    let mut bytes = 0;
    let fit = entries
        .iter()
        .take_while(|entry| {
            if let openraft::EntryPayload::Normal(request) = &entry.payload {
                bytes += request.commands.iter().map(cellog_core::Command::encoded_size).sum::<usize>();
            }
            bytes <= budget
        })
        .count();
    fit.max(1)
}

/// The calls between the nodes of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// Log entries (or a heartbeat) from the leader.
    AppendEntries,
    /// One chunk of a snapshot, for a follower too far behind for the log.
    InstallSnapshot,
    /// Leader election.
    Vote,
    /// Message bodies a node's disk damaged, asked of a peer ([`crate::body_repair`]).
    Bodies,
    /// The founder of a new cell asks a founder whether it holds anything, or tells it to vote ([`crate::founding`]).
    Founding,
}

/// One Raft message on the wire: a request, or the receiver's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The cell of the sender.
    pub cell: String,
    /// The id of the sender's cell, if the sender knows it.
    pub cell_id: Option<CellId>,
    /// crc32c of `payload`, extended over `cell_id` when there is one.
    pub crc32c: u32,
    /// The postcard encoding of the message.
    pub payload: Bytes,
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// It came from another cell.
    #[error("message for cell {got:?}, this is cell {expected:?}")]
    WrongCell {
        /// The receiver's cell.
        expected: String,
        /// The sender's.
        got: String,
    },
    /// It came from another cell of the same name (or, from a leader, from a node that does not know the id).
    #[error("message for cell id {}, this is cell id {expected}", got.map_or("unknown".to_string(), |id| id.to_string()))]
    WrongCellId {
        /// The receiver's cell id.
        expected: CellId,
        /// The sender's.
        got: Option<CellId>,
    },
    /// Its checksum does not match: it was damaged on the way.
    #[error("checksum mismatch: carried {carried:08x}, computed {computed:08x}")]
    Checksum {
        /// What it carried.
        carried: u32,
        /// What its payload sums to.
        computed: u32,
    },
    /// It does not decode.
    #[error("malformed: {0}")]
    Malformed(#[from] postcard::Error),
    /// It names another node as its sender (the leader of entries or a snapshot, the candidate of a vote) than the
    /// node the transport verified it comes from.
    #[error("the message names node {} as its sender, but comes from node {verified}", named.map_or("none".to_string(), |id| id.to_string()))]
    WrongSender {
        /// The node the transport verified (its certificate).
        verified: NodeId,
        /// The node the message names.
        named: Option<NodeId>,
    },
}

impl FrameError {
    /// What the sender is told: why, without this cell's name (a stranger learns nothing to forge a message with).
    /// The whole error is for this node's log.
    pub fn to_sender(&self) -> String {
        match self {
            FrameError::WrongCell { .. } | FrameError::WrongCellId { .. } => {
                "refused: the message is not for this node's cell".to_string()
            }
            other => format!("refused: {other}"),
        }
    }
}

/// Frames `value` as a message of `cell`.
pub fn frame_message<T: Serialize>(cell: &CellIdentity, value: &T) -> Result<Frame, postcard::Error> {
    let payload = postcard::to_allocvec(value)?;
    Ok(Frame {
        cell: cell.name().to_string(),
        cell_id: cell.id(),
        crc32c: checksum(cell.id(), &payload),
        payload: payload.into(),
    })
}

/// A frame's checksum: crc32c over its payload, extended over its cell id when it carries one (a frame without one
/// sums as frames did before cell ids).
fn checksum(cell_id: Option<CellId>, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(payload);
    match cell_id {
        Some(id) => crc32c::crc32c_append(crc, &id.0.to_le_bytes()),
        None => crc,
    }
}

/// Unframes a message, checking its cell (the name, and the id when both sides know one) and its checksum.
pub fn unframe_message<T: DeserializeOwned>(cell: &CellIdentity, frame: &Frame) -> Result<T, FrameError> {
    if frame.cell != cell.name() {
        return Err(FrameError::WrongCell { expected: cell.name().to_string(), got: frame.cell.clone() });
    }
    if let (Some(expected), Some(got)) = (cell.id(), frame.cell_id)
        && expected != got
    {
        return Err(FrameError::WrongCellId { expected, got: Some(got) });
    }
    let computed = checksum(frame.cell_id, &frame.payload);
    if computed != frame.crc32c {
        return Err(FrameError::Checksum { carried: frame.crc32c, computed });
    }
    Ok(postcard::from_bytes(&frame.payload)?)
}

/// Why a call to a peer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The peer could not be reached (or did not answer): it may not have seen the message.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The call failed otherwise.
    #[error("{0}")]
    Failed(String),
    /// The peer took nothing: its disk is below its free-space watermark (see [`PeersLow`]).
    #[error("the peer's disk is below its watermark: {0}")]
    StorageFull(String),
}

/// A connection to one peer, as the transport provides it.
pub trait Link: Send + Sync + 'static {
    /// Sends `frame` as `rpc` and returns the peer's answer, giving up after `timeout`.
    fn call(
        &mut self,
        rpc: Rpc,
        frame: Frame,
        timeout: Duration,
    ) -> impl Future<Output = Result<Frame, LinkError>> + Send;
}

/// How a node reaches its peers, as the transport provides it.
pub trait Links: Send + Sync + 'static {
    /// A connection to one peer.
    type Link: Link;

    /// A connection to peer `target`, reached at `addrs` (made lazily: an unusable address fails its calls).
    fn link(&mut self, target: NodeId, addrs: &NodeAddrs) -> Self::Link;
}

/// Bodies fetched from peers over the links of a transport.
struct LinkBodies<L> {
    cell: CellIdentity,
    links: std::sync::Mutex<L>,
}

impl<L: Links> FetchBodies for LinkBodies<L> {
    fn fetch(&self, target: NodeId, addrs: &NodeAddrs, request: BodiesRequest) -> BoxFuture<'static, BodiesAnswer> {
        let mut link = self.links.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).link(target, addrs);
        let cell = self.cell.clone();
        Box::pin(async move {
            let frame = frame_message(&cell, &request).map_err(|error| error.to_string())?;
            let answer = link.call(Rpc::Bodies, frame, CALL_TIMEOUT).await.map_err(|error| error.to_string())?;
            unframe_message::<BodiesAnswer>(&cell, &answer).map_err(|error| error.to_string())?
        })
    }
}

impl<L: Links + Clone> PeerBodies for Network<L> {
    fn fetch_bodies(&self) -> Arc<dyn FetchBodies> {
        Arc::new(LinkBodies { cell: self.cell.clone(), links: std::sync::Mutex::new(self.links.clone()) })
    }

    fn ask_founding(&self) -> Option<Arc<dyn AskFounding>> {
        Some(Arc::new(LinkBodies { cell: self.cell.clone(), links: std::sync::Mutex::new(self.links.clone()) }))
    }

    fn peers_low(&self) -> PeersLow {
        self.low.clone()
    }
}

impl<L: Links> AskFounding for LinkBodies<L> {
    fn ask(
        &self,
        target: NodeId,
        addrs: &NodeAddrs,
        request: FoundingRequest,
    ) -> BoxFuture<'static, Result<FoundingAnswer, String>> {
        let mut link = self.links.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).link(target, addrs);
        let cell = self.cell.clone();
        Box::pin(async move {
            let frame = frame_message(&cell, &request).map_err(|error| error.to_string())?;
            let answer = link.call(Rpc::Founding, frame, ASK_TIMEOUT).await.map_err(|error| error.to_string())?;
            unframe_message::<Result<FoundingAnswer, String>>(&cell, &answer).map_err(|error| error.to_string())?
        })
    }
}

/// openraft's network over the links of a transport.
pub struct Network<L> {
    cell: CellIdentity,
    links: L,
    max_message: usize,
    low: PeersLow,
}

impl<L: Links> Network<L> {
    /// The network of a node of `cell`, its messages at most [`MAX_MESSAGE_BYTES`].
    pub fn new(cell: CellIdentity, links: L) -> Self {
        Network { cell, links, max_message: MAX_MESSAGE_BYTES, low: PeersLow::default() }
    }

    /// The same with messages of at most `bytes` (a transport that carries less; tests).
    pub fn with_max_message(self, bytes: usize) -> Self {
        Network { max_message: bytes, ..self }
    }
}

/// A node's connection to one peer.
pub struct Connection<K> {
    cell: CellIdentity,
    target: NodeId,
    link: K,
    max_message: usize,
    low: PeersLow,
}

impl<L: Links> RaftNetworkFactory<TypeConfig> for Network<L> {
    type Network = Connection<L::Link>;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddrs) -> Self::Network {
        Connection {
            cell: self.cell.clone(),
            target,
            link: self.links.link(target, node),
            max_message: self.max_message,
            low: self.low.clone(),
        }
    }
}

fn io_error(message: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(message.to_string())
}

impl<K: Link> Connection<K> {
    /// Sends `request` as `rpc` and unframes the peer's `Result<R, E>`. A request of `entries` log entries that frames
    /// to more than the network's largest message is not sent: openraft is told it is too large and sends fewer.
    async fn call<Q, R, E>(
        &mut self,
        rpc: Rpc,
        request: &Q,
        entries: usize,
        option: &RPCOption,
    ) -> Result<R, RPCError<NodeId, NodeAddrs, E>>
    where
        Q: Serialize,
        R: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let frame = frame_message(&self.cell, request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        if frame.payload.len() > self.max_message {
            if entries > 1 {
                return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((entries / 2) as u64)));
            }
            let (size, max) = (frame.payload.len(), self.max_message);
            let message = format!("{rpc:?} of {size} bytes is over the {max} bytes a message may take");
            return Err(RPCError::Network(NetworkError::new(&io_error(message))));
        }
        let answer = self.link.call(rpc, frame, option.hard_ttl()).await;
        // Entries or a snapshot taken, or refused for the disk: what the leader knows of the peer's room.
        if entries > 0 || rpc == Rpc::InstallSnapshot {
            match &answer {
                Ok(_) => self.low.mark(self.target, false),
                Err(LinkError::StorageFull(_)) => self.low.mark(self.target, true),
                Err(_) => {}
            }
        }
        let answer = answer.map_err(|error| match error {
            LinkError::Unreachable(message) => RPCError::Unreachable(Unreachable::new(&io_error(message))),
            error @ (LinkError::Failed(_) | LinkError::StorageFull(_)) => {
                RPCError::Network(NetworkError::new(&io_error(error)))
            }
        })?;
        let answer: Result<R, E> =
            unframe_message(&self.cell, &answer).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl<K: Link> RaftNetwork<TypeConfig> for Connection<K> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId>>> {
        let entries = rpc.entries.len();
        let fit = entries_within(&rpc.entries, MAX_APPEND_BYTES);
        if fit < entries {
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(fit as u64)));
        }
        self.call(Rpc::AppendEntries, &rpc, entries, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>>,
    > {
        self.call(Rpc::InstallSnapshot, &rpc, 0, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, 0, &option).await
    }
}

/// Why a frame from a peer got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The frame was refused (another cell, damaged, malformed): nothing was applied.
    #[error(transparent)]
    Refused(#[from] FrameError),
    /// The answer could not be framed.
    #[error("the answer could not be encoded: {0}")]
    Unencodable(postcard::Error),
    /// The cell id it brought could not be stored.
    #[error("the cell id could not be stored: {0}")]
    Storage(#[from] StorageError),
    /// Entries or a snapshot, refused unread: this node's disk is below its free-space watermark, and writing them
    /// could fill it (a full disk stops the store).
    #[error(
        "this node's disk has {free} bytes free, below its watermark of {min}; it takes no entries until it has room"
    )]
    StorageFull {
        /// Bytes free.
        free: u64,
        /// The watermark.
        min: u64,
    },
}

/// Refuses a message whose vote names another node (the leader, or the candidate) than the verified `sender`.
fn check_sender(sender: Option<NodeId>, vote: &openraft::Vote<NodeId>) -> Result<(), FrameError> {
    let Some(verified) = sender else { return Ok(()) };
    let named = vote.leader_id().voted_for();
    if named == Some(verified) {
        return Ok(());
    }
    Err(FrameError::WrongSender { verified, named })
}

impl<S: Storage + Clone> CellNode<S> {
    /// Checks the cell id of entries or a snapshot from a leader, before anything in them is looked at: a node that
    /// knows its cell's id takes them only under it.
    fn check_leader_frame(&self, frame: &Frame) -> Result<(), FrameError> {
        match self.identity().id() {
            Some(expected) if frame.cell_id != Some(expected) => {
                Err(FrameError::WrongCellId { expected, got: frame.cell_id })
            }
            _ => Ok(()),
        }
    }

    /// Learns the cell's id from a leader's frame that verified, if this node knows none and holds nothing yet (a new
    /// node, a founder that did not found, a lost disk). A node that holds a log from before cell ids learns none.
    fn learn_cell_id(&self, frame: &Frame) -> Result<(), StorageError> {
        let Some(id) = frame.cell_id.filter(|_| self.identity().id().is_none()) else { return Ok(()) };
        if self.storage().key_bounds(Space::Log)?.is_some() || self.storage().key_bounds(Space::State)?.is_some() {
            return Ok(());
        }
        self.store_cell_id(id)?;
        crate::transition::cell_id(id, "learned");
        Ok(())
    }

    /// Answers a framed Raft message from a peer: checks it, hands it to Raft (a vote to [`CellNode::vote`], which a
    /// repairing node refuses), and frames Raft's result. Entries or a snapshot from a leader are taken only under
    /// this cell's id, which a node holding nothing learns from them. With `sender`, the node the transport verified
    /// the message comes from (a peer's certificate), a message that names another node as its leader or candidate is
    /// refused: one member cannot speak for another.
    pub async fn answer(&self, rpc: Rpc, frame: &Frame, sender: Option<NodeId>) -> Result<Frame, AnswerError> {
        let cell = self.identity();
        if matches!(rpc, Rpc::AppendEntries | Rpc::InstallSnapshot) {
            self.check_leader_frame(frame)?;
        }
        let framed = match rpc {
            Rpc::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> = unframe_message(cell, frame)?;
                check_sender(sender, &request.vote)?;
                self.learn_cell_id(frame)?;
                if !request.entries.is_empty()
                    && let Some((free, min)) = self.below_watermark()
                {
                    return Err(AnswerError::StorageFull { free, min });
                }
                frame_message(cell, &self.append_entries(request).await)
            }
            Rpc::InstallSnapshot => {
                let request: InstallSnapshotRequest<TypeConfig> = unframe_message(cell, frame)?;
                check_sender(sender, &request.vote)?;
                self.learn_cell_id(frame)?;
                if let Some((free, min)) = self.below_watermark() {
                    return Err(AnswerError::StorageFull { free, min });
                }
                frame_message(cell, &self.raft.install_snapshot(request).await)
            }
            Rpc::Vote => {
                let request: VoteRequest<NodeId> = unframe_message(cell, frame)?;
                check_sender(sender, &request.vote)?;
                frame_message(cell, &self.vote(request).await)
            }
            Rpc::Bodies => {
                let request: BodiesRequest = unframe_message(cell, frame)?;
                frame_message(cell, &self.answer_bodies(&request))
            }
            Rpc::Founding => {
                let request: FoundingRequest = unframe_message(cell, frame)?;
                frame_message(cell, &self.answer_founding(request).map_err(|error| error.to_string()))
            }
        };
        framed.map_err(AnswerError::Unencodable)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use cellog_core::{Command, Millis, PublishRequest};
    use openraft::{EntryPayload, LeaderId, Vote};

    use super::*;
    use crate::types::{Entry, LogId, Request};

    /// A link that records what it was asked to send, and answers nothing.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<usize>>>);

    impl Link for Recorded {
        async fn call(&mut self, _rpc: Rpc, frame: Frame, _timeout: Duration) -> Result<Frame, LinkError> {
            self.0.lock().unwrap().push(frame.payload.len());
            Err(LinkError::Unreachable("recorded only".to_string()))
        }
    }

    impl Links for Recorded {
        type Link = Recorded;
        fn link(&mut self, _target: NodeId, _addrs: &NodeAddrs) -> Recorded {
            self.clone()
        }
    }

    fn entries(n: u64, payload: usize) -> AppendEntriesRequest<TypeConfig> {
        let leader = LeaderId::new(1, 1);
        let entries = (1..=n)
            .map(|index| Entry {
                log_id: LogId::new(leader, index),
                payload: EntryPayload::Normal(Request::new(
                    Millis(index),
                    vec![Command::Publish(PublishRequest::new("s.a", vec![7u8; payload]))],
                )),
            })
            .collect();
        AppendEntriesRequest { vote: Vote::new_committed(1, 1), prev_log_id: None, entries, leader_commit: None }
    }

    /// A message from a verified sender names that sender as its leader or candidate; without a verified sender (no
    /// TLS), any is taken. Each row: verified sender, the vote's node, whether it is taken.
    #[tokio::test]
    async fn entries_over_the_byte_budget_go_as_fewer_and_one_entry_goes_whatever_its_size() {
        let sent = Recorded::default();
        let mut network = Network::new(CellIdentity::new("cell"), sent.clone());
        let mut peer = network.new_client(2, &NodeAddrs::new("raft-2", "client-2")).await;
        let option = RPCOption::new(Duration::from_secs(1));
        let quarter = MAX_APPEND_BYTES / 4;

        // Five entries of a quarter of the budget each (and a few bytes more): three fit.
        match peer.append_entries(entries(5, quarter + 1_000), option.clone()).await {
            Err(RPCError::PayloadTooLarge(too_large)) => assert_eq!(too_large.entries_hint(), 3),
            other => panic!("expected payload too large, got {other:?}"),
        }
        assert!(sent.0.lock().unwrap().is_empty(), "nothing over the budget is sent");
        assert!(matches!(
            peer.append_entries(entries(3, quarter + 1_000), option.clone()).await,
            Err(RPCError::Unreachable(_))
        ));
        assert_eq!(sent.0.lock().unwrap().len(), 1, "what fits goes");

        // One entry over the budget (but within a message) goes alone.
        assert!(matches!(
            peer.append_entries(entries(1, 2 * MAX_APPEND_BYTES), option.clone()).await,
            Err(RPCError::Unreachable(_))
        ));
        assert_eq!(sent.0.lock().unwrap().len(), 2);
        match peer.append_entries(entries(2, 2 * MAX_APPEND_BYTES), option).await {
            Err(RPCError::PayloadTooLarge(too_large)) => assert_eq!(too_large.entries_hint(), 1),
            other => panic!("expected payload too large, got {other:?}"),
        }
        assert_eq!(sent.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_message_naming_another_sender_than_the_verified_one_is_refused() {
        let table = [
            (None, Vote::new(3, 2), true),
            (Some(2), Vote::new(3, 2), true),
            (Some(2), Vote::new_committed(3, 2), true),
            (Some(2), Vote::new(3, 3), false),
            (Some(2), Vote::new_committed(3, 1), false),
        ];
        for (sender, vote, taken) in table {
            let checked = check_sender(sender, &vote);
            assert_eq!(checked.is_ok(), taken, "sender {sender:?}, vote {vote:?}: {checked:?}");
            if let Err(error) = checked {
                assert!(matches!(error, FrameError::WrongSender { verified: 2, .. }), "{error}");
                assert!(error.to_sender().contains("comes from node 2"), "{error}");
            }
        }
    }

    #[tokio::test]
    async fn entries_over_the_largest_message_go_as_fewer_and_are_never_sent_whole() {
        let sent = Recorded::default();
        let mut network = Network::new(CellIdentity::new("cell"), sent.clone()).with_max_message(10_000);
        let mut peer = network.new_client(2, &NodeAddrs::new("raft-2", "client-2")).await;
        let option = RPCOption::new(Duration::from_secs(1));

        match peer.append_entries(entries(8, 2_000), option.clone()).await {
            Err(RPCError::PayloadTooLarge(too_large)) => assert_eq!(too_large.entries_hint(), 4),
            other => panic!("expected payload too large, got {other:?}"),
        }
        assert!(sent.0.lock().unwrap().is_empty(), "nothing too large is sent");

        // Fewer entries fit, and go.
        assert!(matches!(peer.append_entries(entries(4, 2_000), option.clone()).await, Err(RPCError::Unreachable(_))));
        assert_eq!(sent.0.lock().unwrap().len(), 1);

        // One entry alone over the limit cannot be split: a network error, never sent.
        let alone = peer.append_entries(entries(1, 20_000), option).await;
        assert!(matches!(alone, Err(RPCError::Network(_))), "{alone:?}");
        assert_eq!(sent.0.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_stranger_is_not_told_the_cells_name() {
        let frame = frame_message(&CellIdentity::new("theirs"), &7u32).unwrap();
        let refused = unframe_message::<u32>(&CellIdentity::new("secret-cell-name"), &frame).unwrap_err();
        assert!(refused.to_string().contains("secret-cell-name"), "the node's own log says which");
        assert!(!refused.to_sender().contains("secret-cell-name"), "{}", refused.to_sender());
    }

    #[test]
    fn a_cell_of_the_same_name_and_another_id_is_refused() {
        let ours = CellIdentity::known("prod", CellId(1));
        let theirs = CellIdentity::known("prod", CellId(2));
        let unknown = CellIdentity::new("prod");
        let refused = unframe_message::<u32>(&ours, &frame_message(&theirs, &7u32).unwrap()).unwrap_err();
        assert!(matches!(refused, FrameError::WrongCellId { expected: CellId(1), got: Some(CellId(2)) }), "{refused}");
        assert!(!refused.to_sender().contains(&CellId(1).to_string()), "{}", refused.to_sender());
        // Either side not knowing the id yet: the name decides (a leader's entries are checked more strictly, by the
        // node).
        assert_eq!(unframe_message::<u32>(&ours, &frame_message(&unknown, &7u32).unwrap()).unwrap(), 7);
        assert_eq!(unframe_message::<u32>(&unknown, &frame_message(&theirs, &7u32).unwrap()).unwrap(), 7);
        // The id is under the checksum.
        let mut forged = frame_message(&ours, &7u32).unwrap();
        forged.cell_id = Some(CellId(3));
        assert!(matches!(unframe_message::<u32>(&unknown, &forged), Err(FrameError::Checksum { .. })));
    }
}

//! What a run leaves to check: its history, what every node holds at the end, and what its workload promised.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::history::Operation;

/// A node of the cell under test.
pub type NodeId = u64;

/// One copy of a message on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
    /// Its body.
    pub body: Bytes,
    /// The cell time it was stored at, in milliseconds.
    pub stored_at_ms: u64,
}

/// What a node holds in one stream, by message id: every copy (more than one is a duplicate).
pub type Stored = BTreeMap<String, Vec<Held>>;

/// A node's applied state (at the end, or read during the run): the index it applied to, and the digest of each
/// part of the state there (`cell`, `producers`, `stream NAME`, `stream NAME partition P`, `stream NAME consumer C`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// The last index applied.
    pub applied_index: u64,
    /// Each part's digest, by part.
    pub parts: BTreeMap<String, String>,
}

/// What the workload promised, which the history alone does not say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Duties {
    /// Durable consumers, by the stream they consume: each must be handed every acknowledged message of its stream
    /// that is not delayed.
    pub consumers: BTreeMap<String, String>,
    /// Durable consumers (by name) that went on until nothing came back: each must end up acking every acknowledged
    /// message of its stream that is not delayed (a nack or an ignored delivery comes back until it is acked).
    pub drained: BTreeSet<String>,
    /// Registered peers, by the stream they mirror: the process that reads it and reports its progress. Retention
    /// must not remove what the peer has not received.
    pub peers: BTreeMap<String, String>,
    /// Streams whose retention may remove acknowledged messages (limits, work queues): what nodes hold of them is
    /// not checked for loss or whole transactions, only for what every stream must be (one copy, the same on every
    /// replica, nothing refused) and, for a peer's stream, nothing removed that the peer had not received.
    pub trimmed: BTreeSet<String>,
    /// Processes that run as a principal of their own, by the subject filters that principal may publish to: every
    /// publish of theirs elsewhere must be refused and never stored.
    pub publishers: BTreeMap<String, Vec<String>>,
    /// Message ids a principal published carrying a header that is the node's (`Cellog-*`, a forged sender): each
    /// must be refused and never stored, inside the principal's grants or not.
    pub forged: BTreeSet<String>,
    /// Mirrors, by the source stream each follows (both in `held`: the mirror's cell's nodes under the mirror's
    /// name, the source's under the source's): each must be a gap-free, in-order prefix of its source.
    pub mirrors: BTreeMap<String, String>,
}

/// What a run leaves to check.
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    /// Every client operation in the order it was invoked, with its completion if it got one.
    pub operations: Vec<Operation>,
    /// Per stream, what each node holds in it at the end (after the cell converged). Only the streams here are
    /// checked against the nodes' contents.
    pub held: BTreeMap<String, BTreeMap<NodeId, Stored>>,
    /// Each node's applied state at the end, where it could be read.
    pub states: BTreeMap<NodeId, NodeState>,
    /// Applied states read from the nodes while the workload ran, each at whatever index its node had reached then:
    /// a replica that went its own way for a while (and was put right by a restart) is seen here, once another
    /// replica was read at the same index.
    pub samples: Vec<(NodeId, NodeState)>,
    /// What the workload promised.
    pub duties: Duties,
}

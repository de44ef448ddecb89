//! Which peers are low on disk, as their answers to a leader's entries said: a leaf, shared by the network (which
//! records the answers), the transport's trait (`body_repair::PeerBodies`, which hands the record to the node) and
//! the node (which counts voters with room).

use std::sync::Arc;

use crate::types::NodeId;

/// The peers whose last answer to entries (or a snapshot) said their disk is below its free-space watermark: they
/// take no entries until they have room, and a leader that counts too few voters with room refuses writes that grow
/// the store ([`crate::ProposeError::QuorumStorageFull`]). Set and cleared by the answers themselves.
#[derive(Clone, Debug, Default)]
pub struct PeersLow(Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>);

impl PeersLow {
    pub(crate) fn mark(&self, peer: NodeId, low: bool) {
        let mut peers = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if low {
            peers.insert(peer);
        } else {
            peers.remove(&peer);
        }
    }

    /// The peers low on disk now.
    pub fn now(&self) -> std::collections::BTreeSet<NodeId> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

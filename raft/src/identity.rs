//! Which cell a node belongs to: the cell's name, and its random id ([`CellId`]) once the node knows it. The network
//! stamps both on every Raft message ([`crate::network`]); the node checks them and learns the id.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

/// A cell's id: random, made when the cell is founded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CellId(pub u128);

impl std::fmt::Display for CellId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Which cell a node's Raft messages belong to: the cell's name, and its id once the node knows it. Shared by the
/// node's network (which stamps outgoing frames) and the node (which checks incoming ones and learns the id).
#[derive(Clone, Debug)]
pub struct CellIdentity {
    name: Arc<str>,
    id: Arc<OnceLock<CellId>>,
}

impl CellIdentity {
    /// The identity of a node of the cell `name`, its id not known yet.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        CellIdentity { name: name.into(), id: Arc::new(OnceLock::new()) }
    }

    /// The identity of a node of the cell `name` whose id is `id` (as the node's data directory records it).
    pub fn known(name: impl Into<Arc<str>>, id: CellId) -> Self {
        let identity = CellIdentity::new(name);
        identity.learn(id);
        identity
    }

    /// The cell's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cell's id, if this node knows it.
    pub fn id(&self) -> Option<CellId> {
        self.id.get().copied()
    }

    /// Takes `id` as the cell's id, unless the node knows another: whether the id is now `id`.
    pub(crate) fn learn(&self, id: CellId) -> bool {
        *self.id.get_or_init(|| id) == id
    }
}

//! The founding protocol's two sides on a node (see [`crate::founding`]): the founder asking every other founder
//! whether it holds anything and telling them to vote, and a founder answering.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::founding::{AskFounding, FoundingAnswer, FoundingRequest, holds_nothing};
use crate::node::{CellNode, StartError};
use crate::storage::{Storage, StorageError};
use crate::types::{NodeAddrs, NodeId};

/// How long the founder waits before asking the founders it has no answer from again.
const ASK_AGAIN: Duration = Duration::from_millis(250);

impl<S: Storage + Clone> CellNode<S> {
    /// Answers the founder: whether this node holds anything; told to vote and holding nothing, it stops repairing.
    pub(crate) fn answer_founding(&self, request: FoundingRequest) -> Result<FoundingAnswer, StorageError> {
        let holds = !holds_nothing(self.storage())?;
        if request.vote && !holds {
            self.stop_repairing("every founder of the cell holds nothing")?;
        }
        Ok(FoundingAnswer { holds })
    }

    /// Founds the cell with `members` (this node, its founder, among them) once every other founder holds nothing,
    /// then tells each of them and itself to vote (see the module doc). Returns once that is done, or once a founder
    /// answers that it holds something: then the cell exists, and this node, which lost its data, repairs from its
    /// leader. A node past founding (it knows a term) only makes sure the cell is founded; a node whose transport
    /// cannot ask its peers founds at once.
    pub async fn found_when_no_founder_holds_anything(
        &self,
        members: BTreeMap<NodeId, NodeAddrs>,
    ) -> Result<(), StartError> {
        match self.ask_founding.clone() {
            Some(ask) => self.found_asking(members, &*ask).await,
            None => self.found(members).await,
        }
    }

    async fn found_asking(
        &self,
        members: BTreeMap<NodeId, NodeAddrs>,
        ask: &dyn AskFounding,
    ) -> Result<(), StartError> {
        if self.current_term() > 0 {
            return self.found(members).await;
        }
        let peers: Vec<(NodeId, NodeAddrs)> =
            members.iter().filter(|(id, _)| **id != self.id()).map(|(id, addrs)| (*id, addrs.clone())).collect();
        // Whom to tell next: first whether they hold anything, then (all empty) to vote.
        let mut empty = BTreeMap::new();
        while empty.len() < peers.len() {
            if self.is_stopped() {
                return Ok(());
            }
            let unanswered: Vec<&(NodeId, NodeAddrs)> =
                peers.iter().filter(|(id, _)| !empty.contains_key(id)).collect();
            for (id, addrs) in unanswered {
                match ask.ask(*id, addrs, FoundingRequest { vote: false }).await {
                    Ok(FoundingAnswer { holds: false }) => {
                        empty.insert(*id, addrs.clone());
                    }
                    Ok(FoundingAnswer { holds: true }) => {
                        tracing::warn!(
                            peer = id,
                            "node {id} holds the cell already: this node lost its data, and repairs from the cell's \
                             leader before it votes"
                        );
                        return Ok(());
                    }
                    Err(error) => tracing::info!(peer = id, %error, "founding: no answer yet from node {id}"),
                }
            }
            if empty.len() < peers.len() {
                tokio::time::sleep(ASK_AGAIN).await;
            }
        }
        // The others are told first, before the founding (its founder campaigns at once), so that its first campaign
        // finds them voting; then the founder itself, even if some were not told yet (a majority may elect it; the rest
        // are told on, or repair from its entries). Telling a founder holding nothing to vote before the cell is
        // founded is as safe as after: no node holds anything until the founder's first entry.
        let (mut untold, mut first) = (peers, true);
        loop {
            let mut still = Vec::new();
            for (id, addrs) in untold {
                if let Err(error) = ask.ask(id, &addrs, FoundingRequest { vote: true }).await {
                    tracing::info!(peer = id, %error, "founding: node {id} not told to vote yet");
                    still.push((id, addrs));
                }
            }
            untold = still;
            if std::mem::take(&mut first) {
                self.found(members.clone()).await?;
                self.stop_repairing("this node founded the cell, every other founder holding nothing")
                    .map_err(StartError::Storage)?;
            }
            // Once a leader is known, the untold ones repair from it.
            if untold.is_empty() || self.is_stopped() || self.current_term() > 0 && self.cluster_view().leader.is_some()
            {
                return Ok(());
            }
            tokio::time::sleep(ASK_AGAIN).await;
        }
    }
}

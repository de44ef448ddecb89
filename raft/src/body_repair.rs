//! Damaged bodies repaired from a peer while the node runs.
//!
//! A body this node reads back (to answer a client, or to send a snapshot) that is missing or does not verify is
//! damage on this node's disk. Every replica that applied the same log holds the same body under the same key, so
//! the node asks its peers for it ([`Rpc::Bodies`](crate::network::Rpc::Bodies)), checks each copy that comes back
//! against the reference its own state holds (length and crc32c), and writes it through the journal, synced. Only
//! when no peer has a copy that verifies does the node fall back on the slow repair: it marks the damage (as
//! [`StoredBodies::mark_damaged`] does), and its next start drops its state and takes a whole snapshot from the leader.
//!
//! The repairs run on one task per node, fed through a bounded queue. A read that finds damage never waits on the
//! network: its client is told, and the delivery comes again after its ack wait. A snapshot being sent waits for the
//! repair of the body it has reached, so a leader holding a body its disk damaged goes on sending instead of stopping.
//!
//! A repaired body is written only while the state still refers to it (checked under the replica's lock, which every
//! release of a body takes): a body written after its message went would never be deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use cellog_core::{Body, BodyRef};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::bodies::{Damaged, Need, StoredBodies};
use crate::state_machine::Replica;
use crate::storage::{Batch, Space, Storage};
use crate::types::{NodeAddrs, NodeId, Raft};

/// Most bodies one call asks a peer for.
pub const MAX_BODIES_PER_CALL: usize = 256;

/// Most body bytes one answer carries (a quarter of the largest message between nodes); the bodies past it are left
/// out, and asked for again.
const ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// How long a peer has to answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Damage found and not yet repaired. Reads that find more while it is full leave it to a later read.
pub(crate) const QUEUE: usize = 1024;

/// A node's request for bodies its own copies of which are damaged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodiesRequest {
    /// The references the requesting node's state holds: what each body must verify against.
    pub bodies: Vec<BodyRef>,
}

/// A peer's answer to a [`BodiesRequest`]: for each body asked, in order, its bytes, verified against the reference
/// asked with, or `None` when the peer holds no such copy (or the answer was full). Or why the request was refused.
pub type BodiesAnswer = Result<Vec<Option<Vec<u8>>>, String>;

/// Asks a peer for bodies, as the transport provides it.
pub trait FetchBodies: Send + Sync + 'static {
    /// Sends `request` to peer `target`, reached at `addrs`, and returns its answer, or why there is none.
    fn fetch(&self, target: NodeId, addrs: &NodeAddrs, request: BodiesRequest) -> BoxFuture<'static, BodiesAnswer>;
}

/// A network that can also fetch bodies from peers: what a node is started with.
pub trait PeerBodies {
    /// A fetcher over the same transport, to keep after the network itself went to Raft.
    fn fetch_bodies(&self) -> Arc<dyn FetchBodies>;

    /// A way to ask peers about founding over the same transport ([`crate::founding`]), if it has one.
    fn ask_founding(&self) -> Option<Arc<dyn crate::founding::AskFounding>> {
        None
    }

    /// The peers this transport found low on disk ([`crate::room::PeersLow`]); none, if it does not tell.
    fn peers_low(&self) -> crate::room::PeersLow {
        crate::room::PeersLow::default()
    }
}

/// Answers a peer's [`BodiesRequest`] from this node's bodies. A body this node cannot read is answered `None` and
/// nothing more: the reference is the peer's, and whether this node's state still refers to it is not known here.
pub fn answer<S: Storage>(bodies: &StoredBodies<S>, request: &BodiesRequest) -> BodiesAnswer {
    if request.bodies.len() > MAX_BODIES_PER_CALL {
        return Err(format!(
            "the request asks for {} bodies; a call asks for at most {MAX_BODIES_PER_CALL}",
            request.bodies.len()
        ));
    }
    let refs: Vec<&BodyRef> = request.bodies.iter().collect();
    let mut budget = ANSWER_BYTES;
    let answer = bodies
        .read_many(&refs)
        .into_iter()
        .map(|read| match read {
            Ok(bytes) if bytes.len() <= budget => {
                budget -= bytes.len();
                Some(bytes.to_vec())
            }
            _ => None,
        })
        .collect();
    Ok(answer)
}

/// The node's repairs: the task that takes [`Damaged`] bodies off the queue and repairs them from the peers.
pub(crate) struct Repairs<S> {
    /// This node, left out of the peers it asks.
    pub me: NodeId,
    /// Where the membership comes from.
    pub raft: Raft,
    /// The transport.
    pub fetch: Arc<dyn FetchBodies>,
    /// Where repaired bodies are written.
    pub storage: S,
    /// The bodies (weak: the task ends with the node, once the queue's sender, which they hold, is gone).
    pub bodies: Weak<StoredBodies<S>>,
    /// Whether the body is still needed is checked, and the repair written, under its lock.
    pub replica: Arc<Mutex<Replica>>,
}

impl<S: Storage> Repairs<S> {
    /// Repairs what arrives on `queue`, up to [`MAX_BODIES_PER_CALL`] bodies a round, until the node goes.
    pub(crate) async fn run(self, mut queue: mpsc::Receiver<Damaged>) {
        while let Some(first) = queue.recv().await {
            let mut round = vec![first];
            while round.len() < MAX_BODIES_PER_CALL
                && let Ok(more) = queue.try_recv()
            {
                round.push(more);
            }
            let Some(bodies) = self.bodies.upgrade() else { return };
            // Damage found again while its repair was queued (a consumer's retry) is repaired once: what reads back
            // whole by now is answered from here.
            let mut damaged = Vec::with_capacity(round.len());
            for job in round {
                match bodies.read(&job.body) {
                    Ok(bytes) => drop(job.answer.send(Ok(bytes))),
                    Err(_) => damaged.push(job),
                }
            }
            drop(bodies);
            if damaged.is_empty() {
                continue;
            }
            let found = self.copies_from_peers(&damaged).await;
            let Some(bodies) = self.bodies.upgrade() else { return };
            self.finish(&bodies, damaged, found);
        }
    }

    /// The peers, in id order: every member but this node.
    fn peers(&self) -> Vec<(NodeId, NodeAddrs)> {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        membership.nodes().filter(|(id, _)| **id != self.me).map(|(id, addrs)| (*id, addrs.clone())).collect()
    }

    /// Asks each peer in turn for the bodies of `round` no peer sent yet: each copy that verifies against its
    /// reference, by key.
    async fn copies_from_peers(&self, round: &[Damaged]) -> BTreeMap<u64, (Bytes, NodeId)> {
        let wanted: BTreeMap<u64, BodyRef> = round.iter().map(|damaged| (damaged.body.key, damaged.body)).collect();
        let mut found = BTreeMap::new();
        for (peer, addrs) in self.peers() {
            loop {
                let ask: Vec<BodyRef> =
                    wanted.values().filter(|body| !found.contains_key(&body.key)).copied().collect();
                if ask.is_empty() {
                    return found;
                }
                let answer = self.fetch.fetch(peer, &addrs, BodiesRequest { bodies: ask.clone() }).await;
                let copies = match answer {
                    Ok(copies) => copies,
                    Err(error) => {
                        tracing::warn!(peer, %error, "could not ask a peer for damaged bodies");
                        break;
                    }
                };
                let before = found.len();
                for (body, copy) in ask.iter().zip(copies) {
                    if let Some(copy) = copy
                        && body.verify(&copy).is_ok()
                    {
                        found.insert(body.key, (Bytes::from(copy), peer));
                    }
                }
                if found.len() == before {
                    break;
                }
            }
        }
        found
    }

    /// Writes the copies found that are still needed, answers each damaged body of `round`, and marks the damage no
    /// peer could repair.
    fn finish(&self, bodies: &StoredBodies<S>, round: Vec<Damaged>, found: BTreeMap<u64, (Bytes, NodeId)>) {
        let replica = self.replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let needed = |damaged: &Damaged| match &damaged.need {
            Need::Held => true,
            Need::Record { stream, partition, seq } => {
                let current = replica.cell.read(stream, *partition, *seq).ok().map(|record| record.body);
                current == Some(Body::Stored(damaged.body))
            }
        };
        let needed: Vec<bool> = round.iter().map(needed).collect();
        let mut batch = Batch::new();
        for (damaged, _) in round.iter().zip(&needed).filter(|(_, needed)| **needed) {
            if let Some((bytes, _)) = found.get(&damaged.body.key) {
                batch.put(Space::Bodies, damaged.body.key, bytes);
            }
        }
        let wrote = !batch.is_empty();
        let written = if wrote { self.storage.write(batch) } else { Ok(()) };
        drop(replica);
        let written = written.and_then(|()| if wrote { self.storage.sync() } else { Ok(()) });
        let written = written.map_err(|error| error.to_string());
        for (damaged, needed) in round.into_iter().zip(needed) {
            let key = damaged.body.key;
            let result = match (found.get(&key), &written) {
                _ if !needed => Err("the message was removed meanwhile".to_string()),
                (Some((bytes, peer)), Ok(())) => {
                    tracing::info!(
                        key,
                        peer,
                        damage = damaged.reason,
                        "a damaged message body was repaired from a peer"
                    );
                    crate::transition::body_repaired(key, *peer);
                    Ok(bytes.clone())
                }
                (Some(_), Err(error)) => {
                    let reason = format!("{} (a peer's copy could not be written: {error})", damaged.reason);
                    bodies.mark(key, &reason);
                    Err(reason)
                }
                (None, _) => {
                    let reason = format!("{} (no peer holds a copy that verifies)", damaged.reason);
                    bodies.mark(key, &reason);
                    Err(reason)
                }
            };
            // Whoever waited may have gone (a read's client is answered at once; a send may have been dropped).
            let _ = damaged.answer.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimDisk;

    #[test]
    fn a_peer_sends_only_copies_that_verify_against_the_asker_s_reference_and_within_bounds() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Bodies, 1, b"one").put(Space::Bodies, 2, b"two");
        disk.write(batch).unwrap();
        let bodies = StoredBodies::new(disk.clone());
        let ask = |bodies_asked: Vec<BodyRef>| answer(&bodies, &BodiesRequest { bodies: bodies_asked });

        let answered = ask(vec![BodyRef::of(1, b"one"), BodyRef::of(2, b"not two"), BodyRef::of(3, b"three")]);
        assert_eq!(answered, Ok(vec![Some(b"one".to_vec()), None, None]), "another body, or none, is not sent");

        assert!(disk.flip_bit(Space::Bodies, 1, 3));
        assert_eq!(ask(vec![BodyRef::of(1, b"one")]), Ok(vec![None]), "a copy damaged here too is not sent");

        let too_many = vec![BodyRef::of(2, b"two"); MAX_BODIES_PER_CALL + 1];
        let refused = ask(too_many).expect_err("refused before anything is read");
        assert!(refused.contains(&format!("at most {MAX_BODIES_PER_CALL}")), "{refused}");
    }
}

//! What a scenario asks of a simulated cell once it has been hurt: that its replicas converge (or where their states
//! differ), what each node stores, that every acknowledged write is there, and samples of the nodes' states for the
//! checkers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cellog_check::record::by_id;
use cellog_check::{Duties, Evidence, NodeState, Stored};
use cellog_client::{Client, proto as v1};

use super::{Cluster, SimNodeId};

impl Cluster {
    /// Waits until every running node of the (first) cell has applied the same index with the same state digest;
    /// returns them.
    pub async fn converge(&self) -> (u64, String) {
        self.converge_in(&self.main_cell).await
    }

    /// Waits until every running node of `cell` has applied the same index with the same state digest.
    ///
    /// # Panics
    /// When they do not within 120 simulated seconds, saying where their states differ.
    pub async fn converge_in(&self, cell: &str) -> (u64, String) {
        self.try_converge_in(cell).await.unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Cluster::converge`], or why the replicas did not converge within 120 simulated seconds: each node's applied
    /// index and digest, and the parts of the state (stream, partition, consumer) where they differ.
    pub async fn try_converge(&self) -> Result<(u64, String), String> {
        self.try_converge_in(&self.main_cell).await
    }

    /// [`Cluster::converge_in`], or why the replicas did not converge.
    pub async fn try_converge_in(&self, cell: &str) -> Result<(u64, String), String> {
        let clients: Vec<(SimNodeId, Client)> =
            self.running_in(cell).into_iter().map(|id| (id, self.client_of(id))).collect();
        self.on_client(async move {
            let mut last = Vec::new();
            for _ in 0..1200 {
                let mut seen = Vec::new();
                for (id, client) in &clients {
                    if let Ok(status) = client.cluster_status_with_digest().await {
                        seen.push((*id, status.applied_index.unwrap_or_default(), status.state_digest));
                    }
                }
                if seen.len() == clients.len()
                    && seen.windows(2).all(|pair| (&pair[0].1, &pair[0].2) == (&pair[1].1, &pair[1].2))
                {
                    let (_, index, digest) = seen.remove(0);
                    return Ok((index, digest));
                }
                last = seen;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let at: Vec<String> =
                last.iter().map(|(id, index, digest)| format!("node {id} at {index} ({:.8})", digest)).collect();
            Err(format!(
                "replicas did not converge within 120 simulated seconds: {}; {}",
                at.join(", "),
                where_states_differ(&clients).await
            ))
        })
        .await
    }

    /// Every message node `id` holds in `stream`'s partitions `0..partitions`, read locally, by id.
    pub async fn stored_on(&self, id: SimNodeId, stream: &str, partitions: u32) -> Stored {
        by_id(self.messages_on(id, stream, partitions).await)
    }

    /// Every message node `id` holds in `stream`'s partitions `0..partitions`, read locally, in partition and
    /// sequence order.
    pub async fn messages_on(&self, id: SimNodeId, stream: &str, partitions: u32) -> Vec<v1::Message> {
        self.try_messages_on(id, stream, partitions).await.expect("a local read")
    }

    /// [`Cluster::messages_on`], or the error of the first read that failed.
    pub async fn try_messages_on(
        &self,
        id: SimNodeId,
        stream: &str,
        partitions: u32,
    ) -> Result<Vec<v1::Message>, cellog_client::ClientError> {
        let client = self.client_of(id);
        let stream = stream.to_string();
        self.on_client(async move {
            let mut messages = Vec::new();
            for partition in 0..partitions {
                let mut from = 1;
                loop {
                    let response = client.read(&stream, partition, from, 1000, true).await?;
                    let Some(last) = response.messages.last().map(|message| message.seq) else { break };
                    messages.extend(response.messages);
                    from = last + 1;
                }
            }
            Ok(messages)
        })
        .await
    }

    /// The replicas converge; then every running node holds every message the history shows acknowledged exactly
    /// once, where it was acknowledged, with the body `body(msg_id)`, and holds no message twice. Returns what the
    /// first node holds.
    pub async fn check_acknowledged(&self, stream: &str, partitions: u32, body: impl Fn(&str) -> Bytes) -> Stored {
        self.converge().await;
        let acked = self.history.acknowledged_in(stream);
        let mut first = None;
        for id in self.running_in(&self.main_cell) {
            let stored = self.stored_on(id, stream, partitions).await;
            for (msg_id, &(partition, seq)) in &acked {
                let copies = stored.get(msg_id).unwrap_or_else(|| panic!("node {id} lost acknowledged {msg_id}"));
                assert_eq!(copies.len(), 1, "node {id} holds {msg_id} {} times", copies.len());
                assert_eq!(
                    (copies[0].partition, copies[0].seq),
                    (partition, seq),
                    "node {id} holds {msg_id} elsewhere"
                );
                assert_eq!(copies[0].body, body(msg_id), "node {id} holds {msg_id} with another body");
            }
            // Unacknowledged ids may exist (their acks were lost) but never twice.
            for (msg_id, copies) in &stored {
                assert_eq!(copies.len(), 1, "node {id} holds {msg_id} {} times", copies.len());
            }
            first.get_or_insert(stored);
        }
        first.expect("a running node")
    }

    /// The run's evidence once the replicas converged: the history, what every running node holds in each of
    /// `streams` (name, partitions), and `duties`.
    pub async fn evidence(&self, streams: &[(&str, u32)], duties: Duties) -> Evidence {
        self.converge().await;
        let mut held: BTreeMap<String, BTreeMap<SimNodeId, Stored>> = BTreeMap::new();
        for id in self.running_in(&self.main_cell) {
            for &(stream, partitions) in streams {
                held.entry(stream.to_string()).or_default().insert(id, self.stored_on(id, stream, partitions).await);
            }
        }
        Evidence {
            operations: self.history.operations(),
            held,
            states: self.states().await,
            samples: Vec::new(),
            duties,
        }
    }

    /// The applied state of each running node of the (first) cell that answers: its index and the digest of each
    /// part of its state.
    pub async fn states(&self) -> BTreeMap<SimNodeId, NodeState> {
        let clients: Vec<(SimNodeId, Client)> =
            self.running_in(&self.main_cell).into_iter().map(|id| (id, self.client_of(id))).collect();
        self.on_client(async move {
            let mut states = BTreeMap::new();
            for (id, client) in clients {
                if let Ok(state) = state_of(&client).await {
                    states.insert(id, state);
                }
            }
            states
        })
        .await
    }

    /// Reads the applied state of each node of the (first) cell, one after another, every `every` until finished:
    /// what the `state` checker compares besides the states at the end, so that a replica that went its own way for
    /// a while (a snapshot installed wrong, then put right by a restart) is seen once another is read at its index.
    /// A node read again at the index it was last read at is not kept twice.
    pub fn sample_states(&self, every: Duration) -> Sampling {
        let stop = Arc::new(AtomicBool::new(false));
        let samplers = self.samplers.clone();
        let task = self.spawn_on_client({
            let stop = stop.clone();
            async move {
                let mut samples: Vec<(SimNodeId, NodeState)> = Vec::new();
                let mut last: BTreeMap<SimNodeId, u64> = BTreeMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let clients: Vec<(SimNodeId, Client)> = samplers
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .iter()
                        .map(|(id, client)| (*id, client.clone()))
                        .collect();
                    for (id, client) in clients {
                        let Ok(state) = state_of(&client).await else { continue };
                        if last.insert(id, state.applied_index) != Some(state.applied_index) {
                            samples.push((id, state));
                        }
                    }
                    tokio::time::sleep(every).await;
                }
                samples
            }
        });
        Sampling { stop, task }
    }
}

/// Where the applied states of the nodes behind `clients` differ: the finest parts (a partition or consumer rather
/// than its whole stream) whose digests are not the same on every node, each with the nodes that agree.
async fn where_states_differ(clients: &[(SimNodeId, Client)]) -> String {
    let mut parts: BTreeMap<String, BTreeMap<String, Vec<SimNodeId>>> = BTreeMap::new();
    let mut answered = Vec::new();
    for (id, client) in clients {
        let Ok(status) = client.cluster_status_with_parts().await else { continue };
        answered.push(*id);
        for part in status.digest_parts {
            parts.entry(part.part).or_default().entry(part.digest).or_default().push(*id);
        }
    }
    let differ: Vec<&String> = parts
        .iter()
        .filter(|(_, digests)| digests.len() > 1 || digests.values().map(Vec::len).sum::<usize>() < answered.len())
        .map(|(part, _)| part)
        .collect();
    let finest: Vec<String> = differ
        .iter()
        .filter(|part| !differ.iter().any(|other| other.len() > part.len() && other.starts_with(&format!("{part} "))))
        .map(|part| {
            let groups: Vec<String> = parts[*part]
                .values()
                .map(|ids| ids.iter().map(ToString::to_string).collect::<Vec<_>>().join("+"))
                .collect();
            format!("{part} (nodes {})", groups.join(" | "))
        })
        .collect();
    if finest.is_empty() {
        format!("the nodes that answered ({answered:?}) show no part that differs")
    } else {
        format!("the states differ in: {}", finest.join(", "))
    }
}

/// The applied state of the node behind `client`: its index and the digest of each part of its state.
async fn state_of(client: &Client) -> Result<NodeState, cellog_client::ClientError> {
    let status = client.cluster_status_with_parts().await?;
    let parts = status.digest_parts.into_iter().map(|part| (part.part, part.digest)).collect();
    Ok(NodeState { applied_index: status.applied_index.unwrap_or_default(), parts })
}

/// States read from the nodes while a workload runs ([`Cluster::sample_states`]).
pub struct Sampling {
    stop: Arc<AtomicBool>,
    task: madsim::task::JoinHandle<Vec<(SimNodeId, NodeState)>>,
}

impl Sampling {
    /// Stops reading; every state read, in the order read.
    pub async fn finish(self) -> Vec<(SimNodeId, NodeState)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampling does not panic")
    }
}

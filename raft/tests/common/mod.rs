//! An in-process cell for tests: nodes on simulated disks, connected by an in-memory router that can isolate nodes.
#![allow(dead_code)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests wait on the runtime's clock, which is madsim's simulated one under --cfg madsim"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_core::{Command, Outcome, PublishRequest, Rejection, StreamConfig};
use cellog_raft::body_repair::{BodiesAnswer, BodiesRequest, FetchBodies, PeerBodies};
use cellog_raft::storage::SimDisk;
use cellog_raft::types::{NodeAddrs, NodeId, TypeConfig};
use cellog_raft::{CellNode, Past, ProposeError};
use futures::future::BoxFuture;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{Config, SnapshotPolicy};

type Nodes = Arc<Mutex<BTreeMap<NodeId, Arc<CellNode<SimDisk>>>>>;

/// Delivers RPCs between in-process nodes; an isolated node neither sends nor receives.
#[derive(Clone, Default)]
pub struct Router {
    nodes: Nodes,
    isolated: Arc<Mutex<BTreeSet<NodeId>>>,
}

/// A node's way out to one peer.
pub struct Connection {
    router: Router,
    from: NodeId,
    target: NodeId,
}

/// The factory a node is started with.
pub struct NodeNetwork {
    router: Router,
    from: NodeId,
}

impl Router {
    fn reach(&self, from: NodeId, target: NodeId) -> Result<Arc<CellNode<SimDisk>>, Unreachable> {
        let isolated = self.isolated.lock().unwrap();
        if isolated.contains(&from) || isolated.contains(&target) {
            return Err(Unreachable::new(&std::io::Error::other(format!("{from} -> {target} is cut"))));
        }
        drop(isolated);
        self.nodes
            .lock()
            .unwrap()
            .get(&target)
            .cloned()
            .ok_or_else(|| Unreachable::new(&std::io::Error::other(format!("node {target} is down"))))
    }
}

/// Bodies fetched from peers through the router.
struct RouterBodies {
    router: Router,
    from: NodeId,
}

impl FetchBodies for RouterBodies {
    fn fetch(&self, target: NodeId, _addrs: &NodeAddrs, request: BodiesRequest) -> BoxFuture<'static, BodiesAnswer> {
        let node = self.router.reach(self.from, target);
        Box::pin(async move { node.map_err(|error| error.to_string())?.answer_bodies(&request) })
    }
}

impl PeerBodies for NodeNetwork {
    fn fetch_bodies(&self) -> Arc<dyn FetchBodies> {
        Arc::new(RouterBodies { router: self.router.clone(), from: self.from })
    }
}

impl RaftNetworkFactory<TypeConfig> for NodeNetwork {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &NodeAddrs) -> Connection {
        Connection { router: self.router.clone(), from: self.from, target }
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
        let node = self.router.reach(self.from, self.target).map_err(RPCError::Unreachable)?;
        node.append_entries(rpc).await.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId, InstallSnapshotError>>>
    {
        let node = self.router.reach(self.from, self.target).map_err(RPCError::Unreachable)?;
        node.raft()
            .install_snapshot(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
        let node = self.router.reach(self.from, self.target).map_err(RPCError::Unreachable)?;
        node.vote(rpc).await.map_err(|error| RPCError::Network(NetworkError::new(&error)))
    }
}

/// Raft timing for tests: fast elections, snapshots every `snapshot_every` entries, the log purged right after.
pub fn config(snapshot_every: u64) -> Arc<Config> {
    Arc::new(
        Config {
            cluster_name: "test".to_string(),
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
            max_in_snapshot_log_to_keep: 0,
            purge_batch_size: 1,
            ..Config::default()
        }
        .validate()
        .expect("a valid config"),
    )
}

/// A cell of in-process nodes, each on its own simulated disk.
pub struct TestCell {
    pub router: Router,
    pub disks: BTreeMap<NodeId, SimDisk>,
    pub config: Arc<Config>,
    /// Every publish the cell acknowledged: (payload, partition, seq).
    pub acked: Vec<(String, u32, u64)>,
}

pub const TIMEOUT: Duration = Duration::from_secs(20);

impl TestCell {
    pub fn new(snapshot_every: u64) -> Self {
        TestCell {
            router: Router::default(),
            disks: BTreeMap::new(),
            config: config(snapshot_every),
            acked: Vec::new(),
        }
    }

    pub fn node(&self, id: NodeId) -> Arc<CellNode<SimDisk>> {
        self.router.nodes.lock().unwrap().get(&id).cloned().unwrap_or_else(|| panic!("node {id} is not running"))
    }

    pub fn running(&self) -> Vec<NodeId> {
        self.router.nodes.lock().unwrap().keys().copied().collect()
    }

    /// Starts (or restarts) a node on its disk, creating the disk the first time.
    pub async fn start(&mut self, id: NodeId) -> Arc<CellNode<SimDisk>> {
        self.start_as(id, Past::Unknown).await
    }

    /// Starts a node knowing what it was (its identity, kept apart from its disk).
    pub async fn start_as(&mut self, id: NodeId, past: Past) -> Arc<CellNode<SimDisk>> {
        let disk = self.disks.entry(id).or_insert_with(|| SimDisk::new(disk_seed(id))).clone();
        let network = NodeNetwork { router: self.router.clone(), from: id };
        let clock = Arc::new(cellog_raft::SystemClock);
        let identity = cellog_raft::network::CellIdentity::new("test");
        let node =
            CellNode::start_with(id, self.config.clone(), disk, network, clock, past, identity, Default::default())
                .await;
        let node = Arc::new(node.expect("the node starts"));
        self.router.nodes.lock().unwrap().insert(id, node.clone());
        node
    }

    /// Stops a node; `power_loss` also drops what its disk had not synced.
    pub async fn stop(&mut self, id: NodeId, power_loss: bool) {
        let node = self.router.nodes.lock().unwrap().remove(&id).expect("running");
        node.shutdown().await;
        if power_loss {
            self.disks[&id].crash();
        } else {
            self.disks[&id].reopen();
        }
    }

    pub fn isolate(&self, id: NodeId) {
        self.router.isolated.lock().unwrap().insert(id);
    }

    pub fn heal(&self) {
        self.router.isolated.lock().unwrap().clear();
    }

    /// Starts nodes and makes them a cell.
    pub async fn bootstrap(&mut self, ids: &[NodeId]) {
        for &id in ids {
            self.start(id).await;
        }
        let members: BTreeMap<NodeId, NodeAddrs> =
            ids.iter().map(|&id| (id, NodeAddrs::new(format!("node-{id}"), format!("client-{id}")))).collect();
        self.node(ids[0]).raft().initialize(members).await.expect("initialize");
        self.wait_leader(ids).await;
    }

    /// Waits until one of `among` is leader and every running node among them agrees.
    pub async fn wait_leader(&self, among: &[NodeId]) -> NodeId {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let leaders: BTreeSet<Option<NodeId>> = among
                .iter()
                .filter(|id| self.running().contains(id))
                .filter(|id| !self.router.isolated.lock().unwrap().contains(id))
                .map(|&id| self.node(id).raft().metrics().borrow().current_leader)
                .collect();
            if leaders.len() == 1
                && let Some(Some(leader)) = leaders.into_iter().next()
                && among.contains(&leader)
                && self.node(leader).raft().metrics().borrow().state.is_leader()
            {
                return leader;
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader among {among:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Proposes through whichever node leads, retrying while leadership moves.
    pub async fn propose(&mut self, command: Command) -> Result<Outcome, Rejection> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let candidates = self.running();
            for id in candidates {
                if self.router.isolated.lock().unwrap().contains(&id) {
                    continue;
                }
                let node = self.node(id);
                if !node.raft().metrics().borrow().state.is_leader() {
                    continue;
                }
                match node.propose_now(command.clone()).await {
                    Ok(result) => return result,
                    Err(
                        ProposeError::NotLeader { .. } | ProposeError::LeaderChanged { .. } | ProposeError::Raft(_),
                    ) => continue,
                    Err(
                        error @ (ProposeError::StorageFull { .. }
                        | ProposeError::QuorumStorageFull { .. }
                        | ProposeError::ApplyHalted { .. }
                        | ProposeError::EntrySkipped { .. }),
                    ) => panic!("{error}"),
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader took {command:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn create_stream(&mut self) {
        let config = StreamConfig { partitions: 2, ..StreamConfig::with_subjects(["orders.>"]) };
        self.propose(Command::CreateStream { name: "orders".to_string(), config }).await.expect("stream");
    }

    /// Publishes `n` messages with ids, recording each acknowledgement.
    pub async fn publish(&mut self, prefix: &str, n: usize) {
        self.publish_sized(prefix, n, 0).await;
    }

    /// Publishes `n` messages with ids and payloads of at least `size` bytes, recording each acknowledgement.
    pub async fn publish_sized(&mut self, prefix: &str, n: usize, size: usize) {
        for i in 0..n {
            let id = format!("{prefix}-{i}");
            let payload = format!("{id:.<size$}");
            let request = PublishRequest::new(format!("orders.{}", i % 5), payload.clone()).with_id(id.clone());
            match self.propose(Command::Publish(request)).await {
                Ok(Outcome::Published(ack)) => self.acked.push((payload, ack.partition, ack.seq)),
                other => panic!("publish {id} answered {other:?}"),
            }
        }
    }

    /// Waits until every running node has applied the same index, then checks their digests agree and every
    /// acknowledged publish is readable at its place on every node.
    pub async fn converge(&self) {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let states: BTreeSet<_> = self
                .running()
                .iter()
                .map(|&id| self.node(id).digest().expect("no panic interrupted applying"))
                .collect();
            if states.len() == 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "replicas did not converge: {states:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for id in self.running() {
            let node = self.node(id);
            for (payload, partition, seq) in &self.acked {
                let record = node.replica().unwrap().cell.read("orders", *partition, *seq);
                let record = record.unwrap_or_else(|e| panic!("node {id} lost acknowledged {payload}: {e}"));
                let stored = node.payload("orders", &record).unwrap_or_else(|e| panic!("node {id} at {seq}: {e}"));
                assert_eq!(stored, payload.as_bytes(), "node {id} at {seq}");
            }
        }
    }
}

/// Waits until a node holds its log up to its repair target again.
pub async fn wait_repaired(node: &CellNode<SimDisk>) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while node.is_repairing() {
        assert!(tokio::time::Instant::now() < deadline, "node {} did not repair", node.id());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The seed of a node's disk faults: from the simulation's seed under madsim, so every seed brings other faults.
fn disk_seed(id: NodeId) -> u64 {
    #[cfg(madsim)]
    {
        use rand::Rng;
        madsim::rand::thread_rng().r#gen::<u64>() ^ id
    }
    #[cfg(not(madsim))]
    {
        id
    }
}

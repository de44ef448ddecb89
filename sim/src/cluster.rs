//! A simulated cell: nodes on madsim's network, each with its own IP, its own simulated disk, and the production
//! node code inside.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cellog_net::{Client, ClientOptions, NodeConfig, Peer, RaftTiming, RunningNode};
use cellog_raft::storage::SimDisk;
use cellog_raft::{Node, SystemClock};
use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};

/// A node's id in the cell.
pub type SimNodeId = u64;

const CLIENT_PORT: u16 = 7401;
const RAFT_PORT: u16 = 7501;

struct SimNode {
    disk: SimDisk,
    handle: NodeHandle,
    config: NodeConfig,
    up: bool,
}

/// A cell of simulated nodes and a client machine.
pub struct Cluster {
    handle: Handle,
    nodes: BTreeMap<SimNodeId, SimNode>,
    client_machine: NodeHandle,
}

fn ip(id: SimNodeId) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, u8::try_from(id).expect("at most 255 nodes")))
}

/// Entries between snapshots in simulation unless a scenario asks otherwise: far fewer than in production, so that
/// catch-up by snapshot and log purging happen within short scenarios.
pub const SIM_SNAPSHOT_EVERY: u64 = 500;

/// Raft timing in simulation: heartbeats and elections as in production.
fn timing(snapshot_every: u64) -> RaftTiming {
    RaftTiming { heartbeat_ms: 100, election_timeout_ms: 600, snapshot_every }
}

fn config(id: SimNodeId, founders: &[SimNodeId], snapshot_every: u64) -> NodeConfig {
    let client_addr = SocketAddr::new(ip(id), CLIENT_PORT);
    let raft_addr = SocketAddr::new(ip(id), RAFT_PORT);
    NodeConfig {
        cell: "sim".to_string(),
        id,
        data_dir: std::path::PathBuf::from(format!("/sim/node-{id}")),
        client_addr,
        raft_addr,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers: founders
            .iter()
            .filter(|&&peer| peer != id)
            .map(|&peer| Peer {
                id: peer,
                node: Node::new(
                    SocketAddr::new(ip(peer), RAFT_PORT).to_string(),
                    SocketAddr::new(ip(peer), CLIENT_PORT).to_string(),
                ),
            })
            .collect(),
        bootstrap: founders.contains(&id),
        timing: timing(snapshot_every),
    }
}

impl Cluster {
    /// A cell founded by nodes `1..=n`, each on a fresh disk whose faults are seeded from `disk_seed`.
    pub fn new(n: u64, disk_seed: u64) -> Self {
        Cluster::with_snapshot_every(n, disk_seed, SIM_SNAPSHOT_EVERY)
    }

    /// The same, taking a snapshot every `snapshot_every` entries.
    pub fn with_snapshot_every(n: u64, disk_seed: u64, snapshot_every: u64) -> Self {
        let handle = Handle::current();
        let founders: Vec<SimNodeId> = (1..=n).collect();
        let client_machine = handle.create_node().name("client").ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1))).build();
        let mut cluster = Cluster { handle, nodes: BTreeMap::new(), client_machine };
        for &id in &founders {
            cluster.add(id, config(id, &founders, snapshot_every), SimDisk::new(disk_seed ^ id));
        }
        cluster
    }

    fn add(&mut self, id: SimNodeId, config: NodeConfig, disk: SimDisk) {
        let (init_config, init_disk) = (config.clone(), disk.clone());
        let handle = self
            .handle
            .create_node()
            .name(format!("node-{id}"))
            .ip(ip(id))
            .init(move || {
                let (config, disk) = (init_config.clone(), init_disk.clone());
                async move {
                    // A madsim node's init future must never return; it is run again on restart.
                    let _running = match RunningNode::start(&config, disk, Arc::new(SystemClock)).await {
                        Ok(running) => Some(running),
                        Err(error) => {
                            tracing::error!(node = config.id, %error, "node did not start");
                            None
                        }
                    };
                    std::future::pending::<()>().await;
                }
            })
            .build();
        self.nodes.insert(id, SimNode { disk, handle, config, up: true });
    }

    /// The ids of the nodes.
    pub fn ids(&self) -> Vec<SimNodeId> {
        self.nodes.keys().copied().collect()
    }

    /// The ids of the nodes that run.
    pub fn running(&self) -> Vec<SimNodeId> {
        self.nodes.iter().filter(|(_, node)| node.up).map(|(id, _)| *id).collect()
    }

    fn node(&self, id: SimNodeId) -> &SimNode {
        self.nodes.get(&id).unwrap_or_else(|| panic!("no node {id}"))
    }

    /// A node's disk.
    pub fn disk(&self, id: SimNodeId) -> &SimDisk {
        &self.node(id).disk
    }

    /// A client of the whole cell.
    pub fn client(&self) -> Client {
        let addrs = self.nodes.values().map(|node| node.config.client_addr.to_string());
        Client::new(addrs, ClientOptions::default()).expect("valid addresses")
    }

    /// A client of one node only, never redirected (for local reads and status).
    pub fn client_of(&self, id: SimNodeId) -> Client {
        let options = ClientOptions { retry_for: Duration::ZERO, ..ClientOptions::default() };
        Client::new([self.node(id).config.client_addr.to_string()], options).expect("a valid address")
    }

    /// Runs `work` on the client machine and waits for it.
    pub async fn on_client<F>(&self, work: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.client_machine.spawn(work).await.expect("client work does not panic")
    }

    /// Starts `work` on the client machine without waiting for it.
    pub fn spawn_on_client<F>(&self, work: F) -> madsim::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.client_machine.spawn(work)
    }

    /// The node's process dies; its disk keeps what the page cache held.
    pub fn crash(&mut self, id: SimNodeId) {
        self.handle.kill(self.node(id).handle.id());
        self.node(id).disk.reopen();
        self.nodes.get_mut(&id).expect("exists").up = false;
        tracing::info!(node = id, "crash");
    }

    /// The node's machine loses power: its disk keeps only what was synced.
    pub fn power_off(&mut self, id: SimNodeId) {
        self.handle.kill(self.node(id).handle.id());
        self.node(id).disk.crash();
        self.nodes.get_mut(&id).expect("exists").up = false;
        tracing::info!(node = id, "power off");
    }

    /// Every node loses power at once.
    pub fn power_fail(&mut self) {
        for id in self.ids() {
            self.power_off(id);
        }
    }

    /// The node starts again on its disk.
    pub fn restart(&mut self, id: SimNodeId) {
        self.handle.restart(self.node(id).handle.id());
        self.nodes.get_mut(&id).expect("exists").up = true;
        tracing::info!(node = id, "restart");
    }

    /// No message crosses between `a` and `b`, either way.
    pub fn partition(&self, a: &[SimNodeId], b: &[SimNodeId]) {
        let net = NetSim::current();
        for &x in a {
            for &y in b {
                net.clog_link(self.node(x).handle.id(), self.node(y).handle.id());
                net.clog_link(self.node(y).handle.id(), self.node(x).handle.id());
            }
        }
    }

    /// A node can reach no other node, nor the client.
    pub fn isolate(&self, id: SimNodeId) {
        NetSim::current().clog_node(self.node(id).handle.id());
    }

    /// Every link works again.
    pub fn heal(&self) {
        let net = NetSim::current();
        let handles: Vec<_> = self.nodes.values().map(|node| node.handle.id()).collect();
        for &x in &handles {
            net.unclog_node(x);
            for &y in &handles {
                net.unclog_link(x, y);
            }
        }
    }

    /// Waits until some node leads and has applied an entry of its term; returns its id.
    pub async fn wait_leader(&self) -> SimNodeId {
        let clients: Vec<(SimNodeId, Client)> = self.running().into_iter().map(|id| (id, self.client_of(id))).collect();
        self.on_client(async move {
            for _ in 0..600 {
                for (id, client) in &clients {
                    if let Ok(status) = client.cluster_status().await
                        && status.state == "Leader"
                        && status.applied_index.is_some()
                    {
                        return *id;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("no leader within 60 simulated seconds");
        })
        .await
    }

    /// Waits until every running node has applied the same index with the same state digest; returns them.
    pub async fn converge(&self) -> (u64, String) {
        let clients: Vec<(SimNodeId, Client)> = self.running().into_iter().map(|id| (id, self.client_of(id))).collect();
        self.on_client(async move {
            let mut last = Vec::new();
            for _ in 0..1200 {
                let mut seen = Vec::new();
                for (id, client) in &clients {
                    if let Ok(status) = client.cluster_status().await {
                        seen.push((*id, status.applied_index.unwrap_or_default(), status.state_digest));
                    }
                }
                if seen.len() == clients.len()
                    && seen.windows(2).all(|pair| (&pair[0].1, &pair[0].2) == (&pair[1].1, &pair[1].2))
                {
                    let (_, index, digest) = seen.remove(0);
                    return (index, digest);
                }
                last = seen;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("replicas did not converge within 120 simulated seconds: {last:?}");
        })
        .await
    }
}

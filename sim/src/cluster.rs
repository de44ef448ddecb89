//! A simulated cell: nodes on madsim's network, each with its own IP, its own simulated disk and clock, and the
//! production node code inside; a client machine; the run's trace and history; and the vocabulary scenarios use to
//! hurt it (crashes, power failures, pauses, clock jumps, partitions, lossy links, disk faults, membership changes).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_client::{Client, ClientOptions};
use cellog_core::Millis;
use cellog_envelope::{CellKey, Keyring};
use cellog_mail::{MailConfig, RetryPolicy};
use cellog_net::mirror::MirrorOptions;
use cellog_net::{NodeConfig, Peer, RaftTiming, RunningNode};
use cellog_raft::storage::{MetaKey, SimDisk, Space, Storage};
use cellog_raft::{Clock, NodeAddrs, SystemClock};
use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};

use crate::history::History;
use crate::seeds::Seeds;
use crate::trace::{self, Trace, TraceGuard};

mod checks;
mod node_ctl;

pub use node_ctl::NodeCtl;

/// A node's id in the cell.
pub type SimNodeId = u64;

const CLIENT_PORT: u16 = 7401;
const RAFT_PORT: u16 = 7501;

/// Entries between snapshots in simulation unless a scenario asks otherwise: far fewer than in production, so that
/// catch-up by snapshot and log purging happen within short scenarios.
pub const SIM_SNAPSHOT_EVERY: u64 = 500;
/// How long the workload's clients may take to finish once the faults have healed (see [`Cluster::finish_workload`]):
/// a run takes under a minute of simulated time in all.
pub const WORKLOAD_BUDGET: Duration = Duration::from_secs(300);

/// A node's clock: the simulated wall clock plus an offset the harness can jump.
#[derive(Clone, Debug, Default)]
struct SimClock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock for SimClock {
    fn now(&self) -> Millis {
        Millis(SystemClock.now().0.saturating_add_signed(self.offset_ms.load(Ordering::Relaxed)))
    }

    /// Jumps move the wall clock only; the steady clock runs on.
    fn elapsed(&self) -> Duration {
        SystemClock.elapsed()
    }
}

struct SimNode {
    cell: String,
    disk: SimDisk,
    clock: SimClock,
    handle: NodeHandle,
    config: NodeConfig,
    /// What the node is given about the entries it applies at its next start (see [`NodeCtl::set_apply`]).
    apply: Arc<Mutex<cellog_raft::ApplyControl>>,
    up: bool,
}

/// Loss and latency on every link.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetworkFaults {
    /// Chance that a packet is dropped. Connections are reliable (as TCP is): a dropped packet is sent again after a
    /// backoff, so loss shows as delay, and a long run of it as a stalled link.
    pub loss_rate: f64,
    /// Each packet's latency is drawn from this range.
    pub latency: Range<Duration>,
}

impl Default for NetworkFaults {
    /// madsim's defaults: no loss, 1–10 ms.
    fn default() -> Self {
        NetworkFaults { loss_rate: 0.0, latency: Duration::from_millis(1)..Duration::from_millis(10) }
    }
}

/// A cell of simulated nodes and a client machine.
pub struct Cluster {
    handle: Handle,
    seeds: Seeds,
    nodes: BTreeMap<SimNodeId, SimNode>,
    /// Each cell's mail setup (`None`: no mail), by cell name; the first cell is the one most methods act on.
    cells: BTreeMap<String, Option<MailConfig>>,
    main_cell: String,
    client_machine: NodeHandle,
    /// Further client machines ([`Cluster::client_host`]).
    client_hosts: Vec<NodeHandle>,
    timing: RaftTiming,
    trace: Trace,
    history: History,
    replay: String,
    /// How often the clients it makes ask for the cell's members.
    discover_every: Duration,
    /// A client of each node of the first cell, for [`Cluster::sample_states`] (kept as nodes come and go).
    samplers: Arc<Mutex<BTreeMap<SimNodeId, Client>>>,
    /// Whether the run asked for its nodes' panics ([`Cluster::node_panics`]) to report them itself.
    panics_asked: AtomicBool,
    // Last, so that it is dropped after the nodes: the trace collects until the cell is gone.
    _trace_guard: TraceGuard,
}

fn ip(id: SimNodeId) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, u8::try_from(id).expect("at most 255 nodes")))
}

fn node_addrs(id: SimNodeId) -> NodeAddrs {
    NodeAddrs::new(SocketAddr::new(ip(id), RAFT_PORT).to_string(), SocketAddr::new(ip(id), CLIENT_PORT).to_string())
}

/// Raft timing in simulation: heartbeats, elections and the log kept behind a snapshot as in production.
fn timing(snapshot_every: u64) -> RaftTiming {
    RaftTiming { snapshot_every, ..RaftTiming::default() }
}

/// The cell of a one-cell simulation.
pub const SIM_CELL: &str = "sim";

/// How sealed mail retries in simulation: soon and often, so that a partition's end shows within seconds.
pub fn sim_retry() -> RetryPolicy {
    RetryPolicy {
        first: Duration::from_millis(200),
        max: Duration::from_secs(2),
        give_up_after: Duration::from_secs(3600),
        attempt_timeout: Duration::from_secs(2),
        poll: Duration::from_millis(200),
    }
}

/// How mirrors run in simulation: a snapshot threshold, reads and chunks small enough that a partition of seconds
/// under a light load passes the threshold and a catch-up takes several chunks; backoff up to ten seconds, so a
/// source that came back and was used only after the backoff would show.
pub fn sim_mirrors() -> MirrorOptions {
    MirrorOptions {
        snapshot_lag: 100,
        incremental_read: 16,
        snapshot_chunk: 40,
        poll: Duration::from_millis(100),
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(10),
        probe_every: Duration::from_millis(250),
        attempt_timeout: Duration::from_secs(1),
        token: None,
        tls: None,
    }
}

/// Node `id`'s configuration in `cell`; `bootstrap` founds the cell with `peers` and itself.
fn config(
    cell: &str,
    id: SimNodeId,
    peers: &[SimNodeId],
    bootstrap: bool,
    timing: &RaftTiming,
    mail: Option<MailConfig>,
) -> NodeConfig {
    NodeConfig {
        cell: cell.to_string(),
        id,
        data_dir: std::path::PathBuf::from(format!("/sim/node-{id}")),
        client_addr: SocketAddr::new(ip(id), CLIENT_PORT),
        raft_addr: SocketAddr::new(ip(id), RAFT_PORT),
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers: peers
            .iter()
            .filter(|&&peer| peer != id)
            .map(|&peer| Peer { id: peer, node: node_addrs(peer) })
            .collect(),
        bootstrap,
        timing: timing.clone(),
        mail,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: cellog_net::auth::Callers { insecure: true, cell: None, rate: None, scrape_token: None },
        root_token: None,
        tls: None,
        limits: cellog_net::Limits::DEFAULT,
        mirrors: sim_mirrors(),
        apply: cellog_raft::ApplyControl::default(),
    }
}

/// Fixed keys for the cells scenarios name, so that their fingerprints (which the trace records) are the same in every
/// run. A cell without one gets a fresh key, whose fingerprint differs from run to run.
const FIXTURE_KEYS: [(&str, &[u8]); 2] =
    [("alpha", include_bytes!("../fixtures/alpha.tsk")), ("bravo", include_bytes!("../fixtures/bravo.tsk"))];

/// Seeds OpenSSL's process-wide random generator from the system, on a thread of its own, once per process. Call it
/// before a run starts, outside the simulation (which allows no threads): seeded inside a run instead, it would draw
/// on that run's randomness, and only in the process's first run, so the same seed would run differently depending
/// on what ran before it. (Each thread's own generator, made on the thread's first use, still draws inside the run,
/// the same in every run that starts on a fresh thread, as madsim's test runs and the golden scenarios do.)
pub fn seed_openssl_outside_the_simulation() {
    static SEEDED: std::sync::Once = std::sync::Once::new();
    SEEDED.call_once(|| {
        std::thread::spawn(|| CellKey::generate("seed").map(drop))
            .join()
            .expect("the seeding thread does not panic")
            .expect("OpenSSL makes a key");
    });
}

/// Each cell's mail: a key of its own, every other cell's public key, and every other cell's client addresses.
fn mail_setup(members: &BTreeMap<String, Vec<SimNodeId>>) -> BTreeMap<String, MailConfig> {
    let key_of = |cell: &str| match FIXTURE_KEYS.iter().find(|(name, _)| *name == cell) {
        Some((_, tsk)) => CellKey::from_tsk(tsk).expect("a fixture key"),
        None => CellKey::generate(cell).expect("a cell key"),
    };
    let keys: BTreeMap<&String, CellKey> = members.keys().map(|cell| (cell, key_of(cell))).collect();
    members
        .keys()
        .map(|cell| {
            let key = keys[cell].clone();
            let mut keyring = Keyring::in_memory();
            let mut homes = BTreeMap::new();
            for (other, ids) in members.iter().filter(|(other, _)| *other != cell) {
                keyring.import(keys[other].public_armored().as_bytes(), Some(&key)).expect("a cell's key imports");
                let addrs = ids.iter().map(|&id| SocketAddr::new(ip(id), CLIENT_PORT).to_string()).collect();
                homes.insert(other.clone(), addrs);
            }
            let config = MailConfig {
                key,
                keyring,
                keyring_dir: None,
                homes,
                // No TLS in simulation.
                home_cas: BTreeMap::new(),
                retry: sim_retry(),
                id_seed: 0,
            };
            (cell.clone(), config)
        })
        .collect()
}

/// The command that replays the running test with this seed (madsim runs a test's body on a thread of its own, so
/// the test's name is known only when that thread carries it).
fn test_replay(seed: u64) -> String {
    let command = format!(
        "MADSIM_TEST_SEED={seed} RUSTFLAGS=\"--cfg madsim\" cargo test --profile sim -p cellog-sim --test scenarios"
    );
    match std::thread::current().name().filter(|name| !name.is_empty() && *name != "main") {
        Some(test) => format!("{command} -- --exact {test}"),
        None => command,
    }
}

impl Cluster {
    /// A cell founded by nodes `1..=n`, everything seeded from madsim's seed.
    pub fn new(n: u64) -> Self {
        Cluster::with_snapshot_every(n, SIM_SNAPSHOT_EVERY)
    }

    /// The same, taking a snapshot every `snapshot_every` entries.
    pub fn with_snapshot_every(n: u64, snapshot_every: u64) -> Self {
        Cluster::with_timing(n, timing(snapshot_every))
    }

    /// The same, with this Raft timing (snapshot interval and log kept behind a snapshot included).
    pub fn with_timing(n: u64, timing: RaftTiming) -> Self {
        Cluster::with_cells(&[(SIM_CELL, n)], timing, false)
    }

    /// Several cells on one network: the first `n` nodes found the first cell, the next ones the next, and so on
    /// (node ids count on across cells). With `mail`, each cell gets a key, every other cell's key and addresses.
    pub fn with_cells(cells: &[(&str, u64)], timing: RaftTiming, mail: bool) -> Self {
        // First, so that the trace knows the nodes' spans from their creation on.
        let (trace, trace_guard) = Trace::install();
        let handle = Handle::current();
        let seeds = Seeds::current();
        let mut members: BTreeMap<String, Vec<SimNodeId>> = BTreeMap::new();
        let mut next = 1;
        for &(cell, n) in cells {
            members.insert(cell.to_string(), (next..next + n).collect());
            next += n;
        }
        let mail_configs = if mail { mail_setup(&members) } else { BTreeMap::new() };
        let client_machine = handle.create_node().name("client").ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1))).build();
        let mut cluster = Cluster {
            handle,
            seeds,
            nodes: BTreeMap::new(),
            cells: members.keys().map(|cell| (cell.clone(), mail_configs.get(cell).cloned())).collect(),
            main_cell: cells.first().expect("at least one cell").0.to_string(),
            client_machine,
            client_hosts: Vec::new(),
            timing,
            trace,
            history: crate::history::simulated(),
            replay: test_replay(seeds.0),
            discover_every: cellog_client::DISCOVERY_INTERVAL,
            panics_asked: AtomicBool::new(false),
            samplers: Arc::default(),
            _trace_guard: trace_guard,
        };
        for (cell, founders) in &members {
            for &id in founders {
                let config = config(cell, id, founders, true, &cluster.timing, cluster.mail_of(cell, id));
                cluster.start_node(id, config);
            }
        }
        cluster
    }

    /// Node `id`'s mail config in `cell`, its envelope ids seeded from the run's seed.
    fn mail_of(&self, cell: &str, id: SimNodeId) -> Option<MailConfig> {
        let mut mail = self.cells.get(cell)?.clone()?;
        mail.id_seed = self.seeds.mail(id);
        Some(mail)
    }

    fn start_node(&mut self, id: SimNodeId, config: NodeConfig) {
        let disk = SimDisk::new(self.seeds.disk(id));
        let clock = SimClock::default();
        let apply = Arc::new(Mutex::new(config.apply.clone()));
        let (init_config, init_disk, init_clock, init_apply) =
            (config.clone(), disk.clone(), clock.clone(), apply.clone());
        let handle = self
            .handle
            .create_node()
            .name(format!("node-{id}"))
            .ip(ip(id))
            // A node's panic ends its process, not the run: it starts again on its disk 1 to 10 s later, as a
            // supervisor restarts it, and the run reports the panic (see `Cluster::node_panics`). A node that cannot
            // go on exits the same way, reported as an exit (see `trace::Exit`).
            .restart_on_panic()
            .init(move || {
                let (mut config, disk, clock) = (init_config.clone(), init_disk.clone(), init_clock.clone());
                config.apply = init_apply.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                // A new process opens the store afresh, whatever made the last one fail.
                disk.reopen();
                async move {
                    // A madsim node's init future must never return; it is run again on restart.
                    let reason = match RunningNode::start(&config, disk, Arc::new(clock)).await {
                        Ok(running) => running.failed().await,
                        Err(error) => {
                            tracing::error!(node = config.id, %error, "node did not start");
                            format!("did not start: {error}")
                        }
                    };
                    // `cellog node` exits non-zero here, and its supervisor starts it again.
                    std::panic::panic_any(trace::Exit(reason))
                }
            })
            .build();
        let sampled = config.cell == self.main_cell;
        self.nodes.insert(id, SimNode { cell: config.cell.clone(), disk, clock, handle, config, apply, up: true });
        if sampled {
            // A sample must not wait out a partition: an unanswered read is skipped and tried at the next round.
            let options = ClientOptions {
                retry_for: Duration::ZERO,
                attempt_timeout: Duration::from_secs(1),
                discover: false,
                ..ClientOptions::default()
            };
            let client = Client::new([self.get(id).config.client_addr.to_string()], options).expect("a valid address");
            self.samplers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, client);
        }
    }

    /// The run's seed.
    pub fn seeds(&self) -> Seeds {
        self.seeds
    }

    /// The trace of state transitions so far.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The panics of the nodes' tasks so far, as their trace lines (each restarted its node). A run that reports them
    /// itself asks here; a cluster dropped after panics no one asked for fails the test that made it.
    pub fn node_panics(&self) -> Vec<String> {
        self.panics_asked.store(true, Ordering::Relaxed);
        self.trace.node_panics()
    }

    /// The history of client operations, shared by every workload client of this cell.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Sets the one-line command printed if the run fails (a test's own by default).
    pub fn set_replay(&mut self, command: impl Into<String>) {
        self.replay = command.into();
    }

    /// The ids of the nodes (of every cell).
    pub fn ids(&self) -> Vec<SimNodeId> {
        self.nodes.keys().copied().collect()
    }

    /// The ids of the nodes of `cell`.
    pub fn ids_in(&self, cell: &str) -> Vec<SimNodeId> {
        self.nodes.iter().filter(|(_, node)| node.cell == cell).map(|(id, _)| *id).collect()
    }

    /// The ids of the nodes that run (of every cell).
    pub fn running(&self) -> Vec<SimNodeId> {
        self.nodes.iter().filter(|(_, node)| node.up).map(|(id, _)| *id).collect()
    }

    /// Restarts every running node that found a damaged message body (its disk holds the mark), as an operator does
    /// when its `cellog_bodies_unreadable` gauge is above zero: the node drops its state and takes it again from the
    /// leader. Returns whether it restarted any.
    pub fn restart_damaged(&mut self) -> bool {
        let damaged: Vec<SimNodeId> = self
            .running()
            .into_iter()
            .filter(|id| !matches!(self.disk(*id).get(Space::Meta, MetaKey::BodiesDamaged as u64), Ok(None)))
            .collect();
        for &id in &damaged {
            self.node(id).crash();
            self.node(id).restart();
        }
        !damaged.is_empty()
    }

    /// The ids of the nodes of `cell` that run.
    pub fn running_in(&self, cell: &str) -> Vec<SimNodeId> {
        self.nodes.iter().filter(|(_, node)| node.up && node.cell == cell).map(|(id, _)| *id).collect()
    }

    fn get(&self, id: SimNodeId) -> &SimNode {
        self.nodes.get(&id).unwrap_or_else(|| panic!("no node {id}"))
    }

    /// One node, to act on.
    pub fn node(&mut self, id: SimNodeId) -> NodeCtl<'_> {
        assert!(self.nodes.contains_key(&id), "no node {id}");
        NodeCtl { cluster: self, id }
    }

    /// A node's disk.
    pub fn disk(&self, id: SimNodeId) -> &SimDisk {
        &self.get(id).disk
    }

    /// A client of the (first) cell.
    pub fn client(&self) -> Client {
        self.client_in(&self.main_cell)
    }

    /// A client of the (first) cell whose options (the cluster's defaults) are changed by `change` first.
    pub fn client_with(&self, change: impl FnOnce(&mut ClientOptions)) -> Client {
        self.client_in_with(&self.main_cell, change)
    }

    /// The client addresses of `cell`'s nodes, as a directory records them.
    pub fn addresses_in(&self, cell: &str) -> Vec<String> {
        self.nodes.values().filter(|node| node.cell == cell).map(|node| node.config.client_addr.to_string()).collect()
    }

    /// A client of `cell`.
    pub fn client_in(&self, cell: &str) -> Client {
        self.client_in_with(cell, |_| {})
    }

    /// A client of `cell` whose options (the cluster's defaults) are changed by `change` first.
    pub fn client_in_with(&self, cell: &str, change: impl FnOnce(&mut ClientOptions)) -> Client {
        let addrs =
            self.nodes.values().filter(|node| node.cell == cell).map(|node| node.config.client_addr.to_string());
        let mut options = ClientOptions { discover_every: self.discover_every, ..ClientOptions::default() };
        change(&mut options);
        Client::new(addrs, options).expect("valid addresses")
    }

    /// Clients made from now on ask for the cell's members every `every` (see `ClientOptions::discover_every`): a
    /// workload whose faults replace every node of the cell within seconds needs clients that keep up.
    pub fn set_discover_every(&mut self, every: Duration) {
        self.discover_every = every;
    }

    /// A client of one node only, never redirected (for local reads and status).
    pub fn client_of(&self, id: SimNodeId) -> Client {
        let options = ClientOptions { retry_for: Duration::ZERO, discover: false, ..ClientOptions::default() };
        Client::new([self.get(id).config.client_addr.to_string()], options).expect("a valid address")
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

    /// Another client machine: what runs on it (its `spawn`) can be cut off from the cell ([`Cluster::isolate_client`])
    /// while the first client machine's work goes on.
    pub fn client_host(&mut self, name: &str) -> NodeHandle {
        let n = u8::try_from(self.client_hosts.len() + 2).expect("fewer than 254 client machines");
        let host = self.handle.create_node().name(name).ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, n))).build();
        self.client_hosts.push(host.clone());
        host
    }

    /// A client machine from [`Cluster::client_host`] can reach no node, nor be reached, until healed.
    pub fn isolate_client(&self, host: &NodeHandle) {
        trace::harness(None, "isolate", &format!("client machine {}", host.id()));
        NetSim::current().clog_node(host.id());
    }

    /// Every node loses power at once: each disk keeps only what it synced.
    pub fn power_fail(&mut self) {
        trace::harness(None, "power-fail", "");
        for id in self.running() {
            self.node(id).power_off();
        }
    }

    fn links(&self, from: &[SimNodeId], to: &[SimNodeId], clog: bool) {
        let net = NetSim::current();
        for &x in from {
            for &y in to {
                let (x, y) = (self.get(x).handle.id(), self.get(y).handle.id());
                if clog { net.clog_link(x, y) } else { net.unclog_link(x, y) }
            }
        }
    }

    /// No message crosses between `a` and `b`, either way.
    pub fn partition(&self, a: &[SimNodeId], b: &[SimNodeId]) {
        trace::harness(None, "partition", &format!("{a:?}|{b:?}"));
        self.links(a, b, true);
        self.links(b, a, true);
    }

    /// Messages from `from` to `to` are held back; the other way works (an asymmetric partition).
    pub fn partition_one_way(&self, from: &[SimNodeId], to: &[SimNodeId]) {
        trace::harness(None, "one-way", &format!("{from:?}->{to:?}"));
        self.links(from, to, true);
    }

    /// The link from `from` to `to` holds every message back until it is unclogged or healed.
    pub fn clog_link(&self, from: SimNodeId, to: SimNodeId) {
        self.partition_one_way(&[from], &[to]);
    }

    /// The link from `from` to `to` works again.
    pub fn unclog_link(&self, from: SimNodeId, to: SimNodeId) {
        trace::harness(None, "unclog", &format!("{from}->{to}"));
        self.links(&[from], &[to], false);
    }

    /// A node can reach no other node, nor the client.
    pub fn isolate(&self, id: SimNodeId) {
        trace::harness(Some(id), "isolate", "");
        NetSim::current().clog_node(self.get(id).handle.id());
    }

    /// Every link works again (loss and latency stay as set).
    pub fn heal(&self) {
        trace::harness(None, "heal", "");
        let net = NetSim::current();
        let mut machines: Vec<_> = self.nodes.values().map(|node| node.handle.id()).collect();
        machines.push(self.client_machine.id());
        machines.extend(self.client_hosts.iter().map(NodeHandle::id));
        for &x in &machines {
            net.unclog_node(x);
            for &y in &machines {
                net.unclog_link(x, y);
            }
        }
    }

    /// Loss and latency on every link from now on.
    pub fn set_network(&self, faults: &NetworkFaults) {
        let detail = format!(
            "loss={:.3} latency={}-{}ms",
            faults.loss_rate,
            faults.latency.start.as_millis(),
            faults.latency.end.as_millis()
        );
        trace::harness(None, "network", &detail);
        NetSim::current().update_config(|config| {
            config.packet_loss_rate = faults.loss_rate;
            config.send_latency = faults.latency.clone();
        });
    }

    /// Starts a new node, adds it as a learner and promotes it to voter, through the client API. Returns its id.
    pub async fn add_node(&mut self) -> SimNodeId {
        let id = self.nodes.keys().max().copied().unwrap_or_default() + 1;
        trace::harness(Some(id), "add-node", "");
        let cell = self.main_cell.clone();
        let peers = self.ids_in(&cell);
        let mail = self.mail_of(&cell, id);
        self.start_node(id, config(&cell, id, &peers, false, &self.timing, mail));
        let client = self.client();
        let addrs = node_addrs(id);
        self.on_client(async move {
            client.add_learner(id, &addrs.raft_addr, &addrs.client_addr).await.expect("learner added");
            client.promote(id).await.expect("learner promoted");
        })
        .await;
        id
    }

    /// Removes a node from the membership through the client API, then stops it for good.
    pub async fn remove_node(&mut self, id: SimNodeId) {
        trace::harness(Some(id), "remove-node", "");
        let client = self.client();
        self.on_client(async move { client.remove_node(id).await.expect("node removed") }).await;
        self.samplers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
        let node = self.nodes.remove(&id).expect("exists");
        self.handle.kill(node.handle.id());
    }

    /// Waits until some node of the (first) cell leads and has applied an entry of its term; returns its id.
    pub async fn wait_leader(&self) -> SimNodeId {
        self.wait_leader_in(&self.main_cell).await
    }

    /// Waits until some node of `cell` leads and has applied an entry of its term; returns its id.
    pub async fn wait_leader_in(&self, cell: &str) -> SimNodeId {
        let clients: Vec<(SimNodeId, Client)> =
            self.running_in(cell).into_iter().map(|id| (id, self.client_of(id))).collect();
        self.on_client(async move {
            for _ in 0..600 {
                for (id, client) in &clients {
                    if let Ok(status) = client.cluster_status().await
                        && status.state == "Leader"
                        && status.applied_index.is_some()
                    {
                        return Some(*id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        })
        .await
        // Panics here, in the harness's task, so that the failure report (trace and history) is written.
        .unwrap_or_else(|| panic!("no leader within 60 simulated seconds"))
    }

    /// Waits for the workload's clients once the faults have healed, for at most [`WORKLOAD_BUDGET`] of simulated
    /// time. A cell that stalls keeps every client retrying each call for its whole retry budget, so a stalled run
    /// would go on for hours of simulated time: it fails here instead, naming `what` overran.
    pub async fn finish_workload<T>(&self, what: &str, workload: impl Future<Output = T>) -> T {
        tokio::time::timeout(WORKLOAD_BUDGET, workload).await.unwrap_or_else(|_| {
            // Panics here, in the harness's task, so that the failure report (trace and history) is written.
            panic!("{what} did not finish within {} simulated seconds of the faults healing", WORKLOAD_BUDGET.as_secs())
        })
    }
}

impl Drop for Cluster {
    /// On a failed run: the seed, the command that replays it, and where its trace and history were written. A run
    /// whose nodes panicked fails here unless it reported the panics itself.
    fn drop(&mut self) {
        let unreported = if self.panics_asked.load(Ordering::Relaxed) { Vec::new() } else { self.trace.node_panics() };
        if !std::thread::panicking() && unreported.is_empty() {
            return;
        }
        let dir = std::env::temp_dir().join("cellog-sim");
        let stem = dir.join(format!("seed-{}", self.seeds.0));
        let (trace, history) = (stem.with_extension("trace"), stem.with_extension("history"));
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&trace, self.trace.render()))
            .and_then(|()| std::fs::write(&history, self.history.render()));
        eprintln!("simulation failed with seed {}; replay: {}", self.seeds.0, self.replay);
        match written {
            Ok(()) => eprintln!("trace: {}  history: {}", trace.display(), history.display()),
            Err(error) => eprintln!("could not write the trace and history to {}: {error}", dir.display()),
        }
        if !unreported.is_empty() && !std::thread::panicking() {
            panic!("nodes panicked (each was restarted):\n{}", unreported.join("\n"));
        }
    }
}

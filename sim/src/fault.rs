//! Faults as plain data, and schedules of them: what a nemesis decides, printable, replayable and shrinkable.

use std::fmt;
use std::time::Duration;

use cellog_raft::storage::DiskFaults;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::cluster::{Cluster, NetworkFaults, SimNodeId};
use crate::trace::{self, simulated_elapsed};

/// One fault. Each is undone when its hold ends (a clock jump stays: clocks do not jump back by themselves).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Fault {
    /// The node's process dies, then restarts.
    Crash(SimNodeId),
    /// The node loses power (unsynced writes are lost), then restarts.
    PowerOff(SimNodeId),
    /// The node stops being scheduled, then goes on.
    Pause(SimNodeId),
    /// Whoever leads when the fault starts is cut off from everyone.
    IsolateLeader,
    /// No message crosses between the two sides.
    Partition(Vec<SimNodeId>, Vec<SimNodeId>),
    /// Messages from the first node to the second are held back.
    OneWay(SimNodeId, SimNodeId),
    /// Links are clogged one after another, then unclogged in another order (FoundationDB's swizzle-clog).
    Swizzle(Vec<(SimNodeId, SimNodeId)>),
    /// Every link loses and delays packets.
    Lossy(NetworkFaults),
    /// The node's clock jumps by this many milliseconds.
    ClockJump(SimNodeId, i64),
    /// The node's disk fails at these rates, then the node restarts on what is left.
    Disk(SimNodeId, DiskFaults),
    /// Every node loses power at once, then all restart.
    PowerFail,
    /// A new node joins as a voter, and the lowest-numbered node that does not lead is removed.
    Membership,
}

/// One step of a schedule: `fault`, starting `at_ms` after the workload starts, held for `hold_ms`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// When it starts.
    pub at_ms: u64,
    /// What.
    pub fault: Fault,
    /// How long it lasts.
    pub hold_ms: u64,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>6}ms +{:>5}ms {:?}", self.at_ms, self.hold_ms, self.fault)
    }
}

/// The schedule `ci/sim-run` uses: six faults of any kind, one at a time.
pub fn simple_schedule(faults: &mut ChaCha8Rng, network: &mut ChaCha8Rng, nodes: &[SimNodeId]) -> Vec<Step> {
    let mut at_ms = 500;
    let mut steps = Vec::new();
    for _ in 0..6 {
        let node = *nodes.choose(faults).expect("nodes");
        let others: Vec<SimNodeId> = nodes.iter().copied().filter(|&id| id != node).collect();
        let other = *others.choose(faults).expect("two nodes");
        let fault = match faults.gen_range(0..9) {
            0 => Fault::Crash(node),
            1 => Fault::PowerOff(node),
            2 => Fault::Pause(node),
            3 => Fault::IsolateLeader,
            4 => Fault::OneWay(node, other),
            5 => Fault::Lossy(NetworkFaults {
                loss_rate: network.gen_range(0.0..0.2),
                latency: Duration::from_millis(1)..Duration::from_millis(network.gen_range(2..80)),
            }),
            6 => Fault::ClockJump(node, faults.gen_range(-600_000..3_600_000)),
            7 => Fault::Disk(node, DiskFaults { bit_flip_ppm: 20_000, ..DiskFaults::default() }),
            _ => Fault::PowerFail,
        };
        let hold_ms = faults.gen_range(300..3_000);
        steps.push(Step { at_ms, fault, hold_ms });
        at_ms += hold_ms + faults.gen_range(200..1_500);
    }
    steps
}

impl Cluster {
    fn exists_and_runs(&self, node: SimNodeId) -> bool {
        self.running().contains(&node)
    }

    /// Applies one fault, holds it, and undoes it. A fault on a node that is gone or down is skipped.
    pub async fn inject(&mut self, fault: &Fault, hold: Duration) {
        match fault.clone() {
            Fault::Crash(node) | Fault::PowerOff(node) | Fault::Pause(node) | Fault::Disk(node, _)
                if !self.exists_and_runs(node) => {}
            Fault::Crash(node) => {
                self.node(node).crash();
                tokio::time::sleep(hold).await;
                self.node(node).restart();
            }
            Fault::PowerOff(node) => {
                self.node(node).power_off();
                tokio::time::sleep(hold).await;
                self.node(node).restart();
            }
            Fault::Pause(node) => {
                self.node(node).pause();
                tokio::time::sleep(hold).await;
                self.node(node).resume();
            }
            Fault::IsolateLeader => {
                let leader = self.wait_leader().await;
                self.isolate(leader);
                tokio::time::sleep(hold).await;
                self.heal();
            }
            Fault::Partition(a, b) => {
                let (a, b) = (self.present(&a), self.present(&b));
                self.partition(&a, &b);
                tokio::time::sleep(hold).await;
                self.heal();
            }
            Fault::OneWay(from, to) => {
                if self.ids().contains(&from) && self.ids().contains(&to) {
                    self.clog_link(from, to);
                    tokio::time::sleep(hold).await;
                    self.unclog_link(from, to);
                }
            }
            Fault::Swizzle(links) => {
                let links: Vec<_> =
                    links.into_iter().filter(|(a, b)| self.ids().contains(a) && self.ids().contains(b)).collect();
                let step = hold / (2 * u32::try_from(links.len()).unwrap_or(1).max(1));
                for &(from, to) in &links {
                    self.clog_link(from, to);
                    tokio::time::sleep(step).await;
                }
                // Unclogged from the middle outwards, so the order differs from the clogging order.
                let mut order: Vec<_> = links.iter().enumerate().collect();
                order.sort_by_key(|(index, _)| (index % 2, usize::MAX - index));
                for (_, &(from, to)) in order {
                    self.unclog_link(from, to);
                    tokio::time::sleep(step).await;
                }
            }
            Fault::Lossy(network) => {
                self.set_network(&network);
                tokio::time::sleep(hold).await;
                self.set_network(&NetworkFaults::default());
            }
            Fault::ClockJump(node, by_ms) => {
                if self.ids().contains(&node) {
                    self.node(node).jump_clock(by_ms);
                }
                tokio::time::sleep(hold).await;
            }
            Fault::Disk(node, faults) => {
                // A node still repairing the damage of an earlier fault is a failed node: damaging a second disk
                // meanwhile would take a cell of three past the one failure it tolerates, where it must stop rather
                // than elect a leader that may lack acknowledged entries. The fault waits for the repair.
                self.wait_until_none_repairing(node, Duration::from_secs(30)).await;
                self.node(node).disk_faults(faults);
                tokio::time::sleep(hold).await;
                self.node(node).disk_faults(DiskFaults::default());
                // A node that stopped on a fault it found comes back through recovery.
                self.node(node).crash();
                self.node(node).restart();
            }
            Fault::PowerFail => {
                self.power_fail();
                tokio::time::sleep(hold).await;
                for node in self.ids() {
                    self.node(node).restart();
                }
            }
            Fault::Membership => {
                let joined = self.add_node().await;
                let leader = self.wait_leader().await;
                let leaving = self.ids().into_iter().find(|&id| id != leader && id != joined);
                if let Some(leaving) = leaving {
                    self.remove_node(leaving).await;
                }
                tokio::time::sleep(hold).await;
            }
        }
    }

    /// Waits (at most `limit`) until no running node but `except` says it is repairing a damaged log.
    async fn wait_until_none_repairing(&self, except: SimNodeId, limit: Duration) {
        let clients: Vec<_> =
            self.running().into_iter().filter(|&id| id != except).map(|id| self.client_of(id)).collect();
        let waited = self
            .on_client(async move {
                let started = simulated_elapsed();
                let mut waited = Duration::ZERO;
                loop {
                    let mut repairing = false;
                    for client in &clients {
                        repairing |= client.cluster_status().await.is_ok_and(|status| status.repairing);
                    }
                    if !repairing || waited >= limit {
                        return waited;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    waited = simulated_elapsed() - started;
                }
            })
            .await;
        if !waited.is_zero() {
            trace::harness(Some(except), "disk-faults-waited", &format!("ms={}", waited.as_millis()));
        }
    }

    fn present(&self, nodes: &[SimNodeId]) -> Vec<SimNodeId> {
        nodes.iter().copied().filter(|id| self.ids().contains(id)).collect()
    }

    /// Runs `steps` in order, each at its time after now (or at once, when the previous one ran late).
    pub async fn run_schedule(&mut self, steps: &[Step]) {
        let started = simulated_elapsed();
        for step in steps {
            let due = started + Duration::from_millis(step.at_ms);
            tokio::time::sleep(due.saturating_sub(simulated_elapsed())).await;
            self.inject(&step.fault, Duration::from_millis(step.hold_ms)).await;
        }
    }

    /// Ends every fault: links healed, the network clean, every node running.
    pub fn heal_all(&mut self) {
        self.heal();
        self.set_network(&NetworkFaults::default());
        for node in self.ids() {
            if !self.running().contains(&node) {
                self.node(node).restart();
            }
        }
    }
}

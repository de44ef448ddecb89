//! The nemesis: swarm testing (each seed enables its own subset of fault kinds, with its own rates) and a schedule
//! drawn from the seed's fault stream.

use std::fmt;
use std::time::Duration;

use cellog_net::RaftTiming;
use cellog_raft::storage::DiskFaults;
use cellog_sim::fault::{Fault, Step};
use cellog_sim::{NetworkFaults, SimNodeId};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The kinds of fault a swarm can enable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A node crashes and restarts.
    Crash,
    /// A node loses power and restarts.
    PowerOff,
    /// A node pauses.
    Pause,
    /// The leader is cut off.
    IsolateLeader,
    /// A symmetric partition.
    Partition,
    /// A one-way link failure.
    OneWay,
    /// Links clogged and unclogged one by one.
    Swizzle,
    /// Packet loss and latency.
    Lossy,
    /// A clock jump.
    ClockJump,
    /// Disk faults on one node (a minority).
    Disk,
    /// Every node loses power.
    PowerFail,
    /// A node joins and another leaves.
    Membership,
}

const KINDS: [Kind; 12] = [
    Kind::Crash,
    Kind::PowerOff,
    Kind::Pause,
    Kind::IsolateLeader,
    Kind::Partition,
    Kind::OneWay,
    Kind::Swizzle,
    Kind::Lossy,
    Kind::ClockJump,
    Kind::Disk,
    Kind::PowerFail,
    Kind::Membership,
];

/// One seed's mix: which kinds, how many steps, how long each lasts and how far apart they are.
#[derive(Clone, Debug, PartialEq)]
pub struct Swarm {
    /// The kinds enabled.
    pub kinds: Vec<Kind>,
    /// Steps in the schedule.
    pub steps: usize,
    /// Longest hold of one step.
    pub max_hold_ms: u64,
    /// Longest gap between steps.
    pub max_gap_ms: u64,
    /// Highest packet loss rate a lossy step draws.
    pub max_loss: f64,
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot (a follower further behind is sent the snapshot).
    pub keep_logs: u64,
}

impl fmt::Display for Swarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kinds={:?} steps={} max_hold={}ms max_gap={}ms max_loss={:.2} snapshot_every={} keep_logs={}",
            self.kinds,
            self.steps,
            self.max_hold_ms,
            self.max_gap_ms,
            self.max_loss,
            self.snapshot_every,
            self.keep_logs
        )
    }
}

impl Swarm {
    /// Draws a mix: each kind enabled with even odds (at least one), 3 to 10 steps, and how often snapshots are taken
    /// and how much log they leave (so that some runs catch followers up by snapshot, and restart from one).
    pub fn draw(rng: &mut ChaCha8Rng) -> Swarm {
        let mut kinds: Vec<Kind> = KINDS.iter().copied().filter(|_| rng.gen_bool(0.5)).collect();
        if kinds.is_empty() {
            kinds.push(*KINDS.choose(rng).expect("kinds"));
        }
        Swarm {
            kinds,
            steps: rng.gen_range(3..=10),
            max_hold_ms: rng.gen_range(500..4_000),
            max_gap_ms: rng.gen_range(100..2_000),
            max_loss: rng.gen_range(0.01..0.3),
            snapshot_every: *[100, 250, 500].choose(rng).expect("choices"),
            keep_logs: *[5, 100, 1000].choose(rng).expect("choices"),
        }
    }

    /// The Raft timing of this mix: production's, with its snapshot interval and log kept.
    pub fn timing(&self) -> RaftTiming {
        RaftTiming { snapshot_every: self.snapshot_every, keep_logs: self.keep_logs, ..RaftTiming::default() }
    }

    /// A schedule of this mix over `nodes`: one fault at a time.
    pub fn schedule(&self, faults: &mut ChaCha8Rng, network: &mut ChaCha8Rng, nodes: &[SimNodeId]) -> Vec<Step> {
        let mut at_ms = faults.gen_range(0..1_000);
        let mut steps = Vec::new();
        for _ in 0..self.steps {
            let kind = *self.kinds.choose(faults).expect("at least one kind");
            let node = *nodes.choose(faults).expect("nodes");
            let others: Vec<SimNodeId> = nodes.iter().copied().filter(|&id| id != node).collect();
            let other = *others.choose(faults).expect("two nodes");
            let fault = match kind {
                Kind::Crash => Fault::Crash(node),
                Kind::PowerOff => Fault::PowerOff(node),
                Kind::Pause => Fault::Pause(node),
                Kind::IsolateLeader => Fault::IsolateLeader,
                Kind::Partition => Fault::Partition(vec![node], others),
                Kind::OneWay => Fault::OneWay(node, other),
                Kind::Swizzle => {
                    let mut links: Vec<(SimNodeId, SimNodeId)> = nodes
                        .iter()
                        .flat_map(|&a| nodes.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
                        .filter(|_| faults.gen_bool(0.5))
                        .collect();
                    links.shuffle(faults);
                    Fault::Swizzle(links)
                }
                Kind::Lossy => Fault::Lossy(NetworkFaults {
                    loss_rate: network.gen_range(0.0..self.max_loss),
                    latency: Duration::from_millis(1)..Duration::from_millis(network.gen_range(2..100)),
                }),
                Kind::ClockJump => Fault::ClockJump(node, faults.gen_range(-3_600_000..3_600_000)),
                Kind::Disk => Fault::Disk(
                    node,
                    DiskFaults {
                        read_error_ppm: faults.gen_range(0..2) * 5_000,
                        torn_write_ppm: faults.gen_range(0..2) * 200_000,
                        misdirected_write_ppm: faults.gen_range(0..2) * 5_000,
                        bit_flip_ppm: faults.gen_range(0..2) * 20_000,
                    },
                ),
                Kind::PowerFail => Fault::PowerFail,
                Kind::Membership => Fault::Membership,
            };
            let hold_ms = faults.gen_range(100..self.max_hold_ms);
            steps.push(Step { at_ms, fault, hold_ms });
            at_ms += hold_ms + faults.gen_range(0..self.max_gap_ms);
        }
        steps
    }
}

//! Prometheus metrics of a node, served as text on `/metrics`. Rates and latencies are recorded as they happen;
//! consumer lag, consumer groups and Raft state are read from the replica and Raft when scraped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_core::Cap;
use cellog_mail::MailMetrics;
use cellog_raft::storage::{Space, Storage, StorageError};
use cellog_raft::{CellNode, Replica};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::mirror::{MirrorFigures, MirrorStatuses, PeerState};

/// What a node records as it serves.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Messages appended (duplicates included) through publish calls.
    pub published: Counter,
    /// Publishes the cell refused.
    pub publish_rejected: Counter,
    /// Deliveries answered.
    pub acked: Counter,
    /// From proposing a command to its answer: commit on a quorum and apply.
    pub commit_latency: Histogram,
    /// One fsync of this node's storage.
    pub fsync_latency: Histogram,
    /// On a follower, the time between two `AppendEntries` from a leader (entries or a heartbeat): a leader whose
    /// workers are held up shows here first, and a gap near the election timeout costs an election.
    leader_gap: Histogram,
    /// On a leader, from sending an `AppendEntries` (entries or a heartbeat) to a follower's answer: the way there and
    /// back, and the follower's append and fsync.
    pub raft_append_round_trip: Histogram,
    /// On a follower, from receiving an `AppendEntries` to answering it: its append and fsync.
    pub raft_append_answer: Histogram,
    last_leader_message: Mutex<Option<tokio::time::Instant>>,
    /// What sealed mail counts: delivery attempts, provenance rows not recorded.
    pub mail: MailMetrics,
    consumer_lag_max: Gauge,
    consumer_lag_sum: Gauge,
    consumers_behind: Gauge,
    oldest_unacked_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    raft_term: Gauge,
    raft_leader: Gauge,
    raft_is_leader: Gauge,
    raft_applied_index: Gauge,
    raft_last_log_index: Gauge,
    streams: Gauge,
    messages: Gauge,
    bodies_unreadable: Gauge,
    /// Live tails open on the HTTP port.
    pub http_tails: Gauge,
    /// This process's resident memory, read from `/proc/self/status` at each scrape (-1 where there is none, and in
    /// the simulator, whose runs must not depend on the host).
    resident_memory: Gauge,
    /// Refusals for each cap, one counter a cap. Not a labelled family: a family's map is a std `HashMap`, whose
    /// random keys would draw from the simulator's random numbers when the first one is made, and so make a simulated
    /// run depend on what made a map before it.
    caps_reached: [(Cap, Counter); Cap::ALL.len()],
    /// Each consumer group's figures as of the last scrape.
    groups: Arc<Groups>,
    /// Each mirror's figures on this node, kept by the mirror driver (see [`crate::mirror`]).
    pub mirrors: Arc<MirrorStatuses>,
}

/// One consumer group's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupFigures {
    stream: String,
    group: String,
    members: u64,
    generation: u64,
    rebalances: u64,
    rebalancing: bool,
    lag: u64,
}

/// The consumer groups' metrics, labelled by stream and group: read from the replica at each scrape and encoded by
/// this collector, in the replica's (stream, group) order. Not labelled families: see `caps_reached`.
#[derive(Debug, Default)]
struct Groups(Mutex<Vec<GroupFigures>>);

impl Collector for Groups {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let groups = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        type Figure = fn(&GroupFigures) -> u64;
        let gauges: [(&str, &str, Figure); 4] = [
            ("group_members", "Members of a consumer group", |g| g.members),
            ("group_generation", "A consumer group's generation", |g| g.generation),
            (
                "group_rebalancing",
                "1 while a consumer group has a partition being revoked or waiting for its owner",
                |g| u64::from(g.rebalancing),
            ),
            (
                "group_lag",
                "Messages of a consumer group's stream not yet done (from its ack floors), in messages",
                |g| g.lag,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            for g in groups.iter() {
                let labels = [("stream", g.stream.as_str()), ("group", g.group.as_str())];
                ConstGauge::new(saturating_i64(value(g))).encode(family.encode_family(&labels)?)?;
            }
        }
        let counter = ConstCounter::new(0u64);
        let help = "Changes of a consumer group's membership (joins, leaves, expired sessions)";
        let mut family = encoder.encode_descriptor("group_rebalances", help, None, counter.metric_type())?;
        for g in groups.iter() {
            let labels = [("stream", g.stream.as_str()), ("group", g.group.as_str())];
            ConstCounter::new(g.rebalances).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The mirrors' metrics, labelled by mirror: read from the driver's figures at each scrape, in name order. Only the
/// node that runs a mirror (its cell's leader) reports it. Not labelled families: see `caps_reached`.
#[derive(Debug)]
struct Mirrors(Arc<MirrorStatuses>);

impl Collector for Mirrors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mirrors: Vec<(String, MirrorFigures)> =
            self.0.figures().into_iter().filter(|(_, figures)| figures.driven).collect();
        type Figure = fn(&MirrorFigures) -> u64;
        let gauges: [(&str, &str, Figure); 2] = [
            ("mirror_lag", "Messages a mirror's source held past it at the last read", |m| m.lag),
            ("mirror_up", "1 while the last attempt reached a mirror's source, 0 once one failed", |m| {
                u64::from(m.peer == PeerState::Up)
            }),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            for (mirror, figures) in &mirrors {
                let labels = [("mirror", mirror.as_str())];
                ConstGauge::new(saturating_i64(value(figures))).encode(family.encode_family(&labels)?)?;
            }
        }
        let counters: [(&str, &str, Figure); 4] = [
            ("mirror_snapshots", "A mirror's catch-ups by snapshot", |m| m.snapshots),
            ("mirror_increments", "A mirror's incremental copies", |m| m.increments),
            ("mirror_copied", "Messages copied into a mirror", |m| m.copied),
            ("mirror_errors", "A mirror's failed attempts", |m| m.errors),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            for (mirror, figures) in &mirrors {
                let labels = [("mirror", mirror.as_str())];
                ConstCounter::new(value(figures)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 50 µs to about 3.3 s.
    exponential_buckets(0.000_05, 2.0, 17)
}

fn gap_buckets() -> impl Iterator<Item = f64> {
    // 100 µs to about 5.7 s, finer than latencies: the tail is what counts against an election timeout.
    exponential_buckets(0.000_1, 1.5, 28)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Counts a command refused for `cap`.
    pub fn cap_reached(&self, cap: Cap) {
        if let Some((_, counter)) = self.caps_reached.iter().find(|(each, _)| *each == cap) {
            counter.inc();
        }
    }

    /// A fresh set, registered under `cellog_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cellog");
        let metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            published: Counter::default(),
            publish_rejected: Counter::default(),
            acked: Counter::default(),
            commit_latency: Histogram::new(latency_buckets()),
            fsync_latency: Histogram::new(latency_buckets()),
            leader_gap: Histogram::new(gap_buckets()),
            raft_append_round_trip: Histogram::new(latency_buckets()),
            raft_append_answer: Histogram::new(latency_buckets()),
            last_leader_message: Mutex::new(None),
            mail: MailMetrics::default(),
            consumer_lag_max: Gauge::default(),
            consumer_lag_sum: Gauge::default(),
            consumers_behind: Gauge::default(),
            oldest_unacked_age: Gauge::default(),
            raft_term: Gauge::default(),
            raft_leader: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            streams: Gauge::default(),
            messages: Gauge::default(),
            bodies_unreadable: Gauge::default(),
            http_tails: Gauge::default(),
            resident_memory: Gauge::default(),
            caps_reached: Cap::ALL.map(|cap| (cap, Counter::default())),
            groups: Arc::new(Groups::default()),
            mirrors: Arc::new(MirrorStatuses::default()),
        };
        registry.register_collector(Box::new(metrics.groups.clone()));
        registry.register_collector(Box::new(Mirrors(metrics.mirrors.clone())));
        registry.register("published", "Messages published (appended or deduplicated)", metrics.published.clone());
        registry.register("publish_rejected", "Publishes the cell refused", metrics.publish_rejected.clone());
        registry.register("acked", "Deliveries answered by consumers", metrics.acked.clone());
        for (cap, counter) in &metrics.caps_reached {
            registry.register(
                format!("caps_reached_{}", cap.name().replace('-', "_")),
                format!("Commands refused for reaching the cap on {cap} (RESOURCE_EXHAUSTED CAP_REACHED)"),
                counter.clone(),
            );
        }
        registry.register(
            "commit_latency_seconds",
            "From proposing a command to its answer (commit on a quorum, apply)",
            metrics.commit_latency.clone(),
        );
        registry.register("fsync_latency_seconds", "One fsync of this node's storage", metrics.fsync_latency.clone());
        registry.register(
            "raft_leader_gap_seconds",
            "On a follower, the time between two AppendEntries from a leader (entries or a heartbeat)",
            metrics.leader_gap.clone(),
        );
        registry.register(
            "raft_append_round_trip_seconds",
            "On a leader, from sending an AppendEntries (entries or a heartbeat) to a follower's answer",
            metrics.raft_append_round_trip.clone(),
        );
        registry.register(
            "raft_append_answer_seconds",
            "On a follower, from receiving an AppendEntries (entries or a heartbeat) to answering it",
            metrics.raft_append_answer.clone(),
        );
        registry.register(
            "mail_attempts",
            "Sealed-mail delivery attempts made by this node",
            metrics.mail.attempts.clone(),
        );
        registry.register(
            "provenance_failures",
            "Provenance rows that could not be recorded (the mail went on)",
            metrics.mail.provenance_failures.clone(),
        );
        registry.register(
            "consumer_lag_max",
            "Largest lag of any consumer, in messages",
            metrics.consumer_lag_max.clone(),
        );
        registry.register(
            "consumer_lag_sum",
            "Sum of every consumer's lag, in messages",
            metrics.consumer_lag_sum.clone(),
        );
        registry.register("consumers_behind", "Consumers with a lag above zero", metrics.consumers_behind.clone());
        registry.register(
            "oldest_unacked_age_seconds",
            "Age of the oldest unacknowledged delivery of any consumer",
            metrics.oldest_unacked_age.clone(),
        );
        registry.register("raft_term", "This node's Raft term", metrics.raft_term.clone());
        registry.register(
            "raft_leader",
            "The leader's node id as this node knows it (-1: none)",
            metrics.raft_leader.clone(),
        );
        registry.register("raft_is_leader", "1 when this node leads", metrics.raft_is_leader.clone());
        registry.register("raft_applied_index", "Last log index applied", metrics.raft_applied_index.clone());
        registry.register("raft_last_log_index", "Last log index held", metrics.raft_last_log_index.clone());
        registry.register("streams", "Streams in the cell", metrics.streams.clone());
        registry.register("messages", "Messages retained in the cell", metrics.messages.clone());
        registry.register(
            "bodies_unreadable",
            "Reads of message bodies that did not verify since this node started; each is repaired from a peer's copy, \
             or, when no peer holds one (the log says so), by a whole snapshot at the node's next start",
            metrics.bodies_unreadable.clone(),
        );
        registry.register("http_tails", "Live tails open on the HTTP port", metrics.http_tails.clone());
        registry.register_with_unit(
            "resident_memory",
            "This process's resident memory",
            prometheus_client::registry::Unit::Bytes,
            metrics.resident_memory.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = registry;
        metrics
    }

    /// Notes that an `AppendEntries` from a leader arrived at `now`, observing the gap since the previous one.
    pub fn leader_message(&self, now: tokio::time::Instant) {
        let mut last = self.last_leader_message.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(previous) = last.replace(now) {
            self.leader_gap.observe(now.saturating_duration_since(previous).as_secs_f64());
        }
    }

    /// Reads the gauges off the node and encodes everything in the Prometheus text format.
    pub fn render<S: Storage + Clone>(&self, node: &CellNode<S>) -> String {
        self.observe_raft(node);
        // A replica that a panic interrupted is not read: its gauges keep their last values.
        if let Ok(replica) = node.replica() {
            self.observe_replica(&replica);
        }
        self.bodies_unreadable.set(saturating_i64(node.bodies().n_unreadable()));
        self.resident_memory.set(resident_bytes().map_or(-1, saturating_i64));
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if encode(&mut text, &registry).is_err() {
            text.clear();
        }
        text
    }

    fn observe_raft<S: Storage + Clone>(&self, node: &CellNode<S>) {
        let view = node.cluster_view();
        let index = |index: Option<u64>| index.map_or(-1, saturating_i64);
        self.raft_term.set(saturating_i64(view.term));
        self.raft_leader.set(view.leader.map_or(-1, |(id, _)| saturating_i64(id)));
        self.raft_is_leader.set(i64::from(view.leading));
        self.raft_applied_index.set(index(view.applied_index));
        self.raft_last_log_index.set(index(view.last_log_index));
    }

    fn observe_replica(&self, replica: &Replica) {
        let cell = &replica.cell;
        let now = cell.last_at();
        let (mut lag_max, mut lag_sum, mut behind, mut oldest, mut n_messages) = (0u64, 0u64, 0i64, 0u64, 0u64);
        let names = cell.stream_names();
        for stream in &names {
            let Ok(info) = cell.stream_info(stream) else { continue };
            n_messages += info.n_messages;
            for consumer in &info.consumers {
                let Ok(consumer) = cell.consumer_info(stream, consumer, now) else { continue };
                lag_max = lag_max.max(consumer.lag_total);
                lag_sum = lag_sum.saturating_add(consumer.lag_total);
                behind += i64::from(consumer.lag_total > 0);
                oldest = oldest.max(consumer.oldest_unacked_age_ms);
            }
        }
        let mut groups = Vec::new();
        for stream in &names {
            for group in cell.group_names(stream).unwrap_or_default() {
                let Ok(info) = cell.group_info(stream, &group, now) else { continue };
                groups.push(GroupFigures {
                    stream: stream.to_string(),
                    group: group.to_string(),
                    members: info.members.len() as u64,
                    generation: info.generation,
                    rebalances: info.n_rebalances,
                    rebalancing: info.rebalancing,
                    lag: info.consumer.lag_total,
                });
            }
        }
        *self.groups.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = groups;
        self.consumer_lag_max.set(saturating_i64(lag_max));
        self.consumer_lag_sum.set(saturating_i64(lag_sum));
        self.consumers_behind.set(behind);
        self.oldest_unacked_age.set(Duration::from_millis(oldest).as_secs_f64());
        self.streams.set(saturating_i64(names.len() as u64));
        self.messages.set(saturating_i64(n_messages));
    }
}

/// This process's resident set size, from the kernel's `VmRSS` line (kB); `None` where there is no `/proc`.
#[cfg(not(madsim))]
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(madsim)]
fn resident_bytes() -> Option<u64> {
    None
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A store that times its fsyncs into [`Metrics::fsync_latency`]; everything else passes through.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Metered<S> {
    /// `inner`, timed into `metrics`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Storage> Storage for Metered<S> {
    fn write(&self, batch: cellog_raft::storage::Batch) -> Result<(), StorageError> {
        self.inner.write(batch)
    }

    fn write_unlogged(&self, batch: cellog_raft::storage::Batch) -> Result<(), StorageError> {
        self.inner.write_unlogged(batch)
    }

    fn persist(&self) -> Result<(), StorageError> {
        self.inner.persist()
    }

    fn free_bytes(&self) -> Option<u64> {
        self.inner.free_bytes()
    }

    fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.read_framed(space, key)
    }

    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
        self.inner.read_many_framed(space, keys)
    }

    fn read_part(
        &self,
        space: Space,
        key: u64,
        within: std::ops::Range<usize>,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.read_part(space, key, within)
    }

    fn scan_framed(
        &self,
        space: Space,
        keys: std::ops::Range<u64>,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        self.inner.scan_framed(space, keys, limit)
    }

    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
        self.inner.key_bounds(space)
    }

    #[allow(clippy::disallowed_methods, reason = "measures the real time an fsync takes")]
    fn sync(&self) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let result = self.inner.sync();
        self.metrics.fsync_latency.observe(started.elapsed().as_secs_f64());
        result
    }

    fn sync_delay(&self) -> Duration {
        self.inner.sync_delay()
    }

    fn checkpoint(&self) -> Result<(), StorageError> {
        self.inner.checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use cellog_raft::storage::{Batch, SimDisk};

    use super::*;

    /// A store that counts the calls a wrapper must pass on.
    struct Counting {
        disk: SimDisk,
        syncs: AtomicU64,
        checkpoints: AtomicU64,
        many: AtomicU64,
        parts: AtomicU64,
        persists: AtomicU64,
    }

    impl Storage for Counting {
        fn write(&self, batch: Batch) -> Result<(), StorageError> {
            self.disk.write(batch)
        }
        fn write_unlogged(&self, batch: Batch) -> Result<(), StorageError> {
            self.disk.write_unlogged(batch)
        }
        fn persist(&self) -> Result<(), StorageError> {
            self.persists.fetch_add(1, Ordering::Relaxed);
            self.disk.persist()
        }
        fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
            self.disk.read_framed(space, key)
        }
        fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
            self.many.fetch_add(1, Ordering::Relaxed);
            self.disk.read_many_framed(space, keys)
        }
        fn read_part(
            &self,
            space: Space,
            key: u64,
            within: std::ops::Range<usize>,
        ) -> Result<Option<Vec<u8>>, StorageError> {
            self.parts.fetch_add(1, Ordering::Relaxed);
            self.disk.read_part(space, key, within)
        }
        fn scan_framed(
            &self,
            space: Space,
            keys: std::ops::Range<u64>,
            limit: usize,
        ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
            self.disk.scan_framed(space, keys, limit)
        }
        fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
            self.disk.key_bounds(space)
        }
        fn sync(&self) -> Result<(), StorageError> {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            self.disk.sync()
        }
        fn free_bytes(&self) -> Option<u64> {
            None
        }
        fn sync_delay(&self) -> Duration {
            Duration::from_millis(3)
        }
        fn checkpoint(&self) -> Result<(), StorageError> {
            self.checkpoints.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn the_metered_store_passes_every_call_on() {
        let inner = Arc::new(Counting {
            disk: SimDisk::new(1),
            syncs: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            many: AtomicU64::new(0),
            parts: AtomicU64::new(0),
            persists: AtomicU64::new(0),
        });
        let metered = Metered::new(inner.clone(), Arc::new(Metrics::new()));
        let mut batch = Batch::new();
        batch.put(Space::Bodies, 7, b"body");
        metered.write(batch).unwrap();
        metered.sync().unwrap();
        metered.checkpoint().unwrap();
        let mut unlogged = Batch::new();
        unlogged.put(Space::Bodies, 9, b"unlogged");
        metered.write_unlogged(unlogged).unwrap();
        metered.persist().unwrap();
        assert_eq!(inner.persists.load(Ordering::Relaxed), 1, "a persist reaches the store it wraps");
        inner.disk.crash();
        assert_eq!(metered.get(Space::Bodies, 9), Ok(Some(b"unlogged".to_vec())), "an unlogged write reaches it");
        assert_eq!(metered.get(Space::Bodies, 7), Ok(Some(b"body".to_vec())));
        assert_eq!(metered.key_bounds(Space::Bodies), Ok(Some((7, 9))));
        assert_eq!(
            metered.get_many(Space::Bodies, &[8, 7]),
            vec![Ok(None), Ok(Some(bytes::Bytes::from_static(b"body")))]
        );
        assert_eq!(inner.many.load(Ordering::Relaxed), 1, "a batched read reaches the store it wraps");
        assert_eq!(metered.read_part(Space::Bodies, 7, 1..3), Ok(Some(b"od".to_vec())));
        assert_eq!(inner.parts.load(Ordering::Relaxed), 1, "a part's read reaches the store it wraps");
        assert_eq!(metered.sync_delay(), Duration::from_millis(3));
        assert_eq!(inner.syncs.load(Ordering::Relaxed), 1);
        assert_eq!(inner.checkpoints.load(Ordering::Relaxed), 1, "a checkpoint reaches the store it wraps");
    }

    #[test]
    #[allow(clippy::disallowed_methods, reason = "a starting point; the gaps are given")]
    fn a_follower_times_the_gaps_between_a_leaders_messages() {
        let metrics = Metrics::new();
        let start = tokio::time::Instant::now();
        for after_ms in [0, 100, 130, 1_330] {
            metrics.leader_message(start + Duration::from_millis(after_ms));
        }
        let mut text = String::new();
        encode(&mut text, &metrics.registry.lock().unwrap()).unwrap();
        let line = |prefix: &str| text.lines().find(|line| line.starts_with(prefix)).map(str::to_string);
        assert_eq!(
            line("cellog_raft_leader_gap_seconds_count").as_deref(),
            Some("cellog_raft_leader_gap_seconds_count 3")
        );
        let sum: f64 =
            line("cellog_raft_leader_gap_seconds_sum ").unwrap().rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 1.33).abs() < 1e-9, "three gaps: 100 ms, 30 ms and 1.2 s, not {sum}");
    }
}

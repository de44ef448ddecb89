//! How a node's Raft keeps time and compacts its log, and the openraft config that follows from it.

use std::sync::Arc;

use openraft::{Config, SnapshotPolicy};

/// How a node's Raft keeps time and compacts its log.
#[derive(Clone, Debug)]
pub struct RaftTiming {
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// Shortest election timeout; the longest is one and a half times that. A follower that has heard from a leader
    /// waits the longest timeout (openraft's leader lease) and then its own, drawn between the two, before it
    /// campaigns: with the defaults, 875 ms to 1.05 s of silence.
    pub election_timeout_ms: u64,
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Bytes of log between snapshots, whatever their count ([`crate::CellNode::set_snapshot_every_bytes`]).
    pub snapshot_every_bytes: u64,
    /// Log entries kept behind a snapshot: a follower further behind than that is sent the snapshot.
    pub keep_logs: u64,
    /// Bytes of log kept behind a snapshot, whatever their count ([`crate::CellNode::set_keep_log_bytes`]).
    pub keep_log_bytes: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: 100,
            // A client sees its leader replaced 1.2 s on average after it stopped (in simulation, the election
            // included), against 2.3 s with 600 ms and a longest of twice that. Shorter is quicker still (250 ms: under
            // 1 s) but elects again and again under a full pipeline of large payloads on a slow disk, whose syncs keep
            // a follower from hearing its leader for longer than 625 ms.
            election_timeout_ms: 350,
            snapshot_every: 50_000,
            snapshot_every_bytes: crate::node::SNAPSHOT_EVERY_BYTES,
            keep_logs: 1000,
            keep_log_bytes: crate::node::KEEP_LOG_BYTES,
        }
    }
}

impl RaftTiming {
    /// The openraft config of a node of `cell` with this timing; an error says which setting is unusable.
    pub fn raft_config(&self, cell: &str) -> Result<Arc<Config>, String> {
        let config = Config {
            cluster_name: cell.to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_ms,
            election_timeout_max: self.election_timeout_ms * 3 / 2,
            install_snapshot_timeout: 10_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_logs,
            max_payload_entries: 16,
            ..Config::default()
        };
        config.validate().map(Arc::new).map_err(|error| error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_election_timeout_at_or_below_the_heartbeat_is_refused() {
        assert!(RaftTiming::default().raft_config("prod").is_ok());
        let bad = RaftTiming { heartbeat_ms: 500, election_timeout_ms: 500, ..RaftTiming::default() };
        assert!(bad.raft_config("prod").is_err());
    }
}

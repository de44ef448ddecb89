//! How a node's Raft keeps time and compacts its log, and the openraft config that follows from it.

use std::sync::Arc;

use openraft::{Config, SnapshotPolicy};

/// How a node's Raft keeps time and compacts its log.
#[derive(Clone, Debug)]
pub struct RaftTiming {
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// Shortest election timeout; the longest is twice that.
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
            election_timeout_ms: 600,
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
            election_timeout_max: self.election_timeout_ms * 2,
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

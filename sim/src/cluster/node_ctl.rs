//! One node of a simulated cell to act on: crash, power off, lose its disk, restart, pause, set its apply, jump its
//! clock, fault its disk.

use std::sync::atomic::Ordering;

use cellog_raft::storage::DiskFaults;

use super::{Cluster, SimNode, SimNodeId};
use crate::trace;

/// One node of a [`Cluster`], to act on.
pub struct NodeCtl<'a> {
    pub(super) cluster: &'a mut Cluster,
    pub(super) id: SimNodeId,
}

impl NodeCtl<'_> {
    fn state(&mut self) -> &mut SimNode {
        self.cluster.nodes.get_mut(&self.id).expect("checked when made")
    }

    /// The node's process dies; its disk keeps what the page cache held.
    pub fn crash(mut self) {
        trace::harness(Some(self.id), "crash", "");
        let node = self.state();
        node.up = false;
        node.disk.reopen();
        let machine = node.handle.id();
        self.cluster.handle.kill(machine);
    }

    /// The node's machine loses power: its disk keeps only what was synced.
    pub fn power_off(mut self) {
        trace::harness(Some(self.id), "power-off", "");
        let node = self.state();
        node.up = false;
        node.disk.crash();
        let machine = node.handle.id();
        self.cluster.handle.kill(machine);
    }

    /// The node's machine loses power and its data directory is lost whole: it comes back on an empty disk, with
    /// nothing to say it was a member.
    pub fn lose_disk(mut self) {
        trace::harness(Some(self.id), "lose-disk", "");
        let node = self.state();
        node.up = false;
        node.disk.lose_everything();
        let machine = node.handle.id();
        self.cluster.handle.kill(machine);
    }

    /// The node starts again on its disk.
    pub fn restart(mut self) {
        trace::harness(Some(self.id), "restart", "");
        let node = self.state();
        node.up = true;
        let machine = node.handle.id();
        self.cluster.handle.restart(machine);
    }

    /// The node's process stops being scheduled (a long GC pause, a stopped VM), until [`NodeCtl::resume`].
    pub fn pause(mut self) {
        trace::harness(Some(self.id), "pause", "");
        let machine = self.state().handle.id();
        self.cluster.handle.pause(machine);
    }

    /// The paused node goes on where it stopped.
    pub fn resume(mut self) {
        trace::harness(Some(self.id), "resume", "");
        let machine = self.state().handle.id();
        self.cluster.handle.resume(machine);
    }

    /// What the node is told about the entries it applies, from its next start on (as an operator restarts it with
    /// `--halt-apply-at` or `--skip-entry`).
    pub fn set_apply(mut self, control: cellog_raft::ApplyControl) {
        trace::harness(Some(self.id), "set-apply", &format!("{control:?}"));
        *self.state().apply.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = control;
    }

    /// The node's clock jumps by `by_ms` milliseconds (backwards when negative).
    pub fn jump_clock(mut self, by_ms: i64) {
        trace::harness(Some(self.id), "clock-jump", &format!("by={by_ms}"));
        self.state().clock.offset_ms.fetch_add(by_ms, Ordering::Relaxed);
    }

    /// The node's disk starts failing at these rates.
    pub fn disk_faults(mut self, faults: DiskFaults) {
        let detail = format!(
            "read-error={} torn-write={} misdirected-write={} bit-flip={}",
            faults.read_error_ppm, faults.torn_write_ppm, faults.misdirected_write_ppm, faults.bit_flip_ppm
        );
        trace::harness(Some(self.id), "disk-faults", &detail);
        self.state().disk.set_faults(faults);
    }
}

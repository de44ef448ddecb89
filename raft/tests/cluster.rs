//! A cell of in-process nodes on simulated disks: failover, restarts, snapshot catch-up, membership changes and
//! corruption repair. Every scenario ends with every replica at the same index with the same state digest, and every
//! acknowledged publish readable at its place on every node.
#![allow(
    clippy::disallowed_methods,
    reason = "tests wait on the runtime's clock, which is madsim's simulated one under --cfg madsim"
)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cellog_raft::storage::{Batch, DiskFaults, MetaKey, SimDisk, Space, Storage};
use cellog_raft::{CellNode, NodeAddrs, NodeId, Past};
use common::{TIMEOUT, TestCell};
use openraft::Config;
use openraft::raft::VoteRequest;

const NO_SNAPSHOTS: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_every_acknowledged_publish() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 40).await;
    let old_leader = cell.wait_leader(&[1, 2, 3]).await;
    cell.isolate(old_leader);
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != old_leader).collect();
    let new_leader = cell.wait_leader(&others).await;
    assert_ne!(new_leader, old_leader);
    cell.publish("during", 40).await;
    cell.heal();
    cell.publish("after", 20).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_and_then_the_leader_restart_on_their_data() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("first", 30).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    cell.stop(follower, true).await;
    cell.publish("follower-down", 30).await;
    let restarted = cell.start(follower).await;
    assert_eq!(restarted.recovery().log_cut_from, None, "a crash loses nothing that was synced");
    cell.converge().await;

    cell.stop(leader, true).await;
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    cell.wait_leader(&survivors).await;
    cell.publish("leader-down", 30).await;
    cell.start(leader).await;
    cell.publish("all-back", 10).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_catches_up_by_snapshot_and_membership_changes_online() {
    let mut cell = TestCell::new(20);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("history", 100).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    // Wait for the leader to snapshot and purge, so a newcomer cannot be served from the log alone.
    cell.node(leader)
        .raft()
        .wait(Some(TIMEOUT))
        .metrics(|m| m.purged.is_some_and(|purged| purged.index >= 40), "leader purged its log")
        .await
        .expect("the leader snapshots and purges");

    cell.start(4).await;
    cell.node(leader).raft().add_learner(4, NodeAddrs::new("node-4", "client-4"), true).await.expect("learner added");
    let newcomer = cell.node(4);
    newcomer
        .raft()
        .wait(Some(TIMEOUT))
        .metrics(|m| m.snapshot.is_some(), "snapshot installed")
        .await
        .expect("the learner gets a snapshot");

    // Promote the learner and remove node 3, while publishing.
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let members: BTreeSet<u64> = [1, 2, 4].into_iter().collect();
    cell.node(leader).raft().change_membership(members, false).await.expect("membership changed");
    cell.publish("after-change", 20).await;
    let leader = cell.wait_leader(&[1, 2, 4]).await;
    let membership = cell.node(leader).raft().metrics().borrow().membership_config.clone();
    let voters: BTreeSet<u64> = membership.membership().voter_ids().collect();
    assert_eq!(voters, [1, 2, 4].into_iter().collect());
    cell.stop(3, false).await;
    cell.publish("without-3", 10).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_detected_and_repaired_from_the_leader() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 40).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    cell.stop(victim, false).await;
    let keys = cell.disks[&victim].keys(Space::Log);
    let damaged = keys[keys.len() / 2];
    assert!(cell.disks[&victim].flip_bit(Space::Log, damaged, 77));

    let node = cell.start(victim).await;
    assert_eq!(node.recovery().log_cut_from, Some(damaged), "the damaged entry and everything after it are cut");
    assert_eq!(node.recovery().repair_target, Some(*keys.last().unwrap() + 1));
    assert_eq!(node.recovery().vote_floor, None, "a cut log does not say what the node held");
    assert!(node.is_repairing());
    // While repairing it grants no vote, whatever the candidate offers.
    let metrics = node.raft().metrics().borrow().clone();
    let mut vote = metrics.vote;
    vote.leader_id.term += 10;
    vote.leader_id.node_id = leader;
    let response = node.vote(VoteRequest::new(vote, Some(openraft::LogId::new(vote.leader_id, u64::MAX / 2)))).await;
    assert!(!response.expect("answered").vote_granted);

    cell.publish("during-repair", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cell_power_failure_keeps_every_acknowledged_publish() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before-power-loss", 50).await;
    for id in [1, 2, 3] {
        cell.stop(id, true).await;
    }
    for id in [1, 2, 3] {
        cell.start(id).await;
    }
    cell.wait_leader(&[1, 2, 3]).await;
    cell.publish("after-power-loss", 10).await;
    cell.converge().await;
}

/// Waits until node `id` has taken a snapshot and purged its log behind it.
async fn wait_purged(cell: &TestCell, id: NodeId) {
    cell.node(id)
        .raft()
        .wait(Some(TIMEOUT))
        .metrics(|m| m.purged.is_some(), "the node snapshotted and purged")
        .await
        .expect("the node purges");
}

/// Waits until node `id`'s disk holds the damage mark: no peer could repair a body its disk damaged.
async fn wait_marked(cell: &TestCell, id: NodeId) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while cell.disks[&id].get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "node {id} did not mark the damage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many of the messages node `id` holds it refuses to serve, reading every one.
fn n_unreadable(cell: &TestCell, id: NodeId) -> usize {
    let node = cell.node(id);
    let records: Vec<_> = {
        let replica = node.replica().unwrap();
        (0..2).flat_map(|partition| replica.cell.read_from("orders", partition, 0, 1_000).unwrap()).collect()
    };
    records
        .iter()
        .filter(|record| matches!(node.payload("orders", record), Err(cellog_raft::BodyError::Unreadable { .. })))
        .count()
}

/// A cell with 80 messages and snapshots every 20 entries, and a follower that has snapshotted and purged its log.
async fn with_a_purged_follower() -> (TestCell, NodeId) {
    let mut cell = TestCell::new(20);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("history", 80).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    wait_purged(&cell, victim).await;
    (cell, victim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_is_dropped_and_the_node_catches_up_from_the_leader() {
    let (mut cell, victim) = with_a_purged_follower().await;
    cell.stop(victim, false).await;
    assert!(cell.disks[&victim].flip_bit(Space::State, 0, 1234));

    let node = cell.start(victim).await;
    assert!(node.recovery().snapshot_dropped);
    assert!(node.is_repairing(), "without its snapshot the node must get its state back before voting");
    assert_eq!(node.recovery().vote_floor, None, "a snapshot that does not verify may have covered more than the log");
    cell.publish("during-repair", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

/// A node whose state went (a body damaged) beside a purged log that verifies whole knows the log it held:
/// while it repairs, it votes for a candidate whose log reaches that log's last id, as Raft asks of a log it holds,
/// and for no other; across a restart too. So a cell whose other follower repairs at the same time can still elect
/// the node that holds everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dropped_only_its_state_votes_for_a_log_that_reaches_the_one_it_held() {
    let (mut cell, victim) = with_a_purged_follower().await;
    cell.converge().await;
    let metrics = cell.node(victim).raft().metrics();
    let bodies = cell.disks[&victim].keys(Space::Bodies);
    assert!(cell.disks[&victim].flip_bit(Space::Bodies, bodies[0], 99));
    // Cut off, the node finds no peer to repair the body from, and marks the damage for its next start.
    cell.isolate(victim);
    assert_eq!(n_unreadable(&cell, victim), 1, "the damaged body is found");
    wait_marked(&cell, victim).await;
    cell.stop(victim, false).await;
    // The leader's ticks keep coming until the node is cut off: what it held is what it had when it stopped.
    let last_held = metrics.borrow().last_log_index;

    let mut node = cell.start(victim).await;
    assert!(node.recovery().bodies_damaged && node.recovery().snapshot_dropped && node.is_repairing());
    let held = node.recovery().vote_floor.expect("a floor");
    assert_eq!(Some(held.index), last_held, "the floor is the last entry the node held");
    // Restarted while it repairs, it still knows.
    cell.stop(victim, false).await;
    node = cell.start(victim).await;
    assert!(node.is_repairing());
    assert_eq!(node.recovery().vote_floor, Some(held), "the floor is kept until the node is repaired");

    // A candidate from outside the cell, so that no member takes the vote for its own.
    let mut vote = node.raft().metrics().borrow().vote;
    vote.leader_id.term += 10;
    vote.leader_id.node_id = 9;
    let short = openraft::LogId::new(held.leader_id, held.index - 1);
    let refused = node.vote(VoteRequest::new(vote, Some(short))).await.expect("answered");
    assert!(!refused.vote_granted, "the candidate lacks an entry the node held");
    let granted = node.vote(VoteRequest::new(vote, Some(held))).await.expect("answered");
    assert!(granted.vote_granted, "the candidate's log reaches the one the node held");

    // Its repair target lost to the disk (a write gone astray), the floor alone says it was repairing: it repairs
    // on, and votes for nobody, not knowing how far it had got.
    cell.stop(victim, false).await;
    let disk = &cell.disks[&victim];
    let mut batch = Batch::new();
    batch.delete_range(Space::Meta, MetaKey::RepairTarget as u64..MetaKey::RepairTarget as u64 + 1);
    disk.write(batch).unwrap();
    disk.sync().unwrap();
    node = cell.start(victim).await;
    assert!(node.is_repairing(), "a floor without a target is a damaged target");
    assert_eq!(node.recovery().vote_floor, None);

    cell.heal();
    cell.publish("during-repair", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

/// A leader holds a body its disk damaged, unread so far, when a follower that lost its disk needs a snapshot, and the
/// third node is cut off: the body does not verify, no peer can repair it, and the leader cannot go on. Restarted, as its supervisor would, it drops its state and
/// repairs, as the follower does; the third node holds everything and must lead. The restarted leader's log
/// verified whole, so it votes for a log that reaches the one it held, and the cell goes on with every acknowledged
/// publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_by_a_damaged_body_while_a_follower_repairs_votes_the_third_node_in() {
    let (mut cell, leader, lost, keeper) = with_a_purged_leader().await;
    // The keeper holds everything the leader does before the lost node's disk goes. Otherwise a publish committed by
    // the leader and the lost node alone would then live on the leader only, and its floor would rightly refuse the
    // keeper: the cell waits for it rather than lose an acknowledged publish.
    let held = cell.node(leader).raft().metrics().borrow().last_log_index;
    cell.node(keeper)
        .raft()
        .wait(Some(TIMEOUT))
        .metrics(|m| m.last_log_index >= held, "the keeper holds the leader's log")
        .await
        .expect("the keeper catches up");
    let (restarted, lost_node) = damage_a_body_and_lose_a_disk(&mut cell, leader, lost, keeper).await;
    cell.heal();
    assert!(lost_node.recovery().vote_floor.is_none());
    let recovery = restarted.recovery();
    assert!(recovery.vote_floor.is_some(), "its log verified whole: {recovery:?}");
    assert_eq!(cell.wait_leader(&[1, 2, 3]).await, keeper, "only the third node holds everything");
    cell.publish("after", 20).await;
    common::wait_repaired(&restarted).await;
    common::wait_repaired(&lost_node).await;
    cell.converge().await;
}

/// A cell with 80 messages and snapshots every 20 entries, whose leader has snapshotted and purged its log: the cell,
/// its leader, and its two followers.
async fn with_a_purged_leader() -> (TestCell, NodeId, NodeId, NodeId) {
    let mut cell = TestCell::new(20);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("history", 80).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    wait_purged(&cell, leader).await;
    let mut others = [1, 2, 3].into_iter().filter(|id| *id != leader);
    let (lost, keeper) = (others.next().unwrap(), others.next().unwrap());
    (cell, leader, lost, keeper)
}

/// Damages a body on the leader's disk, cuts the keeper off, then replaces `lost`'s disk with an empty one: the leader
/// reads the body for the snapshot `lost` needs, finds no peer to repair it from (the keeper cut off, `lost` holding
/// nothing), and stops. Restarted, it drops its state to repair. The restarted leader and the node that lost its disk,
/// both repairing; the keeper stays cut off.
async fn damage_a_body_and_lose_a_disk(
    cell: &mut TestCell,
    leader: NodeId,
    lost: NodeId,
    keeper: NodeId,
) -> (Arc<CellNode<SimDisk>>, Arc<CellNode<SimDisk>>) {
    let bodies = cell.disks[&leader].keys(Space::Bodies);
    assert!(cell.disks[&leader].flip_bit(Space::Bodies, bodies[0], 99));
    cell.isolate(keeper);
    cell.stop(lost, true).await;
    cell.disks.insert(lost, SimDisk::new(99));
    let lost_node = cell.start_as(lost, Past::Member).await;
    assert!(lost_node.is_repairing());
    let reason = tokio::time::timeout(TIMEOUT, cell.node(leader).wait_fatal()).await.expect("the leader stops");
    assert!(reason.contains("body"), "{reason}");
    cell.stop(leader, false).await;
    let restarted = cell.start(leader).await;
    let recovery = restarted.recovery();
    assert!(recovery.bodies_damaged && recovery.snapshot_dropped && restarted.is_repairing(), "{recovery:?}");
    (restarted, lost_node)
}

/// As above, but the publishes the keeper lacks were committed by the leader and the node whose disk then goes: once
/// it has gone, the restarted leader's log is their only copy, and the keeper's log does not reach the leader's floor.
/// The cell must elect nobody rather than the keeper, which would lose acknowledged publishes: the leader refuses it
/// its vote, and the node without a disk votes for nobody while it repairs. It waits for an operator instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_by_a_damaged_body_refuses_its_vote_to_a_follower_that_lacks_acknowledged_publishes() {
    let (mut cell, leader, lost, keeper) = with_a_purged_leader().await;
    cell.isolate(keeper);
    cell.publish("without-the-keeper", 10).await;
    let keeper_held = cell.node(keeper).raft().metrics().borrow().last_log_index.expect("the keeper holds a log");
    let (restarted, lost_node) = damage_a_body_and_lose_a_disk(&mut cell, leader, lost, keeper).await;
    let floor = restarted.recovery().vote_floor.expect("its log verified whole");
    assert!(floor.index > keeper_held, "the keeper lacks entries the leader held: {floor} against {keeper_held}");

    let term_before = cell.node(keeper).raft().metrics().borrow().current_term;
    cell.heal();
    // Ten election timeouts and more: the keeper campaigns, and nobody grants it a vote.
    tokio::time::sleep(Duration::from_millis(10 * cell.config.election_timeout_max)).await;
    assert!(
        cell.node(keeper).raft().metrics().borrow().current_term > term_before,
        "the keeper campaigned while the cell had no leader"
    );
    for id in [1, 2, 3] {
        let metrics = cell.node(id).raft().metrics().borrow().clone();
        assert!(!metrics.state.is_leader(), "node {id} leads without the acknowledged publishes: {metrics:?}");
    }
    assert!(restarted.is_repairing() && lost_node.is_repairing());
}

/// The victim's snapshot records in `lost` are gone as a write that went astray leaves them: no record there fails
/// to verify, yet its state no longer reaches its purged log, so it must be dropped like a corrupt one.
async fn a_lost_snapshot(lost: std::ops::Range<u64>) {
    let (mut cell, victim) = with_a_purged_follower().await;
    cell.stop(victim, false).await;
    let disk = &cell.disks[&victim];
    let mut batch = Batch::new();
    batch.delete_range(Space::State, lost.clone());
    disk.write(batch).unwrap();
    disk.sync().unwrap();

    let node = cell.start(victim).await;
    assert!(node.recovery().snapshot_dropped, "{lost:?}");
    assert!(node.is_repairing(), "without its snapshot the node must get its state back before voting");
    cell.publish("during-repair", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_without_its_header_is_dropped_and_the_node_catches_up_from_the_leader() {
    a_lost_snapshot(0..1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_lost_whole_beside_a_purged_log_is_dropped_and_the_node_catches_up_from_the_leader() {
    a_lost_snapshot(0..u64::MAX).await;
}

/// A follower's disk damages a body: a read of it is refused, never served changed, and the node repairs it from a
/// peer's copy while it runs. The next read serves it, and the next start finds nothing to repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_body_is_never_served_and_is_repaired_from_a_peer() {
    let (mut cell, victim) = with_a_purged_follower().await;
    let bodies = cell.disks[&victim].keys(Space::Bodies);
    assert!(cell.disks[&victim].flip_bit(Space::Bodies, bodies[bodies.len() / 2], 99));

    assert_eq!(n_unreadable(&cell, victim), 1, "the damaged body is refused");
    assert_eq!(cell.node(victim).bodies().n_unreadable(), 1);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while n_unreadable(&cell, victim) > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the body was not repaired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cell.disks[&victim].scan(Space::Bodies, 0..u64::MAX, usize::MAX).is_ok(), "every body verifies");
    assert!(cell.disks[&victim].get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_none());

    cell.stop(victim, true).await;
    let node = cell.start(victim).await;
    assert!(!node.recovery().bodies_damaged && !node.recovery().snapshot_dropped, "{:?}", node.recovery());
    assert!(!node.is_repairing());
    cell.publish("after", 20).await;
    cell.converge().await;
}

/// The same, with the node cut off from its peers: nobody can send it a copy, so it marks the damage, and its next
/// start drops its state and takes a whole snapshot from the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_body_no_peer_can_repair_is_taken_with_a_whole_snapshot_at_the_next_start() {
    let (mut cell, victim) = with_a_purged_follower().await;
    let bodies = cell.disks[&victim].keys(Space::Bodies);
    assert!(cell.disks[&victim].flip_bit(Space::Bodies, bodies[bodies.len() / 2], 99));
    cell.isolate(victim);
    assert_eq!(n_unreadable(&cell, victim), 1, "the damaged body is refused");
    wait_marked(&cell, victim).await;
    assert_eq!(cell.node(victim).bodies().n_unreadable(), 1, "one read failed, counted once");
    assert_eq!(n_unreadable(&cell, victim), 1, "still refused: nothing was written over it");

    cell.stop(victim, false).await;
    cell.heal();
    let node = cell.start(victim).await;
    assert!(node.recovery().bodies_damaged && node.recovery().snapshot_dropped);
    assert!(node.is_repairing(), "without its state the node must get it back before voting");
    cell.publish("during-repair", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

/// A leader holds a body its disk damaged, unread so far, when a follower that lost its disk needs a snapshot. The
/// stream waits at the body while the leader repairs it from the third node's copy, then goes on: the leader does not
/// stop, and the follower gets its whole state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_repairs_a_damaged_body_from_a_peer_and_sends_its_snapshot() {
    let (mut cell, leader, lost, _keeper) = with_a_purged_leader().await;
    cell.converge().await;
    let bodies = cell.disks[&leader].keys(Space::Bodies);
    assert!(cell.disks[&leader].flip_bit(Space::Bodies, bodies[0], 99));
    cell.stop(lost, true).await;
    cell.disks.insert(lost, SimDisk::new(99));
    let lost_node = cell.start_as(lost, Past::Member).await;
    assert!(lost_node.is_repairing());
    common::wait_repaired(&lost_node).await;
    assert_eq!(cell.node(leader).fatal(), None, "the leader went on");
    assert_eq!(cell.wait_leader(&[1, 2, 3]).await, leader);
    assert_eq!(cell.node(leader).bodies().n_unreadable(), 1, "the damage was found once");
    assert!(cell.disks[&leader].get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_none());
    cell.publish("after", 20).await;
    cell.converge().await;
}

/// A cell of three with a stream, whose leader's device takes a millisecond to sync: what arrives meanwhile waits for
/// the entry being committed. The cell, and its leader's id.
async fn with_a_slow_syncing_leader() -> (TestCell, NodeId) {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    cell.disks[&leader].set_sync_delay(Duration::from_millis(1));
    (cell, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_share_syncs() {
    let (cell, leader) = with_a_slow_syncing_leader().await;
    let node = cell.node(leader);
    // Appends that arrive while the last syncs must share the next sync.
    let syncs_before = cell.disks[&leader].n_syncs();
    let publishes = (0..200).map(|i| {
        let node = node.clone();
        async move {
            let request = cellog_core::PublishRequest::new("orders.a", format!("{i}")).with_id(format!("c-{i}"));
            node.propose_now(cellog_core::Command::Publish(request)).await
        }
    });
    for result in futures::future::join_all(publishes).await {
        assert!(matches!(result, Ok(Ok(cellog_core::Outcome::Published(_)))), "{result:?}");
    }
    let syncs = cell.disks[&leader].n_syncs() - syncs_before;
    println!("200 concurrent publishes took {syncs} syncs on the leader");
    assert!(syncs < 50, "200 entries took {syncs} syncs on the leader: appends are not batched");
}

/// `commands` admitted on the node's own authority, each as the cell would take it or refuse it.
fn admitted_own(
    node: &CellNode<SimDisk>,
    commands: Vec<cellog_core::Command>,
) -> Vec<Result<cellog_raft::Admitted, cellog_core::Rejection>> {
    let door = node.door().expect("applying was not interrupted");
    commands.into_iter().map(|command| door.own(command)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_commands_shares_one_entry_in_its_order_and_a_refused_one_never_reaches_it() {
    use cellog_core::{Command, Outcome, PublishRequest, Rejection};

    // Commands queued one by one would be split between the entry being committed and the next.
    let (cell, leader) = with_a_slow_syncing_leader().await;
    let node = cell.node(leader);
    let last = || node.raft().metrics().borrow().last_log_index;
    let before = last();
    let publish = |i: usize| Command::Publish(PublishRequest::new("orders.a", format!("{i}")));
    let mut group: Vec<Command> = (0..300).map(publish).collect();
    group[150] = Command::Publish(PublishRequest::new("orders.a b", "refused"));
    let mut admitted = admitted_own(&node, group);
    assert!(matches!(admitted.remove(150), Err(Rejection::InvalidSubject { .. })), "refused at the door");
    let admitted: Vec<_> = admitted.into_iter().map(|admitted| admitted.expect("admitted")).collect();
    let answers = node.submit_all(admitted).await.expect("this node leads");
    assert_eq!(answers.len(), 299);
    let mut seqs = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer.wait().await.expect("answered") {
            Ok(Outcome::Published(ack)) => seqs.push(ack.seq),
            other => panic!("command {i} was answered {other:?}"),
        }
    }
    assert!(seqs.windows(2).all(|pair| pair[1] == pair[0] + 1), "the group's order is the log's: {seqs:?}");
    assert_eq!(seqs.len(), 299);
    assert_eq!(last().map(|index| index - before.unwrap_or(0)), Some(1), "the group took one entry");
    // A follower queues nothing and names the leader.
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let follower = cell.node(follower);
    let admitted = admitted_own(&follower, vec![publish(0)]).into_iter().map(|admitted| admitted.unwrap()).collect();
    match follower.submit_all(admitted).await {
        Err(cellog_raft::ProposeError::NotLeader { leader: Some((id, _)) }) => assert_eq!(id, leader),
        Err(other) => panic!("a follower refused a group with {other}"),
        Ok(_) => panic!("a follower queued a group"),
    }
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_more_than_an_entrys_commands_takes_consecutive_entries_in_its_order() {
    use cellog_core::{Command, Outcome, PublishRequest};
    use cellog_raft::MAX_BATCH;

    let (cell, leader) = with_a_slow_syncing_leader().await;
    let node = cell.node(leader);
    let last = || node.raft().metrics().borrow().last_log_index.unwrap_or(0);
    let before = last();
    let n = 2 * MAX_BATCH + 100;
    let group: Vec<Command> =
        (0..n).map(|i| Command::Publish(PublishRequest::new("orders.a", format!("{i}")))).collect();
    let group = admitted_own(&node, group).into_iter().map(|admitted| admitted.expect("admitted")).collect();
    let answers = node.submit_all(group).await.expect("this node leads");
    let mut seqs = Vec::with_capacity(n);
    for (i, answer) in answers.into_iter().enumerate() {
        match answer.wait().await.expect("answered") {
            Ok(Outcome::Published(ack)) => seqs.push(ack.seq),
            other => panic!("command {i} was answered {other:?}"),
        }
    }
    assert_eq!(seqs.len(), n);
    assert!(seqs.windows(2).all(|pair| pair[1] == pair[0] + 1), "the group's order is the log's");
    // Groups of MAX_BATCH, MAX_BATCH and 100 commands; an entry that holds MAX_BATCH takes nothing more.
    assert_eq!(last() - before, 3, "the commands took one entry per MAX_BATCH");
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_with_a_cut_log_does_not_lead_again_before_it_is_repaired() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 40).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    cell.stop(leader, false).await;
    let keys = cell.disks[&leader].keys(Space::Log);
    assert!(cell.disks[&leader].flip_bit(Space::Log, keys[keys.len() / 2], 5));
    let node = cell.start(leader).await;
    assert!(node.is_repairing());
    // Its saved vote no longer says it leads: it comes back as a follower and the others elect a leader.
    assert!(!node.raft().metrics().borrow().state.is_leader());
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    cell.wait_leader(&others).await;
    cell.publish("after", 20).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

/// How a follower's last log record is damaged while it is down.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// An append written but never synced, torn by a power loss: it was never acknowledged.
    TornBeforeItsSync,
    /// The last record was synced (so maybe acknowledged) and damaged afterwards: not a torn write.
    FlippedAfterItsSync,
}

/// A follower restarts over a damaged last log record: the record is cut, and the follower holds back its vote until
/// it holds its old end again exactly when that record may have been acknowledged.
async fn a_damaged_tail(tail: Tail) {
    use cellog_raft::storage::{Batch, Storage};
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 20).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    cell.stop(victim, false).await;
    let disk = &cell.disks[&victim];
    let last = *disk.keys(Space::Log).last().unwrap();
    let (cut_from, repair_target) = match tail {
        Tail::TornBeforeItsSync => {
            let mut batch = Batch::new();
            batch.put(Space::Log, last + 1, &[7; 64]);
            disk.write(batch).unwrap();
            disk.set_faults(DiskFaults { torn_write_ppm: 1_000_000, ..DiskFaults::default() });
            disk.crash();
            disk.set_faults(DiskFaults::default());
            (last + 1, None)
        }
        Tail::FlippedAfterItsSync => {
            assert!(disk.flip_bit(Space::Log, last, 3));
            (last, Some(last + 1))
        }
    };
    let node = cell.start(victim).await;
    assert_eq!(node.recovery().log_cut_from, Some(cut_from), "{tail:?}");
    assert_eq!(
        node.recovery().repair_target,
        repair_target,
        "{tail:?}: held back only if it may have been acknowledged"
    );
    if repair_target.is_none() {
        assert!(!node.is_repairing());
    }
    cell.publish("after", 10).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_record_is_cut_without_holding_the_node_back() {
    a_damaged_tail(Tail::TornBeforeItsSync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_last_record_that_was_synced_holds_the_node_back_until_repaired() {
    a_damaged_tail(Tail::FlippedAfterItsSync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_on_a_faulty_disk_repairs_and_nothing_acknowledged_is_lost() {
    faulty_follower().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_on_a_faulty_disk_steps_down_repairs_and_nothing_acknowledged_is_lost() {
    faulty_disk(true).await;
}

/// Seeds that once failed a faulty-disk scenario, kept as regressions (the fault draws come from the seed):
/// (whether the leader is the node on the faulty disk, seed).
#[cfg(madsim)]
const FAULTY_DISK_SEEDS: &[(bool, u64)] = &[
    // A bit flipped in the committed id that recovery itself had just rewritten: `read_committed` failed and the node
    // never started, though the committed id is only a hint.
    (false, 1_795_962_462_032_096_343),
    // A vote record torn at a power loss: the node refused to start instead of repairing.
    (true, 1_795_962_974_321_813_339),
];

#[cfg(madsim)]
#[test]
fn faulty_disk_regression_seeds() {
    for &(leader_is_victim, seed) in FAULTY_DISK_SEEDS {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.block_on(faulty_disk(leader_is_victim));
    }
}

async fn faulty_follower() {
    faulty_disk(false).await;
}

/// One node (the leader, or a follower) writes to a faulty disk and loses power five times under load.
async fn faulty_disk(leader_is_victim: bool) {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| (*id == leader) == leader_is_victim).unwrap();
    // Bits flip as records reach the disk, and the last unsynced record tears at every power loss. Misdirected
    // writes are left out: the repair target is a local estimate that a record moved past the end can defeat.
    cell.disks[&victim].set_faults(DiskFaults {
        bit_flip_ppm: 20_000,
        torn_write_ppm: 500_000,
        ..DiskFaults::default()
    });
    for round in 0..5 {
        cell.publish(&format!("round-{round}"), 20).await;
        cell.stop(victim, true).await;
        let restarted = cell.start(victim).await;
        // A node whose raft stopped on a record that no longer verifies served nothing from it; the restart
        // repairs it.
        let _ = restarted;
    }
    cell.disks[&victim].set_faults(DiskFaults::default());
    // A last restart finds whatever flipped since the previous one.
    cell.stop(victim, false).await;
    let node = cell.start(victim).await;
    cell.publish("healthy", 10).await;
    common::wait_repaired(&node).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_ticks_so_timers_fire_without_client_commands() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    let request =
        cellog_core::PublishRequest { ttl_ms: Some(300), ..cellog_core::PublishRequest::new("orders.a", "brief") };
    cell.propose(cellog_core::Command::Publish(request)).await.expect("published");
    // Nothing else is proposed: only the leader's Tick can remove the message once its TTL passes.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let retained: Vec<u64> = cell
            .running()
            .iter()
            // A replica that has not applied the stream yet counts as still retaining the message.
            .map(|&id| cell.node(id).replica().unwrap().cell.stream_info("orders").map_or(1, |s| s.n_messages))
            .collect();
        if retained.iter().all(|n| *n == 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the expired message is still retained: {retained:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fails_says_it_cannot_go_on_and_the_cell_goes_on_without_it() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 10).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let node = cell.node(victim);
    assert_eq!(node.fatal(), None, "a healthy node can go on");
    cell.disks[&victim].fail_next_io();
    cell.publish("during", 10).await;
    let reason = tokio::time::timeout(TIMEOUT, node.wait_fatal()).await.expect("the failure is reported");
    assert!(reason.contains("raft stopped"), "{reason}");
    assert_eq!(node.fatal().as_deref(), Some(reason.as_str()));

    // The other two go on; the failed node comes back through recovery, as its supervisor would restart it.
    cell.publish("without", 10).await;
    cell.stop(victim, true).await;
    let restarted = cell.start(victim).await;
    assert_eq!(restarted.fatal(), None);
    cell.publish("after", 10).await;
    cell.converge().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_that_was_asked_for_is_not_a_failure() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1]).await;
    let node = cell.node(1);
    cell.stop(1, false).await;
    assert_eq!(node.fatal(), None);
    assert!(tokio::time::timeout(Duration::from_secs(2), node.wait_fatal()).await.is_err(), "nothing to report");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_every_replica_would_refuse_never_reaches_the_log() {
    use cellog_core::{Command, PublishRequest, Rejection};

    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish("before", 5).await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let node = cell.node(leader);
    let last = || node.raft().metrics().borrow().last_log_index;
    let before = last();
    let bad_subject = Command::Publish(PublishRequest::new("orders.a b", "x"));
    let answer = node.propose_now(bad_subject).await.expect("answered");
    assert!(matches!(answer, Err(Rejection::InvalidSubject { .. })), "{answer:?}");
    let oversized =
        Command::Publish(PublishRequest::new("orders.a", vec![0u8; cellog_core::MAX_PAYLOAD_LIMIT as usize + 1]));
    let answer = node.propose_now(oversized).await.expect("answered");
    assert!(matches!(answer, Err(Rejection::PayloadTooLarge { .. })), "{answer:?}");
    assert_eq!(last(), before, "nothing was logged");
    // A follower refuses it the same way, without sending it anywhere.
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let answer = cell.node(follower).propose_now(Command::Publish(PublishRequest::new("", "x"))).await;
    assert!(matches!(answer, Ok(Err(Rejection::InvalidSubject { .. }))), "{answer:?}");
    cell.publish("after", 5).await;
    cell.converge().await;
}

/// The classic Raft disk-loss case: entries committed by the leader and one follower; that follower loses its disk
/// and comes back empty; the leader fails. The third node, which lacks those entries, must not win the lost node's
/// vote, or they would be gone. The lost node votes for nobody until it has the log up to a leader's commit index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_disk_votes_for_nobody_until_a_leader_has_brought_it_back() {
    use cellog_raft::Past;
    use cellog_raft::storage::SimDisk;

    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let mut followers = [1, 2, 3].into_iter().filter(|id| *id != leader);
    let (keeper, behind) = (followers.next().unwrap(), followers.next().unwrap());
    cell.isolate(behind);
    cell.publish("only-on-two", 20).await;

    // The keeper loses its disk and comes back empty, knowing only that it was a member.
    cell.stop(keeper, true).await;
    cell.disks.insert(keeper, SimDisk::new(99));
    let lost = cell.start_as(keeper, Past::Member).await;
    assert!(lost.is_repairing(), "an empty store that was a member's is a lost disk");

    // The leader fails; the node that is behind comes back. It must not win the lost node's vote.
    cell.stop(leader, true).await;
    cell.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in [keeper, behind] {
        assert!(!cell.node(id).raft().metrics().borrow().state.is_leader(), "node {id} must not lead without the log");
    }

    // The leader returns: everything acknowledged is still there, and the lost node repairs and votes again.
    cell.start(leader).await;
    cell.publish("after", 5).await;
    cell.converge().await;
    tokio::time::timeout(TIMEOUT, async {
        while lost.is_repairing() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lost node repairs from a leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_kept_behind_a_snapshot_stays_within_its_byte_budget() {
    const BUDGET: u64 = 2_000;
    let mut cell = TestCell::new(20);
    // openraft alone would keep a thousand entries behind each snapshot: all of them, here.
    cell.config = Arc::new(Config { max_in_snapshot_log_to_keep: 1000, ..(*cell.config).clone() });
    cell.bootstrap(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        cell.node(id).set_keep_log_bytes(BUDGET);
    }
    cell.create_stream().await;
    cell.publish("history", 100).await;
    cell.converge().await;
    for id in [1, 2, 3] {
        let node = cell.node(id);
        let purged = node
            .raft()
            .wait(Some(TIMEOUT))
            .metrics(|m| m.purged.is_some_and(|purged| purged.index >= 60), "purged to the budget")
            .await
            .expect("the log behind the snapshot is purged to its byte budget")
            .purged
            .expect("purged");
        let snapshot = node.raft().metrics().borrow().snapshot.expect("a snapshot").index;
        let kept: u64 = cell.disks[&id]
            .scan_framed(Space::Log, purged.index + 1..snapshot + 1, usize::MAX)
            .expect("the log reads")
            .iter()
            .map(|(_, framed)| framed.len() as u64)
            .sum();
        assert!(kept <= BUDGET, "node {id} keeps {kept} bytes of log behind its snapshot at {snapshot}");
        assert!(snapshot - purged.index >= 3, "node {id} keeps what fits: {} entries", snapshot - purged.index);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_taken_once_the_log_after_the_last_passes_its_byte_budget() {
    const EVERY: u64 = 4_000;
    // openraft alone would take none for a million entries.
    let mut cell = TestCell::new(1_000_000);
    cell.bootstrap(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        cell.node(id).set_snapshot_every_bytes(EVERY);
    }
    cell.create_stream().await;
    cell.publish("history", 100).await;
    cell.converge().await;
    for id in [1, 2, 3] {
        let node = cell.node(id);
        // Once the history is applied, snapshots follow it to within about one budget of its end.
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let (snapshot, applied) = {
                let metrics = node.raft().metrics();
                let metrics = metrics.borrow();
                (metrics.snapshot.map(|id| id.index), metrics.last_applied.expect("applied").index)
            };
            let after: u64 = cell.disks[&id]
                .scan_framed(Space::Log, snapshot.map_or(1, |s| s + 1)..applied + 1, usize::MAX)
                .expect("the log reads")
                .iter()
                .map(|(_, framed)| framed.len() as u64)
                .sum();
            // The budget is EVERY, or twice the snapshot's size once that is more.
            let budget = EVERY.max(2 * node.snapshot_bytes());
            if snapshot.is_some() && after <= 2 * budget {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {id} has {after} bytes of log after its snapshot {snapshot:?}, {budget} make a snapshot"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_waits_for_twice_its_own_size_of_log() {
    const EVERY: u64 = 1_000;
    let mut cell = TestCell::new(1_000_000);
    cell.bootstrap(&[1]).await;
    cell.node(1).set_snapshot_every_bytes(EVERY);
    cell.create_stream().await;
    cell.publish("history", 200).await;
    cell.converge().await;
    let state = |cell: &TestCell| {
        let node = cell.node(1);
        let (snapshot, applied) = {
            let metrics = node.raft().metrics();
            let metrics = metrics.borrow();
            (metrics.snapshot.map(|id| id.index), metrics.last_applied.expect("applied").index)
        };
        let after: u64 = cell.disks[&1]
            .scan_framed(Space::Log, snapshot.map_or(1, |s| s + 1)..applied + 1, usize::MAX)
            .expect("the log reads")
            .iter()
            .map(|(_, framed)| framed.len() as u64)
            .sum();
        (snapshot, node.snapshot_bytes(), after)
    };
    // The history's snapshots: the last is far larger than EVERY.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (first, size) = loop {
        let (snapshot, size, after) = state(&cell);
        if let Some(snapshot) = snapshot
            && after <= 2 * size
        {
            break (snapshot, size);
        }
        assert!(tokio::time::Instant::now() < deadline, "no snapshot settled: {snapshot:?}, {after} bytes after it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(size > 8 * EVERY, "the history's snapshot is {size} bytes");
    // More than EVERY bytes of log after it, less than twice its size: no snapshot yet.
    let mut published = 0;
    while state(&cell).2 <= 3 * EVERY {
        cell.publish(&format!("more-{published}"), 1).await;
        published += 1;
    }
    let (_, _, after) = state(&cell);
    assert!(after < 2 * size, "{after} bytes of log after a {size}-byte snapshot");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(state(&cell).0, Some(first), "a snapshot taken at {after} bytes of log, under twice {size}");
    // Past twice its size: the next one.
    while state(&cell).2 <= 2 * size {
        cell.publish(&format!("more-{published}"), 1).await;
        published += 1;
    }
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while state(&cell).0 == Some(first) {
        assert!(tokio::time::Instant::now() < deadline, "no snapshot past twice {size} bytes of log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// openraft waits out a replication backoff in a `tokio::select!` of a sleep and its event channel, polling the two in
/// an order tokio draws from a per-thread generator seeded by a process-wide counter, so two runs of one seed in one
/// process poll them in different orders. Whether the sleep was polled must not change which task runs first when
/// several are due at one instant (it did, and a node far behind a leader replayed differently from the same seed).
#[cfg(madsim)]
#[test]
fn timers_do_not_depend_on_the_order_a_select_polls_its_branches() {
    use openraft::AsyncRuntime;

    async fn race() -> Vec<u32> {
        use cellog_raft::runtime::CellRuntime;

        let due = <openraft::TokioInstant as openraft::Instant>::now() + Duration::from_millis(10);
        let (ready, mut events) = tokio::sync::mpsc::unbounded_channel();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut sleepers = Vec::new();
        for task in 0..8 {
            // Selects that find their channel ready, each with a sleep due at one instant: tokio's generator says
            // which of them poll their sleep first.
            for event in 0..20 {
                ready.send(event).expect("the receiver is here");
            }
            for _ in 0..20 {
                tokio::select! {
                    () = CellRuntime::sleep_until(due) => {}
                    _ = events.recv() => {}
                }
            }
            // Then a sleeper due at the same instant, its timer set.
            let order = order.clone();
            sleepers.push(tokio::spawn(async move {
                CellRuntime::sleep_until(due).await;
                order.lock().unwrap().push(task);
            }));
            tokio::task::yield_now().await;
        }
        for sleeper in sleepers {
            sleeper.await.expect("a sleeper finishes");
        }
        order.lock().unwrap().clone()
    }

    let run = || {
        std::thread::spawn(|| {
            madsim::runtime::Runtime::with_seed_and_config(11, madsim::Config::default()).block_on(race())
        })
        .join()
        .expect("the run finishes")
    };
    let first = run();
    for _ in 0..4 {
        assert_eq!(run(), first, "the same seed woke the sleepers in another order");
    }
}

/// Bytes of a payload the log keeps: well above `IN_LOG_MIN_BYTES`.
const LARGE: usize = 3 * cellog_raft::in_log::IN_LOG_MIN_BYTES;

/// Large payloads are written once, in the log: no node writes them to its body store until a snapshot refers to
/// them, which copies them out before the log behind it goes; they read the same before, after and across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stay_in_the_log_until_a_snapshot_copies_them_out() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish_sized("large", 20, LARGE).await;
    cell.publish("small", 5).await;
    cell.converge().await;
    for id in [1, 2, 3] {
        assert_eq!(cell.disks[&id].keys(Space::Bodies).len(), 5, "node {id} wrote only the small bodies");
    }

    for id in [1, 2, 3] {
        cell.node(id).raft().trigger().snapshot().await.expect("snapshot");
        wait_snapshot(&cell, id).await;
        cell.node(id).raft().trigger().purge_log(last_applied(&cell, id)).await.expect("purge");
        wait_purged(&cell, id).await;
        let stored = cell.disks[&id].keys(Space::Bodies).len();
        assert_eq!(stored, 25, "node {id} copied every retained body out before its log went");
    }
    cell.converge().await;

    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
    cell.stop(follower, true).await;
    cell.start(follower).await;
    cell.publish_sized("after", 5, LARGE).await;
    cell.converge().await;
}

/// A large body released before any snapshot refers to it never reaches the body store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_released_before_a_snapshot_is_never_written_again() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    let config =
        cellog_core::StreamConfig { max_messages: Some(2), ..cellog_core::StreamConfig::with_subjects(["orders.>"]) };
    cell.propose(cellog_core::Command::CreateStream { name: "orders".to_string(), config }).await.expect("stream");
    cell.publish_sized("large", 10, LARGE).await;
    cell.acked.drain(..8);
    cell.converge().await;
    for id in [1, 2, 3] {
        assert_eq!(cell.disks[&id].keys(Space::Bodies).len(), 0, "node {id} wrote no body");
    }
    for id in [1, 2, 3] {
        cell.node(id).raft().trigger().snapshot().await.expect("snapshot");
        wait_snapshot(&cell, id).await;
        assert_eq!(cell.disks[&id].keys(Space::Bodies).len(), 2, "node {id} wrote only the two retained bodies");
    }
    cell.converge().await;
}

/// A body kept in the log that the disk damaged is never served, and is repaired from a peer's copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_body_in_the_log_is_never_served_and_is_repaired_from_a_peer() {
    let mut cell = TestCell::new(NO_SNAPSHOTS);
    cell.bootstrap(&[1, 2, 3]).await;
    cell.create_stream().await;
    cell.publish_sized("large", 10, LARGE).await;
    cell.converge().await;
    let leader = cell.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let (payload, partition, seq) = cell.acked.last().cloned().unwrap();
    let record = cell.node(victim).replica().unwrap().cell.read("orders", partition, seq).unwrap();
    assert!(cell.node(victim).payload("orders", &record).is_ok());
    // A bit in the middle of the payload, where the entry that carries it holds it.
    let disk = &cell.disks[&victim];
    let (entry, at) = disk
        .keys(Space::Log)
        .into_iter()
        .find_map(|key| {
            let record = disk.read_framed(Space::Log, key).unwrap().unwrap();
            let at = record.windows(payload.len()).position(|window| window == payload.as_bytes())?;
            Some((key, at))
        })
        .expect("the log holds the payload");
    assert!(disk.flip_bit(Space::Log, entry, (at + payload.len() / 2) * 8));

    assert!(
        matches!(cell.node(victim).payload("orders", &record), Err(cellog_raft::BodyError::Unreadable { .. })),
        "the damaged body is refused"
    );
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while cell.node(victim).payload("orders", &record).is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the body was not repaired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cell.disks[&victim].get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_none());
    cell.converge().await;
}

/// Waits until node `id` has taken a snapshot of everything it applied.
async fn wait_snapshot(cell: &TestCell, id: NodeId) {
    let applied = cell.node(id).raft().metrics().borrow().last_applied;
    cell.node(id)
        .raft()
        .wait(Some(TIMEOUT))
        .metrics(|m| m.snapshot >= applied, "the node snapshotted")
        .await
        .expect("the node snapshots");
}

fn last_applied(cell: &TestCell, id: NodeId) -> u64 {
    cell.node(id).raft().metrics().borrow().last_applied.map_or(0, |log_id| log_id.index)
}

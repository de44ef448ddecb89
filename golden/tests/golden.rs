//! The golden traces: each named scenario's trace, kept under `golden/snapshots/`. A change in behaviour shows here as
//! a snapshot diff; review it with `cargo insta review` (see README), never accept blindly.

#![cfg(madsim)]

use cellog_golden::scenarios::{ALL, Scenario};

fn golden(scenario: Scenario) {
    let trace = scenario.trace();
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(scenario.name(), trace);
    });
}

#[test]
fn every_scenario_is_listed() {
    assert_eq!(ALL.len(), 9);
}

#[test]
fn leader_failover_during_batch_publish() {
    golden(Scenario::LeaderFailoverDuringBatchPublish);
}

#[test]
fn zombie_producer_fenced() {
    golden(Scenario::ZombieProducerFenced);
}

#[test]
fn transaction_across_subjects_while_a_follower_restarts() {
    golden(Scenario::TransactionAcrossSubjectsWhileAFollowerRestarts);
}

#[test]
fn dead_letter_after_max_deliver() {
    golden(Scenario::DeadLetterAfterMaxDeliver);
}

#[test]
fn snapshot_catch_up() {
    golden(Scenario::SnapshotCatchUp);
}

#[test]
fn power_failure() {
    golden(Scenario::PowerFailure);
}

#[test]
fn membership_change() {
    golden(Scenario::MembershipChange);
}

#[test]
fn retention_blocked_by_a_lagging_peer() {
    golden(Scenario::RetentionBlockedByALaggingPeer);
}

#[test]
fn sealed_mail_across_a_healing_partition() {
    golden(Scenario::SealedMailAcrossAHealingPartition);
}

/// Envelopes carry fresh session keys and signatures each run; the trace records none of their bytes.
#[test]
fn the_mail_scenario_traces_the_same_twice() {
    let scenario = Scenario::SealedMailAcrossAHealingPartition;
    assert_eq!(scenario.trace(), scenario.trace());
}

#[test]
fn a_scenario_traces_the_same_twice() {
    let scenario = Scenario::ZombieProducerFenced;
    assert_eq!(scenario.trace(), scenario.trace(), "regenerating on an unchanged tree is byte-identical");
}

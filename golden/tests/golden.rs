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

/// Every scenario in [`ALL`] against its reviewed snapshot. Each runs even when an earlier one differs, and the failure
/// names every scenario whose trace changed.
#[test]
fn every_scenario_matches_its_reviewed_trace() {
    let changed: Vec<&str> = ALL
        .iter()
        .filter(|scenario| std::panic::catch_unwind(|| golden(**scenario)).is_err())
        .map(|scenario| scenario.name())
        .collect();
    assert!(changed.is_empty(), "traces differ from their snapshots (review with `cargo insta review`): {changed:?}");
}

/// A scenario without a reviewed snapshot, or a snapshot whose scenario is gone, is a mistake.
#[test]
fn every_snapshot_belongs_to_a_listed_scenario() {
    let mut names: Vec<String> = ALL.iter().map(|scenario| scenario.name().to_string()).collect();
    names.sort();
    let directory = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots");
    let mut files: Vec<String> = std::fs::read_dir(&directory)
        .expect("golden/snapshots")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".snap").map(str::to_string))
        .collect();
    files.sort();
    assert_eq!(files, names);
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

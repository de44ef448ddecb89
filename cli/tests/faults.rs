//! Three `cellog node` processes of this build on hosts of their own (network namespaces on a bridge), killed with
//! SIGKILL, paused, partitioned with iptables and restarted as a whole while clients publish, consume and commit
//! transactions; at the end the history and every node's contents pass every checker of `cellog-check` (see
//! `faults/`). It needs root, for the namespaces and iptables: CI runs as root. `CELLOG_FAULTS_SECS` sets how long
//! faults go on (60 s by default), `CELLOG_FAULTS_SEED` the schedule's seed; `CELLOG_SKIP_FAULTS=1` skips it on a
//! machine without root.

use std::time::Duration;

use cellog_faults::{Config, run};

mod common;

/// The number in the environment variable `name`, or `default` when it is unset; a value that is not a number is
/// refused rather than quietly replaced by the default.
fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => default,
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name} is a number, not {value:?}")),
        Err(error) => panic!("{name}: {error}"),
    }
}

#[test]
fn node_processes_under_kills_pauses_partitions_and_restarts_lose_nothing() {
    if common::switch("CELLOG_SKIP_FAULTS") {
        eprintln!("skipped: CELLOG_SKIP_FAULTS=1");
        return;
    }
    let work = tempfile::tempdir().expect("a temporary directory");
    let config = Config {
        cellog: env!("CARGO_BIN_EXE_cellog").into(),
        duration_secs: env_number("CELLOG_FAULTS_SECS", 60),
        seed: env_number("CELLOG_FAULTS_SEED", 1),
        work: work.path().to_path_buf(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let report = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(config.duration_secs + 600), run(&config)).await })
        .expect("the fault test ends within ten minutes of its faults")
        .unwrap_or_else(|error| {
            panic!("the fault test could not run: {error} (it needs root; CELLOG_SKIP_FAULTS=1 skips it)")
        });
    println!("{report}");
    if report.anomalies() > 0 {
        // Keep what the nodes wrote for a look.
        let kept = work.keep();
        panic!("{report}\n(kept in {})", kept.display());
    }
}

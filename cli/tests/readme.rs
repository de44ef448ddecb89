//! The README's examples, run as written: every `sh` block the README marks `<!-- example: … -->` runs in bash, in
//! the README's order, in a fresh directory whose `scripts/cellog` is this build's `cellog`, against a fresh
//! `cellog dev` on its default ports with its data in that directory's `.cellog-dev`, as a newcomer would run them.
//! A command that fails fails the test (each block runs under `set -euo pipefail`); the output is then shown with
//! each command traced.

// The node binary runs on RocksDB.
#![cfg(not(madsim))]

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// The blocks of `readme` marked `<!-- MARKER: … -->`, in order.
fn examples(readme: &str, marker: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(&format!("<!-- {marker}:")) {
            continue;
        }
        assert_eq!(lines.next(), Some("```sh"), "an example marker is followed by a sh block");
        let block: Vec<&str> = lines.by_ref().take_while(|line| *line != "```").collect();
        blocks.push(block.join("\n"));
    }
    blocks
}

/// Runs `script` in `dir` under bash with each command traced; its output, and whether it succeeded.
fn run(dir: &Path, script: &str) -> (bool, String) {
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-x", "-c", script])
        .current_dir(dir)
        .env_remove("CELLOG_SERVER")
        .env_remove("CELLOG_TOKEN")
        .env_remove("CELLOG_TOKEN_FILE")
        .env_remove("CELLOG_CA")
        .output()
        .expect("bash runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// Runs `blocks` in order in a fresh directory whose `scripts/cellog` is this build's, against `cellog dev ARGS` on its
/// default ports (`ports` must be free) with its data in that directory's `.cellog-dev`; panics with the transcript
/// at the first that fails.
fn run_against_dev(blocks: &[String], args: &[&str], ports: &[u16]) {
    for &port in ports {
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken: the README's examples run against `cellog dev` on its default ports"
        );
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::create_dir(dir.path().join("scripts")).expect("scripts/");
    let wrapper = dir.path().join("scripts/cellog");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec '{}' \"$@\"\n", env!("CARGO_BIN_EXE_cellog"))).expect("written");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let (mut dev, _) = common::dev_with(&dir.path().join(".cellog-dev"), 7400, args);

    let mut failure = None;
    let mut transcript = String::new();
    for (index, block) in blocks.iter().enumerate() {
        let (ok, output) = run(dir.path(), block);
        transcript.push_str(&format!("== example {}\n{output}\n", index + 1));
        if !ok {
            failure = Some(index + 1);
            break;
        }
    }
    assert!(common::terminate(&mut dev).success(), "cellog dev stops cleanly");
    if let Some(index) = failure {
        panic!("the README's example {index} failed:\n{transcript}");
    }
}

/// The nodes' ports of `cellog dev` on its default base with `cells` cells beside the directory.
fn dev_ports(cells: u16) -> Vec<u16> {
    (0..=cells)
        .flat_map(|k| (1..=3).flat_map(move |i| [0, 100, 200].map(|offset| 7400 + offset + 10 * k + i)))
        .collect()
}

/// Both kinds of example in one test, one after the other: they use the same ports.
#[test]
fn the_readme_examples_run_as_written_against_a_fresh_dev_cell() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README");
    let blocks = examples(&readme, "example");
    assert!(blocks.len() >= 2, "the README marks its runnable examples: {} found", blocks.len());
    run_against_dev(&blocks, &[], &dev_ports(0));
    // The many-cells walk, against a directory and two cells beside it.
    let blocks = examples(&readme, "example-cells");
    assert!(!blocks.is_empty(), "the README marks its many-cells example");
    run_against_dev(&blocks, &["--cells", "2"], &dev_ports(2));
}

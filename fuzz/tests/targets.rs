//! The fuzz targets (`../targets.rs`) as tests, one each: each runs `CELLOG_FUZZ_CASES` inputs (3 000 by default: the
//! short pass of the workspace's tests), or inputs for `CELLOG_FUZZ_MINUTES`, with the stream of `CELLOG_FUZZ_SEED`
//! (1), starting from its corpus in `fuzz/corpus/TARGET/` (`write_corpora`, ignored, writes it again). An input that
//! panics is kept in `fuzz/crashes/` and fails the test.
//!
//! The node's TOML config file has its target, `config`, in the `cli` crate (`run::tests::config`), where it is read.

#[path = "../targets.rs"]
mod targets;

use cellog_core::{Command, Outcome};
use cellog_envelope::{CellKey, Keyring};
use targets::*;

const FUZZ_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `target` over its corpus and mutations of it; fails naming the kept inputs if any panicked.
fn fuzz(target: &str) {
    let (_, f) = TARGETS.iter().find(|(name, _)| *name == target).expect("a target of that name");
    cellog_fuzz::fuzz(&corpus_dir(target), target, f);
}

#[test]
fn command() {
    fuzz("command");
}

#[test]
fn client_request() {
    fuzz("client-request");
}

#[test]
fn raft_message() {
    fuzz("raft-message");
}

#[test]
fn log_record() {
    fuzz("log-record");
}

#[test]
fn snapshot() {
    fuzz("snapshot");
}

#[test]
fn envelope() {
    let keys = corpus_dir("envelope").join("keys");
    assert!(keys.exists(), "run `write_corpora` (ignored) to write the envelope corpus and keys");
    fuzz("envelope");
}

/// Writes every target's corpus (valid inputs of what it decodes) and the envelope keys, replacing what is there.
/// Inputs kept from crashes that were fixed are added by hand and stay.
#[test]
#[ignore = "writes the corpora"]
fn write_corpora() {
    let write = |target: &str, inputs: Vec<Vec<u8>>| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("a corpus directory");
        for (n, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{n:02}")), input).expect("written");
        }
    };
    write("command", requests().iter().map(|request| postcard::to_stdvec(request).expect("encodes")).collect());
    write("client-request", client_requests());
    write("raft-message", raft_messages());
    write("log-record", log_records());
    write("snapshot", snapshots());
    let keys = corpus_dir("envelope").join("keys");
    std::fs::create_dir_all(&keys).expect("a keys directory");
    let receiver = CellKey::generate("receiver").expect("a key");
    let sender = CellKey::generate("sender").expect("a key");
    std::fs::write(keys.join("receiver.tsk"), receiver.to_tsk()).expect("written");
    std::fs::write(keys.join("sender.tsk"), sender.to_tsk()).expect("written");
    let mut keyring = Keyring::in_memory();
    keyring.import(receiver.public_armored().as_bytes(), Some(&sender)).expect("imports");
    let envelopes = [(b"x".as_slice(), "ops"), (b"a longer payload, sealed and signed".as_slice(), "acme/alice")]
        .into_iter()
        .enumerate()
        .map(|(n, (payload, principal))| {
            let sealed =
                cellog_envelope::seal((&sender, principal), &keyring, &["receiver"], format!("e{n}"), 1_000, payload)
                    .expect("sealed");
            sealed.envelope.encode()
        })
        .collect();
    write("envelope", envelopes);
}

/// Every outcome of the prepared state's setup was a success: the targets start from a cell that holds what their
/// commands name.
#[test]
fn the_prepared_cell_holds_what_the_targets_name() {
    let cell = prepared();
    assert_eq!(cell.stream_names().len(), 2);
    assert!(cell.producer_info(1).is_some_and(|producer| producer.open_transaction.is_some()));
    let mut copy = cell.clone();
    let outcome = copy.apply(AT.plus(1), Command::Tick);
    assert_eq!(outcome, Ok(Outcome::Ticked));
}

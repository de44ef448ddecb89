//! Tidy checks that keep the state machine sans-IO and deterministic, run with the tests so they cannot be skipped.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn core_depends_on_no_runtime_rpc_raft_or_randomness() {
    let manifest = read(&crate_dir().join("Cargo.toml"));
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .unwrap_or_default();
    for banned in ["tokio", "tonic", "prost", "openraft", "madsim", "rand", "rocksdb"] {
        let named = dependencies.lines().any(|line| {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default().trim();
            name == banned || name.starts_with(&format!("{banned}-")) || name.starts_with(&format!("{banned}_"))
        });
        assert!(!named, "core/Cargo.toml must not depend on {banned}: the cell is sans-IO and deterministic");
    }
}

#[test]
fn core_source_reads_no_clock_and_iterates_no_hash_maps() {
    let banned = [
        ("Instant", "time is the `at` argument"),
        ("SystemTime", "time is the `at` argument"),
        ("HashMap", "iteration order must be fixed: use BTreeMap"),
        ("HashSet", "iteration order must be fixed: use BTreeSet"),
        ("hashbrown", "iteration order must be fixed: use BTreeMap"),
        ("thread_rng", "randomness comes in as a seed"),
        ("std::thread", "the cell spawns nothing"),
        ("std::fs", "the cell does no IO"),
        ("std::net", "the cell does no IO"),
        ("tokio", "the cell does no IO"),
    ];
    // The message-id index is the one hash map (see its module): it may name one, and every line of it that
    // iterates the map says why the order does not matter.
    let hashed = crate_dir().join("src/dedup.rs");
    let mut offences = Vec::new();
    for path in sources(&crate_dir().join("src")) {
        for (number, line) in read(&path).lines().enumerate() {
            if path == hashed {
                let code = line.trim_start();
                let iterates = code.starts_with("for ")
                    || [".iter()", ".iter_mut()", ".drain(", ".keys()", ".values", "into_iter", ".retain("]
                        .iter()
                        .any(|word| line.contains(word));
                if !code.starts_with("//") && iterates && !line.contains("// order-free: ") {
                    offences.push(format!("{}:{}: iterates without `// order-free: why`", path.display(), number + 1));
                }
            }
            for (word, why) in banned {
                if path == hashed && word.to_lowercase().starts_with("hash") {
                    continue;
                }
                if line.contains(word) {
                    offences.push(format!("{}:{}: {word} ({why})", path.display(), number + 1));
                }
            }
        }
    }
    assert!(offences.is_empty(), "banned names in core/src:\n{}", offences.join("\n"));
}

/// The workspace's members, as the root `Cargo.toml` lists them.
fn members() -> Vec<String> {
    let manifest = read(&crate_dir().join("../Cargo.toml"));
    let list = manifest.split("members = [").nth(1).expect("a members list").split(']').next().unwrap_or_default();
    list.split(',').map(|name| name.trim().trim_matches('"').to_string()).filter(|name| !name.is_empty()).collect()
}

#[test]
fn every_crate_says_what_it_is() {
    let root = crate_dir().join("..");
    let members = members();
    assert!(members.len() >= 8, "the members list was not read: {members:?}");
    for name in members {
        let lib = root.join(&name).join("src/lib.rs");
        let main = root.join(&name).join("src/main.rs");
        let top = if lib.exists() { lib } else { main };
        assert!(read(&top).trim_start().starts_with("//!"), "{} must start with a //! doc", top.display());
    }
}

#[test]
fn every_crate_bans_ambient_time_and_randomness_through_clippy() {
    // clippy.toml at the root bans them for every crate; a crate that allows one does so at the use, with a reason.
    let root = crate_dir().join("..");
    let clippy = read(&root.join("clippy.toml"));
    for banned in ["Instant::now", "SystemTime::now", "thread_rng", "HashMap", "HashSet"] {
        assert!(clippy.contains(banned), "clippy.toml must ban {banned}");
    }
    for name in members() {
        for path in sources(&root.join(&name).join("src")) {
            for (number, line) in read(&path).lines().enumerate() {
                if line.contains("allow(clippy::disallowed_") {
                    assert!(
                        line.contains("reason")
                            || read(&path).lines().nth(number + 1).is_some_and(|next| next.contains("reason")),
                        "{}:{}: an allowed ambient source says why (`reason = ...`)",
                        path.display(),
                        number + 1
                    );
                }
            }
        }
    }
}

#[test]
fn ci_runs_the_readme_test_command() {
    let root = crate_dir().join("..");
    let readme = read(&root.join("README.md"));
    let ci = read(&root.join(".ci/run"));
    assert!(readme.contains("\nci/test\n"), "README.md must give `ci/test` as the test command");
    assert!(ci.contains("ci/test"), ".ci/run must call ci/test");
}

#[test]
fn simulated_code_makes_no_std_hash_maps() {
    // The code a simulated node runs (the node, Raft glue, mail, the client library) makes no std hash map or set,
    // not even inside a dependency's type: making the first one on a thread draws std's random keys, which the
    // simulator serves from its own random numbers, so a run would depend on what made a map before it and replay
    // differently ("non-determinism detected"). clippy.toml bans the std types by name; a labelled metrics family
    // holds one inside.
    let root = crate_dir().join("..");
    let mut offences = Vec::new();
    for krate in ["net", "raft", "mail", "client"] {
        for path in sources(&root.join(krate).join("src")) {
            for (number, line) in read(&path).lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for banned in ["HashMap", "HashSet", "RandomState", "family::Family"] {
                    if line.contains(banned) {
                        offences.push(format!("{}:{}: {banned}", path.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(offences.is_empty(), "use BTreeMap, BTreeSet or plain counters instead:\n{}", offences.join("\n"));
}

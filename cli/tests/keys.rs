//! `cellog keys`: the cell key a node made in its data directory, and the keyring of other cells' keys.

#![cfg(feature = "node")]

use std::process::Command;

use cellog_envelope::CellKey;

fn cellog(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cellog")).args(args).output().expect("cellog runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn keys_show_import_and_list() {
    let dir = tempfile::tempdir().expect("a directory");
    let data = dir.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");

    let (ok, text) = cellog(&["keys", "show", "--data-dir", data]);
    assert!(!ok && text.contains("no cell key"), "{text}");

    // As a node's first start does.
    let (own, created) = CellKey::load_or_create(std::path::Path::new(data), "alpha").expect("made");
    assert!(created);
    let (ok, text) = cellog(&["keys", "show", "--data-dir", data]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("cell alpha fingerprint {}", own.fingerprint())), "{text}");
    assert!(text.contains("BEGIN PGP PUBLIC KEY BLOCK"), "{text}");

    let bravo = CellKey::generate("bravo").expect("a key");
    let bravo_file = dir.path().join("bravo.asc");
    std::fs::write(&bravo_file, bravo.public_armored()).expect("written");
    let (ok, text) = cellog(&["keys", "import", bravo_file.to_str().expect("UTF-8"), "--data-dir", data]);
    assert!(ok && text.contains(&bravo.fingerprint()), "{text}");
    let (ok, text) = cellog(&["keys", "list", "--data-dir", data]);
    assert!(ok && text.contains("bravo") && text.contains(&bravo.fingerprint()), "{text}");

    // Refused with a clear reason: this cell's own key, and a file that is not a key.
    let own_file = dir.path().join("own.asc");
    std::fs::write(&own_file, own.public_armored()).expect("written");
    let (ok, text) = cellog(&["keys", "import", own_file.to_str().expect("UTF-8"), "--data-dir", data]);
    assert!(!ok && text.contains("own key"), "{text}");
    let junk = dir.path().join("junk.asc");
    std::fs::write(&junk, "junk").expect("written");
    let (ok, text) = cellog(&["keys", "import", junk.to_str().expect("UTF-8"), "--data-dir", data]);
    assert!(!ok && text.contains("not a usable cell key"), "{text}");
}

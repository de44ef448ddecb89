//! The cell key in the data directory and the keyring of other cells' keys; and envelopes of every earlier version
//! still opening.

use cellog_envelope::{CellKey, Envelope, KeyError, Keyring, open, seal};
use sequoia_openpgp::serialize::SerializeInto;

#[test]
fn the_cell_key_is_made_once_and_kept() {
    let dir = tempfile::tempdir().expect("a directory");
    let (key, created) = CellKey::load_or_create(dir.path(), "alpha").expect("made");
    assert!(created);
    let (again, created) = CellKey::load_or_create(dir.path(), "alpha").expect("loaded");
    assert!(!created);
    assert_eq!(key.fingerprint(), again.fingerprint());
    let path = dir.path().join("keys").join("cell.tsk");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("the key file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "only its owner reads a secret key");
    }
    let error = CellKey::load_or_create(dir.path(), "bravo").expect_err("another cell's key");
    assert!(matches!(error, KeyError::OtherCell { .. }), "{error}");
    assert!(key.public_armored().starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"));
    assert!(!key.public_armored().contains("PRIVATE"));
}

#[test]
fn the_keyring_keeps_other_cells_public_keys() {
    let dir = tempfile::tempdir().expect("a directory");
    let (own, _) = CellKey::load_or_create(dir.path(), "alpha").expect("made");
    let bravo = CellKey::generate("bravo").expect("a key");
    let charlie = CellKey::generate("charlie").expect("a key");

    let mut keyring = Keyring::open(dir.path()).expect("an empty keyring");
    assert_eq!(keyring.list().count(), 0);
    let imported = keyring.import(bravo.public_armored().as_bytes(), Some(&own)).expect("imported");
    assert_eq!((imported.cell.as_str(), imported.fingerprint.clone()), ("bravo", bravo.fingerprint()));
    // A key handed over with its secret parts is kept without them.
    keyring.import(&charlie.to_tsk(), Some(&own)).expect("imported");
    keyring.import(bravo.public_armored().as_bytes(), Some(&own)).expect("the same key again changes nothing");

    let reopened = Keyring::open(dir.path()).expect("reopened");
    let cells: Vec<&str> = reopened.list().map(|peer| peer.cell.as_str()).collect();
    assert_eq!(cells, vec!["bravo", "charlie"]);
    assert!(reopened.list().all(|peer| !peer.cert.is_tsk()), "no secret key material in the keyring");
    assert_eq!(reopened.by_fingerprint(&charlie.fingerprint()).map(|peer| peer.cell.as_str()), Some("charlie"));

    // Refused: this cell's own key, a different key for a known cell, garbage.
    let error = keyring.import(own.public_armored().as_bytes(), Some(&own)).expect_err("own key");
    assert!(matches!(error, KeyError::OwnKey { .. }), "{error}");
    let other_bravo = CellKey::generate("bravo").expect("a key");
    let error = keyring.import(other_bravo.public_armored().as_bytes(), Some(&own)).expect_err("changed");
    assert!(matches!(error, KeyError::KeyChanged { .. }), "{error}");
    assert!(error.to_string().contains("bravo"));
    let impostor = CellKey::generate("alpha").expect("a key naming this cell");
    let error = keyring.import(impostor.public_armored().as_bytes(), Some(&own)).expect_err("this cell's name");
    assert!(matches!(error, KeyError::OwnKey { .. }), "{error}");
    let error = keyring.import(b"not a key", Some(&own)).expect_err("garbage");
    assert!(matches!(error, KeyError::Unusable { .. }), "{error}");

    // A file named for another key, or a second key for a known cell, is an error naming it.
    let peers = dir.path().join("keys").join("peers");
    let misnamed = peers.join(format!("{}.pgp", bravo.fingerprint()));
    let renamed = peers.join("0000.pgp");
    std::fs::rename(&misnamed, &renamed).expect("renamed");
    let error = Keyring::open(dir.path()).expect_err("misnamed");
    assert!(error.to_string().contains("0000.pgp"), "{error}");
    std::fs::rename(&renamed, &misnamed).expect("renamed back");
    let second = peers.join(format!("{}.pgp", other_bravo.fingerprint()));
    std::fs::write(&second, other_bravo.public().armored().to_vec().expect("armored")).expect("written");
    let error = Keyring::open(dir.path()).expect_err("two keys for bravo");
    assert!(error.to_string().contains("second key"), "{error}");
    std::fs::remove_file(&second).expect("removed");

    // A damaged file in the keyring is an error naming it, not a silently missing peer.
    std::fs::write(peers.join("junk.pgp"), b"junk").expect("written");
    let error = Keyring::open(dir.path()).expect_err("damaged");
    assert!(error.to_string().contains("junk.pgp"), "{error}");
}

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Envelopes written by earlier versions, with the keys that open them: each must keep opening.
#[test]
fn envelopes_of_earlier_versions_still_open() {
    let read = |name: &str| std::fs::read(format!("{FIXTURES}/{name}")).expect("a fixture");
    for (version, principal) in [(1, ""), (2, "acme/alice")] {
        let sender = CellKey::from_tsk(&read(&format!("v{version}-sender.tsk"))).expect("the sender's key");
        let receiver = CellKey::from_tsk(&read(&format!("v{version}-receiver.tsk"))).expect("the receiver's key");
        let mut keyring = Keyring::in_memory();
        keyring.import(sender.public_armored().as_bytes(), Some(&receiver)).expect("imported");
        let bytes = read(&format!("v{version}.envelope"));
        let opened = open(&receiver, &keyring, &bytes, 0).expect("an envelope of an earlier version opens");
        assert_eq!(&opened.payload[..], format!("version {version} payload").as_bytes());
        assert_eq!(opened.header.id, format!("fixture-v{version}"));
        assert_eq!(opened.header.principal, principal);
        let envelope = Envelope::decode(&bytes).expect("decodes");
        assert_eq!(envelope.version, version);
        assert_eq!(envelope.encode(), bytes, "version {version} encodes back to the bytes it was read from");
    }
}

/// Writes the current version's fixtures; run by hand (`cargo test -p cellog-envelope --test keys -- --ignored`)
/// only when a new envelope version is introduced, to keep the files of the version it replaces (add that version to
/// the test above).
#[test]
#[ignore = "writes fixtures"]
fn write_fixture() {
    let version = cellog_envelope::ENVELOPE_VERSION;
    let sender = CellKey::generate("fixture-sender").expect("a key");
    let receiver = CellKey::generate("fixture-receiver").expect("a key");
    let mut keyring = Keyring::in_memory();
    keyring.import(receiver.public_armored().as_bytes(), Some(&sender)).expect("imported");
    let payload = format!("version {version} payload");
    let id = format!("fixture-v{version}");
    let sealed =
        seal((&sender, "acme/alice"), &keyring, &["fixture-receiver"], id, 0, payload.as_bytes()).expect("sealed");
    assert_eq!(Envelope::decode(&sealed.envelope.encode()).expect("decodes"), sealed.envelope);
    std::fs::write(format!("{FIXTURES}/v{version}-sender.tsk"), sender.to_tsk()).expect("written");
    std::fs::write(format!("{FIXTURES}/v{version}-receiver.tsk"), receiver.to_tsk()).expect("written");
    std::fs::write(format!("{FIXTURES}/v{version}.envelope"), sealed.envelope.encode()).expect("written");
}

#[test]
fn a_cell_key_is_shared_by_storing_it_on_another_node_never_over_a_different_one() {
    let (first, second) = (tempfile::tempdir().expect("a dir"), tempfile::tempdir().expect("a dir"));
    let (key, _) = CellKey::load_or_create(first.path(), "alpha").expect("made");
    key.store(second.path()).expect("stored on the second node");
    key.store(second.path()).expect("storing it again changes nothing");
    let (loaded, created) = CellKey::load_or_create(second.path(), "alpha").expect("loaded");
    assert!(!created);
    assert_eq!(loaded.fingerprint(), key.fingerprint());

    let other = CellKey::generate("alpha").expect("another key");
    let refused = other.store(second.path()).expect_err("a different key is never written over the one there");
    assert!(matches!(refused, KeyError::KeyChanged { .. }), "{refused}");
    assert_eq!(CellKey::load(second.path()).expect("reads").expect("a key").fingerprint(), key.fingerprint());
}

#[test]
fn a_cell_key_prints_as_its_cell_and_fingerprint_only() {
    let key = CellKey::generate("alpha").expect("a key");
    assert_eq!(format!("{key:?}"), format!("CellKey {{ cell: \"alpha\", fingerprint: \"{}\" }}", key.fingerprint()));
}

//! Sealing and opening: round trips to several recipients, each opening alone; all-or-nothing sealing; every kind of
//! tampering refused; size per recipient; provenance rows, and a failing ledger that does not stop delivery.

use std::sync::OnceLock;

use cellog_envelope::envelope::DecodeError;
use cellog_envelope::{CellKey, Direction, Envelope, Keyring, OpenError, PrincipalKind, SCHEME, SealError, open, seal};

/// Five cells, each with its key and a keyring holding the other four.
struct World {
    keys: Vec<CellKey>,
    keyrings: Vec<Keyring>,
}

const CELLS: [&str; 5] = ["alpha", "bravo", "charlie", "delta", "echo"];

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let keys: Vec<CellKey> = CELLS.iter().map(|cell| CellKey::generate(cell).expect("a key")).collect();
        let keyrings = keys
            .iter()
            .map(|own| {
                let mut keyring = Keyring::in_memory();
                for other in keys.iter().filter(|other| other.cell() != own.cell()) {
                    keyring.import(other.public_armored().as_bytes(), Some(own)).expect("imported");
                }
                keyring
            })
            .collect();
        World { keys, keyrings }
    })
}

fn sealed_by_alpha(recipients: &[&str], payload: &[u8]) -> Vec<u8> {
    let w = world();
    seal((&w.keys[0], "ops"), &w.keyrings[0], recipients, "env-1".to_string(), 1_000, payload)
        .expect("sealed")
        .envelope
        .encode()
}

fn open_as(index: usize, bytes: &[u8]) -> Result<cellog_envelope::Opened, OpenError> {
    let w = world();
    open(&w.keys[index], &w.keyrings[index], bytes, 2_000)
}

#[test]
fn every_recipient_opens_it_alone_and_others_cannot() {
    let bytes = sealed_by_alpha(&["bravo", "charlie", "delta"], b"the payload");
    for (index, cell) in CELLS.iter().enumerate().skip(1).take(3) {
        let opened = open_as(index, &bytes).unwrap_or_else(|error| panic!("{cell} opens: {error}"));
        assert_eq!(&opened.payload[..], b"the payload");
        assert_eq!(opened.header.sender, "alpha");
        assert_eq!(opened.header.principal, "ops");
        assert_eq!(opened.header.recipients.len(), 3);
    }
    // Echo is not a recipient; alpha (the sender) did not seal it for itself.
    assert!(matches!(open_as(4, &bytes), Err(OpenError::NotForUs { .. })));
    assert!(matches!(open_as(0, &bytes), Err(OpenError::NotForUs { .. })));
}

#[test]
fn a_recipient_listed_in_a_forged_header_still_cannot_decrypt() {
    let w = world();
    let bytes = sealed_by_alpha(&["bravo"], b"secret");
    let mut envelope = Envelope::decode(&bytes).expect("decodes");
    envelope
        .header
        .recipients
        .push(cellog_envelope::Recipient { cell: "echo".to_string(), fingerprint: w.keys[4].fingerprint() });
    assert!(matches!(open_as(4, &envelope.encode()), Err(OpenError::NotForUs { .. })));
}

#[test]
fn an_unknown_recipient_aborts_the_whole_send_naming_it() {
    let w = world();
    let error = seal((&w.keys[0], "ops"), &w.keyrings[0], &["bravo", "zulu", "charlie"], "e".to_string(), 0, b"x")
        .expect_err("refused");
    assert!(matches!(&error, SealError::UnknownRecipient { cell } if cell == "zulu"), "{error}");
    assert!(error.to_string().contains("zulu"));
    assert!(matches!(
        seal((&w.keys[0], "ops"), &w.keyrings[0], &[], "e".to_string(), 0, b"x"),
        Err(SealError::NoRecipients)
    ));
    assert!(matches!(
        seal((&w.keys[0], "ops"), &w.keyrings[0], &["bravo", "bravo"], "e".to_string(), 0, b"x"),
        Err(SealError::DuplicateRecipient { .. })
    ));
}

#[test]
fn size_grows_by_a_key_packet_per_recipient_not_by_a_payload() {
    let payload = vec![7u8; 64 * 1024];
    let one = sealed_by_alpha(&["bravo"], &payload).len();
    let four = sealed_by_alpha(&["bravo", "charlie", "delta", "echo"], &payload).len();
    let per_recipient = (four - one) / 3;
    println!("envelope_bytes one={one} four={four} per_extra_recipient={per_recipient} payload={}", payload.len());
    // A Curve25519 key packet is about a hundred bytes; the header adds a name and a fingerprint.
    assert!(per_recipient < 400, "{per_recipient} bytes per extra recipient");
    assert!(one < payload.len() + 2_048, "{one} bytes for a {} byte payload", payload.len());
}

#[test]
fn tampering_with_any_part_is_refused() {
    let bytes = sealed_by_alpha(&["bravo"], b"pay me 10");
    let clean = Envelope::decode(&bytes).expect("decodes");

    // Every byte of the sealed OpenPGP message: flipping any one is refused (a sample of positions, all kinds of
    // packets: key packet, encrypted data, its integrity tag).
    let n = clean.sealed.len();
    for position in (0..n).step_by(7).chain([n - 1]) {
        let mut sealed = clean.sealed.to_vec();
        sealed[position] ^= 0x20;
        let tampered = Envelope { header: clean.header.clone(), sealed: sealed.into(), ..clean.clone() };
        let result = open_as(1, &tampered.encode());
        assert!(result.is_err(), "a flipped byte at {position} of {n} was accepted");
    }

    // Each field of the clear header.
    let mut headers = Vec::new();
    let mut h = clean.header.clone();
    h.id = "env-2".to_string();
    headers.push(("id", h));
    let mut h = clean.header.clone();
    h.created_ms += 1;
    headers.push(("created_ms", h));
    let mut h = clean.header.clone();
    h.recipients.push(cellog_envelope::Recipient { cell: "zulu".to_string(), fingerprint: "00".repeat(20) });
    headers.push(("recipients", h));
    let mut h = clean.header.clone();
    h.sender = "zulu".to_string();
    headers.push(("sender", h));
    let mut h = clean.header.clone();
    h.principal = "root".to_string();
    headers.push(("principal", h));
    for (field, header) in headers {
        let tampered = Envelope { header, ..clean.clone() };
        let error = open_as(1, &tampered.encode()).expect_err(field);
        assert!(matches!(error, OpenError::Tampered { .. } | OpenError::UnknownSigner { .. }), "{field}: {error}");
    }
    // A recipient's fingerprint changed: no longer addressed to this cell's key.
    let mut header = clean.header.clone();
    header.recipients[0].fingerprint = header.recipients[0].fingerprint.to_lowercase();
    let tampered = Envelope { header, ..clean.clone() };
    assert!(matches!(open_as(1, &tampered.encode()), Err(OpenError::NotForUs { .. })));

    // The wire form itself: truncated, a newer version, garbage.
    assert!(matches!(open_as(1, &bytes[..bytes.len() - 1]), Err(OpenError::Decode(_))));
    let mut newer = bytes.clone();
    newer[8] = 9;
    assert!(matches!(open_as(1, &newer), Err(OpenError::Decode(DecodeError::UnsupportedVersion { version: 9 }))));
    assert!(matches!(open_as(1, b"hello"), Err(OpenError::Decode(DecodeError::NotAnEnvelope))));
}

#[test]
fn a_signature_by_anyone_but_the_known_sender_is_refused() {
    let w = world();
    // An impostor with its own key claims to be alpha: the header names alpha, but the key is not alpha's.
    let impostor = CellKey::generate("alpha").expect("a key");
    let mut keyring = Keyring::in_memory();
    keyring.import(w.keys[1].public_armored().as_bytes(), None).expect("bravo's key");
    let forged = seal((&impostor, "ops"), &keyring, &["bravo"], "env-f".to_string(), 0, b"x").expect("sealed").envelope;
    let error = open_as(1, &forged.encode()).expect_err("refused");
    assert!(matches!(error, OpenError::UnknownSigner { .. }), "{error}");

    // The impostor also copies alpha's fingerprint into the header: the signature does not verify against it.
    let mut forged = forged;
    forged.header.sender_fingerprint = w.keys[0].fingerprint();
    let error = open_as(1, &forged.encode()).expect_err("refused");
    assert!(matches!(error, OpenError::BadSignature { .. } | OpenError::Tampered { .. }), "{error}");

    // A sender bravo does not know at all.
    let stranger = CellKey::generate("foxtrot").expect("a key");
    let sealed = seal((&stranger, "ops"), &keyring, &["bravo"], "env-s".to_string(), 0, b"x").expect("sealed").envelope;
    assert!(matches!(open_as(1, &sealed.encode()), Err(OpenError::UnknownSigner { .. })));
}

#[test]
fn provenance_rows_hold_fingerprints_and_hashes_only() {
    let w = world();
    let payload = b"an order";
    let sealed =
        seal((&w.keys[0], "ops"), &w.keyrings[0], &["bravo", "charlie"], "env-p".to_string(), 5, payload).unwrap();
    let sent = &sealed.provenance;
    assert_eq!((sent.direction, sent.verified, sent.scheme.as_str()), (Direction::Sent, false, SCHEME));
    assert_eq!(sent.signer_fingerprint, w.keys[0].fingerprint());
    assert_eq!(sent.recipients, vec![w.keys[1].fingerprint(), w.keys[2].fingerprint()]);

    let bytes = sealed.envelope.encode();
    let opened = open_as(1, &bytes).expect("opens");
    let received = &opened.provenance;
    assert_eq!((received.direction, received.verified, received.at_ms), (Direction::Received, true, 2_000));
    assert_eq!(received.signer_fingerprint, w.keys[0].fingerprint());
    assert_eq!(received.payload_sha256, sent.payload_sha256);
    assert_eq!(received.envelope_sha256, sent.envelope_sha256);

    // Nothing in a row is plaintext, key material or signature bytes: every field is a name, a fingerprint, a hash
    // or a number.
    for row in [sent, received] {
        let encoded = format!("{row:?}");
        assert!(!encoded.contains("an order"));
        for text in row.recipients.iter().chain([&row.signer_fingerprint, &row.payload_sha256, &row.envelope_sha256]) {
            assert!(text.chars().all(|c| c.is_ascii_hexdigit()), "{text}");
        }
    }
}

#[test]
fn cells_and_nodes_must_encrypt_users_may() {
    assert!(PrincipalKind::Cell.check(false).is_err());
    assert!(PrincipalKind::Node.check(false).is_err());
    assert!(PrincipalKind::Cell.check(true).is_ok());
    assert!(PrincipalKind::User.check(false).is_ok());
    assert!(PrincipalKind::User.check(true).is_ok());
}

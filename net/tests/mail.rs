//! Sealed mail between one-node cells over real loopback gRPC: a multicast with every kind of result, the inbox read
//! back and verified, repeats stored once, provenance rows pinning their envelopes, a failing ledger that does not
//! stop delivery, and store and forward to a cell that comes up later.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]
#![allow(clippy::disallowed_methods, reason = "waits on the real clock for delivery")]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError, ClientOptions};
use cellog_envelope::{CellKey, Envelope, Keyring};
use cellog_mail::schema::{INBOX, OUTBOX, PROVENANCE};
use cellog_mail::{MailConfig, RetryPolicy};
use cellog_net::{NodeConfig, RaftTiming, RunningNode};
use cellog_raft::SystemClock;
use cellog_raft::storage::SimDisk;
use common::free_addr;
use tonic::Code;

/// A cell of one node at `client_addr`, with `key`, knowing `peers`' keys and `homes`, serving callers without a
/// credential as root.
async fn cell(
    key: &CellKey,
    peers: &[&CellKey],
    homes: BTreeMap<String, Vec<String>>,
    client_addr: SocketAddr,
    retry: RetryPolicy,
) -> (RunningNode<SimDisk>, Client) {
    cell_as(key, peers, homes, client_addr, retry, None).await
}

/// The same, requiring a credential when `root_token` is given (and installing it as root's), the client using it.
async fn cell_as(
    key: &CellKey,
    peers: &[&CellKey],
    homes: BTreeMap<String, Vec<String>>,
    client_addr: SocketAddr,
    retry: RetryPolicy,
    root_token: Option<&str>,
) -> (RunningNode<SimDisk>, Client) {
    let any = "127.0.0.1:0".parse().expect("an address");
    let mut keyring = Keyring::in_memory();
    for peer in peers {
        keyring.import(peer.public_armored().as_bytes(), Some(key)).expect("a peer's key imports");
    }
    let config = NodeConfig {
        cell: key.cell().to_string(),
        id: 1,
        data_dir: std::env::temp_dir(),
        client_addr,
        raft_addr: any,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers: Vec::new(),
        bootstrap: true,
        timing: RaftTiming {
            heartbeat_ms: 50,
            election_timeout_ms: 200,
            snapshot_every: 1000,
            keep_logs: 1000,
            ..RaftTiming::default()
        },
        mail: Some(MailConfig {
            key: key.clone(),
            keyring,
            keyring_dir: None,
            homes,
            home_cas: BTreeMap::new(),
            retry,
            id_seed: 7,
        }),
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: cellog_net::auth::Callers {
            insecure: root_token.is_none(),
            cell: None,
            rate: None,
            scrape_token: None,
        },
        root_token: root_token.map(str::to_string),
        tls: None,
        limits: cellog_net::Limits::DEFAULT,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    };
    let node = RunningNode::start(&config, SimDisk::new(7), Arc::new(SystemClock)).await.expect("the node starts");
    let options = ClientOptions { token: root_token.map(str::to_string), ..ClientOptions::default() };
    let client = Client::new([node.client_addr.to_string()], options).expect("a client");
    for _ in 0..200 {
        if client.cluster_status().await.is_ok_and(|status| status.state == "Leader" && status.applied_index.is_some())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (node, client)
}

fn quick_retry(give_up_after: Duration) -> RetryPolicy {
    RetryPolicy {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
        give_up_after,
        attempt_timeout: Duration::from_millis(500),
        poll: Duration::from_millis(50),
    }
}

fn key(cell: &str) -> CellKey {
    CellKey::generate(cell).expect("a key")
}

async fn settled(client: &Client, id: &str) -> v1::DeliveryStatusResponse {
    for _ in 0..400 {
        let status = client.delivery_status(id).await.expect("a status");
        if status.pending == 0 {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("envelope {id} never settled: {:?}", client.delivery_status(id).await);
}

fn results(status: &v1::DeliveryStatusResponse) -> BTreeMap<String, v1::DeliveryResult> {
    status
        .recipients
        .iter()
        .map(|recipient| (recipient.cell.clone(), v1::DeliveryResult::try_from(recipient.result).expect("known")))
        .collect()
}

async fn read(client: &Client, stream: &str) -> Vec<v1::Message> {
    client.read(stream, 0, 0, 100, false).await.expect("reads").messages
}

fn home(cells: &[(&str, SocketAddr)]) -> BTreeMap<String, Vec<String>> {
    cells.iter().map(|(cell, addr)| (cell.to_string(), vec![addr.to_string()])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multicast_says_which_recipients_it_reached_and_how_the_others_ended() {
    let (alpha, bravo, charlie, delta, echo, foxtrot) =
        (key("alpha"), key("bravo"), key("charlie"), key("delta"), key("echo"), key("foxtrot"));
    let (bravo_addr, charlie_addr, foxtrot_addr, delta_addr) = (free_addr(), free_addr(), free_addr(), free_addr());
    // delta has an address where nothing listens; echo has none; foxtrot does not know alpha's key.
    let homes =
        home(&[("bravo", bravo_addr), ("charlie", charlie_addr), ("delta", delta_addr), ("foxtrot", foxtrot_addr)]);
    let everyone = [&bravo, &charlie, &delta, &echo, &foxtrot];
    let (_alpha_node, alpha_client) =
        cell(&alpha, &everyone, homes, free_addr(), quick_retry(Duration::from_secs(2))).await;
    let (bravo_node, bravo_client) =
        cell(&bravo, &[&alpha, &charlie], BTreeMap::new(), bravo_addr, quick_retry(Duration::from_secs(2))).await;
    let (_charlie_node, charlie_client) =
        cell(&charlie, &[&alpha], BTreeMap::new(), charlie_addr, quick_retry(Duration::from_secs(2))).await;
    let (_foxtrot_node, foxtrot_client) =
        cell(&foxtrot, &[], BTreeMap::new(), foxtrot_addr, quick_retry(Duration::from_secs(2))).await;

    let recipients: Vec<String> = ["bravo", "charlie", "delta", "echo", "foxtrot"].map(String::from).to_vec();
    let sent =
        alpha_client.send_sealed(&recipients, Bytes::from_static(b"the quarterly figures"), None).await.expect("sent");
    assert!(!sent.duplicate);
    let status = settled(&alpha_client, &sent.envelope_id).await;
    use v1::DeliveryResult::*;
    assert_eq!(
        results(&status),
        BTreeMap::from([
            ("bravo".to_string(), Delivered),
            ("charlie".to_string(), Delivered),
            ("delta".to_string(), Failed),
            ("echo".to_string(), NoHome),
            ("foxtrot".to_string(), Denied),
        ])
    );
    assert_eq!((status.delivered, status.failed, status.no_home, status.denied, status.pending), (2, 1, 1, 1, 0));
    let delta_status = status.recipients.iter().find(|r| r.cell == "delta").expect("delta");
    assert!(delta_status.attempts > 1, "delta was retried: {delta_status:?}");
    let foxtrot_status = status.recipients.iter().find(|r| r.cell == "foxtrot").expect("foxtrot");
    assert!(foxtrot_status.detail.contains("not a known cell"), "{foxtrot_status:?}");

    // Each recipient opens it alone, verified as alpha's.
    for client in [&bravo_client, &charlie_client] {
        let mail = client.read_mail(0, 10).await.expect("reads mail");
        assert_eq!(mail.len(), 1);
        assert_eq!((mail[0].sender.as_str(), &mail[0].payload[..]), ("alpha", &b"the quarterly figures"[..]));
        assert_eq!(mail[0].sender_fingerprint, alpha.fingerprint());
        assert_eq!(mail[0].envelope_id, sent.envelope_id);
    }
    assert!(foxtrot_client.read_mail(0, 10).await.expect("reads").is_empty(), "nothing unverified is stored");

    // A repeat of the envelope is stored once.
    let inbox = read(&bravo_client, INBOX).await;
    let again = bravo_client.deliver(inbox[0].payload.clone()).await.expect("a repeat is accepted");
    assert!(again.duplicate);
    assert_eq!(read(&bravo_client, INBOX).await.len(), 1);
    // So is a repeat of the send under the same id.
    let resent = alpha_client.send_sealed(&recipients, Bytes::from_static(b"other"), Some(&sent.envelope_id)).await;
    assert!(resent.expect("a repeat send answers").duplicate);

    // Provenance: the sender's row (unverified) pins the outbox envelope, the receiver's (verified) the inbox one.
    let sent_rows = read(&alpha_client, PROVENANCE).await;
    let received_rows = read(&bravo_client, PROVENANCE).await;
    assert_eq!((sent_rows.len(), received_rows.len()), (1, 1));
    let row = String::from_utf8(received_rows[0].payload.to_vec()).expect("text");
    assert!(row.contains("verified = true") && row.contains(&alpha.fingerprint()), "{row}");
    assert!(!row.contains("quarterly"), "no plaintext in a row: {row}");
    assert_eq!(received_rows[0].headers.get("Cellog-Pin").map(String::as_str), Some("mail-inbox/0/1"));
    assert!(String::from_utf8_lossy(&sent_rows[0].payload).contains("verified = false"));
    // The node's own streams: not even root recalls an envelope or deletes a mail stream (the provenance rows' pins
    // keep them from the node's own retention too).
    let recall = bravo_client.recall(INBOX, 0, 1).await;
    assert!(
        matches!(&recall, Err(ClientError::Status { code: Code::PermissionDenied, detail }) if detail.reason == "PERMISSION_DENIED"),
        "{recall:?}"
    );
    assert!(alpha_client.delete_stream(OUTBOX).await.is_err());

    // No principal changes a mail stream, root included (its subjects are reserved for the node).
    let mut full = bravo_client.stream_info(PROVENANCE).await.expect("info").config.expect("a config");
    full.max_messages = Some(1);
    full.discard = v1::DiscardPolicy::DiscardNew as i32;
    let refused = bravo_client.update_stream(PROVENANCE, full).await.expect_err("a mail stream is the node's");
    assert_eq!(refused.reason(), Some("PERMISSION_DENIED"), "{refused}");
    // A ledger that refuses rows does not stop delivery: the failure is counted. (The node fills it itself.)
    let info = bravo_node.node.replica().expect("the replica").cell.stream_info(PROVENANCE).expect("info");
    let full =
        cellog_core::StreamConfig { max_messages: Some(1), discard: cellog_core::DiscardPolicy::New, ..info.config };
    let command = cellog_core::Command::UpdateStream { name: PROVENANCE.to_string(), config: full };
    bravo_node.node.propose_now(command).await.expect("proposed").expect("updated");
    let second =
        alpha_client.send_sealed(&["bravo".to_string()], Bytes::from_static(b"second"), None).await.expect("sent");
    assert_eq!(results(&settled(&alpha_client, &second.envelope_id).await)["bravo"], Delivered);
    assert_eq!(bravo_client.read_mail(0, 10).await.expect("reads").len(), 2);
    assert_eq!(read(&bravo_client, PROVENANCE).await.len(), 1);
    assert_eq!(bravo_node.metrics.mail.provenance_failures.get(), 1);

    // An unknown recipient refuses the whole send, naming it; nothing is stored.
    let outbox_before = read(&alpha_client, OUTBOX).await.len();
    let refused =
        alpha_client.send_sealed(&["bravo".to_string(), "zulu".to_string()], Bytes::from_static(b"x"), None).await;
    match refused {
        Err(ClientError::Status { code: Code::NotFound, detail }) => {
            assert_eq!(detail.reason, "UNKNOWN_RECIPIENT");
            assert!(detail.message.contains("zulu"), "{}", detail.message);
        }
        other => panic!("expected UNKNOWN_RECIPIENT, got {other:?}"),
    }
    assert_eq!(read(&alpha_client, OUTBOX).await.len(), outbox_before);

    // Garbage and forgeries handed to Deliver are denied and not stored.
    let garbage = bravo_client.deliver(Bytes::from_static(b"not an envelope")).await;
    assert!(matches!(garbage, Err(ClientError::Status { code: Code::PermissionDenied, .. })), "{garbage:?}");
    let mut tampered_body = inbox[0].payload.to_vec();
    let last = tampered_body.len() - 1;
    tampered_body[last] ^= 0x40;
    let mut tampered_header = Envelope::decode(&inbox[0].payload).expect("an envelope");
    tampered_header.header.created_ms += 1;
    for forged in [Bytes::from(tampered_body), Bytes::from(tampered_header.encode())] {
        let refused = bravo_client.deliver(forged).await;
        assert!(matches!(refused, Err(ClientError::Status { code: Code::PermissionDenied, .. })), "{refused:?}");
    }
    assert_eq!(read(&bravo_client, INBOX).await.len(), 2);

    // An envelope older than the freshness window, or from too far in the future, is refused as stale.
    let sealed_at = bravo_client.read_mail(0, 1).await.expect("reads")[0].created_ms;
    let mut to_bravo = Keyring::in_memory();
    to_bravo.import(bravo.public_armored().as_bytes(), Some(&alpha)).expect("bravo's key imports");
    let sealed = |sender: &CellKey, id: &str, at: u64| {
        let sealed =
            cellog_envelope::seal((sender, "ops"), &to_bravo, &["bravo"], id.to_string(), at, b"x").expect("sealed");
        Bytes::from(sealed.envelope.encode())
    };
    let day = 24 * 3600 * 1000;
    for at in [sealed_at - 7 * day, sealed_at + day] {
        let refused = bravo_client.deliver(sealed(&alpha, "late", at)).await;
        assert!(
            matches!(&refused, Err(ClientError::Status { code: Code::PermissionDenied, detail }) if detail.reason == "STALE_ENVELOPE"),
            "{refused:?}"
        );
    }
    assert_eq!(read(&bravo_client, INBOX).await.len(), 2);
    // Two senders choosing the same envelope id are two envelopes: the inbox tells them apart by their sender.
    let taken = sent.envelope_id.clone();
    let from_charlie = bravo_client.deliver(sealed(&charlie, &taken, sealed_at)).await.expect("charlie's envelope");
    assert!(!from_charlie.duplicate);
    let mail = bravo_client.read_mail(0, 10).await.expect("reads");
    let with_id: Vec<&str> = mail.iter().filter(|m| m.envelope_id == taken).map(|m| m.sender.as_str()).collect();
    assert_eq!(with_id, ["alpha", "charlie"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_waits_in_the_outbox_until_its_recipient_comes_up() {
    let (alpha, bravo) = (key("alpha"), key("bravo"));
    let bravo_addr = free_addr();
    let patient = quick_retry(Duration::from_secs(600));
    let (_alpha_node, alpha_client) =
        cell(&alpha, &[&bravo], home(&[("bravo", bravo_addr)]), free_addr(), patient.clone()).await;
    let sent =
        alpha_client.send_sealed(&["bravo".to_string()], Bytes::from_static(b"later"), None).await.expect("sent");
    let mut waiting = alpha_client.delivery_status(&sent.envelope_id).await.expect("a status");
    for _ in 0..100 {
        if waiting.recipients[0].attempts >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiting = alpha_client.delivery_status(&sent.envelope_id).await.expect("a status");
    }
    assert_eq!(waiting.pending, 1);
    assert!(waiting.recipients[0].attempts >= 2, "{waiting:?}");
    assert!(!waiting.recipients[0].detail.is_empty(), "the last error is shown: {waiting:?}");

    let (_bravo_node, bravo_client) = cell(&bravo, &[&alpha], BTreeMap::new(), bravo_addr, patient).await;
    let status = settled(&alpha_client, &sent.envelope_id).await;
    assert_eq!(results(&status)["bravo"], v1::DeliveryResult::Delivered);
    let mail = bravo_client.read_mail(0, 10).await.expect("reads");
    assert_eq!(mail.len(), 1);
    assert_eq!(&mail[0].payload[..], b"later");
}

/// The mailroom verifies its streams before it uses them: an outbox whose deduplication window was shortened (before
/// its subjects were reserved) gets the schema's back, and a stream of a mail stream's name that claims other subjects
/// stops mail with `MAIL_STREAMS`, having written nothing into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mail_streams_are_verified_before_they_are_used() {
    let alpha = key("alpha");
    let (node, client) = cell(&alpha, &[], BTreeMap::new(), free_addr(), quick_retry(Duration::from_secs(5))).await;
    client.send_sealed(&["alpha".to_string()], Bytes::from_static(b"first"), None).await.expect("sent");
    let config_of = |name: &str| {
        let replica = node.node.replica().expect("the replica");
        replica.cell.stream_info(name).expect("the stream").config
    };
    // What a principal could once do, done here as the node: change a mail stream.
    let change = |name: &str, config: cellog_core::StreamConfig| {
        let command = cellog_core::Command::UpdateStream { name: name.to_string(), config };
        async { node.node.propose_now(command).await.expect("proposed").expect("changed") }
    };
    let schema_window = config_of(OUTBOX).duplicate_window_ms;
    change(OUTBOX, cellog_core::StreamConfig { duplicate_window_ms: 1, ..config_of(OUTBOX) }).await;
    client.send_sealed(&["alpha".to_string()], Bytes::from_static(b"second"), None).await.expect("sent");
    assert_eq!(config_of(OUTBOX).duplicate_window_ms, schema_window, "the window is the schema's again");

    let elsewhere = cellog_core::StreamConfig { subjects: vec!["evil.>".to_string()], ..config_of(OUTBOX) };
    change(OUTBOX, elsewhere).await;
    let before = config_of(OUTBOX);
    let messages = node.node.replica().expect("the replica").cell.stream_info(OUTBOX).expect("the stream").n_messages;
    let refused = client.send_sealed(&["alpha".to_string()], Bytes::from_static(b"third"), None).await;
    assert!(
        matches!(&refused, Err(ClientError::Status { code: Code::FailedPrecondition, detail }) if detail.reason == "MAIL_STREAMS"),
        "{refused:?}"
    );
    assert_eq!(config_of(OUTBOX), before);
    let after = node.node.replica().expect("the replica").cell.stream_info(OUTBOX).expect("the stream").n_messages;
    assert_eq!(after, messages, "nothing was written into it");
}

/// On a cell that requires credentials, sending needs publish grants covering the outbox and reading the inbox or the
/// results subscribe grants covering them; a caller without a token gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_calls_need_their_grants() {
    const ROOT: &str = "cellog_root-of-the-mail-grants-test-000000000000000";
    let echo = key("echo");
    let (node, root) =
        cell_as(&echo, &[], BTreeMap::new(), free_addr(), quick_retry(Duration::from_secs(5)), Some(ROOT)).await;
    wait_for_root(&root).await;
    let reader =
        principal(&root, "reader", v1::Grants { subscribe: vec!["mail.>".into()], ..Default::default() }).await;
    let sender =
        principal(&root, "sender", v1::Grants { publish: vec!["mail.out.>".into()], ..Default::default() }).await;
    let anonymous = Client::new([node_addr(&root)], ClientOptions::default()).expect("a client");

    let refused =
        |result: Result<Vec<v1::OpenedMail>, ClientError>| result.expect_err("refused").reason().map(str::to_string);
    assert_eq!(refused(anonymous.read_mail(0, 10).await).as_deref(), Some("UNAUTHENTICATED"));
    assert_eq!(refused(sender.read_mail(0, 10).await).as_deref(), Some("PERMISSION_DENIED"));
    assert!(reader.read_mail(0, 10).await.expect("reader reads the inbox").is_empty());
    let payload = Bytes::from_static(b"hello");
    let denied = reader.send_sealed(&["echo".to_string()], payload.clone(), None).await.expect_err("no publish grant");
    assert_eq!(denied.reason(), Some("PERMISSION_DENIED"));
    let sent = sender.send_sealed(&["echo".to_string()], payload, None).await.expect("sender sends");
    // The mail streams are the node's alone: a grant on their subjects does not let a principal write them directly.
    let forged = v1::PublishRequest {
        subject: "mail.out.forged".into(),
        payload: Bytes::from_static(b"x"),
        ..Default::default()
    };
    assert_eq!(sender.publish(forged).await.expect_err("reserved").reason(), Some("PERMISSION_DENIED"));
    assert_eq!(root.delete_stream(OUTBOX).await.expect_err("reserved").reason(), Some("PERMISSION_DENIED"));
    let status = reader.delivery_status(&sent.envelope_id).await.expect("reader reads the results");
    assert_eq!(status.recipients.len(), 1);
    assert_eq!(
        sender.delivery_status(&sent.envelope_id).await.expect_err("no subscribe grant").reason(),
        Some("PERMISSION_DENIED")
    );
    node.stop().await.expect("stops");
}

fn node_addr(client: &Client) -> String {
    client.current_addr()
}

/// Waits until the cell took root's token.
async fn wait_for_root(root: &Client) {
    for _ in 0..200 {
        if root.who_am_i().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the root token never worked");
}

/// Makes principal `name` with `grants` and a token, and a client that uses it.
async fn principal(root: &Client, name: &str, grants: v1::Grants) -> Client {
    root.put_principal(name, grants).await.expect("a principal");
    let token = cellog_client::token::from_random(cellog_client::token::hash(name));
    root.add_token(name, cellog_client::token::hash(&token)).await.expect("a token");
    let options = ClientOptions { token: Some(token), ..ClientOptions::default() };
    Client::new([node_addr(root)], options).expect("a client")
}

/// A tenant's mail is its own: its principals send from it and read its inbox only, in their own terms (`mail.>`),
/// an envelope id one tenant chose is not another's, and mail for a tenant lands in that tenant's inbox of the
/// recipient cell, which nobody but the node writes. A tenant the recipient cell does not have gets no inbox there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_mail_is_its_own() {
    const ROOT: &str = "cellog_root-of-the-tenant-mail-test-0000000000000000";
    let (alpha, bravo) = (key("alpha"), key("bravo"));
    let bravo_addr = free_addr();
    let retry = || quick_retry(Duration::from_secs(3));
    let (alpha_node, alpha_root) =
        cell_as(&alpha, &[&bravo], home(&[("bravo", bravo_addr)]), free_addr(), retry(), Some(ROOT)).await;
    let (bravo_node, bravo_root) = cell_as(&bravo, &[&alpha], BTreeMap::new(), bravo_addr, retry(), Some(ROOT)).await;
    wait_for_root(&alpha_root).await;
    wait_for_root(&bravo_root).await;
    let mail = || v1::Grants { publish: vec!["mail.>".into()], subscribe: vec!["mail.>".into()], ..Default::default() };
    let alice = principal(&alpha_root, "acme/alice", mail()).await;
    let olga = principal(&alpha_root, "other/olga", mail()).await;
    let ghost = principal(&alpha_root, "ghost/gary", mail()).await;
    let ops = principal(&alpha_root, "ops", mail()).await;
    let bob = principal(&bravo_root, "acme/bob", mail()).await;
    let oscar = principal(&bravo_root, "other/oscar", mail()).await;
    let bravo_ops = principal(&bravo_root, "ops", mail()).await;

    // Three senders choose the same envelope id: three envelopes, each known to its own sender.
    let to_bravo = ["bravo".to_string()];
    let id = Some("e1");
    for (sender, text) in [(&alice, "from acme"), (&olga, "from other"), (&ops, "from the cell")] {
        let sent = sender.send_sealed(&to_bravo, Bytes::from(text), id).await.expect("sent");
        assert!(!sent.duplicate, "{text}: another sender's e1 is not this one");
        let status = settled(sender, "e1").await;
        let delivered = BTreeMap::from([("bravo".to_string(), v1::DeliveryResult::Delivered)]);
        assert_eq!(results(&status), delivered, "{text}: {status:?}");
    }
    // Each reads its own tenant's inbox at bravo, the sending principal signed in the envelope.
    for (reader, principal, text) in
        [(&bob, "acme/alice", "from acme"), (&oscar, "other/olga", "from other"), (&bravo_ops, "ops", "from the cell")]
    {
        let inbox = reader.read_mail(0, 10).await.expect("reads its inbox");
        let got: Vec<(&str, &str, &str, &[u8])> = inbox
            .iter()
            .map(|m| (m.sender.as_str(), m.principal.as_str(), m.envelope_id.as_str(), &m.payload[..]))
            .collect();
        assert_eq!(got, [("alpha", principal, "e1", text.as_bytes())], "{principal}");
    }
    // The tenant's inbox is a stream of its own, which it reads in its own terms and may not write.
    let own = bob.read("mail-inbox", 0, 0, 10, false).await.expect("acme reads its inbox stream").messages;
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].subject, "mail.in.alpha");
    let forged = v1::PublishRequest {
        subject: "mail.in.alpha".into(),
        payload: Bytes::from_static(b"forged"),
        msg_id: Some("forged".into()),
        ..Default::default()
    };
    assert_eq!(bob.publish(forged).await.expect_err("the node's alone").reason(), Some("PERMISSION_DENIED"));
    assert_eq!(bob.read_mail(0, 10).await.expect("reads").len(), 1);
    // A tenant bravo does not have: refused there, and the sender learns why.
    ghost.send_sealed(&to_bravo, Bytes::from_static(b"anyone?"), id).await.expect("sent");
    let status = settled(&ghost, "e1").await;
    assert_eq!(results(&status), BTreeMap::from([("bravo".to_string(), v1::DeliveryResult::Denied)]));
    assert!(
        status.recipients[0].detail.contains("NO_TENANT") || status.recipients[0].detail.contains("tenant"),
        "{status:?}"
    );
    alpha_node.stop().await.expect("stops");
    bravo_node.stop().await.expect("stops");
}

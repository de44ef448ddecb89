//! Tenants: two tenants use the same names without meeting, neither can name the other's streams, subjects,
//! consumers or producers, and the cell's own principals reach a tenant's subjects only through grants that name it.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    AckItem, AckKind, Command, ConsumerConfig, Grants, Outcome, PublishRequest, ROOT, Rejection, SENDER_HEADER,
    StreamConfig,
};

fn publish(subject: &str) -> Command {
    Command::Publish(PublishRequest::new(subject, Bytes::from_static(b"x")))
}

fn fetch(stream: &str) -> Command {
    Command::Fetch { stream: stream.into(), consumer: "work".into(), member: "m".into(), max: 10 }
}

fn orders() -> Command {
    Command::CreateStream { name: "orders".into(), config: StreamConfig::with_subjects(["orders.>"]) }
}

fn consumer() -> Command {
    Command::CreateConsumer { stream: "orders".into(), name: "work".into(), config: ConsumerConfig::default() }
}

/// Root (token 9); tenant admins `acme/ops` (token 1) and `beta/ops` (token 2), each with every grant of its tenant;
/// `acme/alice` (token 3), who publishes `orders.eu.*` and consumes `orders/work`; each tenant has stream `orders`
/// (`orders.>`) with consumer `work`.
fn cell() -> Harness {
    let mut h = Harness::new();
    h.ok(Command::AddToken { principal: ROOT.into(), token: token(9) });
    let tenant_admin = Grants { cluster_admin: false, ..Grants::all() };
    let alice = Grants {
        publish: vec!["orders.eu.*".into()],
        subscribe: vec![],
        consume: vec!["orders/work".into()],
        admin: false,
        cluster_admin: false,
    };
    for (name, n, grants) in
        [("acme/ops", 1, tenant_admin.clone()), ("beta/ops", 2, tenant_admin), ("acme/alice", 3, alice)]
    {
        h.ok(as_token(9, Command::PutPrincipal { name: name.into(), grants }));
        h.ok(as_token(9, Command::AddToken { principal: name.into(), token: token(n) }));
    }
    for admin in [1, 2] {
        h.ok(as_token(admin, orders()));
        h.ok(as_token(admin, consumer()));
    }
    h
}

#[test]
fn two_tenants_use_the_same_names_apart() {
    let mut h = cell();
    let names: Vec<String> = h.cell.stream_names().iter().map(|name| name.to_string()).collect();
    assert_eq!(names, ["acme/orders", "beta/orders"]);
    let Outcome::Published(ack) = h.ok(as_token(1, publish("orders.1"))) else { panic!("a publish") };
    assert_eq!(&*ack.stream, "orders", "the ack names the stream as the tenant does");
    let stored = h.cell.read("acme/orders", ack.partition, ack.seq).unwrap();
    assert_eq!(&*stored.subject, "@acme.orders.1");
    assert_eq!(stored.headers.get(SENDER_HEADER).map(String::as_str), Some("acme/ops"));
    assert_eq!(n_messages(&h, "beta/orders"), 0);
    // Each tenant's consumer sees its own tenant's message alone, named as the tenant names it.
    let Outcome::Fetched(acme) = h.ok(as_token(1, fetch("orders"))) else { panic!("deliveries") };
    assert_eq!(acme.iter().map(|d| &*d.record.subject).collect::<Vec<_>>(), ["orders.1"]);
    let Outcome::Fetched(beta) = h.ok(as_token(2, fetch("orders"))) else { panic!("deliveries") };
    assert!(beta.is_empty());
    // Transactional ids are the tenant's too: the same id in two tenants fences nothing.
    let init = || Command::InitProducer { transactional_id: "tx".into(), transaction_timeout_ms: 10_000 };
    let Outcome::ProducerInitialized(a) = h.ok(as_token(1, init())) else { panic!("a producer") };
    let Outcome::ProducerInitialized(b) = h.ok(as_token(2, init())) else { panic!("a producer") };
    assert_ne!(a.producer_id, b.producer_id);
    h.ok(as_token(1, Command::BeginTransaction(a)));
    // And the state, tenants and their derived grants included, survives a snapshot.
    stored_state_holds(&h.cell, &h.bodies).unwrap();
    let restored = cellog_core::Cell::restore(&h.cell.snapshot()).unwrap();
    let mut again = Harness { cell: restored, ..Harness::new() };
    again.now = h.now;
    assert!(again.apply(as_token(3, publish("orders.us.1"))).is_err(), "alice's grants are still her tenant's");
    again.ok(as_token(3, publish("orders.eu.1")));
}

#[test]
fn a_tenant_cannot_name_another_tenant_s_things() {
    let mut h = cell();
    h.ok(as_token(2, publish("orders.1")));
    let before = state_parts(&h.cell);
    // (who, command): every one refused, and nothing changes.
    let table: Vec<(u8, Command)> = vec![
        (1, Command::DeleteStream { name: "beta/orders".into() }),
        (1, fetch("beta/orders")),
        (1, Command::Recall { stream: "beta/orders".into(), partition: 0, seq: 1 }),
        (1, publish("@beta.orders.2")),
        (1, Command::CreateStream { name: "beta/x".into(), config: StreamConfig::with_subjects(["x.>"]) }),
        (3, publish("orders.us.1")),
        (3, Command::DeleteStream { name: "orders".into() }),
    ];
    for (who, command) in table {
        let description = format!("token {who}: {command:?}");
        let result = h.apply(as_token(who, command));
        assert!(result.is_err(), "{description}: {result:?}");
        assert_eq!(state_parts(&h.cell), before, "{description}: the state changed");
    }
    // Another tenant's scope token in a tenant's subject is only a token of the caller's own subject
    // (`@acme.@beta.orders.>`): the stream it makes claims nothing of beta's.
    let own = Command::CreateStream { name: "x".into(), config: StreamConfig::with_subjects(["@beta.orders.>"]) };
    h.ok(as_token(1, own));
    h.ok(as_token(1, publish("@beta.orders.2")));
    assert_eq!((n_messages(&h, "beta/orders"), n_messages(&h, "acme/x")), (1, 1));
}

#[test]
fn refusals_name_what_the_tenant_named() {
    let mut h = cell();
    let result = h.apply(as_token(3, publish("orders.us.1")));
    assert!(
        matches!(&result, Err(Rejection::PermissionDenied { needs, .. }) if needs == "publish on \"orders.us.1\""),
        "{result:?}"
    );
    let result = h.apply(as_token(1, fetch("nope")));
    assert_eq!(result, Err(Rejection::StreamNotFound { stream: "nope".into() }));
    let result = h.apply(as_token(1, publish("nothing.here")));
    assert_eq!(result, Err(Rejection::NoStreamForSubject { subject: "nothing.here".into() }));
    let other = Command::CreateStream { name: "more".into(), config: StreamConfig::with_subjects(["orders.eu"]) };
    let result = h.apply(as_token(1, other));
    assert!(
        matches!(&result, Err(Rejection::SubjectOverlap { subject, other, owner })
            if subject == "orders.eu" && other == "orders.>" && owner == "stream \"orders\""),
        "{result:?}"
    );
    let result = h.apply(as_token(3, fetch("orders")));
    assert!(result.is_ok(), "alice consumes her tenant's orders/work: {result:?}");
    let result = h.apply(as_token(
        3,
        Command::Fetch { stream: "orders".into(), consumer: "other".into(), member: "m".into(), max: 1 },
    ));
    assert!(
        matches!(&result, Err(Rejection::PermissionDenied { needs, .. }) if needs == "consume orders/other"),
        "{result:?}"
    );
}

/// Each refused item of a tenant's batch of acks names what the tenant named, as a lone ack's refusal does.
#[test]
fn a_refused_ack_in_a_batch_names_what_the_tenant_named() {
    let mut h = cell();
    h.ok(as_token(3, publish("orders.eu.1")));
    let Outcome::Fetched(deliveries) = h.ok(as_token(3, fetch("orders"))) else { panic!("deliveries") };
    let d = &deliveries[0].record;
    let items = vec![
        AckItem { partition: 99, seq: 1, kind: AckKind::Applied },
        AckItem { partition: d.partition, seq: d.seq, kind: AckKind::Applied },
    ];
    let acks = Command::Acks { stream: "orders".into(), consumer: "work".into(), member: None, items };
    let Outcome::AckedEach(answers) = h.ok(as_token(3, acks)) else { panic!("one answer per ack") };
    let [refused, acked] = &answers[..] else { panic!("two answers: {answers:?}") };
    assert!(
        matches!(refused, Err(Rejection::Invalid { reason }) if reason == "stream \"orders\" has no partition 99"),
        "{refused:?}"
    );
    assert!(matches!(acked, Ok(answer) if !answer.already_done), "{acked:?}");
    // The whole batch refused names the tenant's stream too.
    let acks = Command::Acks {
        stream: "nope".into(),
        consumer: "work".into(),
        member: None,
        items: vec![AckItem { partition: 0, seq: 1, kind: AckKind::Applied }],
    };
    assert_eq!(h.apply(as_token(1, acks)), Err(Rejection::StreamNotFound { stream: "nope".into() }));
}

#[test]
fn the_cell_s_wildcards_do_not_reach_a_tenant() {
    let mut h = cell();
    // A catch-all stream of the cell's own claims none of a tenant's subjects, and does not stop a tenant's stream.
    h.ok(as_token(9, Command::CreateStream { name: "all".into(), config: StreamConfig::with_subjects([">"]) }));
    h.ok(as_token(1, Command::CreateStream { name: "more".into(), config: StreamConfig::with_subjects(["more.>"]) }));
    h.ok(as_token(1, publish("orders.1")));
    h.ok(as_token(9, publish("orders.1")));
    assert_eq!((n_messages(&h, "all"), n_messages(&h, "acme/orders")), (1, 1));
    // Root's `>` does not cover a tenant's subjects; a grant that names the tenant does.
    let result = h.apply(as_token(9, publish("@acme.orders.2")));
    assert!(matches!(result, Err(Rejection::PermissionDenied { .. })), "{result:?}");
    let auditor = Grants { publish: vec!["@acme.>".into()], ..Grants::default() };
    h.ok(as_token(9, Command::PutPrincipal { name: "auditor".into(), grants: auditor }));
    h.ok(as_token(9, Command::AddToken { principal: "auditor".into(), token: token(5) }));
    h.ok(as_token(5, publish("@acme.orders.2")));
    assert_eq!(n_messages(&h, "acme/orders"), 2);
    // The cell's own streams claim no tenant's subjects, and a tenant's stream no other scope's.
    let claim = Command::CreateStream { name: "spy".into(), config: StreamConfig::with_subjects(["@acme.x.>"]) };
    assert!(matches!(h.apply(as_token(9, claim)), Err(Rejection::InvalidConfig { .. })));
    // An operator administers a tenant's streams by their stored names.
    h.ok(as_token(9, Command::DeleteStream { name: "acme/more".into() }));
}

#[test]
fn a_tenant_s_principal_holds_no_cluster_admin_and_sets_no_pins() {
    let mut h = cell();
    let put = Command::PutPrincipal { name: "acme/boss".into(), grants: Grants::all() };
    assert!(matches!(h.apply(as_token(9, put)), Err(Rejection::InvalidConfig { .. })));
    for bad in ["acme/", "/boss", "a/b/c"] {
        let put = Command::PutPrincipal { name: bad.into(), grants: Grants::default() };
        assert!(matches!(h.apply(as_token(9, put)), Err(Rejection::InvalidName { .. })), "{bad}");
    }
    // A pin holds a message against retention: the node's provenance rows set them, no principal does.
    h.ok(as_token(2, publish("orders.1")));
    let mut pinning = PublishRequest::new("orders.2", Bytes::from_static(b"x"));
    pinning.headers.insert(cellog_core::PIN_HEADER.into(), "beta/orders/0/1".into());
    let result = h.apply(as_token(1, Command::Publish(pinning)));
    assert!(matches!(result, Err(Rejection::PermissionDenied { .. })), "{result:?}");
}

/// The node itself (a command not run as a principal) may make a tenant's stream by its full name, with subjects in
/// the tenant's scope only (the mailroom makes a tenant's inbox so); no principal may, root included.
#[test]
fn only_the_node_makes_a_tenant_s_stream_by_its_full_name() {
    let mut h = cell();
    let inbox = |subject: &str| Command::CreateStream {
        name: "acme/mail-inbox".into(),
        config: StreamConfig::with_subjects([subject]),
    };
    for who in [9, 1, 2] {
        let refused = h.apply(as_token(who, inbox("@acme.mail.in.>")));
        assert!(matches!(refused, Err(Rejection::InvalidName { .. })), "token {who}: {refused:?}");
    }
    assert!(h.apply(inbox("mail.in.>")).is_err(), "a tenant's stream claims nothing outside its scope");
    assert!(h.apply(inbox("@beta.mail.in.>")).is_err(), "nor another tenant's");
    assert!(
        h.apply(Command::CreateStream { name: "a/b/c".into(), config: StreamConfig::with_subjects(["@a.x"]) }).is_err()
    );
    h.ok(inbox("@acme.mail.in.>"));
    // The tenant sees it as its own.
    h.ok(as_token(1, publish("mail.in.alpha")));
    assert_eq!(n_messages(&h, "acme/mail-inbox"), 1);
}

/// A duplicate's answer shows its original message in the tenant's own terms, as the first answer showed it.
#[test]
fn a_duplicate_s_original_is_shown_in_the_tenant_s_terms() {
    let mut h = cell();
    let publish_id = || {
        Command::Publish(PublishRequest {
            msg_id: Some("m-1".into()),
            ..PublishRequest::new("orders.1", Bytes::from_static(b"x"))
        })
    };
    let Outcome::Published(first) = h.ok(as_token(1, publish_id())) else { panic!("a publish") };
    let Outcome::Published(again) = h.ok(as_token(1, publish_id())) else { panic!("a publish") };
    assert!(again.duplicate);
    let original = again.original.expect("a duplicate carries its original");
    assert_eq!((&*again.stream, &*original.subject, original.seq), ("orders", "orders.1", first.seq));
}

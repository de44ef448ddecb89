//! Principals, tokens and grants: what a command run as a principal may do, the sender stamped on what it publishes,
//! and that a refusal changes nothing. Each case is a row: who asks, what, and what must come back.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::subject::{filter_covers, filter_matches};
use cellog_core::{
    AckItem, AckKind, Actor, Cell, Command, ConsumerConfig, Grants, Outcome, ProducerRef, PublishRequest, ROOT,
    Rejection, SENDER_HEADER, StreamConfig,
};

fn publish(subject: &str) -> Command {
    Command::Publish(PublishRequest::new(subject, Bytes::from_static(b"x")))
}

fn grants(publish: &[&str], subscribe: &[&str], consume: &[&str]) -> Grants {
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
    Grants {
        publish: strings(publish),
        subscribe: strings(subscribe),
        consume: strings(consume),
        admin: false,
        cluster_admin: false,
    }
}

/// A cell with streams `orders` (`orders.>`) and `audit` (`audit.>`), consumer `orders/billing`, and principals:
/// `alice` (token 1) publishes `orders.eu.*` and consumes `orders/billing`; `bob` (token 2) reads `audit.>`;
/// `ops` (token 3) is an admin; root holds token 9.
fn cell() -> Harness {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.simple_stream("audit");
    h.ok(Command::CreateConsumer {
        stream: "orders".into(),
        name: "billing".into(),
        config: ConsumerConfig::default(),
    });
    h.ok(Command::AddToken { principal: ROOT.into(), token: token(9) });
    let people = [
        ("alice", 1, grants(&["orders.eu.*"], &[], &["orders/billing"])),
        ("bob", 2, grants(&[], &["audit.>"], &[])),
        ("ops", 3, Grants { admin: true, ..Grants::default() }),
    ];
    for (name, n, grants) in people {
        h.ok(as_token(9, Command::PutPrincipal { name: name.into(), grants }));
        h.ok(as_token(9, Command::AddToken { principal: name.into(), token: token(n) }));
    }
    h
}

fn denied(result: Result<Outcome, Rejection>) -> Option<String> {
    match result {
        Err(Rejection::PermissionDenied { needs, .. }) => Some(needs),
        _ => None,
    }
}

#[test]
fn each_command_needs_its_grant_and_a_refusal_changes_nothing() {
    let consumer =
        |stream: &str| Command::Fetch { stream: stream.into(), consumer: "billing".into(), member: "m".into(), max: 1 };
    let new_stream = || Command::CreateStream { name: "x".into(), config: StreamConfig::with_subjects(["x.>"]) };
    let new_principal = || Command::PutPrincipal { name: "eve".into(), grants: Grants::all() };
    // (who, command, refused for want of this grant, or allowed)
    let table: Vec<(u8, Command, Option<&str>)> = vec![
        (1, publish("orders.eu.1"), None),
        (1, publish("orders.us.1"), Some("publish on \"orders.us.1\"")),
        (1, publish("orders.eu.1.extra"), Some("publish on \"orders.eu.1.extra\"")),
        (2, publish("audit.x"), Some("publish on \"audit.x\"")),
        (1, consumer("orders"), None),
        (2, consumer("orders"), Some("consume orders/billing")),
        (1, new_stream(), Some("admin")),
        (3, new_stream(), None),
        (3, new_principal(), Some("cluster admin")),
        (1, Command::AddToken { principal: "alice".into(), token: token(7) }, Some("cluster admin")),
        (9, new_principal(), None),
        (9, Command::Tick, Some("the node's own authority (this command is not a client's)")),
    ];
    for (who, command, refused) in table {
        let mut h = cell();
        let before = state_parts(&h.cell);
        let description = format!("principal with token {who}: {command:?}");
        let result = h.apply(as_token(who, command));
        match refused {
            Some(needs) => {
                assert_eq!(denied(result).as_deref(), Some(needs), "{description}");
                assert_eq!(state_parts(&h.cell), before, "{description}: a refusal changed the state");
            }
            None => assert!(result.is_ok(), "{description}: {result:?}"),
        }
    }
}

#[test]
fn an_unknown_or_revoked_token_and_an_unknown_principal_are_unauthenticated() {
    let mut h = cell();
    let unauthenticated = |result: Result<Outcome, Rejection>| matches!(result, Err(Rejection::Unauthenticated { .. }));
    assert!(unauthenticated(h.apply(as_token(42, publish("orders.eu.1")))));
    let vouched = Command::As { actor: Actor::Vouched("mallory".into()), command: Box::new(publish("orders.eu.1")) };
    assert!(unauthenticated(h.apply(vouched)));
    h.ok(as_token(9, Command::RevokeToken { token: token(1) }));
    assert!(unauthenticated(h.apply(as_token(1, publish("orders.eu.1")))));
    // A deleted principal's tokens go with it.
    h.ok(as_token(9, Command::DeletePrincipal { name: "ops".into() }));
    assert!(unauthenticated(h.apply(as_token(3, publish("orders.eu.1")))));
}

#[test]
fn the_cell_stamps_the_sender_and_refuses_a_caller_s_node_header_in_any_case() {
    let mut h = cell();
    let Outcome::Published(ack) = h.ok(as_token(1, publish("orders.eu.1"))) else { panic!("a publish") };
    let record = h.cell.read("orders", ack.partition, ack.seq).unwrap();
    assert_eq!(record.headers.get(SENDER_HEADER).map(String::as_str), Some("alice"));
    // The node's own publish (not run as anyone) is stored as sent.
    let Outcome::Published(ack) = h.ok(publish("orders.eu.2")) else { panic!("a publish") };
    assert_eq!(h.cell.read("orders", ack.partition, ack.seq).unwrap().headers.get(SENDER_HEADER), None);
    // (header a caller sends, refused): every `Cellog-*` name is the node's, in whatever case a reader folds to.
    let table = [
        ("Cellog-Sender", true),
        ("cellog-sender", true),
        ("CELLOG-SENDER", true),
        ("Cellog-Pin", true),
        ("cellog-dead-letter-stream", true),
        ("cElLoG-anything", true),
        ("Cellog-", true),
        ("Cellog", false),
        ("Cellogx-Sender", false),
        ("X-Cellog-Sender", false),
        ("sender", false),
    ];
    for (name, refused) in table {
        let mut request = PublishRequest::new("orders.eu.3", Bytes::from_static(b"x"));
        request.headers.insert(name.to_string(), "root".to_string());
        let command = as_token(1, Command::Publish(request));
        let before = state_parts(&h.cell);
        let result = h.apply(command.clone());
        if refused {
            let needs = denied(result).unwrap_or_else(|| panic!("a caller's {name:?} header was not refused"));
            assert!(needs.contains(&format!("{name:?}")), "{name}: {needs}");
            assert_eq!(state_parts(&h.cell), before, "{name}: a refusal changed the state");
            // The node refuses it before proposing, with the same answer.
            assert!(h.cell.authorize_command(&Actor::Token(token(1)), &unwrap_as(command)).is_err(), "{name}");
        } else {
            let Ok(Outcome::Published(ack)) = result else { panic!("{name}: {result:?}") };
            let record = h.cell.read("orders", ack.partition, ack.seq).unwrap();
            assert_eq!(record.headers.get(name).map(String::as_str), Some("root"), "{name}");
            assert_eq!(record.headers.get(SENDER_HEADER).map(String::as_str), Some("alice"), "{name}");
        }
    }
}

/// The command inside an `As`.
fn unwrap_as(command: Command) -> Command {
    match command {
        Command::As { command, .. } => *command,
        other => other,
    }
}

#[test]
fn only_the_principal_that_registered_a_producer_drives_its_transactions() {
    let mut h = cell();
    h.ok(as_token(9, Command::PutPrincipal { name: "carol".into(), grants: grants(&["orders.>"], &[], &[]) }));
    h.ok(as_token(9, Command::AddToken { principal: "carol".into(), token: token(4) }));
    let init = Command::InitProducer { transactional_id: "t".into(), transaction_timeout_ms: 10_000 };
    let Outcome::ProducerInitialized(r) = h.ok(as_token(1, init)) else { panic!("a producer") };
    assert!(denied(h.apply(as_token(4, Command::BeginTransaction(r)))).is_some());
    h.ok(as_token(1, Command::BeginTransaction(r)));
    let stage = |subject: &str, r: ProducerRef| {
        let mut request = PublishRequest::new(subject, Bytes::from_static(b"x"));
        request.transaction = Some(r);
        Command::Publish(request)
    };
    assert!(denied(h.apply(as_token(4, stage("orders.eu.1", r)))).is_some());
    assert!(denied(h.apply(as_token(1, stage("orders.us.1", r)))).is_some());
    h.ok(as_token(1, stage("orders.eu.1", r)));
    assert!(denied(h.apply(as_token(4, Command::AbortTransaction(r)))).is_some());
    h.ok(as_token(1, Command::CommitTransaction(r)));
}

/// A transactional id is its registering principal's: another principal's `InitProducer` of it is refused before it
/// fences the owner or aborts the owner's open transaction, and no principal's id reaches into a tenant's ids.
#[test]
fn another_principal_cannot_take_over_a_transactional_id() {
    let mut h = cell();
    h.ok(as_token(9, Command::PutPrincipal { name: "carol".into(), grants: grants(&["orders.>"], &[], &[]) }));
    h.ok(as_token(9, Command::AddToken { principal: "carol".into(), token: token(4) }));
    h.ok(as_token(9, Command::PutPrincipal { name: "acme/alice".into(), grants: grants(&["orders.>"], &[], &[]) }));
    h.ok(as_token(9, Command::AddToken { principal: "acme/alice".into(), token: token(5) }));
    let init = |id: &str| Command::InitProducer { transactional_id: id.into(), transaction_timeout_ms: 10_000 };
    let Outcome::ProducerInitialized(r) = h.ok(as_token(1, init("t"))) else { panic!("a producer") };
    h.ok(as_token(1, Command::BeginTransaction(r)));
    // acme/alice registers `t` in her tenant: stored as `acme/t`, another id than the cell's `t`.
    let Outcome::ProducerInitialized(tenants) = h.ok(as_token(5, init("t"))) else { panic!("a producer") };
    assert_ne!(tenants.producer_id, r.producer_id);

    // (who, id, refused with): carol takes neither alice's `t` nor (through a `/`) acme's.
    type Refusal = fn(&Rejection) -> bool;
    let table: Vec<(u8, &str, Refusal)> = vec![
        (
            4,
            "t",
            |r| matches!(r, Rejection::PermissionDenied { needs, .. } if needs.contains("transactional id \"t\"")),
        ),
        (4, "acme/t", |r| matches!(r, Rejection::InvalidName { .. })),
        (9, "acme/t", |r| matches!(r, Rejection::InvalidName { .. })),
        (5, "x/t", |r| matches!(r, Rejection::InvalidName { .. })),
    ];
    for (who, id, expected) in table {
        let before = state_parts(&h.cell);
        let result = h.apply(as_token(who, init(id)));
        assert!(result.as_ref().is_err_and(expected), "principal with token {who}, id {id:?}: {result:?}");
        assert_eq!(state_parts(&h.cell), before, "{id}: a refusal changed the state");
    }
    // Alice's transaction is still open at her epoch, and she may register her id again (fencing herself).
    h.ok(as_token(1, Command::CommitTransaction(r)));
    let Outcome::ProducerInitialized(again) = h.ok(as_token(1, init("t"))) else { panic!("a producer") };
    assert_eq!(again.producer_id, r.producer_id);
    // The node's own commands name a tenant's id in full.
    let Outcome::ProducerInitialized(node) = h.ok(init("acme/t")) else { panic!("a producer") };
    assert_eq!(node.producer_id, tenants.producer_id);
}

/// A principal revokes a token of its own (a leaked one) without cluster admin, and no other principal's; the revoked
/// token no longer authenticates.
#[test]
fn a_principal_revokes_its_own_token_and_no_other() {
    let mut h = cell();
    h.ok(as_token(9, Command::AddToken { principal: "alice".into(), token: token(11) }));
    // (who, whose token, refused)
    let table = [(2, 11, true), (2, 9, true), (2, 42, true), (1, 2, true), (1, 11, false), (1, 1, false)];
    for (who, revoked, refused) in table {
        let before = state_parts(&h.cell);
        let result = h.apply(as_token(who, Command::RevokeToken { token: token(revoked) }));
        let row = format!("token {who} revokes token {revoked}: {result:?}");
        if refused {
            assert_eq!(denied(result).as_deref(), Some("cluster admin"), "{row}");
            assert_eq!(state_parts(&h.cell), before, "{row}: a refusal changed the state");
        } else {
            assert!(result.is_ok(), "{row}");
        }
    }
    // Alice revoked the token she acted with last: it authenticates no more; bob's and root's still do.
    assert!(matches!(h.apply(as_token(1, publish("orders.eu.1"))), Err(Rejection::Unauthenticated { .. })));
    assert!(matches!(h.apply(as_token(11, publish("orders.eu.1"))), Err(Rejection::Unauthenticated { .. })));
    h.ok(as_token(9, publish("orders.eu.1")));
}

#[test]
fn acks_need_the_consume_grant() {
    let mut h = cell();
    h.ok(as_token(9, publish("orders.eu.1")));
    let fetch = Command::Fetch { stream: "orders".into(), consumer: "billing".into(), member: "m".into(), max: 1 };
    let Outcome::Fetched(deliveries) = h.ok(as_token(1, fetch)) else { panic!("deliveries") };
    let d = &deliveries[0];
    let ack = |kind| Command::Ack {
        stream: "orders".into(),
        consumer: "billing".into(),
        partition: d.record.partition,
        seq: d.record.seq,
        kind,
    };
    assert_eq!(denied(h.apply(as_token(2, ack(AckKind::Applied)))).as_deref(), Some("consume orders/billing"));
    // A batch is authorized as a whole: refused, it changes nothing, not even its first item.
    let item = AckItem { partition: d.record.partition, seq: d.record.seq, kind: AckKind::Applied };
    let acks = Command::Acks { stream: "orders".into(), consumer: "billing".into(), member: None, items: vec![item] };
    let before = state_parts(&h.cell);
    assert_eq!(denied(h.apply(as_token(2, acks.clone()))).as_deref(), Some("consume orders/billing"));
    assert_eq!(state_parts(&h.cell), before, "a refused batch changed the state");
    h.ok(as_token(1, acks));
    assert!(matches!(h.ok(as_token(1, ack(AckKind::Applied))), Outcome::Acked { already_done: true, .. }));
}

#[test]
fn root_cannot_be_deleted_or_narrowed_and_bad_grants_are_refused() {
    let mut h = cell();
    assert!(matches!(
        h.apply(as_token(9, Command::DeletePrincipal { name: ROOT.into() })),
        Err(Rejection::Invalid { .. })
    ));
    let narrow = Command::PutPrincipal { name: ROOT.into(), grants: Grants::default() };
    assert!(matches!(h.apply(as_token(9, narrow)), Err(Rejection::Invalid { .. })));
    for bad in [grants(&["orders..x"], &[], &[]), grants(&[], &["a.>.b"], &[]), grants(&[], &[], &["orders"])] {
        let command = Command::PutPrincipal { name: "eve".into(), grants: bad };
        assert!(h.apply(as_token(9, command)).is_err());
    }
    let bad_name = Command::PutPrincipal { name: "e v e".into(), grants: Grants::default() };
    assert!(matches!(h.apply(as_token(9, bad_name)), Err(Rejection::InvalidName { .. })));
    // A token another principal holds is not handed to a second one.
    let stolen = Command::AddToken { principal: "bob".into(), token: token(1) };
    assert!(matches!(h.apply(as_token(9, stolen)), Err(Rejection::Invalid { .. })));
    let nested = as_token(9, as_token(9, publish("orders.eu.1")));
    assert!(matches!(h.apply(nested), Err(Rejection::Invalid { .. })));
}

/// A command naming a principal badly is refused by its own check, before it reaches the cell.
#[test]
fn a_badly_named_principal_is_refused_by_the_command_s_check() {
    for command in [
        Command::PutPrincipal { name: "e v e".into(), grants: Grants::default() },
        Command::DeletePrincipal { name: "e v e".into() },
        Command::AddToken { principal: "e v e".into(), token: token(7) },
    ] {
        assert!(matches!(command.check(), Err(Rejection::InvalidName { .. })), "{command:?}");
    }
}

/// Each of a principal's grant lists holds at most 64 entries.
#[test]
fn a_grant_list_holds_at_most_sixty_four_entries() {
    assert_eq!(cellog_core::auth::MAX_GRANT_ENTRIES, 64);
    let filters = |n: usize| (0..n).map(|i| format!("s{i}.>")).collect::<Vec<_>>();
    let consume = |n: usize| (0..n).map(|i| format!("s{i}/*")).collect::<Vec<_>>();
    for n in [1, 63, 64] {
        assert_eq!(Grants { publish: filters(n), ..Grants::default() }.validate(), Ok(()));
        assert_eq!(Grants { subscribe: filters(n), ..Grants::default() }.validate(), Ok(()));
        assert_eq!(Grants { consume: consume(n), ..Grants::default() }.validate(), Ok(()));
    }
    for n in [65, 100] {
        for over in [
            Grants { publish: filters(n), ..Grants::default() },
            Grants { subscribe: filters(n), ..Grants::default() },
            Grants { consume: consume(n), ..Grants::default() },
        ] {
            assert!(matches!(over.validate(), Err(Rejection::InvalidConfig { .. })), "{n} entries");
        }
    }
}

#[test]
fn reserved_subjects_are_the_node_s_alone() {
    let mut h = cell();
    h.ok(Command::CreateStream { name: "mail".into(), config: StreamConfig::with_subjects(["mail.>"]) });
    assert!(!h.cell.is_reserved("mail.>"));
    h.ok(Command::ReserveSubjects { filter: "mail.>".into() });
    assert!(h.cell.is_reserved("mail.>"));
    assert!(!h.cell.is_reserved("mail.out.*"), "a filter is reserved as it was written, not by what it covers");
    assert!(matches!(
        h.ok(Command::ReserveSubjects { filter: "mail.>".into() }),
        Outcome::SubjectsReserved { reserved: false }
    ));
    let Outcome::Published(ack) = h.ok(publish("mail.out.1")) else { panic!("the node publishes") };
    // Not even root may write, recall or delete the node's own streams, or reserve subjects itself.
    for command in [
        publish("mail.out.2"),
        Command::Recall { stream: "mail".into(), partition: ack.partition, seq: ack.seq },
        Command::DeleteStream { name: "mail".into() },
        Command::ReserveSubjects { filter: "orders.>".into() },
    ] {
        let description = format!("{command:?}");
        let needs = denied(h.apply(as_token(9, command))).unwrap_or_else(|| panic!("{description} was not refused"));
        assert!(needs.starts_with("the node's own authority"), "{description}: {needs}");
    }
    assert_eq!(h.cell.stream_info("mail").unwrap().n_messages, 1);
}

/// No principal's stream change touches a reserved subject: not what a stream claims after the change, not what it
/// claimed before (re-subjecting the node's stream to write into it, or weakening its deduplication), and not through
/// a dead-letter stream. The node changes its own streams.
#[test]
fn a_stream_change_never_touches_a_reserved_subject() {
    let mut h = cell();
    h.ok(Command::CreateStream { name: "mail".into(), config: StreamConfig::with_subjects(["mail.in.>"]) });
    h.ok(Command::ReserveSubjects { filter: "mail.>".into() });
    let config = |subjects: &[&str]| StreamConfig::with_subjects(subjects.iter().copied());
    let create = |name: &str, config: StreamConfig| Command::CreateStream { name: name.into(), config };
    let update = |name: &str, config: StreamConfig| Command::UpdateStream { name: name.into(), config };
    let shorter_window = StreamConfig { duplicate_window_ms: 1, ..config(&["mail.in.>"]) };
    let into_mail = StreamConfig { dead_letter_stream: Some("mail".into()), ..config(&["x.>"]) };
    let table = [
        create("evil", config(&["mail.in.x"])),
        create("evil", config(&["mail.*.x"])),
        create("evil", config(&["*.in.>"])),
        create("evil", into_mail.clone()),
        update("mail", config(&["evil.>"])),
        update("mail", shorter_window.clone()),
        update("orders", config(&["orders.>", "mail.out.>"])),
        update("orders", StreamConfig { dead_letter_stream: Some("mail".into()), ..config(&["orders.>"]) }),
    ];
    for command in table {
        for who in [3, 9] {
            let before = state_parts(&h.cell);
            let description = format!("principal with token {who}: {command:?}");
            let needs = denied(h.apply(as_token(who, command.clone())))
                .unwrap_or_else(|| panic!("{description} was not refused"));
            assert!(needs.contains("mail.> is reserved for the node's own streams"), "{description}: {needs}");
            assert_eq!(state_parts(&h.cell), before, "{description}: a refusal changed the state");
        }
    }
    // What touches no reserved subject is an admin's to change; the node's own stream is the node's.
    h.ok(as_token(3, create("x", config(&["x.>"]))));
    h.ok(as_token(3, update("orders", config(&["orders.>", "more.>"]))));
    h.ok(update("mail", shorter_window));
}

/// A dead letter never lands in a stream whose subjects the node reserved after the stream was named the dead-letter
/// stream: the message is dead-lettered without a copy.
#[test]
fn a_dead_letter_is_not_copied_into_a_reserved_stream() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream(
        "orders",
        StreamConfig { dead_letter_stream: Some("dlq".into()), ..StreamConfig::with_subjects(["orders.>"]) },
    );
    let consumer = ConsumerConfig { ack_wait_ms: 1_000, max_deliver: Some(1), ..ConsumerConfig::default() };
    h.create_consumer("orders", "c", consumer);
    h.ok(Command::ReserveSubjects { filter: "dlq.>".into() });
    h.publish("orders.eu", "poison").unwrap();
    assert_eq!(h.fetch("orders", "c", 1).len(), 1);
    h.take_effects();
    h.advance(1_000);
    h.tick();
    let copies: Vec<_> = h
        .take_effects()
        .into_iter()
        .filter_map(|effect| match effect {
            cellog_core::Transition::DeadLettered { copy, .. } => Some(copy),
            _ => None,
        })
        .collect();
    assert_eq!(copies, vec![None]);
    assert_eq!(h.cell.stream_info("dlq").unwrap().n_messages, 0);
}

/// At most [`cellog_core::auth::MAX_GRANT_ENTRIES`] filters are reserved; reserving one of them again is still fine.
#[test]
fn reserved_filters_are_bounded_and_one_already_reserved_is_taken_again() {
    let mut h = cell();
    let most = cellog_core::auth::MAX_GRANT_ENTRIES;
    for n in 0..most {
        h.ok(Command::ReserveSubjects { filter: format!("node{n}.>") });
    }
    assert!(matches!(
        h.apply(Command::ReserveSubjects { filter: "one.more.>".into() }),
        Err(Rejection::Invalid { .. })
    ));
    assert!(!h.cell.is_reserved("one.more.>"));
    assert_eq!(
        h.apply(Command::ReserveSubjects { filter: "node0.>".into() }),
        Ok(Outcome::SubjectsReserved { reserved: false })
    );
}

#[test]
fn reads_are_authorized_against_the_stream_subjects() {
    let h = cell();
    assert!(h.cell.authorize_read("bob", "audit").is_ok());
    assert!(matches!(h.cell.authorize_read("bob", "orders"), Err(Rejection::PermissionDenied { .. })));
    assert!(h.cell.authorize_read(ROOT, "orders").is_ok());
    assert_eq!(h.cell.authenticate(&Actor::Token(token(2))).as_deref(), Ok("bob"));
}

#[test]
fn principals_survive_a_snapshot() {
    let h = cell();
    let restored = Cell::restore(&h.cell.snapshot()).unwrap();
    assert!(restored == h.cell);
    assert_eq!(restored.authenticate(&Actor::Token(token(1))).as_deref(), Ok("alice"));
    assert_eq!(restored.principals(), h.cell.principals());
}

/// `filter_covers(outer, inner)` against its definition: every subject `inner` matches, `outer` matches. Subjects of
/// up to four tokens decide it for filters of up to three.
#[test]
fn a_filter_covers_another_exactly_when_it_matches_everything_the_other_matches() {
    let tokens = ["a", "b", "*", ">"];
    let mut filters = Vec::new();
    for n in 1..=3 {
        let mut combos = vec![String::new()];
        for position in 0..n {
            combos = combos
                .into_iter()
                .flat_map(|prefix| {
                    tokens
                        .iter()
                        .filter(move |t| **t != ">" || position == n - 1)
                        .map(move |t| if prefix.is_empty() { t.to_string() } else { format!("{prefix}.{t}") })
                })
                .collect();
        }
        filters.extend(combos);
    }
    let mut subjects = Vec::new();
    for n in 1..=4u32 {
        for index in 0..3usize.pow(n) {
            let parts: Vec<&str> = (0..n).map(|i| ["a", "b", "c"][index / 3usize.pow(i) % 3]).collect();
            subjects.push(parts.join("."));
        }
    }
    for outer in &filters {
        for inner in &filters {
            let expected = subjects.iter().all(|s| !filter_matches(inner, s) || filter_matches(outer, s));
            assert_eq!(filter_covers(outer, inner), expected, "{outer} covers {inner}");
        }
    }
}

#[test]
fn a_token_is_named_by_the_first_eight_bytes_of_its_hash_alone() {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04]);
    hash[8..].fill(0xff);
    assert_eq!(cellog_core::TokenHash(hash).to_string(), "deadbeef01020304");
}

fn certified(principal: &str, serial: u8, command: Command) -> Command {
    let actor = Actor::Certified { principal: principal.into(), serial: vec![serial; 16] };
    Command::As { actor, command: Box::new(command) }
}

fn revoke(serial: u8, until_ms: u64) -> Command {
    as_token(
        9,
        Command::RevokeCertificate {
            serial: vec![serial; 16],
            subject: "cellog://prod/principal/alice".into(),
            until_ms,
        },
    )
}

/// A certificate the cell revoked no longer authenticates, from the next entry on, while others of the same principal
/// still do; only a cluster admin revokes; the cell forgets a revocation once its certificate has ended.
#[test]
fn a_revoked_certificate_is_refused_and_forgotten_once_it_ends() {
    let mut h = cell();
    let until = h.now.0 + 60_000;
    h.ok(certified("alice", 1, publish("orders.eu.1")));
    let denied =
        h.apply(as_token(3, Command::RevokeCertificate { serial: vec![1; 16], subject: "x".into(), until_ms: until }));
    assert!(matches!(denied, Err(Rejection::PermissionDenied { .. })), "an admin is not a cluster admin: {denied:?}");
    assert_eq!(h.ok(revoke(1, until)), Outcome::CertificateRevoked { revoked: true });
    assert_eq!(h.ok(revoke(1, until)), Outcome::CertificateRevoked { revoked: false });
    let before = state_parts(&h.cell);
    let refused = h.apply(certified("alice", 1, publish("orders.eu.1")));
    match refused {
        Err(Rejection::Unauthenticated { reason }) => assert!(reason.contains("revoked"), "{reason}"),
        other => panic!("a revoked certificate authenticated: {other:?}"),
    }
    assert_eq!(state_parts(&h.cell), before, "the refused call wrote nothing");
    assert!(
        h.cell
            .authorize_command(
                &Actor::Certified { principal: "alice".into(), serial: vec![1; 16] },
                &publish("orders.eu.1")
            )
            .is_err()
    );
    h.ok(certified("alice", 2, publish("orders.eu.1")));
    // Malformed serials are refused before they cost anything.
    for serial in [vec![], vec![7; 21]] {
        let bad = h.apply(as_token(9, Command::RevokeCertificate { serial, subject: "x".into(), until_ms: until }));
        assert!(matches!(bad, Err(Rejection::Invalid { .. })), "{bad:?}");
    }
    // Once the certificate has ended, the next revocation forgets it.
    h.advance(60_001);
    h.ok(revoke(3, h.now.0 + 1_000));
    let serials: Vec<Vec<u8>> = h.cell.revoked_certificates().keys().cloned().collect();
    assert_eq!(serials, [vec![3u8; 16]]);
    stored_state_holds(&h.cell, &h.bodies).unwrap();
}

/// A mirror grant lets a principal mirror the streams it names and nothing else: register as their mirror and report
/// its progress (and, on the node, read them for the mirror), but not publish, administer, or mirror another stream.
/// Only a cluster admin grants one, never to a tenant's principal; replacing a principal's grants keeps it, and an
/// empty grant takes it away. Each refusal changes nothing.
#[test]
fn a_mirror_grant_mirrors_the_streams_it_names_and_nothing_else() {
    let mut h = cell();
    h.ok(as_token(9, Command::PutPrincipal { name: "east".into(), grants: Grants::default() }));
    h.ok(as_token(9, Command::AddToken { principal: "east".into(), token: token(5) }));
    let grant = |streams: &[&str]| Command::GrantMirror {
        principal: "east".into(),
        streams: streams.iter().map(|s| s.to_string()).collect(),
    };
    let register = |stream: &str| Command::RegisterMirror { stream: stream.into(), peer: "east-mirror".into() };
    let progress = |stream: &str| Command::MirrorProgress {
        stream: stream.into(),
        peer: "east-mirror".into(),
        received: vec![0],
        recalls_applied: 0,
    };
    // Before the grant, and from anyone but a cluster admin, nothing.
    for (who, command) in [(5, register("orders")), (3, grant(&["orders"])), (5, grant(&["orders"]))] {
        let before = state_parts(&h.cell);
        let result = h.apply(as_token(who, command));
        assert!(denied(result).is_some(), "token {who}");
        assert_eq!(state_parts(&h.cell), before, "token {who}: a refusal changed the state");
    }
    h.ok(as_token(9, grant(&["orders"])));
    assert!(h.cell.authorize_mirror("east", "orders").is_ok());
    h.ok(as_token(5, register("orders")));
    h.ok(as_token(5, progress("orders")));
    // (what east asks, the grant it lacks)
    let table = [
        (register("audit"), "a mirror grant on stream \"audit\" (or cluster admin)"),
        (progress("audit"), "a mirror grant on stream \"audit\" (or cluster admin)"),
        (publish("orders.eu.1"), "publish on \"orders.eu.1\""),
        (Command::DeleteStream { name: "orders".into() }, "admin"),
        (grant(&["orders", "audit"]), "cluster admin"),
    ];
    for (command, needs) in table {
        let before = state_parts(&h.cell);
        let row = format!("{command:?}");
        assert_eq!(denied(h.apply(as_token(5, command))).as_deref(), Some(needs), "{row}");
        assert_eq!(state_parts(&h.cell), before, "{row}: a refusal changed the state");
    }
    assert!(h.cell.authorize_mirror("east", "audit").is_err());
    // New grants keep the mirror grant; an empty one ends it.
    h.ok(as_token(9, Command::PutPrincipal { name: "east".into(), grants: grants(&[], &["audit.>"], &[]) }));
    assert!(h.cell.authorize_mirror("east", "orders").is_ok());
    h.ok(as_token(9, grant(&[])));
    assert!(h.cell.authorize_mirror("east", "orders").is_err());
    // A tenant's principal holds none; an unknown principal is named.
    h.ok(as_token(9, Command::PutPrincipal { name: "acme/ops".into(), grants: Grants::default() }));
    let tenant = Command::GrantMirror { principal: "acme/ops".into(), streams: vec!["acme/orders".into()] };
    assert!(matches!(h.apply(as_token(9, tenant)), Err(Rejection::InvalidConfig { .. })));
    let nobody = Command::GrantMirror { principal: "nobody".into(), streams: vec!["orders".into()] };
    assert!(matches!(h.apply(as_token(9, nobody)), Err(Rejection::PrincipalNotFound { .. })));
}

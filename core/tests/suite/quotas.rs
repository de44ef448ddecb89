//! Quotas: a tenant, and the cell as a whole, hold at most so many streams, messages and bytes. A command that would
//! pass one is refused naming it and writes nothing; what retention, deletion and a stream's own limits free counts
//! again; and the ledger the checks read always agrees with a count from scratch.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::quota::{Held, Quotas};
use cellog_core::{
    AckKind, Command, ConsumerConfig, DiscardPolicy, Grants, Outcome, ProducerRef, PublishRequest, Quota, ROOT,
    Rejection, StreamConfig, Work,
};

fn publish(subject: &str, payload: &str) -> Command {
    Command::Publish(PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes())))
}

fn stream(name: &str) -> Command {
    Command::CreateStream { name: name.into(), config: StreamConfig::with_subjects([format!("{name}.>")]) }
}

fn set(tenant: Option<&str>, quotas: Quotas) -> Command {
    as_token(9, Command::SetQuotas { tenant: tenant.map(str::to_string), quotas })
}

/// Root (token 9), tenant admins `acme/ops` (token 1) and `beta/ops` (token 2), each with stream `orders`.
fn cell() -> Harness {
    let mut h = Harness::new();
    h.ok(Command::AddToken { principal: ROOT.into(), token: token(9) });
    let tenant_admin = Grants { cluster_admin: false, ..Grants::all() };
    for (name, n) in [("acme/ops", 1), ("beta/ops", 2)] {
        h.ok(as_token(9, Command::PutPrincipal { name: name.into(), grants: tenant_admin.clone() }));
        h.ok(as_token(9, Command::AddToken { principal: name.into(), token: token(n) }));
        h.ok(as_token(n, stream("orders")));
    }
    h
}

/// Applies `command`, which must be refused for `quota` at `limit`, and checks that it changed no state.
fn refused(h: &mut Harness, command: Command, quota: Quota, limit: u64) {
    let before = state_parts(&h.cell);
    let description = format!("{command:?}");
    assert_eq!(h.apply(command), Err(Rejection::QuotaExceeded { quota, limit }), "{description}");
    assert_eq!(state_parts(&h.cell), before, "a refusal writes nothing: {description}");
    assert!(h.cell.ledger_agrees());
}

#[test]
fn a_tenant_s_quotas_refuse_what_would_pass_them_and_leave_other_tenants_alone() {
    let mut h = cell();
    h.ok(set(Some("acme"), Quotas { max_messages: Some(2), max_streams: Some(2), ..Quotas::default() }));
    h.ok(as_token(1, publish("orders.a", "one")));
    h.ok(as_token(1, publish("orders.a", "two")));
    refused(&mut h, as_token(1, publish("orders.a", "three")), Quota::TenantMessages, 2);
    // Another tenant has no quota; the tenant's streams count to two.
    for n in 0..5 {
        h.ok(as_token(2, publish("orders.b", &format!("b{n}"))));
    }
    h.ok(as_token(1, stream("audit")));
    refused(&mut h, as_token(1, stream("more")), Quota::TenantStreams, 2);
    assert_eq!(h.cell.held(Some("acme")).messages, 2);
    assert_eq!(h.cell.held(Some("beta")).messages, 5);
    assert_eq!(h.cell.held(Some("acme")).streams, 2);

    // Bytes: the next message fits exactly, one more byte does not.
    let held = h.cell.held(Some("acme")).bytes;
    h.ok(set(Some("acme"), Quotas { max_bytes: Some(held + 200), ..Quotas::default() }));
    let sized = |h: &mut Harness, payload: &str| {
        let before = h.cell.held(Some("acme")).bytes;
        h.ok(as_token(1, publish("orders.a", payload)));
        h.cell.held(Some("acme")).bytes - before
    };
    let one = sized(&mut h, "x");
    let room = held + 200 - h.cell.held(Some("acme")).bytes;
    let fits = "y".repeat((room - one + 1) as usize);
    assert_eq!(sized(&mut h, &fits), room, "a message as large as the room left fits");
    refused(&mut h, as_token(1, publish("orders.a", "z")), Quota::TenantBytes, held + 200);
}

#[test]
fn the_cell_s_quotas_count_every_stream_of_every_tenant() {
    let mut h = cell();
    h.ok(set(None, Quotas { max_messages: Some(3), max_streams: Some(3), ..Quotas::default() }));
    h.ok(as_token(1, publish("orders.a", "1")));
    h.ok(as_token(2, publish("orders.b", "2")));
    h.ok(as_token(9, stream("ops")));
    h.ok(as_token(9, publish("ops.c", "3")));
    refused(&mut h, as_token(2, publish("orders.b", "4")), Quota::CellMessages, 3);
    refused(&mut h, as_token(1, stream("more")), Quota::CellStreams, 3);
    assert_eq!(h.cell.held(None), Held { streams: 3, messages: 3, bytes: h.cell.held(None).bytes, in_flight: 0 });
    // Deleting a stream gives its messages back.
    h.ok(as_token(9, Command::DeleteStream { name: "ops".into() }));
    h.ok(as_token(2, publish("orders.b", "4")));
    assert!(h.cell.ledger_agrees());
}

#[test]
fn what_a_stream_s_own_limits_remove_is_room_for_the_tenant() {
    stream_limits_make_room(cell());
}

/// The ledger follows every change to a stream's counts also in a cell that builds no transitions (a node that traces
/// nothing), and decides exactly as a traced one.
#[test]
fn the_ledger_follows_a_cell_that_traces_nothing() {
    let mut h = cell();
    h.traced = false;
    stream_limits_make_room(h);
}

fn stream_limits_make_room(mut h: Harness) {
    let rolling =
        StreamConfig { max_messages: Some(2), discard: DiscardPolicy::Old, ..StreamConfig::with_subjects(["log.>"]) };
    h.ok(as_token(1, Command::CreateStream { name: "log".into(), config: rolling }));
    h.ok(set(Some("acme"), Quotas { max_messages: Some(2), ..Quotas::default() }));
    for n in 0..10 {
        h.ok(as_token(1, publish("log.a", &format!("{n}"))));
    }
    assert_eq!(h.cell.held(Some("acme")).messages, 2, "the stream keeps its newest two; the quota never refuses");
    // Deleting a stream gives room back: at three messages the tenant is full until its rolling stream goes.
    h.ok(set(Some("acme"), Quotas { max_messages: Some(3), ..Quotas::default() }));
    h.ok(as_token(1, publish("orders.a", "kept")));
    refused(&mut h, as_token(1, publish("orders.a", "over")), Quota::TenantMessages, 3);
    h.ok(as_token(1, Command::DeleteStream { name: "log".into() }));
    h.ok(as_token(1, publish("orders.a", "fits again")));
    assert!(h.cell.ledger_agrees());
}

#[test]
fn a_transaction_commits_only_within_the_quotas_and_a_refused_commit_appends_nothing() {
    let mut h = Harness::new();
    h.ok(Command::AddToken { principal: ROOT.into(), token: token(9) });
    h.simple_stream("orders");
    h.ok(set(None, Quotas { max_messages: Some(3), ..Quotas::default() }));
    h.publish("orders.a", "before").unwrap();
    let r: ProducerRef = h.init_producer("tx");
    h.ok(Command::BeginTransaction(r));
    for n in 0..3 {
        let request =
            PublishRequest { transaction: Some(r), ..PublishRequest::new("orders.a", Bytes::from(n.to_string())) };
        h.ok(Command::Publish(request));
    }
    let before = n_messages(&h, "orders");
    // A refused commit aborts the transaction, as any commit refused for a limit does.
    match h.apply(Command::CommitTransaction(r)) {
        Err(Rejection::TransactionAborted { reason }) => {
            assert!(reason.contains("quota exceeded: CellMessages limit of 3"), "{reason}")
        }
        other => panic!("the commit passed the cell's quota: {other:?}"),
    }
    assert_eq!(n_messages(&h, "orders"), before, "nothing of the transaction was appended");
    assert!(h.cell.ledger_agrees());
}

#[test]
fn only_a_cluster_admin_sets_quotas_and_they_survive_a_snapshot() {
    let mut h = cell();
    let quotas = Quotas { max_bytes: Some(1 << 20), ..Quotas::default() };
    let denied = h.apply(as_token(1, Command::SetQuotas { tenant: Some("acme".into()), quotas }));
    assert!(matches!(denied, Err(Rejection::PermissionDenied { .. })), "{denied:?}");
    let bad = h.apply(set(Some("no/such"), quotas));
    assert!(matches!(bad, Err(Rejection::InvalidName { .. })), "{bad:?}");
    assert_eq!(h.ok(set(Some("acme"), quotas)), Outcome::QuotasSet);
    h.ok(set(None, Quotas { max_streams: Some(100), ..Quotas::default() }));
    h.ok(as_token(1, publish("orders.a", "one")));
    stored_state_holds(&h.cell, &h.bodies).unwrap();
    let restored = cellog_core::Cell::restore(&h.cell.snapshot()).unwrap();
    assert_eq!(restored.quotas(), h.cell.quotas());
    assert_eq!(restored.held(Some("acme")), h.cell.held(Some("acme")));
    // Unlimited quotas drop a tenant's entry.
    h.ok(set(Some("acme"), Quotas::default()));
    assert!(h.cell.quotas().tenants.is_empty());
}

/// The subjects of deliveries, in order.
fn subjects(deliveries: &[cellog_core::Delivery]) -> Vec<String> {
    deliveries.iter().map(|delivery| delivery.record.subject.to_string()).collect()
}

fn acked(h: &mut Harness, stream: &str, consumer: &str, deliveries: &[cellog_core::Delivery]) {
    for delivery in deliveries {
        let (partition, seq) = (delivery.record.partition, delivery.record.seq);
        h.ack(stream, consumer, partition, seq, AckKind::Applied).expect("acked");
    }
}

/// A tenant's `max_in_flight` counts the deliveries awaiting an ack across all of its consumers: a fetch past it
/// delivers only the room left, and nothing at all when none is left (a subscription sees no work, so proposes no
/// fetch); acks give room back. Another tenant's consumers are not counted, and the cell's cap counts everyone.
#[test]
fn deliveries_awaiting_an_ack_are_capped_per_tenant_and_per_cell() {
    let mut h = cell();
    for n in 0..10 {
        h.ok(as_token(1, publish("orders.a", &format!("a{n}"))));
        h.ok(as_token(2, publish("orders.b", &format!("b{n}"))));
    }
    for (stream, consumer) in [("acme/orders", "one"), ("acme/orders", "two"), ("beta/orders", "one")] {
        h.create_consumer(stream, consumer, ConsumerConfig::default());
    }
    h.ok(set(Some("acme"), Quotas { max_in_flight: Some(5), ..Quotas::default() }));
    assert_eq!(h.fetch("acme/orders", "one", 3).len(), 3);
    assert_eq!(h.fetch("acme/orders", "two", 10).len(), 2, "the room left under the tenant's cap");
    assert_eq!(h.cell.held(Some("acme")).in_flight, 5);
    assert_eq!(h.cell.consumer_work("acme/orders", "one").map(|(work, _)| work), Ok(Work::None));
    assert!(h.fetch("acme/orders", "one", 10).is_empty(), "no room");
    assert_eq!(h.fetch("beta/orders", "one", 10).len(), 10, "another tenant is not counted");

    // An ack gives its room back, to any consumer of the tenant.
    h.ack("acme/orders", "one", 0, 1, AckKind::Applied).expect("acked");
    assert_eq!(h.cell.consumer_work("acme/orders", "two").map(|(work, _)| work), Ok(Work::Deliver));
    assert_eq!(h.fetch("acme/orders", "two", 10).len(), 1);

    // The cell's cap counts every tenant's deliveries: beta holds 10 already.
    h.ok(set(None, Quotas { max_in_flight: Some(12), ..Quotas::default() }));
    h.ok(set(Some("acme"), Quotas::default()));
    assert_eq!(h.cell.held(None).in_flight, 15);
    assert!(h.fetch("acme/orders", "one", 10).is_empty(), "the cell is past its cap");
    let beta: Vec<_> = (1..=10).collect();
    for seq in beta {
        h.ack("beta/orders", "one", 0, seq, AckKind::Applied).expect("acked");
    }
    assert_eq!(h.fetch("acme/orders", "one", 10).len(), 7, "room for 12 less acme's 5");
    let before = state_parts(&h.cell);
    assert!(h.fetch("acme/orders", "two", 10).is_empty());
    assert_eq!(state_parts(&h.cell), before, "a fetch with no room changes nothing");
}

/// `max_in_flight_per_subject` holds a subject's later messages back while as many of its deliveries await an ack,
/// and lets the consumer's other subjects go on; once acked, the held-back messages come in order.
#[test]
fn a_subject_at_its_cap_waits_in_order_while_other_subjects_go_on() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer("orders", "c", ConsumerConfig::default());
    for (subject, payload) in [("orders.a", "a1"), ("orders.a", "a2"), ("orders.a", "a3"), ("orders.b", "b1")] {
        h.publish(subject, payload).expect("published");
    }
    h.ok(Command::SetQuotas {
        tenant: None,
        quotas: Quotas { max_in_flight_per_subject: Some(1), ..Quotas::default() },
    });
    let first = h.fetch("orders", "c", 10);
    assert_eq!(subjects(&first), ["orders.a", "orders.b"]);
    assert_eq!(first.iter().map(|d| h.text(d)).collect::<Vec<_>>(), ["a1", "b1"]);
    assert_eq!(h.cell.consumer_work("orders", "c").map(|(work, _)| work), Ok(Work::None));
    assert!(h.fetch("orders", "c", 10).is_empty(), "a2 and a3 wait for a1's ack");
    h.publish("orders.b", "b2").expect("published");
    assert_eq!(h.fetch("orders", "c", 10).len(), 0, "b1 awaits its ack too");
    acked(&mut h, "orders", "c", &first);
    let second = h.fetch("orders", "c", 10);
    assert_eq!(second.iter().map(|d| h.text(d)).collect::<Vec<_>>(), ["a2", "b2"], "in order, one per subject");
    acked(&mut h, "orders", "c", &second);
    let third = h.fetch("orders", "c", 10);
    assert_eq!(third.iter().map(|d| h.text(d)).collect::<Vec<_>>(), ["a3"]);
    assert_eq!(third[0].delivery_count, 1, "a held-back message is delivered for the first time");
    acked(&mut h, "orders", "c", &third);
    let info = h.cell.consumer_info("orders", "c", h.now).expect("the consumer");
    assert_eq!(info.n_pending, 0);
    assert_eq!(h.cell.consumer_work("orders", "c").map(|(work, _)| work), Ok(Work::None));
}

#[test]
fn a_cap_on_deliveries_of_zero_is_refused() {
    let mut h = cell();
    for quotas in [
        Quotas { max_in_flight: Some(0), ..Quotas::default() },
        Quotas { max_in_flight_per_subject: Some(0), ..Quotas::default() },
    ] {
        let before = state_parts(&h.cell);
        assert!(matches!(h.apply(set(Some("acme"), quotas)), Err(Rejection::Invalid { .. })));
        assert_eq!(state_parts(&h.cell), before);
    }
}

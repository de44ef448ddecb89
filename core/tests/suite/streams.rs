//! Creating, updating and deleting streams, the validation of their configs, and the subject grammar.

use crate::common;
use common::*;

use cellog_core::subject::{filter_matches, filters_overlap, validate_filter, validate_subject};
use cellog_core::{
    Command, DiscardPolicy, MAX_DURATION_MS, MAX_PARTITIONS, MAX_PAYLOAD_LIMIT, NameKind, Outcome, RateLimit,
    Rejection, RemovalReason, RetentionPolicy, StreamConfig, SubjectError, Transition,
};

fn create(h: &mut Harness, name: &str, config: StreamConfig) -> Result<Outcome, Rejection> {
    h.apply(Command::CreateStream { name: name.to_string(), config })
}

fn update(h: &mut Harness, name: &str, config: StreamConfig) -> Result<Outcome, Rejection> {
    h.apply(Command::UpdateStream { name: name.to_string(), config })
}

fn delete(h: &mut Harness, name: &str) -> Result<Outcome, Rejection> {
    h.apply(Command::DeleteStream { name: name.to_string() })
}

/// Asserts a rejection is an `InvalidConfig`, whatever its wording.
#[track_caller]
fn assert_invalid_config(result: Result<Outcome, Rejection>) {
    match result {
        Err(Rejection::InvalidConfig { .. }) => {}
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

// ----- create -----

#[test]
fn create_reports_created_and_stores_the_config() {
    let mut h = Harness::new();
    let c = config(&["orders.>"]);
    assert_eq!(create(&mut h, "orders", c.clone()), Ok(Outcome::StreamCreated { created: true }));
    let info = h.cell.stream_info("orders").unwrap();
    assert_eq!(&*info.name, "orders");
    assert_eq!(info.config, c);
    assert_eq!(info.created_at, h.now);
    assert_eq!(info.n_messages, 0);
    assert_eq!(info.partitions.len(), 1);
    assert_eq!(h.cell.stream_names(), vec!["orders".into()]);
}

#[test]
fn create_again_with_the_identical_config_is_not_a_new_stream() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "x").unwrap();
    assert_eq!(create(&mut h, "orders", config(&["orders.>"])), Ok(Outcome::StreamCreated { created: false }));
    // The existing stream, with its message, is untouched.
    assert_eq!(h.cell.stream_info("orders").unwrap().n_messages, 1);
}

#[test]
fn create_again_with_a_different_config_is_a_conflict() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let different = StreamConfig { max_messages: Some(10), ..config(&["orders.>"]) };
    assert_eq!(
        create(&mut h, "orders", different),
        Err(Rejection::Conflict { what: "stream".to_string(), name: "orders".to_string() })
    );
    assert_eq!(h.cell.stream_info("orders").unwrap().config, config(&["orders.>"]));
}

#[test]
fn create_again_with_the_subjects_reordered_is_a_conflict() {
    let mut h = Harness::new();
    h.create_stream("s", config(&["a.>", "b.>"]));
    assert!(matches!(create(&mut h, "s", config(&["b.>", "a.>"])), Err(Rejection::Conflict { .. })));
}

#[test]
fn stream_names_are_validated() {
    let mut h = Harness::new();
    let too_long = "n".repeat(65);
    for name in ["", "has space", "dotted.name", "star*", "ünicode", "tab\t", too_long.as_str()] {
        match create(&mut h, name, config(&["x.>"])) {
            Err(Rejection::InvalidName { kind: NameKind::Stream, name: rejected, .. }) => assert_eq!(rejected, name),
            other => panic!("name {name:?}: expected InvalidName, got {other:?}"),
        }
    }
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn stream_names_at_the_limits_are_accepted() {
    let mut h = Harness::new();
    let longest = "n".repeat(64);
    for (index, name) in ["a", "A-b_9", longest.as_str()].into_iter().enumerate() {
        let subject = format!("s{index}.>");
        assert_eq!(create(&mut h, name, config(&[&subject])), Ok(Outcome::StreamCreated { created: true }));
    }
    assert_eq!(h.cell.stream_names().len(), 3);
}

#[test]
fn stream_names_are_listed_in_order() {
    let mut h = Harness::new();
    for name in ["zeta", "alpha", "mid"] {
        h.simple_stream(name);
    }
    assert_eq!(h.cell.stream_names(), vec!["alpha".into(), "mid".into(), "zeta".into()]);
}

#[test]
fn a_stream_must_claim_a_subject() {
    let mut h = Harness::new();
    assert_invalid_config(create(&mut h, "s", StreamConfig::default()));
}

#[test]
fn a_stream_claims_at_most_64_subjects() {
    let mut h = Harness::new();
    let subjects: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
    assert_invalid_config(create(&mut h, "s", StreamConfig::with_subjects(subjects.clone())));
    assert_eq!(
        create(&mut h, "s", StreamConfig::with_subjects(subjects[..64].to_vec())),
        Ok(Outcome::StreamCreated { created: true })
    );
}

#[test]
fn zero_partitions_is_invalid() {
    let mut h = Harness::new();
    assert_invalid_config(create(&mut h, "s", StreamConfig { partitions: 0, ..config(&["s.>"]) }));
}

#[test]
fn too_many_partitions_is_invalid() {
    let mut h = Harness::new();
    assert_invalid_config(create(&mut h, "s", StreamConfig { partitions: MAX_PARTITIONS + 1, ..config(&["s.>"]) }));
}

#[test]
fn the_most_partitions_allowed_is_accepted() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: MAX_PARTITIONS, ..config(&["s.>"]) });
    let info = h.cell.stream_info("s").unwrap();
    assert_eq!(info.partitions.len(), MAX_PARTITIONS as usize);
    assert!(info.partitions.iter().enumerate().all(|(i, p)| p.partition == i as u32));
}

#[test]
fn bad_subject_filters_are_invalid_subjects() {
    let mut h = Harness::new();
    let cases = [
        ("", SubjectError::Empty),
        ("orders..eu", SubjectError::EmptyToken { position: 1 }),
        (".orders", SubjectError::EmptyToken { position: 0 }),
        ("orders.", SubjectError::EmptyToken { position: 1 }),
        ("orders.>.eu", SubjectError::FullWildcardNotLast),
        ("ord*", SubjectError::PartialWildcard { token: "ord*".to_string() }),
        ("orders.eu west", SubjectError::InvalidChar { ch: ' ', position: 9 }),
    ];
    for (filter, reason) in cases {
        assert_eq!(
            create(&mut h, "s", config(&["ok.>", filter])),
            Err(Rejection::InvalidSubject { subject: filter.to_string(), reason }),
            "filter {filter:?}"
        );
    }
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn overlapping_filters_within_one_stream_are_invalid() {
    let mut h = Harness::new();
    for subjects in [["a.>", "a.b"], ["a.*", "*.b"], ["a.b", "a.b"], [">", "z"], ["a.*.c", "a.b.>"]] {
        assert_invalid_config(create(&mut h, "s", config(&subjects)));
    }
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn disjoint_filters_within_one_stream_are_accepted() {
    let mut h = Harness::new();
    h.create_stream("s", config(&["a.>", "b.>", "a", "c.*"]));
    for subject in ["a", "a.x", "b.y.z", "c.d"] {
        assert_eq!(&*h.publish(subject, "x").unwrap().stream, "s", "subject {subject:?}");
    }
}

/// Overlapping several streams' filters, a new stream is refused naming the first overlap in one order (the other
/// stream's name, then the new filter's place, then the other filter's), whatever order the filters were found in.
#[test]
fn of_many_overlaps_the_first_by_stream_name_is_reported() {
    let mut h = Harness::new();
    h.create_stream("b", config(&["x.a.>"]));
    h.create_stream("a", config(&["x.z.>", "x.y.>"]));
    let refused = create(&mut h, "c", config(&["x.>"])).unwrap_err();
    assert_eq!(
        refused,
        Rejection::SubjectOverlap { subject: "x.>".into(), other: "x.z.>".into(), owner: "stream \"a\"".into() }
    );
}

#[test]
fn overlapping_filters_across_streams_are_a_subject_overlap() {
    let mut h = Harness::new();
    h.create_stream("orders", config(&["orders.>"]));
    let cases = [("orders.eu", "orders.>"), ("*.eu", "orders.>"), (">", "orders.>"), ("orders.*.x", "orders.>")];
    for (subject, other) in cases {
        match create(&mut h, "other", config(&[subject])) {
            Err(Rejection::SubjectOverlap { subject: s, other: o, owner }) => {
                assert_eq!(s, subject);
                assert_eq!(o, other);
                assert!(owner.contains("orders"), "owner {owner:?} names the stream holding the filter");
            }
            other => panic!("subject {subject:?}: expected SubjectOverlap, got {other:?}"),
        }
    }
    assert_eq!(h.cell.stream_names(), vec!["orders".into()]);
}

#[test]
fn neighbouring_filters_across_streams_are_accepted() {
    let mut h = Harness::new();
    h.create_stream("orders", config(&["orders.>"]));
    // "orders" alone is not matched by "orders.>", which needs at least one more token.
    h.create_stream("bare", config(&["orders"]));
    h.create_stream("ordersx", config(&["ordersx.>"]));
    assert_eq!(&*h.publish("orders", "x").unwrap().stream, "bare");
    assert_eq!(&*h.publish("orders.a", "x").unwrap().stream, "orders");
    assert_eq!(&*h.publish("ordersx.a", "x").unwrap().stream, "ordersx");
}

#[test]
fn zero_or_oversized_limits_are_invalid() {
    let mut h = Harness::new();
    let base = config(&["s.>"]);
    let cases = [
        StreamConfig { max_age_ms: Some(0), ..base.clone() },
        StreamConfig { max_messages: Some(0), ..base.clone() },
        StreamConfig { max_bytes: Some(0), ..base.clone() },
        StreamConfig { max_messages_per_subject: Some(0), ..base.clone() },
        StreamConfig { max_bytes_per_subject: Some(0), ..base.clone() },
        StreamConfig { max_payload_bytes: 0, ..base.clone() },
        StreamConfig { max_payload_bytes: MAX_PAYLOAD_LIMIT + 1, ..base.clone() },
        StreamConfig { max_age_ms: Some(MAX_DURATION_MS + 1), ..base.clone() },
        StreamConfig { duplicate_window_ms: MAX_DURATION_MS + 1, ..base.clone() },
        StreamConfig { rate_limit: Some(RateLimit { messages_per_second: 0, burst: 1 }), ..base.clone() },
        StreamConfig { rate_limit: Some(RateLimit { messages_per_second: 1, burst: 0 }), ..base.clone() },
    ];
    for config in cases {
        let description = format!("{config:?}");
        match create(&mut h, "s", config) {
            Err(Rejection::InvalidConfig { .. }) => {}
            other => panic!("{description}: expected InvalidConfig, got {other:?}"),
        }
    }
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn limits_at_their_bounds_are_accepted() {
    let mut h = Harness::new();
    let c = StreamConfig {
        max_age_ms: Some(MAX_DURATION_MS),
        max_messages: Some(1),
        max_bytes: Some(1),
        max_messages_per_subject: Some(1),
        max_bytes_per_subject: Some(1),
        max_payload_bytes: MAX_PAYLOAD_LIMIT,
        duplicate_window_ms: MAX_DURATION_MS,
        rate_limit: Some(RateLimit { messages_per_second: 1, burst: 1 }),
        ..config(&["s.>"])
    };
    assert_eq!(create(&mut h, "s", c), Ok(Outcome::StreamCreated { created: true }));
}

/// The limits a client sees documented are the ones enforced: the longest duration is one year, the largest
/// payload a stream may allow 8 MiB.
#[test]
fn the_documented_bounds_are_the_enforced_ones() {
    const ONE_YEAR_MS: u64 = 365 * 24 * 60 * 60 * 1_000;
    assert_eq!(MAX_DURATION_MS, ONE_YEAR_MS);
    assert_eq!(MAX_PAYLOAD_LIMIT, 8 << 20);
    let mut h = Harness::new();
    let aged = |max_age_ms| StreamConfig { max_age_ms: Some(max_age_ms), ..config(&["s.>"]) };
    assert_invalid_config(create(&mut h, "s", aged(ONE_YEAR_MS + 1)));
    assert_eq!(create(&mut h, "s", aged(ONE_YEAR_MS)), Ok(Outcome::StreamCreated { created: true }));
}

#[test]
fn a_dead_letter_stream_must_exist() {
    let mut h = Harness::new();
    let c = StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) };
    assert_eq!(create(&mut h, "orders", c), Err(Rejection::StreamNotFound { stream: "dlq".to_string() }));
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn a_stream_cannot_be_its_own_dead_letter_stream() {
    let mut h = Harness::new();
    let c = StreamConfig { dead_letter_stream: Some("orders".to_string()), ..config(&["orders.>"]) };
    assert_invalid_config(create(&mut h, "orders", c));
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn a_dead_letter_stream_name_is_validated() {
    let mut h = Harness::new();
    let c = StreamConfig { dead_letter_stream: Some("dead letters".to_string()), ..config(&["orders.>"]) };
    let refused = create(&mut h, "orders", c).unwrap_err();
    assert!(matches!(refused, Rejection::InvalidName { kind: NameKind::Stream, .. }));
    // What a client reads names what was wrong.
    assert!(refused.to_string().starts_with("invalid stream name \"dead letters\": "), "{refused}");
}

#[test]
fn an_existing_dead_letter_stream_is_accepted() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    let c = StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) };
    assert_eq!(create(&mut h, "orders", c), Ok(Outcome::StreamCreated { created: true }));
    assert_eq!(h.cell.stream_info("orders").unwrap().config.dead_letter_stream.as_deref(), Some("dlq"));
}

#[test]
fn a_rejected_create_leaves_no_trace() {
    let mut h = Harness::new();
    assert!(create(&mut h, "s", StreamConfig { partitions: 0, ..config(&["s.>"]) }).is_err());
    assert_eq!(h.cell.stream_info("s"), Err(Rejection::StreamNotFound { stream: "s".to_string() }));
    assert_eq!(h.publish("s.a", "x"), Err(Rejection::NoStreamForSubject { subject: "s.a".to_string() }));
    assert!(h.take_effects().is_empty());
}

// ----- update -----

#[test]
fn update_replaces_the_limits() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let c = StreamConfig { max_messages: Some(5), max_payload_bytes: 10, ..config(&["orders.>"]) };
    assert_eq!(update(&mut h, "orders", c.clone()), Ok(Outcome::StreamUpdated));
    assert_eq!(h.cell.stream_info("orders").unwrap().config, c);
    assert_eq!(
        h.publish("orders.a", "eleven byte"),
        Err(Rejection::PayloadTooLarge { size: 11, max: 10 }),
        "the new payload limit applies at once"
    );
}

#[test]
fn update_can_claim_more_subjects() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    assert!(h.publish("refunds.a", "x").is_err());
    update(&mut h, "orders", config(&["orders.>", "refunds.>"])).unwrap();
    assert_eq!(&*h.publish("refunds.a", "x").unwrap().stream, "orders");
}

#[test]
fn update_lowering_max_messages_removes_the_oldest_at_once() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    for i in 1..=5 {
        h.publish("orders.a", &format!("m{i}")).unwrap();
    }
    h.take_effects();
    update(&mut h, "orders", StreamConfig { max_messages: Some(2), ..config(&["orders.>"]) }).unwrap();
    let removed: Vec<(u64, RemovalReason)> = h
        .take_effects()
        .into_iter()
        .filter_map(|e| match e {
            Transition::Removed { seq, reason, .. } => Some((seq, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        vec![(1, RemovalReason::StreamLimit), (2, RemovalReason::StreamLimit), (3, RemovalReason::StreamLimit)]
    );
    let info = h.cell.stream_info("orders").unwrap();
    assert_eq!((info.n_messages, info.partitions[0].low_watermark, info.partitions[0].high_watermark), (2, 4, 5));
}

#[test]
fn update_setting_a_max_age_removes_old_messages_at_once() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "old").unwrap();
    h.advance(5_000);
    h.publish("orders.a", "new").unwrap();
    h.take_effects();
    update(&mut h, "orders", StreamConfig { max_age_ms: Some(1_000), ..config(&["orders.>"]) }).unwrap();
    assert_eq!(
        h.take_effects(),
        vec![Transition::Removed { stream: "orders".into(), partition: 0, seq: 1, reason: RemovalReason::Age }]
    );
    assert_eq!(h.cell.stream_info("orders").unwrap().n_messages, 1);
}

#[test]
fn update_cannot_change_partitions() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 4, ..config(&["orders.>"]) });
    for partitions in [1, 3, 5] {
        assert_invalid_config(update(&mut h, "orders", StreamConfig { partitions, ..config(&["orders.>"]) }));
    }
    assert_eq!(h.cell.stream_info("orders").unwrap().config.partitions, 4);
}

#[test]
fn update_cannot_change_retention() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    for retention in [RetentionPolicy::Interest, RetentionPolicy::WorkQueue] {
        assert_invalid_config(update(&mut h, "orders", StreamConfig { retention, ..config(&["orders.>"]) }));
    }
    assert_eq!(h.cell.stream_info("orders").unwrap().config.retention, RetentionPolicy::Limits);
}

#[test]
fn update_can_change_discard() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let c = StreamConfig { discard: DiscardPolicy::New, max_messages: Some(1), ..config(&["orders.>"]) };
    update(&mut h, "orders", c).unwrap();
    h.publish("orders.a", "x").unwrap();
    assert!(matches!(h.publish("orders.a", "y"), Err(Rejection::QuotaExceeded { .. })));
}

#[test]
fn update_of_a_missing_stream_is_not_found() {
    let mut h = Harness::new();
    assert_eq!(
        update(&mut h, "nope", config(&["nope.>"])),
        Err(Rejection::StreamNotFound { stream: "nope".to_string() })
    );
}

#[test]
fn update_validates_the_new_config() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    assert_invalid_config(update(&mut h, "orders", StreamConfig { max_messages: Some(0), ..config(&["orders.>"]) }));
    assert_invalid_config(update(&mut h, "orders", config(&["orders.>", "orders.a"])));
    assert!(matches!(update(&mut h, "orders", config(&["orders.>.x"])), Err(Rejection::InvalidSubject { .. })));
    assert_eq!(h.cell.stream_info("orders").unwrap().config, config(&["orders.>"]));
}

#[test]
fn update_cannot_claim_another_streams_subjects() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.simple_stream("refunds");
    match update(&mut h, "orders", config(&["orders.>", "refunds.eu"])) {
        Err(Rejection::SubjectOverlap { subject, other, owner }) => {
            assert_eq!((subject.as_str(), other.as_str()), ("refunds.eu", "refunds.>"));
            assert!(owner.contains("refunds"));
        }
        other => panic!("expected SubjectOverlap, got {other:?}"),
    }
    assert_eq!(&*h.publish("refunds.eu", "x").unwrap().stream, "refunds");
}

#[test]
fn update_keeping_its_own_subjects_does_not_overlap_itself() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    assert_eq!(update(&mut h, "orders", config(&["orders.>"])), Ok(Outcome::StreamUpdated));
}

#[test]
fn update_checks_the_dead_letter_stream() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let own = StreamConfig { dead_letter_stream: Some("orders".to_string()), ..config(&["orders.>"]) };
    assert_invalid_config(update(&mut h, "orders", own));
    let missing = StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) };
    assert_eq!(update(&mut h, "orders", missing), Err(Rejection::StreamNotFound { stream: "dlq".to_string() }));
    h.simple_stream("dlq");
    let existing = StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) };
    assert_eq!(update(&mut h, "orders", existing), Ok(Outcome::StreamUpdated));
}

// ----- delete -----

#[test]
fn delete_removes_the_stream_and_its_subjects() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "x").unwrap();
    h.take_effects();
    assert_eq!(delete(&mut h, "orders"), Ok(Outcome::StreamDeleted));
    assert_eq!(h.take_effects(), vec![Transition::StreamDeleted { stream: "orders".into() }]);
    assert_eq!(h.cell.stream_info("orders"), Err(Rejection::StreamNotFound { stream: "orders".to_string() }));
    assert_eq!(h.publish("orders.a", "x"), Err(Rejection::NoStreamForSubject { subject: "orders.a".to_string() }));
    assert!(h.cell.stream_names().is_empty());
}

#[test]
fn a_deleted_streams_name_and_subjects_can_be_reused() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "x").unwrap();
    h.publish("orders.a", "y").unwrap();
    delete(&mut h, "orders").unwrap();
    h.create_stream("other", config(&["orders.a"]));
    assert_eq!(&*h.publish("orders.a", "z").unwrap().stream, "other");
    delete(&mut h, "other").unwrap();
    h.simple_stream("orders");
    let ack = h.publish("orders.a", "fresh").unwrap();
    assert_eq!((&*ack.stream, ack.seq), ("orders", 1), "a recreated stream starts again at sequence 1");
}

#[test]
fn delete_of_a_missing_stream_is_not_found() {
    let mut h = Harness::new();
    assert_eq!(delete(&mut h, "nope"), Err(Rejection::StreamNotFound { stream: "nope".to_string() }));
}

#[test]
fn delete_refuses_a_stream_used_as_a_dead_letter_stream() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream("orders", StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) });
    match delete(&mut h, "dlq") {
        Err(Rejection::InUse { stream, by }) => {
            assert_eq!(stream, "dlq");
            assert!(by.contains("orders"), "{by:?} names the stream using it");
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    assert!(h.cell.stream_info("dlq").is_ok());
    assert!(h.take_effects().is_empty());
}

#[test]
fn a_dead_letter_stream_can_be_deleted_once_unused() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream("orders", StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) });
    update(&mut h, "orders", config(&["orders.>"])).unwrap();
    assert_eq!(delete(&mut h, "dlq"), Ok(Outcome::StreamDeleted));
}

#[test]
fn a_stream_using_a_dead_letter_stream_can_be_deleted_first() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream("orders", StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..config(&["orders.>"]) });
    assert_eq!(delete(&mut h, "orders"), Ok(Outcome::StreamDeleted));
    assert_eq!(delete(&mut h, "dlq"), Ok(Outcome::StreamDeleted));
}

// ----- subject grammar -----

#[test]
fn published_subject_grammar() {
    #[track_caller]
    fn check(subject: &str, expected: Result<(), SubjectError>) {
        assert_eq!(validate_subject(subject), expected, "validate_subject({subject:?})");
    }
    check("orders", Ok(()));
    check("orders.eu.created", Ok(()));
    check("a.b.c.d.e.f.g", Ok(()));
    check("Orders-1_x", Ok(()));
    check("commandes.créées", Ok(()));
    check("a$b.c#d", Ok(()));
    check(&"x".repeat(255), Ok(()));
    check("", Err(SubjectError::Empty));
    check(&"x".repeat(256), Err(SubjectError::TooLong { len: 256, max: 255 }));
    check(".", Err(SubjectError::EmptyToken { position: 0 }));
    check(".orders", Err(SubjectError::EmptyToken { position: 0 }));
    check("orders.", Err(SubjectError::EmptyToken { position: 1 }));
    check("orders..eu", Err(SubjectError::EmptyToken { position: 1 }));
    check("a.b..", Err(SubjectError::EmptyToken { position: 2 }));
    check(" orders", Err(SubjectError::InvalidChar { ch: ' ', position: 0 }));
    check("orders eu", Err(SubjectError::InvalidChar { ch: ' ', position: 6 }));
    check("orders\teu", Err(SubjectError::InvalidChar { ch: '\t', position: 6 }));
    check("orders\n", Err(SubjectError::InvalidChar { ch: '\n', position: 6 }));
    check("a\u{0}b", Err(SubjectError::InvalidChar { ch: '\u{0}', position: 1 }));
    // The position is a byte offset: "é" takes two bytes.
    check("é x", Err(SubjectError::InvalidChar { ch: ' ', position: 2 }));
    check("a.\u{a0}", Err(SubjectError::InvalidChar { ch: '\u{a0}', position: 2 }));
    check("a\u{2028}b", Err(SubjectError::InvalidChar { ch: '\u{2028}', position: 1 }));
    check("a.\u{85}", Err(SubjectError::InvalidChar { ch: '\u{85}', position: 2 }));
    check("\u{7f}", Err(SubjectError::InvalidChar { ch: '\u{7f}', position: 0 }));
    check("a.~!@#$%^&()[]{}|;:'\",/?", Ok(()));
    // A bad character is reported before an empty token further on.
    check("a b..c", Err(SubjectError::InvalidChar { ch: ' ', position: 1 }));
    check("*", Err(SubjectError::WildcardInPublish));
    check(">", Err(SubjectError::WildcardInPublish));
    check("orders.*", Err(SubjectError::WildcardInPublish));
    check("orders.>", Err(SubjectError::WildcardInPublish));
    check("ord*ers", Err(SubjectError::WildcardInPublish));
    check("a>b", Err(SubjectError::WildcardInPublish));
}

#[test]
fn filter_grammar() {
    #[track_caller]
    fn check(filter: &str, expected: Result<(), SubjectError>) {
        assert_eq!(validate_filter(filter), expected, "validate_filter({filter:?})");
    }
    check("orders", Ok(()));
    check("orders.eu", Ok(()));
    check("*", Ok(()));
    check(">", Ok(()));
    check("orders.*", Ok(()));
    check("orders.>", Ok(()));
    check("*.eu.*", Ok(()));
    check("*.*.>", Ok(()));
    check("", Err(SubjectError::Empty));
    check(&format!("{}.>", "x".repeat(253)), Ok(()));
    check(&format!("{}.>", "x".repeat(254)), Err(SubjectError::TooLong { len: 256, max: 255 }));
    check("orders..>", Err(SubjectError::EmptyToken { position: 1 }));
    check(".>", Err(SubjectError::EmptyToken { position: 0 }));
    check("orders.* ", Err(SubjectError::InvalidChar { ch: ' ', position: 8 }));
    check(">.orders", Err(SubjectError::FullWildcardNotLast));
    check("orders.>.eu", Err(SubjectError::FullWildcardNotLast));
    check(">.>", Err(SubjectError::FullWildcardNotLast));
    check("ord*", Err(SubjectError::PartialWildcard { token: "ord*".to_string() }));
    check("orders.eu*", Err(SubjectError::PartialWildcard { token: "eu*".to_string() }));
    check("orders.**", Err(SubjectError::PartialWildcard { token: "**".to_string() }));
    check("orders.>>", Err(SubjectError::PartialWildcard { token: ">>".to_string() }));
    check("orders.*>", Err(SubjectError::PartialWildcard { token: "*>".to_string() }));
    check("a>.b", Err(SubjectError::PartialWildcard { token: "a>".to_string() }));
}

#[test]
fn filter_matching() {
    #[track_caller]
    fn check(filter: &str, subject: &str, expected: bool) {
        assert_eq!(filter_matches(filter, subject), expected, "filter_matches({filter:?}, {subject:?})");
    }
    check("orders", "orders", true);
    check("orders", "order", false);
    check("orders", "orders.eu", false);
    check("orders.eu", "orders", false);
    check("orders.eu", "orders.eu", true);
    check("orders.eu", "orders.us", false);
    check("orders.eu", "orders.eu.x", false);
    check("*", "orders", true);
    check("*", "orders.eu", false);
    check("orders.*", "orders.eu", true);
    check("orders.*", "orders", false);
    check("orders.*", "orders.eu.x", false);
    check("*.eu", "orders.eu", true);
    check("*.eu", "orders.us", false);
    check("orders.*.created", "orders.eu.created", true);
    check("orders.*.created", "orders.eu.deleted", false);
    check(">", "orders", true);
    check(">", "orders.eu.created", true);
    check("orders.>", "orders", false);
    check("orders.>", "orders.eu", true);
    check("orders.>", "orders.eu.created", true);
    check("orders.>", "refunds.eu", false);
    check("*.>", "orders", false);
    check("*.>", "orders.eu", true);
    check("orders.*.>", "orders.eu", false);
    check("orders.*.>", "orders.eu.x.y", true);
}

#[test]
fn filter_overlap() {
    #[track_caller]
    fn check(a: &str, b: &str, expected: bool) {
        assert_eq!(filters_overlap(a, b), expected, "filters_overlap({a:?}, {b:?})");
        assert_eq!(filters_overlap(b, a), expected, "filters_overlap({b:?}, {a:?}) (reversed)");
    }
    check("orders", "orders", true);
    check("orders", "refunds", false);
    check("orders.eu", "orders.us", false);
    check("orders", "orders.eu", false);
    check("orders.>", "orders", false);
    check("orders.>", "orders.eu", true);
    check("orders.>", "orders.eu.x", true);
    check("orders.>", "refunds.>", false);
    check("orders.>", "orders.*", true);
    check("orders.>", "orders.>", true);
    check(">", "anything", true);
    check(">", "a.b.c", true);
    check(">", "*", true);
    check(">", ">", true);
    check("*", "orders", true);
    check("*", "orders.eu", false);
    check("*", "*.eu", false);
    check("orders.*", "orders.eu", true);
    check("orders.*", "refunds.*", false);
    check("orders.*", "*.eu", true);
    check("orders.*", "orders.*.x", false);
    check("*.eu", "*.us", false);
    check("a.*.c", "a.b.>", true);
    check("a.*.c", "a.b.d", false);
    check("*.*", "a.b", true);
    check("*.*", "a.b.c", false);
    check("*.>", "a", false);
}

#[test]
fn update_giving_up_a_subject_stops_routing_it_and_frees_it() {
    let mut h = Harness::new();
    h.create_stream("orders", config(&["orders.>", "refunds.*"]));
    assert_eq!(&*h.publish("refunds.a", "x").unwrap().stream, "orders");
    update(&mut h, "orders", config(&["orders.>"])).unwrap();
    assert!(matches!(h.publish("refunds.a", "x"), Err(Rejection::NoStreamForSubject { .. })));
    h.create_stream("refunds", config(&["refunds.*"]));
    assert_eq!(&*h.publish("refunds.a", "x").unwrap().stream, "refunds");
    assert_eq!(&*h.publish("orders.a.b", "x").unwrap().stream, "orders");
}

#[test]
fn among_many_streams_each_subject_goes_to_the_one_claiming_it() {
    let mut h = Harness::new();
    for i in 0..50 {
        h.create_stream(&format!("s{i}"), config(&[&format!("s{i}.*.x"), &format!("t.{i}.>")]));
    }
    h.create_stream("rest", config(&["t.*"]));
    assert_eq!(&*h.publish("s7.a.x", "m").unwrap().stream, "s7");
    assert_eq!(&*h.publish("t.42.a.b", "m").unwrap().stream, "s42");
    assert_eq!(&*h.publish("t.42", "m").unwrap().stream, "rest");
    assert!(matches!(h.publish("s7.a.y", "m"), Err(Rejection::NoStreamForSubject { .. })));
    delete(&mut h, "s7").unwrap();
    assert!(matches!(h.publish("s7.a.x", "m"), Err(Rejection::NoStreamForSubject { .. })));
}

#[test]
fn a_stream_may_take_payloads_of_up_to_eight_mib_and_no_more() {
    let mut h = Harness::new();
    let eight_mib = 8 * 1024 * 1024;
    let config = |max_payload_bytes| StreamConfig { max_payload_bytes, ..config(&["s.>"]) };
    assert!(create(&mut h, "big", config(eight_mib)).is_ok(), "the documented limit is accepted");
    assert_invalid_config(create(&mut h, "bigger", config(eight_mib + 1)));
    assert_eq!(MAX_PAYLOAD_LIMIT, eight_mib);
}

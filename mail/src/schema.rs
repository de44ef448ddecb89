//! Where mail lives in its cell, in one place: the four streams and their configs, the subjects in them, the headers
//! on their messages, and the limits of one envelope.

use cellog_core::{Record, StreamConfig};
use cellog_proto::v1::{self, DeliveryResult};

/// Envelopes waiting to be delivered, and delivered.
pub const OUTBOX: &str = "mail-outbox";
/// Envelopes delivered to this cell.
pub const INBOX: &str = "mail-inbox";
/// Provenance rows, each pinning its envelope.
pub const PROVENANCE: &str = "mail-provenance";
/// One final delivery result per envelope and recipient.
pub const RESULTS: &str = "mail-results";

/// The header naming an inbox envelope's sender cell.
pub const SENDER_HEADER: &str = "Mail-Sender";
/// The header of an outbox envelope naming its recipients, comma-separated.
pub const RECIPIENTS_HEADER: &str = "Mail-Recipients";
/// The header of a result record naming the result.
pub const RESULT_HEADER: &str = "Mail-Result";
/// The header of a result record with the last error, when there was one.
pub const DETAIL_HEADER: &str = "Mail-Detail";
/// The header of a result record counting the attempts made.
pub const ATTEMPTS_HEADER: &str = "Mail-Attempts";
/// Longest detail a result record keeps (headers are bounded; a long error keeps its start).
pub const MAX_DETAIL_CHARS: usize = 512;

/// The largest payload one envelope seals (its envelope must fit a stream's 8 MiB payload limit).
pub const MAX_MAIL_PAYLOAD: usize = 4 * 1024 * 1024;
/// Most recipients of one envelope.
pub const MAX_RECIPIENTS: usize = 64;

const DAY_MS: u64 = 24 * 3600 * 1000;
/// How long the inbox remembers an envelope id (and so how long a late repeat is still recognized).
pub const INBOX_DEDUP_MS: u64 = 7 * DAY_MS;

/// How old an envelope may be when it arrives: older ones are refused (`STALE_ENVELOPE`). Above the longest a sender
/// keeps trying ([`crate::RetryPolicy::give_up_after`], a day by default) and below [`INBOX_DEDUP_MS`], so that a repeat
/// the inbox no longer remembers is refused as stale instead of stored a second time.
pub const ENVELOPE_FRESH_MS: u64 = 6 * DAY_MS;
/// How far ahead of this cell's clock an envelope's creation may be (the two cells' clocks differ).
pub const ENVELOPE_SKEW_MS: u64 = 10 * 60 * 1000;

/// Refuses an envelope created at `created_ms` arriving at `now_ms` unless it is fresh: at most
/// [`ENVELOPE_FRESH_MS`] old and at most [`ENVELOPE_SKEW_MS`] from the future.
pub fn check_fresh(created_ms: u64, now_ms: u64) -> Result<(), String> {
    if created_ms.saturating_add(ENVELOPE_FRESH_MS) < now_ms {
        let days = (now_ms - created_ms) as f64 / DAY_MS as f64;
        return Err(format!(
            "the envelope was sealed {days:.1} days ago; envelopes older than {} days are refused",
            ENVELOPE_FRESH_MS / DAY_MS
        ));
    }
    if created_ms > now_ms.saturating_add(ENVELOPE_SKEW_MS) {
        return Err(format!(
            "the envelope was sealed {} ms ahead of this cell's clock; the most allowed is {ENVELOPE_SKEW_MS} ms",
            created_ms - now_ms
        ));
    }
    Ok(())
}

/// The inbox's message id of an envelope: its sender cell and its id, so that two cells choosing the same id do not
/// take each other's place.
pub fn inbox_msg_id(sender: &str, id: &str) -> String {
    format!("{sender}/{id}")
}

/// Every subject of the mail streams: reserved for the node, which alone writes them.
pub const RESERVED: &str = "mail.>";

/// What the outbox, results and provenance know a sender's envelope by: its id for the cell's own principals, and
/// `ID.TENANT` for a tenant's, so that two tenants (or a tenant and the cell) choosing the same envelope id do not
/// take each other's place or read each other's results. Stands for the `id` in the subjects and message ids below.
pub fn mail_key(tenant: Option<&str>, id: &str) -> String {
    match tenant {
        None => id.to_string(),
        Some(tenant) => format!("{id}.{tenant}"),
    }
}

/// The inbox stream of `tenant`'s mail (the cell's own for `None`): `TENANT/mail-inbox`, which the tenant names
/// `mail-inbox`.
pub fn inbox_stream(tenant: Option<&str>) -> String {
    match tenant {
        None => INBOX.to_string(),
        Some(tenant) => cellog_core::subject::scoped_name(tenant, INBOX),
    }
}

/// The subjects reserved for the node in `tenant`'s scope (the cell's for `None`): its mail subjects, `mail.>` as the
/// tenant names them.
pub fn reserved(tenant: Option<&str>) -> String {
    scoped(tenant, RESERVED)
}

/// `subject` in `tenant`'s scope (as it is, for `None`).
pub fn scoped(tenant: Option<&str>, subject: &str) -> String {
    match tenant {
        None => subject.to_string(),
        Some(tenant) => cellog_core::subject::scoped_subject(tenant, subject),
    }
}

/// The config of `tenant`'s inbox stream: the cell's inbox's, with its subjects in the tenant's scope.
pub fn tenant_inbox_config(tenant: &str) -> StreamConfig {
    let [_, (_, inbox), ..] = stream_configs();
    StreamConfig { subjects: inbox.subjects.iter().map(|subject| scoped(Some(tenant), subject)).collect(), ..inbox }
}

/// The outbox subject of envelope `id`.
pub fn outbox_subject(id: &str) -> String {
    format!("mail.out.{id}")
}

/// The inbox subject of envelopes from `sender`, in `tenant`'s inbox (the cell's for `None`).
pub fn inbox_subject(tenant: Option<&str>, sender: &str) -> String {
    scoped(tenant, &format!("mail.in.{sender}"))
}

/// The results subject of envelope `id` for `recipient`.
pub fn result_subject(id: &str, recipient: &str) -> String {
    format!("mail.results.{id}.{recipient}")
}

/// The message id of envelope `id`'s result for `recipient`.
pub fn result_msg_id(id: &str, recipient: &str) -> String {
    format!("{id}/{recipient}")
}

/// The provenance subject of envelope `id`'s row, `direction` being `sent` or `received`.
pub fn provenance_subject(direction: &str, id: &str) -> String {
    format!("mail.provenance.{direction}.{id}")
}

/// The message id of envelope `id`'s provenance row in `direction`.
pub fn provenance_msg_id(direction: &str, id: &str) -> String {
    format!("{direction}/{id}")
}

/// The pin a provenance row carries: the envelope at `seq` of `stream`'s only partition.
pub fn pin(stream: &str, seq: u64) -> String {
    format!("{stream}/0/{seq}")
}

/// The four mail streams and their configs.
pub fn stream_configs() -> [(&'static str, StreamConfig); 4] {
    let week = Some(7 * DAY_MS);
    let outbox = StreamConfig {
        max_age_ms: week,
        max_payload_bytes: cellog_core::MAX_PAYLOAD_LIMIT,
        duplicate_window_ms: DAY_MS,
        ..StreamConfig::with_subjects(["mail.out.>"])
    };
    let inbox = StreamConfig {
        max_age_ms: week,
        max_payload_bytes: cellog_core::MAX_PAYLOAD_LIMIT,
        duplicate_window_ms: INBOX_DEDUP_MS,
        ..StreamConfig::with_subjects(["mail.in.>"])
    };
    let provenance = StreamConfig {
        max_age_ms: Some(90 * DAY_MS),
        duplicate_window_ms: DAY_MS,
        ..StreamConfig::with_subjects(["mail.provenance.>"])
    };
    let results = StreamConfig {
        max_age_ms: week,
        max_messages_per_subject: Some(1),
        ..StreamConfig::with_subjects(["mail.results.>"])
    };
    [(OUTBOX, outbox), (INBOX, inbox), (PROVENANCE, provenance), (RESULTS, results)]
}

/// The name a result record carries; `None` for a result that is not final.
pub fn result_name(result: DeliveryResult) -> Option<&'static str> {
    match result {
        DeliveryResult::Delivered => Some("delivered"),
        DeliveryResult::Denied => Some("denied"),
        DeliveryResult::NoHome => Some("no-home"),
        DeliveryResult::Failed => Some("failed"),
        DeliveryResult::Pending | DeliveryResult::Unspecified => None,
    }
}

/// A recipient's status as its result record tells it.
pub fn result_status(cell: &str, record: &Record) -> v1::RecipientStatus {
    let header = |name: &str| record.headers.get(name).cloned().unwrap_or_default();
    let result = match header(RESULT_HEADER).as_str() {
        "delivered" => DeliveryResult::Delivered,
        "denied" => DeliveryResult::Denied,
        "no-home" => DeliveryResult::NoHome,
        "failed" => DeliveryResult::Failed,
        _ => DeliveryResult::Pending,
    };
    v1::RecipientStatus {
        cell: cell.to_string(),
        result: result as i32,
        detail: header(DETAIL_HEADER),
        attempts: header(ATTEMPTS_HEADER).parse().unwrap_or(0),
        at_ms: record.stored_at.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_is_fresh_between_its_window_and_the_allowed_skew() {
        let now = 100 * DAY_MS;
        let give_up = u64::try_from(crate::RetryPolicy::default().give_up_after.as_millis()).unwrap();
        assert!(give_up < ENVELOPE_FRESH_MS && ENVELOPE_FRESH_MS < INBOX_DEDUP_MS);
        for (created, fresh) in [
            (now, true),
            (now - give_up, true),
            (now - ENVELOPE_FRESH_MS, true),
            (now - ENVELOPE_FRESH_MS - 1, false),
            (now - INBOX_DEDUP_MS, false),
            (now + ENVELOPE_SKEW_MS, true),
            (now + ENVELOPE_SKEW_MS + 1, false),
            (0, false),
        ] {
            assert_eq!(check_fresh(created, now).is_ok(), fresh, "sealed at {created}, now {now}");
        }
        assert_ne!(inbox_msg_id("alpha", "e1"), inbox_msg_id("bravo", "e1"));
    }

    #[test]
    fn every_subject_falls_in_its_stream() {
        let configs = stream_configs();
        let stream_of = |subject: &str| {
            let matching: Vec<&str> = configs
                .iter()
                .filter(|(_, config)| {
                    config.subjects.iter().any(|filter| cellog_core::subject::filter_matches(filter, subject))
                })
                .map(|(name, _)| *name)
                .collect();
            matching
        };
        assert_eq!(stream_of(&outbox_subject("e1")), [OUTBOX]);
        assert_eq!(stream_of(&inbox_subject(None, "alpha")), [INBOX]);
        // A tenant's inbox subject falls in its own inbox stream only, and under its reserved subjects.
        let tenant = inbox_subject(Some("acme"), "alpha");
        assert_eq!(stream_of(&tenant), Vec::<&str>::new());
        let config = tenant_inbox_config("acme");
        assert!(config.subjects.iter().any(|filter| cellog_core::subject::filter_matches(filter, &tenant)));
        assert!(cellog_core::subject::filter_matches(&reserved(Some("acme")), &tenant));
        assert!(!cellog_core::subject::filter_matches(&reserved(Some("other")), &tenant));
        assert_eq!(inbox_stream(Some("acme")), "acme/mail-inbox");
        // A tenant's envelope keys never meet the cell's or another tenant's.
        let keys = [mail_key(None, "e1"), mail_key(Some("acme"), "e1"), mail_key(Some("other"), "e1")];
        assert!(keys.iter().all(|key| keys.iter().filter(|other| *other == key).count() == 1), "{keys:?}");
        assert_eq!(stream_of(&outbox_subject(&keys[1])), [OUTBOX]);
        assert_eq!(stream_of(&result_subject(&keys[1], "bravo")), [RESULTS]);
        assert_eq!(stream_of(&result_subject("e1", "bravo")), [RESULTS]);
        assert_eq!(stream_of(&provenance_subject("sent", "e1")), [PROVENANCE]);
    }

    #[test]
    fn a_final_result_reads_back_from_its_record() {
        for result in
            [DeliveryResult::Delivered, DeliveryResult::Denied, DeliveryResult::NoHome, DeliveryResult::Failed]
        {
            let name = result_name(result).expect("a final result has a name");
            let record = Record {
                partition: 0,
                seq: 1,
                subject: result_subject("e1", "bravo").into(),
                key: None,
                msg_id: Some(result_msg_id("e1", "bravo").into()),
                headers: [(RESULT_HEADER, name), (ATTEMPTS_HEADER, "3")]
                    .map(|(header, value)| (header.to_string(), value.to_string()))
                    .into(),
                body: cellog_core::Body::Tombstone { recalled_at: cellog_core::Millis(0) },
                stored_at: cellog_core::Millis(5),
            };
            let status = result_status("bravo", &record);
            assert_eq!((status.result, status.attempts, status.at_ms), (result as i32, 3, 5));
        }
        assert_eq!(result_name(DeliveryResult::Pending), None);
    }
}

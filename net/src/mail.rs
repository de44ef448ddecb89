//! Sealed mail between cells: the outbox, delivery to other cells' inboxes, the inbox, and the provenance ledger.
//!
//! Everything lives in four streams of the cell, so it is replicated, survives restarts and moves with leadership:
//! - [`OUTBOX`] (`mail.out.<envelope id>`): sealed envelopes to deliver;
//! - [`RESULTS`] (`mail.results.<envelope id>.<recipient>`): the final result for each recipient;
//! - [`INBOX`] (`mail.in.<sender>`): envelopes delivered to this cell, stored once per envelope id (the message id);
//! - [`PROVENANCE`] (`mail.provenance.<sent|received>.<envelope id>`): the ledger. Each row pins the envelope it
//!   describes (`Cellog-Pin`), so retention never reclaims an envelope while its row is kept.
//!
//! Sending seals on the leader and stores the envelope in the outbox. The leader's [`deliver_loop`] then walks the
//! outbox: for each recipient without a result it calls the recipient cell's `Deliver` at the addresses its
//! [`MailConfig::homes`] name (store and forward: an unreachable recipient is retried with exponential backoff until
//! [`RetryPolicy::give_up_after`]), and records delivered, denied, no home or failed. A new leader takes over from
//! what the results say; a recipient that gets an envelope twice stores it once.
//!
//! Receiving opens and verifies the envelope (fail-closed: nothing unverified is stored), stores it in the inbox, and
//! records a verified provenance row. A provenance row that cannot be written is logged and counted, and the mail goes
//! on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use cellog_core::{Body, Command, Headers, Outcome, PIN_HEADER, PublishRequest, Record, Rejection, StreamConfig};
use cellog_envelope::{CellKey, Direction, Envelope, Keyring, OpenError, ProvenanceRow, SealError, open, seal};
use cellog_proto::v1::{self, DeliveryResult, ErrorDetail};
use cellog_raft::storage::Storage;
use cellog_raft::transition::TARGET as TRANSITIONS;
use cellog_raft::{BodyError, CellNode, ProposeError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::client::{Client, ClientError, ClientOptions};
use crate::metrics::Metrics;
use crate::service::answered;
use crate::status::{from_propose, from_rejection, invalid_argument, status};

/// Envelopes waiting to be delivered, and delivered.
pub const OUTBOX: &str = "mail-outbox";
/// Envelopes delivered to this cell.
pub const INBOX: &str = "mail-inbox";
/// Provenance rows, each pinning its envelope.
pub const PROVENANCE: &str = "mail-provenance";
/// One final delivery result per envelope and recipient.
pub const RESULTS: &str = "mail-results";
/// The largest payload one envelope seals (its envelope must fit a stream's 8 MiB payload limit).
pub const MAX_MAIL_PAYLOAD: usize = 4 * 1024 * 1024;
/// The header naming an inbox envelope's sender cell.
pub const SENDER_HEADER: &str = "Mail-Sender";
/// The headers of a result record.
pub const RESULT_HEADER: &str = "Mail-Result";
const DETAIL_HEADER: &str = "Mail-Detail";
const ATTEMPTS_HEADER: &str = "Mail-Attempts";

const DAY_MS: u64 = 24 * 3600 * 1000;
/// How long the inbox remembers an envelope id (and so how long a late repeat is still recognized).
pub const INBOX_DEDUP_MS: u64 = 7 * DAY_MS;
/// Most recipients of one envelope.
pub const MAX_RECIPIENTS: usize = 64;
/// Most delivery attempts made at once by one leader.
const PARALLEL_ATTEMPTS: usize = 64;

/// How delivery retries.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Pause after the first failed attempt; it doubles per attempt, up to `max`, with a spread of up to a half.
    pub first: Duration,
    /// Longest pause between attempts.
    pub max: Duration,
    /// After this long since sealing, an unreachable recipient's result is FAILED. Must stay well below
    /// [`INBOX_DEDUP_MS`], so a late repeat is still recognized as one.
    pub give_up_after: Duration,
    /// Deadline of one attempt (following the recipient cell's leader included).
    pub attempt_timeout: Duration,
    /// How often the leader looks at the outbox when nothing wakes it.
    pub poll: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first: Duration::from_millis(200),
            max: Duration::from_secs(30),
            give_up_after: Duration::from_secs(24 * 3600),
            attempt_timeout: Duration::from_secs(5),
            poll: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The pause after attempt `attempt` (1-based) of delivering `id` to `cell`: exponential, spread by a hash of
    /// both so that many envelopes held by one outage do not all retry at once (no random draw: the same envelope
    /// retries on the same schedule in every run).
    pub fn backoff(&self, id: &str, cell: &str, attempt: u32) -> Duration {
        let doubled = self.first.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let base = doubled.min(self.max);
        let spread = crc32c::crc32c(format!("{id}/{cell}/{attempt}").as_bytes()) % 1000;
        base + base.mul_f64(f64::from(spread) / 2000.0)
    }
}

/// What a node needs to send and receive sealed mail.
#[derive(Clone)]
pub struct MailConfig {
    /// The cell's key pair (the same on every node of the cell).
    pub key: CellKey,
    /// Other cells' public keys.
    pub keyring: Keyring,
    /// The data directory whose keyring is read again when an envelope's sender is not in the keyring, so that a key
    /// imported with `cellog keys import` while the node runs is used. `None`: the keyring given is all there is.
    pub keyring_dir: Option<PathBuf>,
    /// Where other cells are reached: cell name to client addresses of (some of) its nodes.
    pub homes: BTreeMap<String, Vec<String>>,
    /// Retries.
    pub retry: RetryPolicy,
    /// Seeds the envelope ids this node picks.
    pub id_seed: u64,
}

impl std::fmt::Debug for MailConfig {
    /// The key by its fingerprint only: a key's own `Debug` may show secret material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailConfig")
            .field("cell", &self.key.cell())
            .field("key", &self.key.fingerprint())
            .field("keyring", &self.keyring.list().map(|peer| &peer.cell).collect::<Vec<_>>())
            .field("keyring_dir", &self.keyring_dir)
            .field("homes", &self.homes)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A node's sealed mail: its keys, where other cells live, and the delivery attempts in progress.
pub struct Mailroom {
    key: CellKey,
    keyring: RwLock<Keyring>,
    keyring_dir: Option<PathBuf>,
    homes: BTreeMap<String, Vec<String>>,
    retry: RetryPolicy,
    ids: Mutex<ChaCha12Rng>,
    wake: Notify,
    metrics: Arc<Metrics>,
    /// (envelope id, recipient) → attempts so far and the last error, while pending on this node.
    attempts: Mutex<BTreeMap<(String, String), (u32, String)>>,
    clients: Mutex<BTreeMap<String, Client>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn failed(code: Code, reason: &str, message: impl Into<String>) -> Status {
    status(code, ErrorDetail { reason: reason.to_string(), message: message.into(), ..ErrorDetail::default() })
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

/// A record's payload read from this node's storage: `None` for a tombstone or a message removed since the record
/// was taken, an error for a body this node cannot read. Called with the replica's lock released.
fn payload<S: Storage + Clone>(node: &CellNode<S>, stream: &str, record: &Record) -> Result<Option<Bytes>, String> {
    if matches!(record.body, Body::Tombstone { .. }) {
        return Ok(None);
    }
    match node.payload(stream, record) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(BodyError::Removed { .. }) => Ok(None),
        Err(error @ BodyError::Unreadable { .. }) => Err(error.to_string()),
    }
}

fn check_token(what: &str, text: &str) -> Result<(), String> {
    cellog_core::subject::validate_name(text).map_err(|reason| format!("{what} {text:?} {reason}"))
}

/// How one delivery attempt ended.
enum Attempt {
    Delivered,
    Denied(String),
    NoHome,
    Unreachable(String),
}

impl Mailroom {
    /// A mailroom for `config`, counting into `metrics`.
    pub fn new(config: MailConfig, metrics: Arc<Metrics>) -> Self {
        Mailroom {
            key: config.key,
            keyring: RwLock::new(config.keyring),
            keyring_dir: config.keyring_dir,
            homes: config.homes,
            retry: config.retry,
            ids: Mutex::new(ChaCha12Rng::seed_from_u64(config.id_seed)),
            wake: Notify::new(),
            metrics,
            attempts: Mutex::new(BTreeMap::new()),
            clients: Mutex::new(BTreeMap::new()),
        }
    }

    /// This cell's name.
    pub fn cell(&self) -> &str {
        self.key.cell()
    }

    fn new_id(&self) -> String {
        let bytes: [u8; 16] = lock(&self.ids).r#gen();
        hex::encode(bytes)
    }

    /// Creates the mail streams that do not exist yet (an operator may have changed an existing one's limits; that
    /// is kept).
    pub async fn ensure_streams<S: Storage + Clone>(&self, node: &CellNode<S>) -> Result<(), Status> {
        for (name, config) in stream_configs() {
            if lock(&node.replica).cell.stream_info(name).is_ok() {
                continue;
            }
            let command = Command::CreateStream { name: name.to_string(), config };
            match node.propose_now(command).await {
                Ok(Ok(_) | Err(Rejection::Conflict { .. })) => {}
                Ok(Err(rejection)) => {
                    return Err(failed(
                        Code::FailedPrecondition,
                        "MAIL_STREAMS",
                        format!("the mail stream {name:?} cannot be created: {rejection}"),
                    ));
                }
                Err(error) => return Err(from_propose(error)),
            }
        }
        Ok(())
    }

    /// Seals `request.payload` for its recipients and stores the envelope in the outbox; the leader delivers it.
    pub async fn send<S: Storage + Clone>(
        &self,
        node: &CellNode<S>,
        request: v1::SendSealedRequest,
    ) -> Result<v1::SendSealedResponse, Status> {
        if request.payload.len() > MAX_MAIL_PAYLOAD {
            return Err(failed(
                Code::InvalidArgument,
                "PAYLOAD_TOO_LARGE",
                format!("a sealed payload of {} bytes exceeds the limit of {MAX_MAIL_PAYLOAD}", request.payload.len()),
            ));
        }
        if request.recipients.len() > MAX_RECIPIENTS {
            return Err(invalid_argument(format!(
                "{} recipients; one envelope has at most {MAX_RECIPIENTS}",
                request.recipients.len()
            )));
        }
        for cell in &request.recipients {
            check_token("recipient", cell).map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        }
        let id = if request.envelope_id.is_empty() { self.new_id() } else { request.envelope_id.clone() };
        check_token("envelope id", &id).map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        if !node.is_leader() {
            return Err(from_propose(ProposeError::NotLeader { leader: node.leader() }));
        }
        self.ensure_streams(node).await?;
        let subject = format!("mail.out.{id}");
        let existing = lock(&node.replica).cell.last_for_subject(OUTBOX, &subject).ok();
        if let Some(record) = existing {
            let envelope = payload(node, OUTBOX, &record).ok().flatten();
            return Ok(v1::SendSealedResponse {
                envelope_id: id,
                outbox_seq: record.seq,
                duplicate: true,
                envelope_bytes: envelope.map_or(0, |bytes| bytes.len() as u64),
            });
        }
        let recipients: Vec<&str> = request.recipients.iter().map(String::as_str).collect();
        let now = node.now();
        let sealed = {
            let keyring = self.keyring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            seal(&self.key, &keyring, &recipients, id.clone(), now.0, &request.payload)
        }
        .map_err(|error| match &error {
            SealError::UnknownRecipient { .. } => failed(Code::NotFound, "UNKNOWN_RECIPIENT", error.to_string()),
            SealError::NoRecipients | SealError::DuplicateRecipient { .. } => invalid_argument(error.to_string()),
            _ => failed(Code::Internal, "SEAL_FAILED", error.to_string()),
        })?;
        let wire = Bytes::from(sealed.envelope.encode());
        let envelope_bytes = wire.len() as u64;
        let headers: Headers = BTreeMap::from([("Mail-Recipients".to_string(), request.recipients.join(","))]);
        let publish = PublishRequest { msg_id: Some(id.clone()), headers, ..PublishRequest::new(subject, wire) };
        let ack = match answered(node.propose_now(Command::Publish(publish)).await)? {
            Outcome::Published(ack) => ack,
            other => return Err(Status::internal(format!("unexpected outcome {other:?}"))),
        };
        if !ack.duplicate {
            self.record_row(node, &sealed.provenance, ack.seq).await;
        }
        self.wake.notify_one();
        Ok(v1::SendSealedResponse { envelope_id: id, outbox_seq: ack.seq, duplicate: ack.duplicate, envelope_bytes })
    }

    /// Records a provenance row pinning its envelope (outbox sequence for a sent row, inbox for a received one).
    /// Fail-soft: a failure is logged and counted, never returned.
    async fn record_row<S: Storage + Clone>(&self, node: &CellNode<S>, row: &ProvenanceRow, seq: u64) {
        let (direction, stream) = match row.direction {
            Direction::Sent => ("sent", OUTBOX),
            Direction::Received => ("received", INBOX),
        };
        let text = match toml::to_string(row) {
            Ok(text) => text,
            Err(error) => {
                self.provenance_failed(row, &error.to_string());
                return;
            }
        };
        let headers: Headers = BTreeMap::from([(PIN_HEADER.to_string(), format!("{stream}/0/{seq}"))]);
        let publish = PublishRequest {
            msg_id: Some(format!("{direction}/{}", row.envelope_id)),
            headers,
            ..PublishRequest::new(format!("mail.provenance.{direction}.{}", row.envelope_id), Bytes::from(text))
        };
        if let Err(error) = answered(node.propose_now(Command::Publish(publish)).await) {
            self.provenance_failed(row, error.message());
        }
    }

    fn provenance_failed(&self, row: &ProvenanceRow, reason: &str) {
        self.metrics.provenance_failures.inc();
        tracing::warn!(
            envelope = %row.envelope_id,
            direction = ?row.direction,
            %reason,
            "provenance row not recorded; the mail goes on"
        );
    }

    /// Opens an envelope, reading the keyring again once if its sender is unknown.
    fn open(&self, bytes: &[u8], now_ms: u64) -> Result<cellog_envelope::Opened, OpenError> {
        let first = {
            let keyring = self.keyring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            open(&self.key, &keyring, bytes, now_ms)
        };
        match (&first, &self.keyring_dir) {
            (Err(OpenError::UnknownSigner { .. }), Some(dir)) => match Keyring::open(dir) {
                Ok(fresh) => {
                    let mut keyring = self.keyring.write().unwrap_or_else(|poisoned| poisoned.into_inner());
                    *keyring = fresh;
                    open(&self.key, &keyring, bytes, now_ms)
                }
                Err(error) => {
                    tracing::warn!(%error, "the keyring could not be read again");
                    first
                }
            },
            _ => first,
        }
    }

    /// Takes in an envelope for this cell: opens and verifies it, stores it in the inbox (once per envelope id) and
    /// records a verified provenance row.
    pub async fn receive<S: Storage + Clone>(
        &self,
        node: &CellNode<S>,
        bytes: Bytes,
    ) -> Result<v1::DeliverResponse, Status> {
        if bytes.len() > cellog_core::MAX_PAYLOAD_LIMIT as usize {
            return Err(failed(
                Code::InvalidArgument,
                "PAYLOAD_TOO_LARGE",
                format!("an envelope of {} bytes exceeds the limit of {}", bytes.len(), cellog_core::MAX_PAYLOAD_LIMIT),
            ));
        }
        if !node.is_leader() {
            return Err(from_propose(ProposeError::NotLeader { leader: node.leader() }));
        }
        self.ensure_streams(node).await?;
        let opened = self
            .open(&bytes, node.now().0)
            .map_err(|error| failed(Code::PermissionDenied, "DENIED", error.to_string()))?;
        let header = &opened.header;
        for (what, text) in [("envelope id", &header.id), ("sender", &header.sender)] {
            check_token(what, text).map_err(|message| failed(Code::PermissionDenied, "DENIED", message))?;
        }
        let headers: Headers = BTreeMap::from([(SENDER_HEADER.to_string(), header.sender.clone())]);
        let publish = PublishRequest {
            msg_id: Some(header.id.clone()),
            headers,
            ..PublishRequest::new(format!("mail.in.{}", header.sender), bytes)
        };
        let ack = match answered(node.propose_now(Command::Publish(publish)).await)? {
            Outcome::Published(ack) => ack,
            other => return Err(Status::internal(format!("unexpected outcome {other:?}"))),
        };
        // Fingerprints and the plaintext's hash, never signature bytes (they carry random salt).
        tracing::info!(
            target: TRANSITIONS,
            envelope = %header.id,
            sender = %header.sender,
            signer = %header.sender_fingerprint,
            plaintext_sha256 = %opened.provenance.payload_sha256,
            seq = ack.seq,
            "{}",
            if ack.duplicate { "mail-again" } else { "mail-received" }
        );
        if !ack.duplicate {
            self.record_row(node, &opened.provenance, ack.seq).await;
        }
        Ok(v1::DeliverResponse { inbox_seq: ack.seq, duplicate: ack.duplicate })
    }

    /// The inbox from `from_seq` on, opened.
    pub fn read<S: Storage + Clone>(
        &self,
        node: &CellNode<S>,
        from_seq: u64,
        max: usize,
    ) -> Result<v1::ReadMailResponse, Status> {
        let records = match lock(&node.replica).cell.read_from(INBOX, 0, from_seq, max) {
            Ok(records) => records,
            Err(Rejection::StreamNotFound { .. }) => Vec::new(),
            Err(rejection) => return Err(from_rejection(&rejection)),
        };
        let mut mail = Vec::with_capacity(records.len());
        for record in records {
            let bytes = payload(node, INBOX, &record).map_err(|reason| {
                let message = format!("this node cannot read inbox message {}: {reason}", record.seq);
                failed(Code::DataLoss, "BODY_UNREADABLE", message)
            })?;
            let Some(bytes) = bytes else { continue };
            let opened = self.open(&bytes, record.stored_at.0).map_err(|error| {
                failed(
                    Code::DataLoss,
                    "UNREADABLE_MAIL",
                    format!("inbox message {} no longer opens: {error}", record.seq),
                )
            })?;
            mail.push(v1::Mail {
                seq: record.seq,
                envelope_id: opened.header.id,
                sender: opened.header.sender,
                sender_fingerprint: opened.header.sender_fingerprint,
                recipients: opened.header.recipients.into_iter().map(|recipient| recipient.cell).collect(),
                created_ms: opened.header.created_ms,
                received_ms: record.stored_at.0,
                payload: opened.payload,
            });
        }
        Ok(v1::ReadMailResponse { mail })
    }

    /// One result per recipient of an envelope this cell sent.
    pub fn status<S: Storage + Clone>(
        &self,
        node: &CellNode<S>,
        id: &str,
    ) -> Result<v1::DeliveryStatusResponse, Status> {
        let not_found = || failed(Code::NotFound, "ENVELOPE_NOT_FOUND", format!("no envelope {id:?} in the outbox"));
        check_token("envelope id", id).map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        let record = lock(&node.replica).cell.last_for_subject(OUTBOX, &format!("mail.out.{id}"));
        let record = record.map_err(|_| not_found())?;
        let bytes = payload(node, OUTBOX, &record)
            .map_err(|reason| failed(Code::DataLoss, "BODY_UNREADABLE", format!("outbox envelope {id:?}: {reason}")))?
            .ok_or_else(not_found)?;
        let envelope = Envelope::decode(&bytes).map_err(|_| {
            failed(Code::DataLoss, "UNREADABLE_MAIL", format!("outbox envelope {id:?} does not decode"))
        })?;
        let replica = lock(&node.replica);
        let attempts = lock(&self.attempts);
        let mut response = v1::DeliveryStatusResponse { envelope_id: id.to_string(), ..Default::default() };
        for recipient in &envelope.header.recipients {
            let subject = format!("mail.results.{id}.{}", recipient.cell);
            let status = match replica.cell.last_for_subject(RESULTS, &subject) {
                Ok(result) => result_status(&recipient.cell, &result),
                Err(_) => {
                    let (n, last_error) =
                        attempts.get(&(id.to_string(), recipient.cell.clone())).cloned().unwrap_or_default();
                    v1::RecipientStatus {
                        cell: recipient.cell.clone(),
                        result: DeliveryResult::Pending as i32,
                        detail: last_error,
                        attempts: n,
                        at_ms: 0,
                    }
                }
            };
            match DeliveryResult::try_from(status.result).unwrap_or(DeliveryResult::Pending) {
                DeliveryResult::Delivered => response.delivered += 1,
                DeliveryResult::Denied => response.denied += 1,
                DeliveryResult::NoHome => response.no_home += 1,
                DeliveryResult::Failed => response.failed += 1,
                _ => response.pending += 1,
            }
            response.recipients.push(status);
        }
        Ok(response)
    }

    fn client_for(&self, cell: &str) -> Option<Result<Client, ClientError>> {
        let addrs = self.homes.get(cell).filter(|addrs| !addrs.is_empty())?;
        let mut clients = lock(&self.clients);
        if let Some(client) = clients.get(cell) {
            return Some(Ok(client.clone()));
        }
        let options = ClientOptions {
            retry_for: self.retry.attempt_timeout,
            attempt_timeout: self.retry.attempt_timeout,
            backoff: Duration::from_millis(50),
            discover: true,
        };
        let client = Client::new(addrs.iter().cloned(), options);
        if let Ok(client) = &client {
            clients.insert(cell.to_string(), client.clone());
        }
        Some(client)
    }

    /// One attempt to deliver `bytes` to `cell`.
    async fn attempt<S: Storage + Clone>(&self, node: &CellNode<S>, cell: &str, bytes: Bytes) -> Attempt {
        self.metrics.mail_attempts.inc();
        if cell == self.cell() {
            return match self.receive(node, bytes).await {
                Ok(_) => Attempt::Delivered,
                Err(status) if status.code() == Code::PermissionDenied => Attempt::Denied(status.message().to_string()),
                Err(status) => Attempt::Unreachable(status.message().to_string()),
            };
        }
        let client = match self.client_for(cell) {
            None => return Attempt::NoHome,
            Some(Err(error)) => return Attempt::Denied(format!("bad address for {cell:?}: {error}")),
            Some(Ok(client)) => client,
        };
        // The client's deadline is advice to the server; a link that holds packets back would hold this attempt,
        // and every attempt after it, for as long. Bounded here.
        let Ok(answer) = tokio::time::timeout(self.retry.attempt_timeout, client.deliver(bytes)).await else {
            return Attempt::Unreachable(format!("no answer within {:?}", self.retry.attempt_timeout));
        };
        match answer {
            Ok(_) => Attempt::Delivered,
            Err(error) => match error.code() {
                Some(Code::PermissionDenied | Code::InvalidArgument | Code::Unimplemented) => {
                    Attempt::Denied(error.to_string())
                }
                Some(Code::FailedPrecondition) if error.reason() == Some("NO_CELL_KEY") => {
                    Attempt::Denied(error.to_string())
                }
                _ => Attempt::Unreachable(error.to_string()),
            },
        }
    }

    /// Records a recipient's final result. False if it could not be (this node no longer leads, say): the recipient
    /// stays pending, and whoever leads next delivers again (the recipient stores it once).
    async fn record_result<S: Storage + Clone>(
        &self,
        node: &CellNode<S>,
        id: &str,
        cell: &str,
        result: DeliveryResult,
        detail: &str,
        attempts: u32,
    ) -> bool {
        let name = match result {
            DeliveryResult::Delivered => "delivered",
            DeliveryResult::Denied => "denied",
            DeliveryResult::NoHome => "no-home",
            DeliveryResult::Failed => "failed",
            DeliveryResult::Pending | DeliveryResult::Unspecified => return false,
        };
        let mut headers: Headers = BTreeMap::from([
            (RESULT_HEADER.to_string(), name.to_string()),
            (ATTEMPTS_HEADER.to_string(), attempts.to_string()),
        ]);
        if !detail.is_empty() {
            // Headers are bounded; a long error keeps its start.
            let detail: String = detail.chars().filter(|c| !c.is_control()).take(512).collect();
            headers.insert(DETAIL_HEADER.to_string(), detail);
        }
        let publish = PublishRequest {
            msg_id: Some(format!("{id}/{cell}")),
            headers,
            ..PublishRequest::new(format!("mail.results.{id}.{cell}"), Bytes::new())
        };
        match answered(node.propose_now(Command::Publish(publish)).await) {
            Ok(_) => {
                tracing::info!(target: TRANSITIONS, envelope = id, recipient = cell, result = name, attempts, "mail-result");
                true
            }
            Err(error) => {
                tracing::debug!(envelope = id, recipient = cell, %error, "mail result not recorded yet");
                false
            }
        }
    }
}

fn result_status(cell: &str, record: &Record) -> v1::RecipientStatus {
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

/// An outbox envelope with recipients still pending.
struct Job {
    id: String,
    bytes: Bytes,
    sealed_at_ms: u64,
    /// Recipient → attempts made, and when the next may start (`None` while one is in flight).
    pending: BTreeMap<String, (u32, Option<Instant>)>,
}

/// How an attempt ended, with the leadership it was started under, its outbox sequence, envelope id and recipient.
type Settled = (u64, u64, String, String, Attempt);

/// While this node leads, delivers the outbox (see the module's documentation). Runs until `stopped`.
///
/// Each attempt is a task of its own (up to [`PARALLEL_ATTEMPTS`] at once), bounded by
/// [`RetryPolicy::attempt_timeout`] and settled as it ends, so a recipient that does not answer holds back no other.
#[allow(
    clippy::disallowed_methods,
    reason = "retries are scheduled on the runtime's clock, which the simulator drives"
)]
pub async fn deliver_loop<S: Storage + Clone + Send + Sync + 'static>(
    mail: Arc<Mailroom>,
    node: Arc<CellNode<S>>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut jobs: BTreeMap<u64, Job> = BTreeMap::new();
    let (settled_tx, mut settled_rx) = tokio::sync::mpsc::unbounded_channel::<Settled>();
    let mut flights: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    // Attempts started under an earlier leadership of this node are ignored when they end.
    let mut term = 0u64;
    let mut scanned = 0u64;
    let mut leading = false;
    loop {
        if *stopped.borrow() {
            flights.iter().for_each(tokio::task::JoinHandle::abort);
            return;
        }
        flights.retain(|flight| !flight.is_finished());
        let mut next_wake = Instant::now() + mail.retry.poll;
        if !node.is_leader() {
            if leading {
                // Whoever leads next starts over from the outbox and the results.
                flights.drain(..).for_each(|flight| flight.abort());
                jobs.clear();
                lock(&mail.attempts).clear();
                scanned = 0;
                leading = false;
            }
        } else if !leading && mail.ensure_streams(&node).await.is_err() {
            // Leadership may have just moved; try again on the next round.
        } else {
            if !leading {
                term += 1;
                leading = true;
            }
            scan_outbox(&node, &mut jobs, &mut scanned);
            let now = Instant::now();
            'start: for (&seq, job) in jobs.iter_mut() {
                for (cell, (_, at)) in job.pending.iter_mut() {
                    if flights.len() >= PARALLEL_ATTEMPTS {
                        break 'start;
                    }
                    if at.is_none_or(|at| at > now) {
                        continue;
                    }
                    *at = None;
                    let (mail, node, tx) = (mail.clone(), node.clone(), settled_tx.clone());
                    let (id, cell, bytes) = (job.id.clone(), cell.clone(), job.bytes.clone());
                    flights.push(tokio::spawn(async move {
                        let outcome = mail.attempt(&node, &cell, bytes).await;
                        let _ = tx.send((term, seq, id, cell, outcome));
                    }));
                }
            }
            let waiting = jobs.values().flat_map(|job| job.pending.values().filter_map(|(_, at)| *at));
            if let Some(due) = waiting.min() {
                next_wake = next_wake.min(due);
            }
        }
        // `biased`: branches are polled in this order, never in an order drawn at random, so a simulated run repeats.
        tokio::select! {
            biased;
            Some((started, seq, id, cell, outcome)) = settled_rx.recv() => {
                if leading && started == term {
                    settle(&mail, &node, &mut jobs, seq, id, cell, outcome).await;
                }
            }
            _ = tokio::time::sleep_until(next_wake) => {}
            _ = mail.wake.notified() => {}
            changed = stopped.changed() => {
                // The node is stopping, or was dropped without a stop.
                if changed.is_err() {
                    flights.iter().for_each(tokio::task::JoinHandle::abort);
                    return;
                }
            }
        }
    }
}

/// Adds the outbox envelopes after `scanned` whose recipients lack a result.
#[allow(
    clippy::disallowed_methods,
    reason = "retries are scheduled on the runtime's clock, which the simulator drives"
)]
fn scan_outbox<S: Storage + Clone>(node: &CellNode<S>, jobs: &mut BTreeMap<u64, Job>, scanned: &mut u64) {
    let records = lock(&node.replica).cell.read_from(OUTBOX, 0, *scanned + 1, 256);
    let Ok(records) = records else { return };
    let now = Instant::now();
    for record in records {
        let bytes = match payload(node, OUTBOX, &record) {
            Ok(bytes) => bytes,
            Err(reason) => {
                // Not skipped: a skipped envelope would never be delivered by this leader. Scanning resumes here.
                tracing::error!(
                    seq = record.seq,
                    reason,
                    "an outbox envelope cannot be read on this node; delivery waits"
                );
                return;
            }
        };
        *scanned = record.seq;
        let Some(bytes) = bytes else { continue };
        let envelope = match Envelope::decode(&bytes) {
            Ok(envelope) => envelope,
            Err(error) => {
                tracing::error!(seq = record.seq, %error, "an outbox message is not an envelope; skipped");
                continue;
            }
        };
        let id = envelope.header.id;
        let replica = lock(&node.replica);
        let pending: BTreeMap<String, (u32, Option<Instant>)> = envelope
            .header
            .recipients
            .into_iter()
            .filter(|recipient| {
                replica.cell.last_for_subject(RESULTS, &format!("mail.results.{id}.{}", recipient.cell)).is_err()
            })
            .map(|recipient| (recipient.cell, (0, Some(now))))
            .collect();
        drop(replica);
        if !pending.is_empty() {
            jobs.insert(record.seq, Job { id, bytes, sealed_at_ms: record.stored_at.0, pending });
        }
    }
}

/// Takes in how an attempt ended: records a final result, or schedules the next attempt.
#[allow(
    clippy::disallowed_methods,
    reason = "retries are scheduled on the runtime's clock, which the simulator drives"
)]
async fn settle<S: Storage + Clone>(
    mail: &Mailroom,
    node: &CellNode<S>,
    jobs: &mut BTreeMap<u64, Job>,
    seq: u64,
    id: String,
    cell: String,
    outcome: Attempt,
) {
    let Some(job) = jobs.get_mut(&seq) else { return };
    let Some(&(n, _)) = job.pending.get(&cell) else { return };
    let n = n + 1;
    let (result, detail) = match outcome {
        Attempt::Delivered => (DeliveryResult::Delivered, String::new()),
        Attempt::Denied(reason) => (DeliveryResult::Denied, reason),
        Attempt::NoHome => (DeliveryResult::NoHome, format!("no address is known for cell {cell:?}")),
        Attempt::Unreachable(reason) => {
            let give_up_ms = u64::try_from(mail.retry.give_up_after.as_millis()).unwrap_or(u64::MAX);
            if node.now().0.saturating_sub(job.sealed_at_ms) < give_up_ms {
                tracing::debug!(envelope = %id, recipient = %cell, attempt = n, %reason, "mail not delivered yet");
                let next = Instant::now() + mail.retry.backoff(&id, &cell, n);
                job.pending.insert(cell.clone(), (n, Some(next)));
                lock(&mail.attempts).insert((id, cell), (n, reason));
                return;
            }
            (DeliveryResult::Failed, format!("gave up after {n} attempts; last: {reason}"))
        }
    };
    if mail.record_result(node, &id, &cell, result, &detail, n).await {
        if let Some(job) = jobs.get_mut(&seq) {
            job.pending.remove(&cell);
            if job.pending.is_empty() {
                jobs.remove(&seq);
            }
        }
        lock(&mail.attempts).remove(&(id, cell));
    } else if let Some(job) = jobs.get_mut(&seq) {
        job.pending.insert(cell, (n, Some(Instant::now() + mail.retry.first)));
    }
}

//! The mailroom of a node: its cell's key and keyring, where other cells live, and the outbox schedule. It seals and
//! stores what is sent, opens, verifies and stores what is delivered, reads the inbox, and makes and settles delivery
//! attempts for the loop in [`crate::deliver`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cellog_client::status::{detail_of, failed};
use cellog_client::{Client, ClientError, ClientOptions, ClientTls};
use cellog_core::{Command, Headers, Outcome, PIN_HEADER, PublishRequest, TRANSITIONS};
use cellog_envelope::{CellKey, Direction, Envelope, Keyring, OpenError, ProvenanceRow, SealError, open, seal};
use cellog_proto::v1::{self, DeliveryResult};
use prometheus_client::metrics::counter::Counter;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::cell::MailCell;
use crate::outbox::{Attempt, Outbox, RetryPolicy, Settled};
use crate::schema::{
    ATTEMPTS_HEADER, DETAIL_HEADER, MAX_DETAIL_CHARS, MAX_MAIL_PAYLOAD, MAX_RECIPIENTS, OUTBOX, RECIPIENTS_HEADER,
    RESERVED, RESULT_HEADER, RESULTS, SENDER_HEADER, check_fresh, inbox_msg_id, inbox_stream, inbox_subject, mail_key,
    outbox_subject, pin, provenance_msg_id, provenance_subject, reserved, result_msg_id, result_name, result_status,
    result_subject, stream_configs, tenant_inbox_config,
};
use cellog_core::tenant::{tenant_of, validate_scoped_name};

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
    /// The CA certificate (PEM) of each other cell whose nodes serve TLS: its nodes are reached over TLS and verified
    /// with it. A cell without one is reached in plaintext (the envelope is sealed and signed either way).
    pub home_cas: BTreeMap<String, Vec<u8>>,
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
            .field("home_cas", &self.home_cas.keys().collect::<Vec<_>>())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// What mail counts, for the node's metrics.
#[derive(Clone, Debug, Default)]
pub struct MailMetrics {
    /// Delivery attempts made by this node, successful or not.
    pub attempts: Counter,
    /// Provenance rows that could not be recorded (the mail went on).
    pub provenance_failures: Counter,
}

/// Longest a delivery waits for its turn to be opened (see `Mailroom::opening`).
pub const OPENING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A node's sealed mail: its keys, where other cells live, and the delivery schedule while it leads.
pub struct Mailroom {
    keys: Arc<Keys>,
    homes: BTreeMap<String, Vec<String>>,
    home_cas: BTreeMap<String, Vec<u8>>,
    pub(crate) retry: RetryPolicy,
    ids: Mutex<ChaCha12Rng>,
    pub(crate) wake: Notify,
    metrics: MailMetrics,
    pub(crate) outbox: Mutex<Outbox<Instant>>,
    clients: Mutex<BTreeMap<String, Client>>,
    /// One envelope is opened (decrypted and verified, up to 8 MiB of OpenPGP) at a time, on a blocking thread: a
    /// delivery carries no credential of this cell, so a flood of them takes one blocking thread, and none of the
    /// node's runtime threads.
    opening: tokio::sync::Semaphore,
}

/// This cell's key and the keyring of the cells it trusts: what opening and sealing an envelope need, shared with
/// the blocking thread an envelope is opened on.
struct Keys {
    key: CellKey,
    keyring: RwLock<Keyring>,
    keyring_dir: Option<PathBuf>,
    /// The keyring directory's modification time when the keyring was last read from it. An unknown signer re-reads
    /// the directory only when it changed since (a key file added, removed or renamed into place), so a flood of
    /// envelopes from a cell nobody trusts costs a `stat` each, not a read of every key.
    keyring_read_at: Mutex<Option<SystemTime>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Creates a mail stream (`what` names it in an error). One made meanwhile is taken as made (`CONFLICT`); a proposal
/// that never landed (leadership moving) comes back as it is, for the caller to retry; any other refusal is
/// `MAIL_STREAMS`.
async fn create_stream(
    cell: &impl MailCell,
    name: &str,
    config: cellog_core::StreamConfig,
    what: &str,
) -> Result<(), Status> {
    match cell.propose(Command::CreateStream { name: name.to_string(), config }).await {
        Ok(_) => Ok(()),
        Err(status) if detail_of(&status).reason == "CONFLICT" => Ok(()),
        Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown) => Err(status),
        Err(status) => Err(failed(
            Code::FailedPrecondition,
            "MAIL_STREAMS",
            format!("{what} cannot be created: {}", status.message()),
        )),
    }
}

impl Keys {
    /// Opens an envelope, reading the keyring again once if its sender is unknown.
    fn open(&self, bytes: &[u8], now_ms: u64) -> Result<cellog_envelope::Opened, OpenError> {
        let first = {
            let keyring = self.keyring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            open(&self.key, &keyring, bytes, now_ms)
        };
        let (Err(OpenError::UnknownSigner { .. }), Some(dir)) = (&first, &self.keyring_dir) else { return first };
        let changed = modified(dir);
        let mut read_at = lock(&self.keyring_read_at);
        if changed.is_some() && changed == *read_at {
            return first;
        }
        match Keyring::open(dir) {
            Ok(fresh) => {
                *read_at = changed;
                let mut keyring = self.keyring.write().unwrap_or_else(|poisoned| poisoned.into_inner());
                *keyring = fresh;
                open(&self.key, &keyring, bytes, now_ms)
            }
            Err(error) => {
                tracing::warn!(%error, "the keyring could not be read again");
                first
            }
        }
    }
}

/// A directory's modification time, if it can be read.
fn modified(dir: &Path) -> Option<SystemTime> {
    std::fs::metadata(dir).and_then(|metadata| metadata.modified()).ok()
}

fn check_token(what: &str, text: &str) -> Result<(), String> {
    cellog_core::subject::validate_name(text).map_err(|reason| format!("{what} {text:?} {reason}"))
}

fn published(outcome: Outcome) -> Result<cellog_core::PublishAck, Status> {
    match outcome {
        Outcome::Published(ack) => Ok(ack),
        other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
    }
}

impl Mailroom {
    /// A mailroom for `config`, counting into `metrics`.
    pub fn new(config: MailConfig, metrics: MailMetrics) -> Self {
        Mailroom {
            keys: Arc::new(Keys {
                key: config.key,
                keyring: RwLock::new(config.keyring),
                keyring_read_at: Mutex::new(config.keyring_dir.as_deref().and_then(modified)),
                keyring_dir: config.keyring_dir,
            }),
            homes: config.homes,
            home_cas: config.home_cas,
            retry: config.retry,
            ids: Mutex::new(ChaCha12Rng::seed_from_u64(config.id_seed)),
            wake: Notify::new(),
            metrics,
            outbox: Mutex::new(Outbox::new()),
            clients: Mutex::new(BTreeMap::new()),
            opening: tokio::sync::Semaphore::new(1),
        }
    }

    /// This cell's name.
    pub fn cell(&self) -> &str {
        self.keys.key.cell()
    }

    fn new_id(&self) -> String {
        let bytes: [u8; 16] = lock(&self.ids).r#gen();
        hex::encode(bytes)
    }

    /// Reserves the mail streams' subjects for the node (no principal may write, recall or delete them, nor change
    /// a stream onto them), creates the mail streams that do not exist yet, and verifies those that do: a stream of a
    /// mail stream's name that claims other subjects is not the node's (mail stops with `MAIL_STREAMS` until an
    /// operator removes it), and a deduplication window shorter than the schema's (from before the subjects were
    /// reserved) is raised to it, so that a replayed envelope is never taken twice. An existing stream's other limits
    /// are the operator's and are kept.
    pub async fn ensure_streams(&self, cell: &impl MailCell) -> Result<(), Status> {
        if !cell.is_reserved(RESERVED) {
            cell.propose(Command::ReserveSubjects { filter: RESERVED.to_string() }).await?;
        }
        for (name, config) in stream_configs() {
            let Some(existing) = cell.stream_config(name) else {
                create_stream(cell, name, config, &format!("the mail stream {name:?}")).await?;
                continue;
            };
            if existing.subjects != config.subjects {
                return Err(failed(
                    Code::FailedPrecondition,
                    "MAIL_STREAMS",
                    format!(
                        "the stream {name:?} is not the mail stream: it claims {:?}, not {:?}; remove it, and the node \
                         makes the mail stream",
                        existing.subjects, config.subjects
                    ),
                ));
            }
            if existing.duplicate_window_ms < config.duplicate_window_ms {
                let window = config.duplicate_window_ms;
                tracing::warn!(stream = name, window_ms = window, "raising a mail stream's deduplication window");
                let config = cellog_core::StreamConfig { duplicate_window_ms: window, ..existing };
                cell.propose(Command::UpdateStream { name: name.to_string(), config }).await?;
            }
        }
        Ok(())
    }

    /// Creates `tenant`'s inbox stream unless it exists, its subjects (`mail.>` in the tenant's scope) reserved for
    /// the node first, so that no principal of the tenant writes, recalls or deletes its mail. A stream of that name
    /// the tenant made itself is not an inbox: mail for the tenant is refused until it is removed.
    async fn ensure_tenant_inbox(&self, cell: &impl MailCell, tenant: &str) -> Result<(), Status> {
        let filter = reserved(Some(tenant));
        if !cell.is_reserved(&filter) {
            cell.propose(Command::ReserveSubjects { filter: filter.clone() }).await?;
        }
        let name = inbox_stream(Some(tenant));
        let config = tenant_inbox_config(tenant);
        if cell.stream_subjects(&name).is_none() {
            create_stream(cell, &name, config.clone(), &format!("tenant {tenant:?}'s inbox {name:?}")).await?;
        }
        match cell.stream_subjects(&name) {
            Some(subjects) if subjects == config.subjects => Ok(()),
            _ => Err(failed(
                Code::FailedPrecondition,
                "MAIL_STREAMS",
                format!("the stream {name:?} is not tenant {tenant:?}'s inbox (its subjects are not {filter})"),
            )),
        }
    }

    /// Seals `request.payload` from `principal` for its recipients and stores the envelope in the outbox; the leader
    /// delivers it. A tenant's principal's envelope is known by its tenant and id ([`mail_key`]), and is delivered
    /// to the same tenant's inbox in each recipient cell.
    pub async fn send(
        &self,
        cell: &impl MailCell,
        principal: &str,
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
            return Err(failed(
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
                format!("{} recipients; one envelope has at most {MAX_RECIPIENTS}", request.recipients.len()),
            ));
        }
        for recipient in &request.recipients {
            check_token("recipient", recipient)
                .map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        }
        let id = if request.envelope_id.is_empty() { self.new_id() } else { request.envelope_id.clone() };
        check_token("envelope id", &id).map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        cell.lead()?;
        self.ensure_streams(cell).await?;
        let key = mail_key(tenant_of(principal), &id);
        let subject = outbox_subject(&key);
        if let Some(record) = cell.last(OUTBOX, &subject) {
            let envelope = cell.payload(OUTBOX, &record).ok().flatten();
            return Ok(v1::SendSealedResponse {
                envelope_id: id,
                outbox_seq: record.seq,
                duplicate: true,
                envelope_bytes: envelope.map_or(0, |bytes| bytes.len() as u64),
            });
        }
        let recipients: Vec<&str> = request.recipients.iter().map(String::as_str).collect();
        let now_ms = cell.now_ms();
        let sealed = {
            let keyring = self.keys.keyring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            seal((&self.keys.key, principal), &keyring, &recipients, id.clone(), now_ms, &request.payload)
        }
        .map_err(|error| match &error {
            SealError::UnknownRecipient { .. } => failed(Code::NotFound, "UNKNOWN_RECIPIENT", error.to_string()),
            SealError::NoRecipients | SealError::DuplicateRecipient { .. } => {
                failed(Code::InvalidArgument, "INVALID_ARGUMENT", error.to_string())
            }
            _ => failed(Code::Internal, "SEAL_FAILED", error.to_string()),
        })?;
        let wire = Bytes::from(sealed.envelope.encode());
        let envelope_bytes = wire.len() as u64;
        let headers: Headers = BTreeMap::from([(RECIPIENTS_HEADER.to_string(), request.recipients.join(","))]);
        let publish = PublishRequest { msg_id: Some(key.clone()), headers, ..PublishRequest::new(subject, wire) };
        let ack = published(cell.propose(Command::Publish(publish)).await?)?;
        if !ack.duplicate {
            self.record_row(cell, &sealed.provenance, &key, (OUTBOX, ack.seq)).await;
        }
        self.wake.notify_one();
        Ok(v1::SendSealedResponse { envelope_id: id, outbox_seq: ack.seq, duplicate: ack.duplicate, envelope_bytes })
    }

    /// Records a provenance row under `key` pinning its envelope at `seq` of `stream` (the outbox for a sent row, an
    /// inbox for a received one). Fail-soft: a failure is logged and counted, never returned.
    async fn record_row(&self, cell: &impl MailCell, row: &ProvenanceRow, key: &str, (stream, seq): (&str, u64)) {
        let direction = match row.direction {
            Direction::Sent => "sent",
            Direction::Received => "received",
        };
        let text = match toml::to_string(row) {
            Ok(text) => text,
            Err(error) => {
                self.provenance_failed(row, &error.to_string());
                return;
            }
        };
        let headers: Headers = BTreeMap::from([(PIN_HEADER.to_string(), pin(stream, seq))]);
        let publish = PublishRequest {
            msg_id: Some(provenance_msg_id(direction, key)),
            headers,
            ..PublishRequest::new(provenance_subject(direction, key), Bytes::from(text))
        };
        if let Err(error) = cell.propose(Command::Publish(publish)).await {
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

    /// Opens `bytes` as [`Keys::open`] does, on a blocking thread (in simulation, in place).
    async fn open_aside(&self, bytes: Bytes, now_ms: u64) -> Result<cellog_envelope::Opened, OpenError> {
        let keys = self.keys.clone();
        #[cfg(not(madsim))]
        {
            match tokio::task::spawn_blocking(move || keys.open(&bytes, now_ms)).await {
                Ok(opened) => opened,
                Err(error) => std::panic::resume_unwind(error.into_panic()),
            }
        }
        #[cfg(madsim)]
        {
            keys.open(&bytes, now_ms)
        }
    }

    /// Takes in an envelope for this cell: opens and verifies it, refuses it unless it is fresh
    /// ([`crate::schema::check_fresh`]), stores it in the inbox (once per sender cell and envelope id) and records a
    /// verified provenance row.
    pub async fn receive(&self, cell: &impl MailCell, bytes: Bytes) -> Result<v1::DeliverResponse, Status> {
        if bytes.len() > cellog_core::MAX_PAYLOAD_LIMIT as usize {
            return Err(failed(
                Code::InvalidArgument,
                "PAYLOAD_TOO_LARGE",
                format!("an envelope of {} bytes exceeds the limit of {}", bytes.len(), cellog_core::MAX_PAYLOAD_LIMIT),
            ));
        }
        cell.lead()?;
        self.ensure_streams(cell).await?;
        // Waits its turn a little; past that the sender's outbox retries later, as for any unreachable cell.
        let turn = tokio::time::timeout(OPENING_WAIT, self.opening.acquire()).await;
        let Ok(Ok(_turn)) = turn else {
            return Err(cellog_client::status::status(
                Code::ResourceExhausted,
                v1::ErrorDetail {
                    reason: "BUSY".to_string(),
                    message: format!(
                        "this node is opening other envelopes; retry after {} ms",
                        OPENING_WAIT.as_millis()
                    ),
                    retry_after_ms: OPENING_WAIT.as_millis() as u64,
                    ..Default::default()
                },
            ));
        };
        let opened = self
            .open_aside(bytes.clone(), cell.now_ms())
            .await
            .map_err(|error| failed(Code::PermissionDenied, "DENIED", error.to_string()))?;
        let header = &opened.header;
        for (what, text) in [("envelope id", &header.id), ("sender", &header.sender)] {
            check_token(what, text).map_err(|message| failed(Code::PermissionDenied, "DENIED", message))?;
        }
        if !header.principal.is_empty() {
            validate_scoped_name(&header.principal).map_err(|reason| {
                failed(Code::PermissionDenied, "DENIED", format!("sending principal {:?} {reason}", header.principal))
            })?;
        }
        check_fresh(header.created_ms, cell.now_ms())
            .map_err(|message| failed(Code::PermissionDenied, "STALE_ENVELOPE", message))?;
        // A tenant's mail goes to the same tenant's inbox here, which must have a principal of this cell.
        let tenant = tenant_of(&header.principal);
        if let Some(tenant) = tenant {
            if !cell.has_tenant(tenant) {
                return Err(failed(
                    Code::PermissionDenied,
                    "NO_TENANT",
                    format!("tenant {tenant:?} has no principal in cell {:?}, so it has no inbox here", self.cell()),
                ));
            }
            self.ensure_tenant_inbox(cell, tenant).await?;
        }
        let headers: Headers = BTreeMap::from([(SENDER_HEADER.to_string(), header.sender.clone())]);
        let publish = PublishRequest {
            msg_id: Some(inbox_msg_id(&header.sender, &header.id)),
            headers,
            ..PublishRequest::new(inbox_subject(tenant, &header.sender), bytes)
        };
        let ack = published(cell.propose(Command::Publish(publish)).await?)?;
        // Fingerprints and the plaintext's hash, never signature bytes (they carry random salt).
        tracing::info!(
            target: TRANSITIONS,
            envelope = %header.id,
            sender = %header.sender,
            principal = %header.principal,
            signer = %header.sender_fingerprint,
            plaintext_sha256 = %opened.provenance.payload_sha256,
            seq = ack.seq,
            "{}",
            if ack.duplicate { "mail-again" } else { "mail-received" }
        );
        if !ack.duplicate {
            let key = format!("{}.{}", header.sender, mail_key(tenant, &header.id));
            self.record_row(cell, &opened.provenance, &key, (&inbox_stream(tenant), ack.seq)).await;
        }
        Ok(v1::DeliverResponse { inbox_seq: ack.seq, duplicate: ack.duplicate })
    }

    /// `principal`'s inbox (its tenant's, or the cell's) from `from_seq` on, opened.
    pub fn read(
        &self,
        cell: &impl MailCell,
        principal: &str,
        from_seq: u64,
        max: usize,
    ) -> Result<v1::ReadMailResponse, Status> {
        let inbox = inbox_stream(tenant_of(principal));
        let records = cell.read(&inbox, from_seq, max)?;
        let mut mail = Vec::with_capacity(records.len());
        for record in records {
            let bytes = cell.payload(&inbox, &record).map_err(|reason| {
                let message = format!("this node cannot read inbox message {}: {reason}", record.seq);
                failed(Code::DataLoss, "BODY_UNREADABLE", message)
            })?;
            let Some(bytes) = bytes else { continue };
            let opened = self.keys.open(&bytes, record.stored_at.0).map_err(|error| {
                failed(
                    Code::DataLoss,
                    "UNREADABLE_MAIL",
                    format!("inbox message {} no longer opens: {error}", record.seq),
                )
            })?;
            mail.push(v1::OpenedMail {
                seq: record.seq,
                envelope_id: opened.header.id,
                sender: opened.header.sender,
                sender_fingerprint: opened.header.sender_fingerprint,
                recipients: opened.header.recipients.into_iter().map(|recipient| recipient.cell).collect(),
                created_ms: opened.header.created_ms,
                received_ms: record.stored_at.0,
                payload: opened.payload,
                principal: opened.header.principal,
            });
        }
        Ok(v1::ReadMailResponse { mail })
    }

    /// One result per recipient of an envelope this cell sent, as `principal` knows it (a tenant's principal knows
    /// its tenant's envelopes only).
    pub fn status(
        &self,
        cell: &impl MailCell,
        principal: &str,
        id: &str,
    ) -> Result<v1::DeliveryStatusResponse, Status> {
        let not_found = || failed(Code::NotFound, "ENVELOPE_NOT_FOUND", format!("no envelope {id:?} in the outbox"));
        check_token("envelope id", id).map_err(|message| failed(Code::InvalidArgument, "INVALID_NAME", message))?;
        let key = mail_key(tenant_of(principal), id);
        let record = cell.last(OUTBOX, &outbox_subject(&key)).ok_or_else(not_found)?;
        let bytes = cell
            .payload(OUTBOX, &record)
            .map_err(|reason| failed(Code::DataLoss, "BODY_UNREADABLE", format!("outbox envelope {id:?}: {reason}")))?
            .ok_or_else(not_found)?;
        let envelope = Envelope::decode(&bytes).map_err(|_| {
            failed(Code::DataLoss, "UNREADABLE_MAIL", format!("outbox envelope {id:?} does not decode"))
        })?;
        let outbox = lock(&self.outbox);
        let mut response = v1::DeliveryStatusResponse { envelope_id: id.to_string(), ..Default::default() };
        for recipient in &envelope.header.recipients {
            let status = match cell.last(RESULTS, &result_subject(&key, &recipient.cell)) {
                Some(result) => result_status(&recipient.cell, &result),
                None => {
                    let (attempts, last_error) = outbox.progress(record.seq, &recipient.cell).unwrap_or_default();
                    v1::RecipientStatus {
                        cell: recipient.cell.clone(),
                        result: DeliveryResult::Pending as i32,
                        detail: last_error.to_string(),
                        attempts,
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

    /// Adds the outbox envelopes after the last one looked at whose recipients lack a result to the schedule.
    #[allow(
        clippy::disallowed_methods,
        reason = "retries are scheduled on the runtime's clock, which the simulator drives"
    )]
    pub(crate) fn scan(&self, cell: &impl MailCell) {
        let from = lock(&self.outbox).scanned() + 1;
        let Ok(records) = cell.read(OUTBOX, from, 256) else { return };
        let now = Instant::now();
        for record in records {
            let bytes = match cell.payload(OUTBOX, &record) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => {
                    lock(&self.outbox).skip(record.seq);
                    continue;
                }
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
            let envelope = match Envelope::decode(&bytes) {
                Ok(envelope) => envelope,
                Err(error) => {
                    tracing::error!(seq = record.seq, %error, "an outbox message is not an envelope; skipped");
                    lock(&self.outbox).skip(record.seq);
                    continue;
                }
            };
            let key = mail_key(tenant_of(&envelope.header.principal), &envelope.header.id);
            let pending: Vec<String> = envelope
                .header
                .recipients
                .into_iter()
                .filter(|recipient| cell.last(RESULTS, &result_subject(&key, &recipient.cell)).is_none())
                .map(|recipient| recipient.cell)
                .collect();
            lock(&self.outbox).add(record.seq, key, bytes, record.stored_at.0, pending, now);
        }
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
            suspect_after: Some(cellog_client::SUSPECT_AFTER),
            discover_every: cellog_client::DISCOVERY_INTERVAL,
            retry_backpressure: true,
            // Another cell's `Deliver` takes an envelope on its signature, not on a credential.
            token: None,
            // Over TLS when the other cell's CA is known; no client certificate, as no credential is needed.
            tls: self.home_cas.get(cell).map(|ca_pem| ClientTls { ca_pem: ca_pem.clone(), identity: None }),
        };
        let client = Client::new(addrs.iter().cloned(), options);
        if let Ok(client) = &client {
            clients.insert(cell.to_string(), client.clone());
        }
        Some(client)
    }

    /// One attempt to deliver `bytes` to `recipient`.
    pub(crate) async fn attempt(&self, cell: &impl MailCell, recipient: &str, bytes: Bytes) -> Attempt {
        self.metrics.attempts.inc();
        if recipient == self.cell() {
            return match self.receive(cell, bytes).await {
                Ok(_) => Attempt::Delivered,
                Err(status) if status.code() == Code::PermissionDenied => Attempt::Denied(status.message().to_string()),
                Err(status) => Attempt::Unreachable(status.message().to_string()),
            };
        }
        let client = match self.client_for(recipient) {
            None => return Attempt::NoHome,
            Some(Err(error)) => return Attempt::Denied(format!("bad address for {recipient:?}: {error}")),
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

    /// Takes in how an attempt ended: records a final result, or lets the schedule retry it.
    #[allow(
        clippy::disallowed_methods,
        reason = "retries are scheduled on the runtime's clock, which the simulator drives"
    )]
    pub(crate) async fn settle(&self, cell: &impl MailCell, seq: u64, recipient: String, attempt: Attempt) {
        let reason = match &attempt {
            Attempt::Unreachable(reason) => reason.clone(),
            _ => String::new(),
        };
        // Read before the outbox is locked: reading the cell's time locks its replica.
        let (now, cell_now) = (Instant::now(), cell.now_ms());
        let settled = lock(&self.outbox).settle(seq, &recipient, attempt, now, cell_now, &self.retry);
        let last = match settled {
            Settled::Final(last) => last,
            Settled::Retry { attempts, .. } => {
                tracing::debug!(seq, %recipient, attempt = attempts, %reason, "mail not delivered yet");
                return;
            }
            Settled::Stale => return,
        };
        if self.record_result(cell, &last.id, &recipient, last.result, &last.detail, last.attempts).await {
            lock(&self.outbox).recorded(seq, &recipient);
        } else {
            lock(&self.outbox).unrecorded(seq, &recipient, Instant::now() + self.retry.first);
        }
    }

    /// Records a recipient's final result. False if it could not be (this node no longer leads, say): the recipient
    /// stays pending, and whoever leads next delivers again (the recipient stores it once).
    async fn record_result(
        &self,
        cell: &impl MailCell,
        id: &str,
        recipient: &str,
        result: DeliveryResult,
        detail: &str,
        attempts: u32,
    ) -> bool {
        let Some(name) = result_name(result) else { return false };
        let mut headers: Headers = BTreeMap::from([
            (RESULT_HEADER.to_string(), name.to_string()),
            (ATTEMPTS_HEADER.to_string(), attempts.to_string()),
        ]);
        if !detail.is_empty() {
            let detail: String = detail.chars().filter(|c| !c.is_control()).take(MAX_DETAIL_CHARS).collect();
            headers.insert(DETAIL_HEADER.to_string(), detail);
        }
        let publish = PublishRequest {
            msg_id: Some(result_msg_id(id, recipient)),
            headers,
            ..PublishRequest::new(result_subject(id, recipient), Bytes::new())
        };
        match cell.propose(Command::Publish(publish)).await {
            Ok(_) => {
                tracing::info!(target: TRANSITIONS, envelope = id, recipient, result = name, attempts, "mail-result");
                true
            }
            Err(error) => {
                tracing::debug!(envelope = id, recipient, %error, "mail result not recorded yet");
                false
            }
        }
    }
}

//! A live tail of a stream: its messages as this node applies them, over server-sent events or WebSocket. A tail
//! reads this node's replica after each applied entry (any node serves one, leader or not): it writes nothing to
//! the log and is no consumer. Each event's id is the tail's position after it, the next sequence of every
//! partition (`0:12,1:7`), so a tail resumed from it (`Last-Event-ID`) misses nothing and repeats nothing.
//!
//! A tail holds one read's worth of events at a time and reads the next only when the last went out, so a slow
//! reader is never buffered for: it falls behind instead, and once it is `max_behind` messages behind a partition's
//! newest, or its next message was removed before it was read, it is told (`lagged`) and closed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message as Frame, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cellog_core::{Cell, Millis, Record, Scope};
use cellog_raft::storage::Storage;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tonic::{Code, Status};

use super::Http;
use super::error::{ApiError, json_of};
use crate::convert;
use crate::metrics::Metered;
use crate::service::CellogService;
use crate::status::from_rejection;

/// How far behind a partition's newest message a tail may fall before it is closed, unless it asks otherwise.
pub const DEFAULT_MAX_BEHIND: u64 = 100_000;
/// The most a tail may ask to fall behind.
pub const MAX_MAX_BEHIND: u64 = 10_000_000;
/// Messages read per partition per round.
const READ_BATCH: usize = 256;
/// Most payload bytes one round of a tail reads (at least one message): past them the round ends and the next goes on
/// from there, so a round over many partitions of large messages holds this much, not partitions × batch × payload.
pub const TAIL_ROUND_BYTES: u64 = 4 * 1024 * 1024;
/// A heartbeat (an SSE comment, a WebSocket ping) this often, so proxies keep an idle tail open.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// A WebSocket reader that takes no frame for this long is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A tail's query string.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TailQuery {
    subject: Option<String>,
    from_seq: Option<u64>,
    from_time_ms: Option<u64>,
    max_behind: Option<u64>,
    /// WebSocket only: a browser's WebSocket sends no `Last-Event-ID` header.
    last_event_id: Option<String>,
}

/// One event of a tail.
#[derive(Debug)]
pub(crate) enum TailEvent {
    /// A message, and the tail's position after it.
    Message { id: String, message: Value },
    /// The tail fell behind or lost its next message; it ends.
    Lagged(Value),
    /// The tail cannot go on (its stream deleted, its grant revoked); it ends.
    Failed(Value),
}

impl TailEvent {
    fn ends(&self) -> bool {
        !matches!(self, TailEvent::Message { .. })
    }

    fn sse(&self) -> Event {
        match self {
            TailEvent::Message { id, message } => Event::default().event("message").id(id).data(message.to_string()),
            TailEvent::Lagged(data) => Event::default().event("lagged").data(data.to_string()),
            TailEvent::Failed(data) => Event::default().event("error").data(data.to_string()),
        }
    }

    fn frame(&self) -> String {
        match self {
            TailEvent::Message { id, message } => json!({ "id": id, "event": "message", "data": message }),
            TailEvent::Lagged(data) => json!({ "event": "lagged", "data": data }),
            TailEvent::Failed(data) => json!({ "event": "error", "data": data }),
        }
        .to_string()
    }
}

/// An open tail.
pub(crate) struct Tail<S: Storage + Clone> {
    service: CellogService<Metered<S>>,
    actor: cellog_core::Actor,
    principal: Arc<str>,
    /// The stream's stored name.
    stream: String,
    /// The subject filter, stored (a tenant's scoped).
    filter: Option<String>,
    /// The next sequence of each partition.
    next: Vec<u64>,
    max_behind: u64,
    /// Rounds read so far (where the next round starts among the partitions).
    rounds: usize,
    _permit: OwnedSemaphorePermit,
    /// Its count among its principal's tails.
    _held: crate::limits::Held,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid("BAD_TAIL", message)
}

/// Parses an event id: the next sequence of each of `partitions` partitions, `0:12,1:7`.
pub fn parse_position(text: &str, partitions: usize) -> Result<Vec<u64>, String> {
    let mut next = vec![0; partitions];
    let mut seen = vec![false; partitions];
    for part in text.split(',') {
        let (partition, seq) = part.split_once(':').ok_or_else(|| format!("{part:?} is not PARTITION:NEXT_SEQ"))?;
        let partition: usize = partition.parse().map_err(|_| format!("{partition:?} is not a partition"))?;
        let seq: u64 = seq.parse().map_err(|_| format!("{seq:?} is not a sequence"))?;
        if partition >= partitions || seen[partition] || seq == 0 {
            return Err(format!("{part:?} does not fit a stream of {partitions} partitions"));
        }
        next[partition] = seq;
        seen[partition] = true;
    }
    if seen.iter().any(|seen| !seen) {
        return Err(format!("the position names {} of {partitions} partitions", seen.iter().filter(|s| **s).count()));
    }
    Ok(next)
}

/// The position `next`, as an event id.
pub fn format_position(next: &[u64]) -> String {
    next.iter().enumerate().map(|(partition, seq)| format!("{partition}:{seq}")).collect::<Vec<_>>().join(",")
}

impl<S: Storage + Clone> Tail<S> {
    /// Opens a tail of stream `name` for the caller the headers name, where the query and `resume` say.
    fn open(
        http: &Http<S>,
        name: &str,
        query: TailQuery,
        headers: &HeaderMap,
        resume: Option<String>,
    ) -> Result<Self, ApiError> {
        let service = http.service.clone();
        let request = super::api::grpc(headers.get(axum::http::header::AUTHORIZATION), ())?;
        let actor = service.callers().actor(&request)?;
        let principal = service.principal(&actor)?;
        let scope = Scope::of(&principal);
        let stream = scope.name_in(name);
        let filter = match query.subject {
            Some(subject) => {
                cellog_core::subject::validate_filter(&subject)
                    .map_err(|error| invalid(format!("subject filter {subject:?}: {error}")))?;
                Some(scope.subject_in(&subject))
            }
            None => None,
        };
        let max_behind = query.max_behind.unwrap_or(DEFAULT_MAX_BEHIND);
        if max_behind == 0 || max_behind > MAX_MAX_BEHIND {
            return Err(invalid(format!("max_behind is from 1 to {MAX_MAX_BEHIND}, not {max_behind}")));
        }
        let resume = resume.or(query.last_event_id);
        if [resume.is_some(), query.from_seq.is_some(), query.from_time_ms.is_some()].iter().filter(|x| **x).count() > 1
        {
            return Err(invalid("give one of Last-Event-ID, from_seq and from_time_ms"));
        }
        let next = {
            let replica = service.node().replica().map_err(|error| Status::unavailable(error.to_string()))?;
            let cell = &replica.cell;
            let refused = |rejection| ApiError::from(from_rejection(&scope.rejection_out(rejection)));
            cell.authorize_read(&principal, &stream).map_err(refused)?;
            let info = cell.stream_info(&stream).map_err(refused)?;
            let partitions = info.partitions.len();
            match (resume, query.from_seq, query.from_time_ms) {
                (Some(text), _, _) => parse_position(&text, partitions)
                    .map_err(|error| invalid(format!("Last-Event-ID {text:?}: {error}")))?,
                // What retention removed before the tail began is not missed: it starts at the oldest retained.
                (_, Some(seq), _) => info.partitions.iter().map(|partition| seq.max(partition.low_watermark)).collect(),
                (_, _, Some(time)) => (0..partitions as u32)
                    .map(|partition| cell.first_seq_at_or_after(&stream, partition, Millis(time)))
                    .collect::<Result<_, _>>()
                    .map_err(refused)?,
                _ => info.partitions.iter().map(|partition| partition.high_watermark + 1).collect(),
            }
        };
        // Opening a tail counts against the principal's rate as a command does.
        service.take_rate(&principal)?;
        let caps = &http.tails_per_principal;
        let held = caps.try_open(&principal).ok_or_else(|| {
            ApiError::from(crate::limits::too_many_for_principal("TOO_MANY_TAILS", "tails", &principal, caps.max()))
        })?;
        let permit = http.tails.clone().try_acquire_owned().map_err(|_| {
            ApiError::from(cellog_client::status::failed(
                Code::ResourceExhausted,
                "TOO_MANY_TAILS",
                format!("this node holds at most {} tails at once", http.max_tails),
            ))
        })?;
        Ok(Tail {
            service,
            actor,
            principal,
            stream,
            filter,
            next,
            max_behind,
            rounds: 0,
            _permit: permit,
            _held: held,
        })
    }

    /// The next events, waiting for the replica to apply something when there are none; the last of them ends the
    /// tail if it is not a message.
    pub(crate) async fn next_events(&mut self) -> Vec<TailEvent> {
        let node = self.service.node().clone();
        loop {
            let mut applied = std::pin::pin!(node.applied().notified());
            applied.as_mut().enable();
            let (records, more) = match self.read() {
                Ok(Ok(read)) => read,
                Ok(Err(lagged)) => return vec![lagged],
                Err(status) => return vec![TailEvent::Failed(json_of(&status))],
            };
            let scope = Scope::of(&self.principal);
            let mut events = Vec::new();
            let refs: Vec<&Record> = records.iter().map(|(record, _)| record).collect();
            let payloads = self.service.payloads(&self.stream, &refs);
            for ((record, next), payload) in records.into_iter().zip(payloads) {
                match payload {
                    Ok(Some(payload)) => {
                        let message = convert::record_to_wire(scope.record_out(record), payload);
                        match serde_json::to_value(&message) {
                            Ok(message) => events.push(TailEvent::Message { id: format_position(&next), message }),
                            Err(error) => {
                                let status =
                                    Status::internal(format!("a message could not be written as JSON: {error}"));
                                events.push(TailEvent::Failed(json_of(&status)));
                                return events;
                            }
                        }
                    }
                    // Removed since it was read: a read after the removal would not see it either.
                    Ok(None) => {}
                    Err(status) => {
                        events.push(TailEvent::Failed(json_of(&status)));
                        return events;
                    }
                }
            }
            if !events.is_empty() {
                return events;
            }
            if !more {
                applied.await;
            }
        }
    }

    /// Reads the next messages the filter matches from the replica, each with the position after it, advancing the
    /// tail past everything read, and whether more is there to read at once; or the `lagged` event that ends it.
    #[allow(clippy::type_complexity, reason = "read once, by next_events")]
    fn read(&mut self) -> Result<Result<(Vec<(cellog_core::Record, Vec<u64>)>, bool), TailEvent>, Status> {
        let replica = self.service.node().replica().map_err(|error| Status::unavailable(error.to_string()))?;
        let cell: &Cell = &replica.cell;
        let scope = Scope::of(&self.principal);
        let refused = |rejection| from_rejection(&scope.rejection_out(rejection));
        // Grants are checked at every read: a tail stops as soon as its caller may no longer read the stream.
        let principal = cell.authenticate(&self.actor).map_err(refused)?;
        cell.authorize_read(&principal, &self.stream).map_err(refused)?;
        let info = cell.stream_info(&self.stream).map_err(refused)?;
        if info.partitions.len() != self.next.len() {
            return Err(cellog_client::status::failed(
                Code::NotFound,
                "STREAM_NOT_FOUND",
                "the stream was deleted and made again while it was tailed",
            ));
        }
        let mut records = Vec::new();
        let mut more = false;
        let mut bytes = 0u64;
        // Each round starts one partition further on, so a partition of large messages that fills rounds does not
        // keep the others waiting.
        let n = info.partitions.len();
        self.rounds = self.rounds.wrapping_add(1);
        for partition in (0..n).map(|i| (i + self.rounds % n.max(1)) % n) {
            let log = &info.partitions[partition];
            if bytes >= TAIL_ROUND_BYTES {
                more = true;
                break;
            }
            let next = self.next[partition];
            let behind = (log.high_watermark + 1).saturating_sub(next);
            if next < log.low_watermark || behind > self.max_behind {
                let data = json!({
                    "partition": partition,
                    "next_seq": next.to_string(),
                    "low_watermark": log.low_watermark.to_string(),
                    "high_watermark": log.high_watermark.to_string(),
                    "reason": if next < log.low_watermark {
                        "messages were removed before the tail read them"
                    } else {
                        "the tail is more than max_behind messages behind"
                    },
                });
                return Ok(Err(TailEvent::Lagged(data)));
            }
            if behind == 0 {
                continue;
            }
            let read = cell.read_from(&self.stream, partition as u32, next, READ_BATCH).map_err(refused)?;
            if read.is_empty() {
                // Nothing retained from `next` to the newest (removed from the middle): past it all.
                self.next[partition] = log.high_watermark + 1;
            }
            for record in read {
                if bytes >= TAIL_ROUND_BYTES {
                    break;
                }
                if let cellog_core::Body::Stored(body) = &record.body {
                    bytes += u64::from(body.len);
                }
                self.next[partition] = record.seq + 1;
                if self
                    .filter
                    .as_deref()
                    .is_none_or(|filter| cellog_core::subject::filter_matches(filter, &record.subject))
                {
                    records.push((record, self.next.clone()));
                }
            }
            more |= self.next[partition] <= log.high_watermark;
        }
        Ok(Ok((records, more)))
    }
}

/// The tail's events as a stream that ends after the first event that ends it.
fn events<S: Storage + Clone>(tail: Tail<S>) -> impl Stream<Item = TailEvent> {
    futures::stream::unfold((tail, false), |(mut tail, ended)| async move {
        if ended {
            return None;
        }
        let events = tail.next_events().await;
        let ended = events.last().is_some_and(TailEvent::ends);
        Some((futures::stream::iter(events), (tail, ended)))
    })
    .flatten()
}

/// `GET /v1/streams/{name}/tail`: server-sent events.
pub(crate) async fn sse<S: Storage + Clone>(
    State(http): State<Arc<Http<S>>>,
    Path(name): Path<String>,
    query: Result<Query<TailQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(error) => return invalid(format!("the query string: {}", error.body_text())).into_response(),
    };
    let resume = headers.get("last-event-id").and_then(|value| value.to_str().ok()).map(str::to_string);
    match Tail::open(&http, &name, query, &headers, resume) {
        Ok(tail) => {
            let stream = events(tail).map(|event| Ok::<_, Infallible>(event.sse()));
            Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT)).into_response()
        }
        Err(error) => error.into_response(),
    }
}

/// `GET /v1/streams/{name}/tail/ws`: the same events as WebSocket text frames.
pub(crate) async fn websocket<S: Storage + Clone>(
    State(http): State<Arc<Http<S>>>,
    Path(name): Path<String>,
    query: Result<Query<TailQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(error) => return invalid(format!("the query string: {}", error.body_text())).into_response(),
    };
    match Tail::open(&http, &name, query, &headers, None) {
        Ok(tail) => upgrade.max_message_size(64 * 1024).on_upgrade(move |socket| push(socket, tail)),
        Err(error) => error.into_response(),
    }
}

/// Sends a tail's events on a WebSocket, with a ping every [`HEARTBEAT`], until either side ends it.
async fn push<S: Storage + Clone>(mut socket: WebSocket, tail: Tail<S>) {
    let mut events = std::pin::pin!(events(tail));
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.reset();
    loop {
        let frame = tokio::select! {
            biased;
            incoming = socket.recv() => match incoming {
                Some(Ok(Frame::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
            event = events.next() => match event {
                Some(event) => Frame::Text(event.frame().into()),
                None => {
                    let _ = socket.send(Frame::Close(None)).await;
                    return;
                }
            },
            _ = heartbeat.tick() => Frame::Ping(Default::default()),
        };
        match tokio::time::timeout(SEND_TIMEOUT, socket.send(frame)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

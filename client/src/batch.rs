//! Publishing many messages pipelined: a window of unanswered messages on one call, answers matched to messages in
//! order, and what was not answered retried where that is safe.

#![allow(
    clippy::disallowed_methods,
    reason = "retry deadlines and latencies use the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::collections::VecDeque;
use std::time::Duration;

use cellog_proto::v1::{self, cellog_client::CellogClient};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::error::ClientError;
use crate::limits::{MAX_PUBLISH_BATCH, PUBLISH_BATCH_BYTES};
use crate::route::Client;
use crate::route::{Next, classify};
use crate::status::from_item_error;

impl Client {
    /// Publishes many messages pipelined, at most `window` unanswered at once, and returns one result per message in
    /// the order given, with the time from its (last) send to its ack.
    pub async fn publish_batch(&self, requests: Vec<v1::PublishRequest>, window: usize) -> Vec<BatchResult> {
        let window = window.max(1);
        let mut results: Vec<Option<BatchResult>> = vec![None; requests.len()];
        let mut todo: VecDeque<usize> = (0..requests.len()).collect();
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        // Per message: whether an attempt of it went out and got no answer, so that it may have been applied.
        let mut unanswered = vec![false; requests.len()];
        while !todo.is_empty() {
            let failure = match self.current() {
                Ok(client) => {
                    self.publish_round(client, &requests, &mut todo, &mut results, &mut unanswered, window).await
                }
                Err(error) => Some((Status::unavailable(error.to_string()), None)),
            };
            let Some((status, failed_at)) = failure else { continue };
            // Messages from the one that failed on were not answered: retry those that are safe to retry.
            let idempotent = failed_at.is_none_or(|index| requests[index].msg_id.is_some());
            if !self.recover(&status, idempotent, deadline, &mut backoff).await {
                self.after_giving_up(&status);
                let error = ClientError::from(status);
                for index in todo.drain(..) {
                    let error = ClientError::settle(error.clone(), unanswered[index]);
                    results[index] = Some(BatchResult { result: Err(error), latency: Duration::ZERO });
                }
                break;
            }
        }
        if results.iter().any(|result| result.as_ref().is_some_and(|result| result.result.is_ok())) {
            self.rediscover().await;
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or(BatchResult { result: Err(ClientError::NoNodes), latency: Duration::ZERO }))
            .collect()
    }

    /// One pass over `todo` on one connection. Returns the status that ended it early and the message it concerned;
    /// marks in `unanswered` each message that went out and may have been applied without an answer.
    async fn publish_round(
        &self,
        mut client: CellogClient<Channel>,
        requests: &[v1::PublishRequest],
        todo: &mut VecDeque<usize>,
        results: &mut [Option<BatchResult>],
        unanswered: &mut [bool],
        window: usize,
    ) -> Option<(Status, Option<usize>)> {
        // The messages in flight when the call broke went out and got no answer.
        let broke = |in_flight: &VecDeque<(usize, Instant)>, unanswered: &mut [bool], status: &Status| {
            if ClientError::from(status.clone()).outcome_unknown() {
                in_flight.iter().for_each(|(index, _)| unanswered[*index] = true);
            }
        };
        // Each request carries the messages that fit in the window, up to a quarter of it, so that answers to the
        // first requests free room while the later ones are still being committed.
        let per_request = (window / 4).clamp(1, MAX_PUBLISH_BATCH);
        // Every request in flight carries at least one message, so the channel never holds more than `window`.
        let (sender, receiver) = mpsc::channel::<v1::PublishBatchRequest>(window);
        let outgoing = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let mut in_flight: VecDeque<(usize, Instant)> = VecDeque::new();
        // Prime the window before opening the call, so the first messages go out with it.
        Self::send_more(&sender, requests, todo, &mut in_flight, window, per_request);
        // A node that stopped answering (paused, cut off, hung) must not hold the batch for ever: opening the call, and
        // each answer while messages are in flight, takes at most one attempt's deadline.
        // A leader deposed meanwhile gives the call up sooner (see `ClientOptions::suspect_after`).
        let silent = || Status::deadline_exceeded("the node did not answer within the attempt deadline");
        let addr = self.current_addr();
        let opening = tokio::time::timeout(
            self.options.attempt_timeout,
            client.publish_batch(self.credentials(Request::new(outgoing))),
        );
        let opened = tokio::select! {
            biased;
            opened = opening => opened.unwrap_or_else(|_| Err(silent())),
            deposed = self.deposed(&addr) => Err(deposed),
        };
        let mut answers = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => {
                broke(&in_flight, unanswered, &status);
                Self::requeue(todo, &mut in_flight);
                return Some((status, None));
            }
        };
        let mut sender = Some(sender);
        loop {
            if todo.is_empty() {
                // Closing our side lets the node end the call once it has answered everything.
                if in_flight.is_empty() {
                    return None;
                }
                sender = None;
            }
            if let Some(open) = &sender {
                Self::send_more(open, requests, todo, &mut in_flight, window, per_request);
            }
            let next = tokio::time::timeout(self.options.attempt_timeout, answers.message());
            let answer = tokio::select! {
                biased;
                answer = next => answer.unwrap_or_else(|_| Err(silent())),
                deposed = self.deposed(&addr) => Err(deposed),
            };
            let answer = match answer {
                Ok(Some(answer)) => answer,
                Ok(None) if in_flight.is_empty() && todo.is_empty() => return None,
                Ok(None) => {
                    let front = in_flight.front().map(|(index, _)| *index);
                    let status = Status::unavailable("the node ended the batch early");
                    broke(&in_flight, unanswered, &status);
                    Self::requeue(todo, &mut in_flight);
                    return Some((status, front));
                }
                Err(status) => {
                    let front = in_flight.front().map(|(index, _)| *index);
                    broke(&in_flight, unanswered, &status);
                    Self::requeue(todo, &mut in_flight);
                    return Some((status, front));
                }
            };
            // The answers continue the call's sequence: one per message sent, in order.
            for answer in answer.results {
                let Some((index, sent)) = in_flight.pop_front() else {
                    return Some((Status::internal("the node answered more messages than were sent"), None));
                };
                match answer.result {
                    Some(v1::publish_result::Result::Ack(ack)) => {
                        results[index] = Some(BatchResult { result: Ok(ack), latency: sent.elapsed() });
                    }
                    Some(v1::publish_result::Result::Error(error)) => {
                        let status = from_item_error(error);
                        let retryable = !matches!(
                            classify(&status, requests[index].msg_id.is_some(), self.options.retry_backpressure),
                            Next::Fail
                        );
                        if retryable {
                            // Those sent after it are dropped with the call unanswered; it was answered itself.
                            broke(&in_flight, unanswered, &Status::cancelled("the batch was given up"));
                            unanswered[index] |= ClientError::from(status.clone()).outcome_unknown();
                            in_flight.push_front((index, sent));
                            Self::requeue(todo, &mut in_flight);
                            return Some((status, Some(index)));
                        }
                        let error = ClientError::settle(status.into(), unanswered[index]);
                        results[index] = Some(BatchResult { result: Err(error), latency: sent.elapsed() });
                    }
                    None => {
                        results[index] = Some(BatchResult {
                            result: Err(Status::internal("an empty answer").into()),
                            latency: sent.elapsed(),
                        });
                    }
                }
            }
        }
    }

    /// Sends the next messages of `todo` on a call while fewer than `window` are in flight, at most `per_request` in
    /// one request and, past its first, at most [`PUBLISH_BATCH_BYTES`] of them. A request the call no longer takes
    /// (it ended) puts its messages back, unsent.
    fn send_more(
        sender: &mpsc::Sender<v1::PublishBatchRequest>,
        requests: &[v1::PublishRequest],
        todo: &mut VecDeque<usize>,
        in_flight: &mut VecDeque<(usize, Instant)>,
        window: usize,
        per_request: usize,
    ) {
        while in_flight.len() < window && !todo.is_empty() {
            let room = per_request.min(window - in_flight.len());
            let mut messages = Vec::with_capacity(room.min(todo.len()));
            let mut bytes = 0;
            while messages.len() < room
                && let Some(&index) = todo.front()
            {
                let size = requests[index].encoded_len();
                if !messages.is_empty() && bytes + size > PUBLISH_BATCH_BYTES {
                    break;
                }
                bytes += size;
                todo.pop_front();
                messages.push(requests[index].clone());
                in_flight.push_back((index, Instant::now()));
            }
            let sent = messages.len();
            if sender.try_send(v1::PublishBatchRequest { messages }).is_err() {
                for _ in 0..sent {
                    let (index, _) = in_flight.pop_back().expect("the request's messages are in flight");
                    todo.push_front(index);
                }
                return;
            }
        }
    }

    /// Puts unanswered messages back at the front of `todo`, in order.
    fn requeue(todo: &mut VecDeque<usize>, in_flight: &mut VecDeque<(usize, Instant)>) {
        while let Some((index, _)) = in_flight.pop_back() {
            todo.push_front(index);
        }
    }
}

/// The answer to one message of a batch.
#[derive(Clone, Debug)]
pub struct BatchResult {
    /// Where it landed, or why not.
    pub result: Result<v1::PublishAck, ClientError>,
    /// From its last send to its ack.
    pub latency: Duration,
}

//! The node's budget of request bytes in flight: how many bytes of requests every caller together may have sent this
//! node and not yet had read, on the client port and the HTTP port at once.
//!
//! Each call is bounded on its own (a gRPC message by [`cellog_client::limits::MAX_CLIENT_MESSAGE`], an HTTP body by
//! [`crate::http::MAX_BODY_BYTES`]) and so are the calls at once, but without this many callers each sending a large
//! request slowly would together hold connections × calls × 16 MiB of the node's memory. A gRPC message counts from
//! its first byte's arrival until it is whole (the decoder has it); an HTTP body counts, by its declared length, for
//! the call's life. A request that would pass the budget is refused as `RESOURCE_EXHAUSTED REQUEST_BYTES`, nothing of
//! it is written, and the caller may retry once others' requests are read.
//!
//! Both ports count only after their door: a caller without a credential is refused on its request's head, before a
//! byte of its body is read or counted.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tonic::{Code, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bytes in flight against their most.
#[derive(Debug)]
pub(crate) struct RequestBytes {
    max: u64,
    held: AtomicU64,
}

impl RequestBytes {
    pub(crate) fn new(max: u64) -> Arc<Self> {
        Arc::new(RequestBytes { max, held: AtomicU64::new(0) })
    }

    /// Counts `n` more bytes, or refuses them when they would pass the most.
    fn take(&self, n: u64) -> Result<(), Status> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&after| after <= self.max)
            })
            .map(|_| ())
            .map_err(|_| self.refusal())
    }

    fn give(&self, n: u64) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Holds `n` bytes until the hold is dropped (an HTTP body, by its declared length).
    pub(crate) fn hold(self: &Arc<Self>, n: u64) -> Result<Hold, Status> {
        self.take(n)?;
        Ok(Hold { budget: self.clone(), n })
    }

    /// The bytes counted now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    fn refusal(&self) -> Status {
        cellog_client::status::failed(
            Code::ResourceExhausted,
            "REQUEST_BYTES",
            format!(
                "this node reads at most {} bytes of requests at once, and has that many in flight; retry shortly",
                self.max
            ),
        )
    }
}

/// Bytes held until dropped.
#[derive(Debug)]
pub(crate) struct Hold {
    budget: Arc<RequestBytes>,
    n: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget.give(self.n);
    }
}

/// Where a gRPC request body is in its framing: each message is a 5-byte prefix (a flag and a big-endian length) and
/// that many bytes. Read by hand because it is five bytes, and the budget must see the boundaries as they pass.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message's body still to come (once its prefix is whole).
    remaining: u64,
}

impl Framing {
    /// Reads `data` on; returns how many of its bytes end a message or lie in messages it ends (from the last
    /// boundary on), so that what is whole can be let go.
    fn advance(&mut self, mut data: &[u8], unfinished: &mut u64) -> u64 {
        let mut finished = 0;
        while !data.is_empty() {
            if self.prefix_len < self.prefix.len() {
                let n = (self.prefix.len() - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
                self.prefix_len += n;
                *unfinished += n as u64;
                data = &data[n..];
                if self.prefix_len < self.prefix.len() {
                    break;
                }
                let mut length = &self.prefix[1..];
                self.remaining = u64::from(length.get_u32());
            } else {
                let n = self.remaining.min(data.len() as u64);
                self.remaining -= n;
                *unfinished += n;
                data = &data[n as usize..];
            }
            if self.remaining == 0 {
                finished += std::mem::take(unfinished);
                self.prefix_len = 0;
            }
        }
        finished
    }
}

/// A gRPC request body counted against the budget as its bytes arrive; a message's bytes are let go once it is whole
/// and the decoder asks for more (or the body is dropped).
pub(crate) struct Counted<B> {
    inner: B,
    budget: Arc<RequestBytes>,
    framing: Framing,
    /// Bytes of the message under way.
    unfinished: u64,
    /// Bytes of whole messages, let go at the next read.
    finished: u64,
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, budget: Arc<RequestBytes>) -> Self {
        Counted { inner, budget, framing: Framing::default(), unfinished: 0, finished: 0 }
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        self.budget.give(self.unfinished + self.finished);
    }
}

impl<B> http_body::Body for Counted<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        this.budget.give(std::mem::take(&mut this.finished));
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(refused) = this.budget.take(data.len() as u64) {
                        // Boxed as itself, so that the decoder answers the call with it.
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                    this.finished += this.framing.advance(data, &mut this.unfinished);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Counts every request body of the services it wraps (the client port's) against the budget.
#[derive(Clone, Debug)]
pub(crate) struct CountLayer {
    pub(crate) budget: Arc<RequestBytes>,
}

impl<S> tower_layer::Layer<S> for CountLayer {
    type Service = CountService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountService { inner, budget: self.budget.clone() }
    }
}

/// See [`CountLayer`].
#[derive(Clone, Debug)]
pub(crate) struct CountService<S> {
    inner: S,
    budget: Arc<RequestBytes>,
}

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for CountService<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let budget = self.budget.clone();
        self.inner.call(request.map(|body| tonic::body::Body::new(Counted::new(body, budget))))
    }
}

/// The bytes an HTTP/1.1 request's body may take: its declared length; at most `max` when it is chunked (the body
/// limit ends it there); none when it declares neither (it has no body).
pub(crate) fn http_body_bytes(headers: &http::HeaderMap, max: u64) -> u64 {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok())
        .and_then(|length| length.trim().parse::<u64>().ok());
    match declared {
        Some(length) => length.min(max),
        None if headers.contains_key(http::header::TRANSFER_ENCODING) => max,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&len.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7u8, len as usize));
        bytes
    }

    #[test]
    fn whole_messages_are_let_go_wherever_the_frames_cut_them() {
        let mut wire = message(10);
        wire.extend(message(0));
        wire.extend(message(3));
        wire.extend(message(20)[..9].to_vec());
        for cut in 1..wire.len() {
            let (mut framing, mut unfinished, mut finished) = (Framing::default(), 0, 0);
            for chunk in wire.chunks(cut) {
                finished += framing.advance(chunk, &mut unfinished);
            }
            assert_eq!(finished, 15 + 5 + 8, "frames of {cut}");
            assert_eq!(unfinished, 9, "frames of {cut}");
        }
    }

    #[test]
    fn the_budget_refuses_what_would_pass_it_and_takes_back_what_is_let_go() {
        let budget = RequestBytes::new(100);
        let first = budget.hold(60).expect("within the budget");
        let refused = budget.hold(41).expect_err("past the budget");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert_eq!(cellog_client::status::detail_of(&refused).reason, "REQUEST_BYTES");
        let second = budget.hold(40).expect("exactly the budget");
        drop(first);
        assert_eq!(budget.held(), 40);
        drop(second);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_http_body_counts_by_its_declared_length() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(http_body_bytes(&headers, 1000), 0);
        headers.insert(http::header::TRANSFER_ENCODING, http::HeaderValue::from_static("chunked"));
        assert_eq!(http_body_bytes(&headers, 1000), 1000);
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("12"));
        assert_eq!(http_body_bytes(&headers, 1000), 12);
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("5000"));
        assert_eq!(http_body_bytes(&headers, 1000), 1000);
    }
}

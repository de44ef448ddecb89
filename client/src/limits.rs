//! Limits of the client API on the wire, the same for nodes and clients.

/// Largest client request or answer on the wire (a payload is at most 8 MiB).
pub const MAX_CLIENT_MESSAGE: usize = 16 * 1024 * 1024;

/// Most messages one `PublishBatch` request carries.
pub const MAX_PUBLISH_BATCH: usize = 1024;
/// The client puts messages into one `PublishBatch` request until they reach this many encoded bytes (a request always
/// carries at least one message, and one message is at most [`MAX_CLIENT_MESSAGE`] less room for its framing).
pub const PUBLISH_BATCH_BYTES: usize = MAX_CLIENT_MESSAGE / 2;

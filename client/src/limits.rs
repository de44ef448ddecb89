//! Limits of the client API on the wire, the same for nodes and clients.

/// Largest client request or answer on the wire (a payload is at most 8 MiB).
pub const MAX_CLIENT_MESSAGE: usize = 16 * 1024 * 1024;

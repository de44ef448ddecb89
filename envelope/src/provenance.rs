//! Provenance rows: who sealed an envelope for whom (the sender's row, unverified: what it claims) and who verified
//! it (the receiver's row, after checking the signature). Rows hold public fingerprints and SHA-256 references only:
//! no key material, no plaintext, no signature bytes.
//!
//! The ledger that keeps rows is the node's (`cellog_net::mail`): a replicated stream where each row pins the envelope
//! it describes. Writing a row there is fail-soft: a failure is logged and counted, and delivery goes on.

use serde::{Deserialize, Serialize};

/// Which side recorded the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// The sender sealed it.
    Sent,
    /// The receiver opened it.
    Received,
}

/// One provenance row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceRow {
    /// The envelope.
    pub envelope_id: String,
    /// Sender's or receiver's row.
    pub direction: Direction,
    /// Whether the signature was checked (the receiver's row) or only claimed (the sender's).
    pub verified: bool,
    /// The signing key's fingerprint (hex).
    pub signer_fingerprint: String,
    /// The sealing scheme.
    pub scheme: String,
    /// Each recipient key's fingerprint (hex), in the header's order.
    pub recipients: Vec<String>,
    /// SHA-256 of the payload (hex).
    pub payload_sha256: String,
    /// SHA-256 of the envelope's wire form (hex).
    pub envelope_sha256: String,
    /// When the row was made (milliseconds since the Unix epoch).
    pub at_ms: u64,
}

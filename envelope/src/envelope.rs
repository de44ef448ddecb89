//! The envelope's wire form: 8 bytes of magic, a little-endian `u32` version, then the version's body encoded with
//! postcard. Every version this build ever wrote stays decodable: [`Envelope::decode`] keeps an arm per version.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"CELLOGEV";
const PREFIX_BYTES: usize = 12;

/// The version this build writes. Version 2 added the sending principal to the header.
pub const ENVELOPE_VERSION: u32 = 2;

/// An envelope's id, chosen by the sender; receivers deduplicate by it.
pub type EnvelopeId = String;

/// One recipient: a cell and the fingerprint of the key the envelope was sealed for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Recipient {
    /// The cell's name.
    pub cell: String,
    /// Its key's fingerprint (hex).
    pub fingerprint: String,
}

/// What an envelope says about itself in the clear. A copy sealed inside is compared with it on opening.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The envelope's id.
    pub id: EnvelopeId,
    /// The sending cell.
    pub sender: String,
    /// The fingerprint of the key that signed it (hex).
    pub sender_fingerprint: String,
    /// Every recipient, in the order the sender named them.
    pub recipients: Vec<Recipient>,
    /// When it was sealed (milliseconds since the Unix epoch, the sender's cell time).
    pub created_ms: u64,
    /// The principal of the sending cell that sent it, as that cell authenticated it (`TENANT/NAME` for a tenant's
    /// principal). Signed with the rest; empty in a version 1 envelope, which did not carry it.
    pub principal: String,
}

/// Version 1's header: no principal.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct HeaderV1 {
    id: EnvelopeId,
    sender: String,
    sender_fingerprint: String,
    recipients: Vec<Recipient>,
    created_ms: u64,
}

impl From<HeaderV1> for Header {
    fn from(v1: HeaderV1) -> Header {
        let HeaderV1 { id, sender, sender_fingerprint, recipients, created_ms } = v1;
        Header { id, sender, sender_fingerprint, recipients, created_ms, principal: String::new() }
    }
}

/// A sealed envelope: the clear header and the OpenPGP message (signed, then encrypted for every recipient).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The version it was written at: its sealed contents are that version's too.
    pub version: u32,
    /// The clear header.
    pub header: Header,
    /// The OpenPGP message.
    pub sealed: Bytes,
}

/// Version 1's body.
#[derive(Serialize, Deserialize)]
struct V1 {
    header: HeaderV1,
    sealed: Bytes,
}

/// Version 2's body.
#[derive(Serialize, Deserialize)]
struct V2 {
    header: Header,
    sealed: Bytes,
}

/// What is encrypted and signed: the header again, and the payload.
#[derive(Serialize, Deserialize)]
pub(crate) struct Inner {
    pub header: Header,
    pub payload: Bytes,
}

/// Version 1's sealed contents.
#[derive(Serialize, Deserialize)]
pub(crate) struct InnerV1 {
    pub header: HeaderV1,
    pub payload: Bytes,
}

impl Inner {
    /// Sealed contents written at `version`.
    pub(crate) fn decode(version: u32, bytes: &[u8]) -> Result<Inner, DecodeError> {
        match version {
            1 => {
                let v1: InnerV1 = decode_all(bytes)?;
                Ok(Inner { header: v1.header.into(), payload: v1.payload })
            }
            2 => decode_all(bytes),
            version => Err(DecodeError::UnsupportedVersion { version }),
        }
    }
}

/// Why bytes are not an envelope.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Too short, or the magic is wrong.
    #[error("not an envelope (no envelope magic)")]
    NotAnEnvelope,
    /// A version this build does not know (written by a newer one).
    #[error("envelope version {version} is newer than this build reads (up to {ENVELOPE_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
    },
    /// The body does not decode.
    #[error("malformed envelope: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
}

impl Envelope {
    /// The wire form, at its version (an envelope this build seals is at [`ENVELOPE_VERSION`]; one it decoded keeps
    /// the version it was written at, since its signed contents are that version's).
    pub fn encode(&self) -> Vec<u8> {
        let version = if self.version == 1 { 1 } else { ENVELOPE_VERSION };
        let body = match version {
            1 => {
                let Header { id, sender, sender_fingerprint, recipients, created_ms, principal: _ } =
                    self.header.clone();
                let header = HeaderV1 { id, sender, sender_fingerprint, recipients, created_ms };
                postcard::to_stdvec(&V1 { header, sealed: self.sealed.clone() })
            }
            _ => postcard::to_stdvec(&V2 { header: self.header.clone(), sealed: self.sealed.clone() }),
        };
        let mut bytes = Vec::with_capacity(PREFIX_BYTES + self.sealed.len() + 256);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&body.expect("encoding into memory does not fail"));
        bytes
    }

    /// Reads any version this build knows.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
        if bytes.len() < PREFIX_BYTES || &bytes[..8] != MAGIC {
            return Err(DecodeError::NotAnEnvelope);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let body = &bytes[PREFIX_BYTES..];
        match version {
            1 => {
                let v1: V1 = decode_all(body)?;
                Ok(Envelope { version, header: v1.header.into(), sealed: v1.sealed })
            }
            2 => {
                let v2: V2 = decode_all(body)?;
                Ok(Envelope { version, header: v2.header, sealed: v2.sealed })
            }
            version => Err(DecodeError::UnsupportedVersion { version }),
        }
    }
}

/// Decodes `bytes` as one `T` with nothing after it.
pub(crate) fn decode_all<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|error| DecodeError::Malformed { reason: error.to_string() })?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed { reason: format!("{} bytes after the end", rest.len()) });
    }
    Ok(value)
}

//! Sealing (sign once, encrypt once, wrap the session key per recipient) and fail-closed opening.

use std::io::{Read, Write};

use bytes::Bytes;
use sequoia_openpgp as openpgp;
use sha2::{Digest, Sha256};

use openpgp::crypto::SessionKey;
use openpgp::packet::{PKESK, SKESK};
use openpgp::parse::Parse;
use openpgp::parse::stream::{DecryptionHelper, DecryptorBuilder, MessageLayer, MessageStructure, VerificationHelper};
use openpgp::policy::StandardPolicy;
use openpgp::serialize::stream::{Encryptor, LiteralWriter, Message, Signer};
use openpgp::types::SymmetricAlgorithm;
use openpgp::{Cert, KeyHandle};

use crate::envelope::{DecodeError, ENVELOPE_VERSION, Envelope, EnvelopeId, Header, Inner, Recipient};
use crate::keys::{CellKey, Keyring};
use crate::provenance::{Direction, ProvenanceRow};

/// The scheme provenance rows name: OpenPGP (RFC 9580), signed then encrypted, envelope version 1.
pub const SCHEME: &str = "openpgp-sign-encrypt/v1";

/// Largest sealed contents (header and payload) opened: a compressed message could otherwise expand without bound
/// before its signature is checked.
pub const MAX_SEALED_BYTES: u64 = 64 * 1024 * 1024;

/// Why an envelope was not sealed. Nothing was sealed for anyone.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A recipient whose key is not in the keyring: the whole send is refused.
    #[error("no key for recipient cell {cell:?}: the envelope was not sealed for anyone (import its key first)")]
    UnknownRecipient {
        /// The cell.
        cell: String,
    },
    /// No recipients at all.
    #[error("an envelope needs at least one recipient")]
    NoRecipients,
    /// One recipient named twice.
    #[error("recipient cell {cell:?} is named twice")]
    DuplicateRecipient {
        /// The cell.
        cell: String,
    },
    /// The OpenPGP machinery failed.
    #[error("sealing failed: {reason}")]
    Crypto {
        /// What failed.
        reason: String,
    },
}

/// Why an envelope was refused. Nothing of it may be ingested.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The bytes are not an envelope this build reads.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// This cell is not among the recipients, or no key packet decrypts with its key.
    #[error("envelope {id} cannot be decrypted by cell {cell:?}")]
    NotForUs {
        /// The envelope.
        id: EnvelopeId,
        /// This cell.
        cell: String,
    },
    /// The signer is not a cell in the keyring.
    #[error("envelope {id} is signed by {signer}, which is not a known cell's key")]
    UnknownSigner {
        /// The envelope.
        id: EnvelopeId,
        /// The fingerprint the header claims, or that the signature names.
        signer: String,
    },
    /// The signature does not verify, is missing, or is not the one sender's.
    #[error("envelope {id} has no valid signature by its sender: {reason}")]
    BadSignature {
        /// The envelope.
        id: EnvelopeId,
        /// What is wrong.
        reason: String,
    },
    /// The body or header was changed after sealing (or the OpenPGP message is damaged).
    #[error("envelope {id} was tampered with: {reason}")]
    Tampered {
        /// The envelope.
        id: EnvelopeId,
        /// What does not match.
        reason: String,
    },
}

/// A sealed envelope and the sender's provenance row (unverified: it records what the sender claims).
#[derive(Clone, Debug)]
pub struct Sealed {
    /// The envelope.
    pub envelope: Envelope,
    /// The sender's row.
    pub provenance: ProvenanceRow,
}

/// An opened envelope: the verified header and payload, and the receiver's provenance row (verified).
#[derive(Clone, Debug)]
pub struct Opened {
    /// The header, as signed.
    pub header: Header,
    /// The payload.
    pub payload: Bytes,
    /// The receiver's row.
    pub provenance: ProvenanceRow,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Seals `payload` from `principal` of `sender`'s cell for `recipients` (cell names; `sender`'s own cell may be one of
/// them). Every recipient's key is resolved before anything is encrypted: one unknown recipient refuses the whole send.
pub fn seal(
    (sender, principal): (&CellKey, &str),
    keyring: &Keyring,
    recipients: &[&str],
    id: EnvelopeId,
    created_ms: u64,
    payload: &[u8],
) -> Result<Sealed, SealError> {
    if recipients.is_empty() {
        return Err(SealError::NoRecipients);
    }
    let mut certs: Vec<(Recipient, Cert)> = Vec::with_capacity(recipients.len());
    for &cell in recipients {
        if certs.iter().any(|(recipient, _)| recipient.cell == cell) {
            return Err(SealError::DuplicateRecipient { cell: cell.to_string() });
        }
        let cert = if cell == sender.cell() {
            sender.public()
        } else {
            keyring.get(cell).ok_or_else(|| SealError::UnknownRecipient { cell: cell.to_string() })?.cert.clone()
        };
        certs.push((Recipient { cell: cell.to_string(), fingerprint: cert.fingerprint().to_hex() }, cert));
    }
    let header = Header {
        id,
        sender: sender.cell().to_string(),
        sender_fingerprint: sender.fingerprint(),
        recipients: certs.iter().map(|(recipient, _)| recipient.clone()).collect(),
        created_ms,
        principal: principal.to_string(),
    };
    let inner = postcard::to_stdvec(&Inner { header: header.clone(), payload: Bytes::copy_from_slice(payload) })
        .expect("encoding into memory does not fail");

    let crypto = |error: anyhow::Error| SealError::Crypto { reason: format!("{error:#}") };
    let policy = StandardPolicy::new();
    let mut encryption_keys = Vec::new();
    for (recipient, cert) in &certs {
        let valid = cert.with_policy(&policy, None).map_err(crypto)?;
        // One key packet per recipient: its newest live encryption key.
        let newest = valid
            .keys()
            .supported()
            .alive()
            .revoked(false)
            .for_transport_encryption()
            .max_by_key(|ka| ka.key().creation_time())
            .ok_or_else(|| SealError::Crypto {
                reason: format!("{}'s key has no live encryption key", recipient.cell),
            })?;
        encryption_keys.push(newest);
    }
    let signing_key = sender
        .cert()
        .keys()
        .unencrypted_secret()
        .with_policy(&policy, None)
        .supported()
        .alive()
        .revoked(false)
        .for_signing()
        .next()
        .ok_or_else(|| SealError::Crypto { reason: "this cell's key has no live signing key".to_string() })?
        .key()
        .clone()
        .into_keypair()
        .map_err(crypto)?;

    let mut sealed = Vec::with_capacity(inner.len() + 256 * certs.len() + 512);
    {
        let message = Message::new(&mut sealed);
        let message = Encryptor::for_recipients(message, encryption_keys).build().map_err(crypto)?;
        let message = Signer::new(message, signing_key).map_err(crypto)?.build().map_err(crypto)?;
        let mut literal = LiteralWriter::new(message).build().map_err(crypto)?;
        literal.write_all(&inner).map_err(|error| crypto(error.into()))?;
        literal.finalize().map_err(crypto)?;
    }
    let envelope = Envelope { version: ENVELOPE_VERSION, header: header.clone(), sealed: Bytes::from(sealed) };
    let provenance = ProvenanceRow {
        envelope_id: header.id.clone(),
        direction: Direction::Sent,
        verified: false,
        signer_fingerprint: header.sender_fingerprint.clone(),
        scheme: SCHEME.to_string(),
        recipients: header.recipients.iter().map(|recipient| recipient.fingerprint.clone()).collect(),
        payload_sha256: sha256_hex(payload),
        envelope_sha256: sha256_hex(&envelope.encode()),
        at_ms: created_ms,
    };
    Ok(Sealed { envelope, provenance })
}

/// Opens an envelope addressed to `receiver`'s cell: decrypts it, requires exactly one valid signature by the key
/// of the sending cell as the keyring knows it, and requires the sealed header to equal the clear one. Anything
/// else is an error and yields nothing. `now_ms` stamps the receiver's provenance row.
pub fn open(receiver: &CellKey, keyring: &Keyring, bytes: &[u8], now_ms: u64) -> Result<Opened, OpenError> {
    let envelope = Envelope::decode(bytes)?;
    let header = &envelope.header;
    let id = header.id.clone();
    let own = receiver.fingerprint();
    if !header.recipients.iter().any(|recipient| recipient.cell == receiver.cell() && recipient.fingerprint == own) {
        return Err(OpenError::NotForUs { id, cell: receiver.cell().to_string() });
    }
    let signer = if header.sender == receiver.cell() {
        receiver.public()
    } else {
        match keyring.get(&header.sender) {
            Some(peer) => peer.cert.clone(),
            None => return Err(OpenError::UnknownSigner { id, signer: header.sender_fingerprint.clone() }),
        }
    };
    if signer.fingerprint().to_hex() != header.sender_fingerprint {
        return Err(OpenError::UnknownSigner { id, signer: header.sender_fingerprint.clone() });
    }

    let policy = StandardPolicy::new();
    let helper = Helper { receiver, signer: &signer, decrypted: false, verdict: None };
    let mut plaintext = Vec::new();
    let result = DecryptorBuilder::from_bytes(&envelope.sealed[..])
        .and_then(|builder| builder.with_policy(&policy, None, helper))
        .and_then(|mut decryptor| {
            (&mut decryptor).take(MAX_SEALED_BYTES + 1).read_to_end(&mut plaintext)?;
            Ok(decryptor.into_helper())
        });
    let helper = match result {
        Ok(helper) => helper,
        Err(error) => return Err(classify(id, receiver, error)),
    };
    if u64::try_from(plaintext.len()).unwrap_or(u64::MAX) > MAX_SEALED_BYTES {
        return Err(OpenError::Tampered { id, reason: format!("sealed contents exceed {MAX_SEALED_BYTES} bytes") });
    }
    // `check` has run (sequoia releases no plaintext before it); require its verdict anyway.
    match helper.verdict {
        Some(Ok(())) if helper.decrypted => {}
        Some(Err(reason)) => return Err(OpenError::BadSignature { id, reason }),
        _ => return Err(OpenError::BadSignature { id, reason: "the signature was not checked".to_string() }),
    }
    let inner = Inner::decode(envelope.version, &plaintext)
        .map_err(|error| OpenError::Tampered { id: id.clone(), reason: format!("sealed contents: {error}") })?;
    if &inner.header != header {
        return Err(OpenError::Tampered { id, reason: "the clear header differs from the sealed one".to_string() });
    }
    let provenance = ProvenanceRow {
        envelope_id: id,
        direction: Direction::Received,
        verified: true,
        signer_fingerprint: signer.fingerprint().to_hex(),
        scheme: SCHEME.to_string(),
        recipients: header.recipients.iter().map(|recipient| recipient.fingerprint.clone()).collect(),
        payload_sha256: sha256_hex(&inner.payload),
        envelope_sha256: sha256_hex(bytes),
        at_ms: now_ms,
    };
    Ok(Opened { header: inner.header, payload: inner.payload, provenance })
}

/// Sorts a failure of the OpenPGP machinery into the envelope's errors.
fn classify(id: EnvelopeId, receiver: &CellKey, error: anyhow::Error) -> OpenError {
    let reason = format!("{error:#}");
    if let Some(verdict) = error.downcast_ref::<Verdict>() {
        return match verdict {
            Verdict::NotForUs => OpenError::NotForUs { id, cell: receiver.cell().to_string() },
            Verdict::BadSignature(reason) => OpenError::BadSignature { id, reason: reason.clone() },
        };
    }
    OpenError::Tampered { id, reason }
}

/// What the helper decided, carried through sequoia's error type.
#[derive(Debug, thiserror::Error)]
enum Verdict {
    #[error("no key packet decrypts with this cell's key")]
    NotForUs,
    #[error("{0}")]
    BadSignature(String),
}

struct Helper<'a> {
    receiver: &'a CellKey,
    signer: &'a Cert,
    decrypted: bool,
    verdict: Option<Result<(), String>>,
}

impl VerificationHelper for Helper<'_> {
    fn get_certs(&mut self, _ids: &[KeyHandle]) -> openpgp::Result<Vec<Cert>> {
        // Only the sender's key may have signed: no other certificate is offered.
        Ok(vec![self.signer.clone()])
    }

    fn check(&mut self, structure: MessageStructure) -> openpgp::Result<()> {
        let mut good = 0;
        for layer in structure {
            match layer {
                MessageLayer::Encryption { .. } | MessageLayer::Compression { .. } => {}
                MessageLayer::SignatureGroup { results } => {
                    for result in results {
                        match result {
                            Ok(checked) if checked.ka.cert().fingerprint() == self.signer.fingerprint() => good += 1,
                            Ok(checked) => {
                                let reason = format!("signed by {}, not the sender", checked.ka.cert().fingerprint());
                                return Err(Verdict::BadSignature(reason).into());
                            }
                            Err(error) => return Err(Verdict::BadSignature(error.to_string()).into()),
                        }
                    }
                }
            }
        }
        if !self.decrypted {
            return Err(Verdict::NotForUs.into());
        }
        let verdict = match good {
            1 => Ok(()),
            0 => Err("not signed".to_string()),
            n => Err(format!("{n} signatures where one is expected")),
        };
        self.verdict = Some(verdict.clone());
        verdict.map_err(|reason| Verdict::BadSignature(reason).into())
    }
}

impl DecryptionHelper for Helper<'_> {
    fn decrypt(
        &mut self,
        pkesks: &[PKESK],
        _skesks: &[SKESK],
        sym_algo: Option<SymmetricAlgorithm>,
        decrypt: &mut dyn FnMut(Option<SymmetricAlgorithm>, &SessionKey) -> bool,
    ) -> openpgp::Result<Option<Cert>> {
        let policy = StandardPolicy::new();
        let keys: Vec<_> = self
            .receiver
            .cert()
            .keys()
            .unencrypted_secret()
            .with_policy(&policy, None)
            .supported()
            .for_transport_encryption()
            .map(|ka| ka.key().clone())
            .collect();
        for pkesk in pkesks {
            for key in &keys {
                let addressed = pkesk.recipient().is_none_or(|recipient| recipient.aliases(key.key_handle()));
                if !addressed {
                    continue;
                }
                let mut pair = key.clone().into_keypair()?;
                if let Some((algo, session_key)) = pkesk.decrypt(&mut pair, sym_algo)
                    && decrypt(algo, &session_key)
                {
                    self.decrypted = true;
                    return Ok(Some(self.receiver.public()));
                }
            }
        }
        Err(Verdict::NotForUs.into())
    }
}

//! Sealed and signed messages between cells.
//!
//! An [`Envelope`] carries a payload encrypted once, under one session key, with that key wrapped separately for each
//! recipient cell (one OpenPGP key packet per recipient), and signed once, inside the encryption, by the sending
//! cell's key. Its clear [`Header`] (id, sender cell and principal, recipients, time) is repeated inside the signed
//! plaintext, so changing it is detected when the envelope is opened.
//!
//! - [`keys`]: the cell's own key pair, kept in its data directory, and the keyring of other cells' public keys.
//! - [`seal`] and [`open`]: all-or-nothing sealing (a recipient whose key is unknown aborts the whole send, naming it)
//!   and fail-closed opening (a bad or unknown signature, a tampered body or header, or an envelope this cell cannot
//!   decrypt is an error, and nothing is returned).
//! - [`provenance`]: the rows the sender (unverified) and the receiver (verified) record: fingerprints and SHA-256
//!   references only, and a ledger whose failures are logged and counted, never fatal.
//! - [`policy`]: which kinds of principal must encrypt.
//!
//! OpenPGP signatures carry random salt, so signature bytes differ from run to run: anything deterministic (traces,
//! digests) records fingerprints and hashes of the plaintext instead.

pub mod envelope;
pub mod keys;
pub mod policy;
pub mod provenance;
mod seal;

pub use envelope::{ENVELOPE_VERSION, Envelope, EnvelopeId, Header, Recipient};
pub use keys::{CellKey, KeyError, Keyring, PeerKey};
pub use policy::{PolicyError, PrincipalKind};
pub use provenance::{Direction, ProvenanceRow};
pub use seal::{OpenError, Opened, SCHEME, SealError, Sealed, open, seal};

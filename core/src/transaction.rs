//! Transactional producers: epochs that fence older instances, and transactions whose staged messages stay
//! invisible (and out of reach of retention) until a commit appends them all at once.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{AbortReason, PublishRequest};
use crate::time::Millis;

/// Most messages one transaction may stage.
pub const MAX_TRANSACTION_MESSAGES: u64 = 10_000;
/// Most payload bytes one transaction may stage (64 MiB).
pub const MAX_TRANSACTION_BYTES: u64 = 64 * 1024 * 1024;

/// A message waiting in a transaction, already routed and validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Staged {
    pub stream: Arc<str>,
    /// Which incarnation of the stream: a stream deleted and created again under the same name is another stream.
    pub stream_id: u64,
    pub partition: u32,
    pub size: u64,
    pub request: PublishRequest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TransactionState {
    Open,
    Prepared,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Transaction {
    /// Numbers the producer's transactions, so a timer set for one never fires on the next.
    pub number: u64,
    pub state: TransactionState,
    pub begun_at: Millis,
    pub deadline: Millis,
    pub staged: Vec<Staged>,
    pub staged_bytes: u64,
}

/// How the producer's last transaction ended, kept so that a retried commit or abort (whose answer was lost)
/// gets the same answer instead of a bare `Fenced`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TransactionEnd {
    Committed { epoch: u32, outcome: crate::command::Outcome },
    Aborted { epoch: u32, reason: AbortReason, detail: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Producer {
    pub transactional_id: Arc<str>,
    pub epoch: u32,
    pub timeout_ms: u64,
    pub transaction: Option<Transaction>,
    pub next_transaction_number: u64,
    pub last_end: Option<TransactionEnd>,
}

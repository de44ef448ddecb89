//! Sealed mail between cells: the outbox, delivery to other cells' inboxes, the inbox, and the provenance ledger.
//!
//! Everything lives in four streams of the cell ([`schema`]), so it is replicated, survives restarts and moves with
//! leadership:
//! - [`schema::OUTBOX`] (`mail.out.<envelope id>`): sealed envelopes to deliver;
//! - [`schema::RESULTS`] (`mail.results.<envelope id>.<recipient>`): the final result for each recipient;
//! - [`schema::INBOX`] (`mail.in.<sender>`): envelopes delivered to this cell, stored once per envelope id (the
//!   message id);
//! - [`schema::PROVENANCE`] (`mail.provenance.<sent|received>.<envelope id>`): the ledger. Each row pins the envelope
//!   it describes (`Cellog-Pin`), so retention never reclaims an envelope while its row is kept.
//!
//! Sending seals on the leader and stores the envelope in the outbox. The leader's [`deliver_loop`] then walks the
//! outbox: for each recipient without a result it calls the recipient cell's `Deliver` at the addresses its
//! [`MailConfig::homes`] name (store and forward: an unreachable recipient is retried with exponential backoff until
//! [`RetryPolicy::give_up_after`]), and records delivered, denied, no home or failed. A new leader takes over from
//! what the results say; a recipient that gets an envelope twice stores it once. When to try whom is decided by
//! [`outbox::Outbox`], sans-IO.
//!
//! Receiving opens and verifies the envelope (fail-closed: nothing unverified is stored), stores it in the inbox, and
//! records a verified provenance row. A provenance row that cannot be written is logged and counted, and the mail goes
//! on.
//!
//! Mail reaches its own cell only through [`MailCell`] (propose, read, leadership, time), and other cells only through
//! the client library; it serves `cellog.v1.Mail` ([`MailService`]).

#![allow(clippy::result_large_err, reason = "tonic's Status is large, and it is what every call returns")]

pub mod cell;
pub mod deliver;
pub mod outbox;
pub mod room;
pub mod schema;
pub mod service;

pub use cell::MailCell;
pub use deliver::deliver_loop;
pub use outbox::RetryPolicy;
pub use room::{MailConfig, MailMetrics, Mailroom};
pub use service::MailService;

//! `cellog mail`: sealed mail to other cells: send, delivery status, the inbox.

use std::io::Read;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::client;
use crate::table::Table;

#[derive(Subcommand)]
pub enum MailCommand {
    /// Seal a payload for other cells (signed by this cell, encrypted for each recipient) and queue it for
    /// delivery; prints the envelope id to ask `cellog mail status` about.
    Send {
        /// Recipient cells, comma-separated.
        #[arg(long = "to", value_delimiter = ',', required = true)]
        to: Vec<String>,
        /// The payload; read from standard input when absent.
        payload: Option<String>,
        /// The envelope id (makes a retry safe: one id is sent once); the node picks one when absent.
        #[arg(long)]
        id: Option<String>,
        /// Wait until every recipient has a final result, printing it.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// One line per recipient of an envelope this cell sent: delivered, denied, no home, failed or pending.
    Status {
        id: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// This cell's inbox, opened: sender, envelope id and payload of each message.
    Read {
        /// The first inbox sequence.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: u32,
        #[command(flatten)]
        connect: Connect,
    },
}

fn result_name(result: i32) -> &'static str {
    match v1::DeliveryResult::try_from(result).unwrap_or(v1::DeliveryResult::Unspecified) {
        v1::DeliveryResult::Delivered => "delivered",
        v1::DeliveryResult::Denied => "denied",
        v1::DeliveryResult::NoHome => "no home",
        v1::DeliveryResult::Failed => "failed",
        v1::DeliveryResult::Pending | v1::DeliveryResult::Unspecified => "pending",
    }
}

fn print_delivery(status: &v1::DeliveryStatusResponse) {
    let total = status.recipients.len();
    println!(
        "envelope {}: {} of {total} delivered, {} denied, {} no home, {} failed, {} pending",
        status.envelope_id, status.delivered, status.denied, status.no_home, status.failed, status.pending
    );
    let mut table = Table::new(["recipient", "result", "attempts", "detail"]).right([2]);
    for recipient in &status.recipients {
        let result = result_name(recipient.result).to_string();
        table.row([recipient.cell.clone(), result, recipient.attempts.to_string(), recipient.detail.clone()]);
    }
    table.print(2);
}

pub async fn run(command: MailCommand) -> anyhow::Result<()> {
    match command {
        MailCommand::Send { to, payload, id, wait, connect } => {
            let payload = match payload {
                Some(text) => Bytes::from(text),
                None => {
                    let mut body = Vec::new();
                    std::io::stdin().read_to_end(&mut body).context("reading the payload from standard input")?;
                    Bytes::from(body)
                }
            };
            let client = client(&connect)?;
            let sent = client.send_sealed(&to, payload, id.as_deref()).await?;
            let again = if sent.duplicate { " (already sent under this id)" } else { "" };
            println!(
                "envelope {} ({} bytes) queued for {}{again}",
                sent.envelope_id,
                sent.envelope_bytes,
                to.join(", ")
            );
            if wait {
                loop {
                    let status = client.delivery_status(&sent.envelope_id).await?;
                    if status.pending == 0 {
                        print_delivery(&status);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        MailCommand::Status { id, connect } => print_delivery(&client(&connect)?.delivery_status(&id).await?),
        MailCommand::Read { from, max, connect } => {
            for mail in client(&connect)?.read_mail(from, max).await? {
                let by = if mail.principal.is_empty() { String::new() } else { format!(" by {}", mail.principal) };
                println!(
                    "#{} from {}{by} ({}) envelope {}: {}",
                    mail.seq,
                    mail.sender,
                    mail.sender_fingerprint,
                    mail.envelope_id,
                    String::from_utf8_lossy(&mail.payload)
                );
            }
        }
    }
    Ok(())
}

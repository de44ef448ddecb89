//! `cellog quota`: what a tenant, and the cell as a whole, may hold (streams, retained messages and bytes) and have
//! delivered and not yet acknowledged.

use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::client;
use crate::table::Table;

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set a tenant's quotas, or the cell's own (over every stream) without --tenant. A limit not given is none; with
    /// none given, a tenant's quotas are dropped.
    Set {
        /// The tenant (the part before `/` in its principals' names).
        #[arg(long)]
        tenant: Option<String>,
        /// Most streams.
        #[arg(long)]
        max_streams: Option<u64>,
        /// Most retained messages, across its streams.
        #[arg(long)]
        max_msgs: Option<u64>,
        /// Most retained bytes (payload, subject, key and headers), across its streams.
        #[arg(long)]
        max_bytes: Option<u64>,
        /// Most deliveries awaiting an ack, across every consumer of its streams: at it, fetches and subscriptions
        /// deliver nothing more until acks make room.
        #[arg(long)]
        max_in_flight: Option<u64>,
        /// Most deliveries of one subject awaiting an ack at one consumer: a subject's later messages wait, in order,
        /// while the consumer's other subjects go on.
        #[arg(long)]
        max_in_flight_per_subject: Option<u32>,
        #[command(flatten)]
        connect: Connect,
    },
    /// The quotas and what each holder holds now: every one for a cluster admin, a tenant's own for its principals.
    Ls {
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn run(command: QuotaCommand) -> anyhow::Result<()> {
    match command {
        QuotaCommand::Set {
            tenant,
            max_streams,
            max_msgs,
            max_bytes,
            max_in_flight,
            max_in_flight_per_subject,
            connect,
        } => {
            let quotas =
                v1::Quotas { max_streams, max_messages: max_msgs, max_bytes, max_in_flight, max_in_flight_per_subject };
            client(&connect)?.set_quotas(tenant.as_deref(), quotas).await?;
            let holder = tenant.map_or("the cell".to_string(), |tenant| format!("tenant {tenant}"));
            println!("quotas of {holder} set: {}", describe(&quotas));
        }
        QuotaCommand::Ls { connect } => {
            let mut table =
                Table::new(["HOLDER", "STREAMS", "MESSAGES", "BYTES", "IN FLIGHT", "QUOTAS"]).right([1, 2, 3, 4]);
            for holder in client(&connect)?.quotas().await? {
                let name = if holder.tenant.is_empty() { "(cell)".to_string() } else { holder.tenant };
                let quotas = describe(&holder.quotas.unwrap_or_default());
                let counts = [holder.streams, holder.messages, holder.bytes, holder.in_flight].map(|n| n.to_string());
                let [streams, messages, bytes, in_flight] = counts;
                table.row([name, streams, messages, bytes, in_flight, quotas]);
            }
            table.print(0);
        }
    }
    Ok(())
}

fn describe(quotas: &v1::Quotas) -> String {
    let parts: Vec<String> = [
        ("streams", quotas.max_streams),
        ("msgs", quotas.max_messages),
        ("bytes", quotas.max_bytes),
        ("in flight", quotas.max_in_flight),
        ("in flight per subject", quotas.max_in_flight_per_subject.map(u64::from)),
    ]
    .into_iter()
    .filter_map(|(what, limit)| limit.map(|limit| format!("max {what} {limit}")))
    .collect();
    if parts.is_empty() { "none".to_string() } else { parts.join(", ") }
}

//! `cellog consumer`: create, update, list, inspect and delete durable consumers.

use anyhow::{Context, bail};
use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::route::Route;
use crate::table::Table;

#[derive(Subcommand)]
pub enum ConsumerCommand {
    /// Create a durable consumer.
    Add {
        stream: String,
        name: String,
        /// Only subjects matching this filter.
        #[arg(long)]
        filter: Option<String>,
        /// Where to start: all, new, seq:N, or time:MILLIS_SINCE_EPOCH.
        #[arg(long, default_value = "all")]
        deliver: String,
        /// Redeliver a message not acknowledged within this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        ack_wait_ms: u64,
        /// Dead-letter a message after this many deliveries.
        #[arg(long)]
        max_deliver: Option<u32>,
        /// Most deliveries unacknowledged at once.
        #[arg(long, default_value_t = 1000)]
        max_in_flight: u32,
        #[command(flatten)]
        connect: Connect,
    },
    /// Change a consumer's ack wait, max deliver or max in flight (the others stay as they are).
    Update {
        stream: String,
        name: String,
        /// Redeliver a message not acknowledged within this many milliseconds.
        #[arg(long)]
        ack_wait_ms: Option<u64>,
        /// Dead-letter a message after this many deliveries.
        #[arg(long)]
        max_deliver: Option<u32>,
        /// Most deliveries unacknowledged at once.
        #[arg(long)]
        max_in_flight: Option<u32>,
        #[command(flatten)]
        connect: Connect,
    },
    /// List a stream's consumers.
    Ls {
        stream: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a consumer.
    Info {
        stream: String,
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a consumer.
    Rm {
        stream: String,
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
}

fn deliver_policy(text: &str) -> anyhow::Result<(v1::DeliverPolicy, u64)> {
    Ok(match text.split_once(':') {
        None if text == "all" => (v1::DeliverPolicy::DeliverAll, 0),
        None if text == "new" => (v1::DeliverPolicy::DeliverNew, 0),
        Some(("seq", seq)) => (v1::DeliverPolicy::DeliverFromSequence, seq.parse().context("--deliver seq:N")?),
        Some(("time", at)) => (v1::DeliverPolicy::DeliverFromTime, at.parse().context("--deliver time:MILLIS")?),
        _ => bail!("--deliver must be all, new, seq:N or time:MILLIS, not {text:?}"),
    })
}

pub async fn run(command: ConsumerCommand) -> anyhow::Result<()> {
    match command {
        ConsumerCommand::Add { stream, name, filter, deliver, ack_wait_ms, max_deliver, max_in_flight, connect } => {
            let (policy, deliver_from) = deliver_policy(&deliver)?;
            let config = v1::ConsumerConfig {
                filter_subject: filter,
                deliver_policy: policy as i32,
                deliver_from,
                ack_wait_ms: Some(ack_wait_ms),
                max_deliver,
                max_in_flight: Some(max_in_flight),
            };
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, name, config) = (&stream, &name, &config);
            let created =
                route.call(|client| async move { client.create_consumer(stream, name, config.clone()).await }).await?;
            println!("consumer {name} on {stream} {}", if created { "created" } else { "already exists" });
        }
        ConsumerCommand::Update { stream, name, ack_wait_ms, max_deliver, max_in_flight, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, name) = (&stream, &name);
            let info = route.call(|client| async move { client.consumer_info(stream, name).await }).await?;
            let mut config = info.config.unwrap_or_default();
            config.ack_wait_ms = ack_wait_ms.or(config.ack_wait_ms);
            config.max_deliver = max_deliver.or(config.max_deliver);
            config.max_in_flight = max_in_flight.or(config.max_in_flight);
            let config = &config;
            route.call(|client| async move { client.update_consumer(stream, name, config.clone()).await }).await?;
            println!("consumer {name} on {stream} updated");
        }
        ConsumerCommand::Ls { stream, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let stream = &stream;
            let consumers = route.call(|client| async move { client.list_consumers(stream).await }).await?;
            let mut table = Table::new(["consumer", "lag", "pending", "acked", "oldest unacked"]).right([1, 2, 3, 4]);
            for consumer in consumers {
                table.row([
                    consumer.name,
                    consumer.lag_total.to_string(),
                    consumer.pending.to_string(),
                    consumer.acked.to_string(),
                    format!("{}ms", consumer.oldest_unacked_age_ms),
                ]);
            }
            table.print(0);
        }
        ConsumerCommand::Info { stream, name, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, name) = (&stream, &name);
            let info = route.call(|client| async move { client.consumer_info(stream, name).await }).await?;
            println!("consumer {} on {}", info.name, info.stream);
            if let Some(config) = &info.config {
                println!("  filter          {}", config.filter_subject.as_deref().unwrap_or("(all)"));
                println!("  ack wait ms     {}", config.ack_wait_ms.unwrap_or_default());
                println!("  max deliver     {:?}", config.max_deliver);
                println!("  max in flight   {}", config.max_in_flight.unwrap_or_default());
            }
            println!("  lag             {} (max {} in one partition)", info.lag_total, info.lag_max);
            println!("  pending         {}", info.pending);
            println!("  delivered       {} ({} redelivered)", info.delivered, info.redelivered);
            println!("  acked           {}", info.acked);
            println!("  dead-lettered   {}", info.dead_lettered);
            println!("  oldest unacked  {} ms", info.oldest_unacked_age_ms);
            for partition in &info.partitions {
                println!(
                    "  partition {:<3} cursor {} ack floor {} lag {} outstanding {}",
                    partition.partition, partition.cursor, partition.ack_floor, partition.lag, partition.outstanding
                );
            }
        }
        ConsumerCommand::Rm { stream, name, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, name) = (&stream, &name);
            route.call(|client| async move { client.delete_consumer(stream, name).await }).await?;
            println!("consumer {name} on {stream} deleted");
        }
    }
    Ok(())
}

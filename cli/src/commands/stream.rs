//! `cellog stream`: create, list, inspect and delete streams.

use cellog_client::proto as v1;
use clap::{Subcommand, ValueEnum};

use crate::Connect;
use crate::commands::route::Route;
use crate::commands::{client, directory};
use crate::table::Table;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Retention {
    /// Keep messages until a limit removes them.
    Limits,
    /// Keep messages until every consumer is done with them.
    Interest,
    /// Each message is done once one consumer is done with it.
    WorkQueue,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Discard {
    /// At a limit, remove the oldest.
    Old,
    /// At a limit, refuse the new message.
    New,
}

/// A stream's limits, as `add` sets them and `update` changes them (what is not given: none, or unchanged).
#[derive(clap::Args)]
pub struct LimitArgs {
    /// Remove messages older than this many milliseconds.
    #[arg(long)]
    max_age_ms: Option<u64>,
    /// Keep at most this many messages.
    #[arg(long)]
    max_msgs: Option<u64>,
    /// Keep at most this many bytes.
    #[arg(long)]
    max_bytes: Option<u64>,
    /// Keep at most this many messages per subject.
    #[arg(long)]
    max_msgs_per_subject: Option<u64>,
    /// Keep at most this many bytes per subject.
    #[arg(long)]
    max_bytes_per_subject: Option<u64>,
    /// Largest payload accepted.
    #[arg(long)]
    max_payload: Option<u32>,
    /// Deduplicate message ids over this many milliseconds (at least).
    #[arg(long)]
    duplicate_window_ms: Option<u64>,
    /// Where messages go after exhausting their deliveries.
    #[arg(long)]
    dead_letter: Option<String>,
}

impl LimitArgs {
    /// Sets on `config` each limit given, leaving the others as they are.
    fn apply_to(self, config: &mut v1::StreamConfig) {
        let LimitArgs {
            max_age_ms,
            max_msgs,
            max_bytes,
            max_msgs_per_subject,
            max_bytes_per_subject,
            max_payload,
            duplicate_window_ms,
            dead_letter,
        } = self;
        let fields = [
            (&mut config.max_age_ms, max_age_ms),
            (&mut config.max_messages, max_msgs),
            (&mut config.max_bytes, max_bytes),
            (&mut config.max_messages_per_subject, max_msgs_per_subject),
            (&mut config.max_bytes_per_subject, max_bytes_per_subject),
            (&mut config.duplicate_window_ms, duplicate_window_ms),
        ];
        for (field, given) in fields {
            if given.is_some() {
                *field = given;
            }
        }
        if max_payload.is_some() {
            config.max_payload_bytes = max_payload;
        }
        if dead_letter.is_some() {
            config.dead_letter_stream = dead_letter;
        }
    }
}

#[derive(Subcommand)]
pub enum StreamCommand {
    /// Create a stream.
    Add {
        /// The stream's name.
        name: String,
        /// Subjects the stream claims (wildcards `*` and `>`), comma-separated.
        #[arg(long, required = true, value_delimiter = ',')]
        subjects: Vec<String>,
        /// Partitions.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[arg(long, value_enum, default_value = "limits")]
        retention: Retention,
        #[arg(long, value_enum, default_value = "old")]
        discard: Discard,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        connect: Connect,
    },
    /// Change a stream's limits, rate and dead-letter stream; what is not given stays as it is.
    Update {
        /// The stream's name.
        name: String,
        /// Subjects the stream claims, comma-separated (replaces the list).
        #[arg(long, value_delimiter = ',')]
        subjects: Option<Vec<String>>,
        #[arg(long, value_enum)]
        discard: Option<Discard>,
        #[command(flatten)]
        limits: LimitArgs,
        /// Accept at most this many publishes per second (a token bucket; with --burst).
        #[arg(long, requires = "burst")]
        rate: Option<u32>,
        /// Publishes accepted at once after a quiet spell.
        #[arg(long, requires = "rate")]
        burst: Option<u32>,
        /// Limits to lift (age, msgs, bytes, msgs-per-subject, bytes-per-subject, rate, dead-letter), comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = ["age", "msgs", "bytes", "msgs-per-subject", "bytes-per-subject", "rate", "dead-letter"])]
        clear: Vec<String>,
        #[command(flatten)]
        connect: Connect,
    },
    /// List streams.
    Ls {
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a stream.
    Info {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a stream and everything in it.
    Rm {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn run(command: StreamCommand) -> anyhow::Result<()> {
    match command {
        StreamCommand::Add { name, subjects, partitions, retention, discard, limits, connect } => {
            let mut config = v1::StreamConfig {
                subjects,
                partitions,
                retention: match retention {
                    Retention::Limits => v1::RetentionPolicy::RetentionLimits,
                    Retention::Interest => v1::RetentionPolicy::RetentionInterest,
                    Retention::WorkQueue => v1::RetentionPolicy::RetentionWorkQueue,
                } as i32,
                discard: match discard {
                    Discard::Old => v1::DiscardPolicy::DiscardOld,
                    Discard::New => v1::DiscardPolicy::DiscardNew,
                } as i32,
                ..Default::default()
            };
            limits.apply_to(&mut config);
            // With --cell, created on that cell of the directory and placed there.
            let Some(cell) = &connect.to_cell else {
                let created = client(&connect)?.create_stream(&name, config).await?;
                println!("stream {name} {}", if created { "created" } else { "already exists with this config" });
                return Ok(());
            };
            let cells = cellog_client::Cells::new(directory(&connect)?, crate::commands::options(&connect)?);
            let created = cells.cell(cell).await?.create_stream(&name, config).await?;
            let placement = cells.place(&name, cell).await?;
            println!(
                "stream {name} {} on {cell}, placed there at epoch {}",
                if created { "created" } else { "already exists with this config" },
                placement.epoch
            );
        }
        StreamCommand::Update { name, subjects, discard, limits, rate, burst, clear, connect } => {
            let route = Route::new(&connect, Some(&name)).await?;
            let name = &name;
            let info = route.call(|client| async move { client.stream_info(name).await }).await?;
            let mut config =
                info.config.ok_or_else(|| anyhow::anyhow!("the node sent stream {name} without its config"))?;
            for lifted in &clear {
                match lifted.as_str() {
                    "age" => config.max_age_ms = None,
                    "msgs" => config.max_messages = None,
                    "bytes" => config.max_bytes = None,
                    "msgs-per-subject" => config.max_messages_per_subject = None,
                    "bytes-per-subject" => config.max_bytes_per_subject = None,
                    "rate" => config.rate_limit = None,
                    _ => config.dead_letter_stream = None,
                }
            }
            if let Some(subjects) = subjects {
                config.subjects = subjects;
            }
            if let Some(discard) = discard {
                config.discard = match discard {
                    Discard::Old => v1::DiscardPolicy::DiscardOld,
                    Discard::New => v1::DiscardPolicy::DiscardNew,
                } as i32;
            }
            limits.apply_to(&mut config);
            if let (Some(messages_per_second), Some(burst)) = (rate, burst) {
                config.rate_limit = Some(v1::RateLimit { messages_per_second, burst });
            }
            let config = &config;
            route.call(|client| async move { client.update_stream(name, config.clone()).await }).await?;
            println!("stream {name} updated");
            print_limits(config);
        }
        StreamCommand::Ls { connect } => {
            let streams = client(&connect)?.list_streams().await?;
            let mut table = Table::new(["stream", "messages", "bytes", "consumers", "subjects"]).right([1, 2, 3]);
            for stream in streams {
                let subjects = stream.config.map(|config| config.subjects.join(",")).unwrap_or_default();
                let counts = [stream.messages, stream.bytes, stream.consumers.len() as u64].map(|n| n.to_string());
                let [messages, bytes, consumers] = counts;
                table.row([stream.name, messages, bytes, consumers, subjects]);
            }
            table.print(0);
        }
        StreamCommand::Info { name, connect } => {
            let route = Route::new(&connect, Some(&name)).await?;
            let name = &name;
            let info = route.call(|client| async move { client.stream_info(name).await }).await?;
            print_stream(&info);
        }
        StreamCommand::Rm { name, connect } => {
            let route = Route::new(&connect, Some(&name)).await?;
            let name = &name;
            route.call(|client| async move { client.delete_stream(name).await }).await?;
            println!("stream {name} deleted");
        }
    }
    Ok(())
}

/// A stream config's subjects, limits and rate.
fn print_limits(config: &v1::StreamConfig) {
    println!("  subjects     {}", config.subjects.join(", "));
    println!("  partitions   {}", config.partitions);
    println!("  retention    {:?}", v1::RetentionPolicy::try_from(config.retention).ok());
    println!("  discard      {:?}", v1::DiscardPolicy::try_from(config.discard).ok());
    let limit = |value: Option<u64>| value.map_or("none".to_string(), |value| value.to_string());
    println!("  max age ms   {}", limit(config.max_age_ms));
    println!("  max msgs     {}", limit(config.max_messages));
    println!("  max bytes    {}", limit(config.max_bytes));
    println!(
        "  per subject  {} msgs, {} bytes",
        limit(config.max_messages_per_subject),
        limit(config.max_bytes_per_subject)
    );
    println!("  max payload  {}", config.max_payload_bytes.unwrap_or_default());
    match &config.rate_limit {
        Some(rate) => println!("  rate         {}/s, burst {}", rate.messages_per_second, rate.burst),
        None => println!("  rate         none"),
    }
    if let Some(dead_letter) = &config.dead_letter_stream {
        println!("  dead letter  {dead_letter}");
    }
}

fn print_stream(info: &v1::StreamInfo) {
    println!("stream {}", info.name);
    if let Some(config) = &info.config {
        print_limits(config);
    }
    println!("  messages     {}", info.messages);
    println!("  bytes        {}", info.bytes);
    println!("  subjects     {} distinct", info.subjects);
    println!("  consumers    {}", info.consumers.join(", "));
    for partition in &info.partitions {
        println!(
            "  partition {:<3} seq {}..={} ({} messages, {} bytes)",
            partition.partition, partition.low_watermark, partition.high_watermark, partition.messages, partition.bytes
        );
    }
    for peer in &info.peers {
        println!("  peer {} received {:?}", peer.name, peer.received);
    }
}

//! `cellog group`: list and inspect consumer groups, and join one as a member that prints its deliveries and its
//! assignment changes.

use std::time::Duration;

use anyhow::bail;
use cellog_client::group::{GroupMember, MemberOptions, Rebalance};
use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::route::Route;
use crate::table::Table;

#[derive(Subcommand)]
pub enum GroupCommand {
    /// List a stream's consumer groups.
    Ls {
        stream: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a group: generation, members, who owns each partition, lag.
    Info {
        stream: String,
        group: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Join a group as a member: print its deliveries (acknowledging each) and its assignment changes until
    /// interrupted or terminated (Ctrl-C, SIGTERM) or --count deliveries, then leave.
    Join {
        stream: String,
        group: String,
        /// The member's name [default: this host's name and process id].
        #[arg(long)]
        member: Option<String>,
        /// range, round-robin, sticky or cooperative-sticky.
        #[arg(long, default_value = "cooperative-sticky")]
        strategy: String,
        /// Remove the member after this long without a heartbeat.
        #[arg(long, default_value_t = 10_000)]
        session_timeout_ms: u64,
        /// Only subjects matching this filter (the group's consumer; every member must name the same).
        #[arg(long)]
        filter: Option<String>,
        /// Stop after this many deliveries (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Print deliveries without acknowledging them.
        #[arg(long)]
        no_ack: bool,
        #[command(flatten)]
        connect: Connect,
    },
}

fn strategy(text: &str) -> anyhow::Result<v1::GroupStrategy> {
    Ok(match text {
        "range" => v1::GroupStrategy::StrategyRange,
        "round-robin" => v1::GroupStrategy::StrategyRoundRobin,
        "sticky" => v1::GroupStrategy::StrategySticky,
        "cooperative-sticky" => v1::GroupStrategy::StrategyCooperativeSticky,
        _ => bail!("--strategy must be range, round-robin, sticky or cooperative-sticky, not {text:?}"),
    })
}

fn strategy_name(value: i32) -> &'static str {
    match v1::GroupStrategy::try_from(value) {
        Ok(v1::GroupStrategy::StrategyRange) => "range",
        Ok(v1::GroupStrategy::StrategyRoundRobin) => "round-robin",
        Ok(v1::GroupStrategy::StrategySticky) => "sticky",
        Ok(v1::GroupStrategy::StrategyCooperativeSticky) => "cooperative-sticky",
        Err(_) => "unknown",
    }
}

fn list(partitions: &[u32]) -> String {
    if partitions.is_empty() {
        return "-".to_string();
    }
    partitions.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Prints each assignment change as it happens.
struct Printer;

impl Rebalance for Printer {
    fn assigned(&mut self, partitions: &[u32]) {
        println!("assigned {}", list(partitions));
    }
    fn revoked(&mut self, partitions: &[u32]) {
        println!("revoked {}", list(partitions));
    }
}

pub async fn run(command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::Ls { stream, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let stream = &stream;
            let groups = route.call(|client| async move { client.list_groups(stream).await }).await?;
            let mut table =
                Table::new(["group", "strategy", "generation", "members", "lag", "rebalancing"]).right([2, 3, 4]);
            for group in groups {
                table.row([
                    group.name,
                    strategy_name(group.strategy).to_string(),
                    group.generation.to_string(),
                    group.members.len().to_string(),
                    group.consumer.map_or(0, |c| c.lag_total).to_string(),
                    if group.rebalancing { "yes" } else { "no" }.to_string(),
                ]);
            }
            table.print(0);
        }
        GroupCommand::Info { stream, group, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, group) = (&stream, &group);
            let info = route.call(|client| async move { client.group_info(stream, group).await }).await?;
            println!("group {} on {}", info.name, info.stream);
            println!("  strategy     {}", strategy_name(info.strategy));
            println!("  generation   {} ({} rebalances)", info.generation, info.rebalances);
            println!("  rebalancing  {}", if info.rebalancing { "yes" } else { "no" });
            if let Some(consumer) = &info.consumer {
                println!("  lag          {} (max {} in one partition)", consumer.lag_total, consumer.lag_max);
                println!("  pending      {}", consumer.pending);
            }
            let mut members = Table::new(["member", "owns", "revoking", "pending", "expires at ms"]).right([4]);
            for member in &info.members {
                let assignment = member.assignment.clone().unwrap_or_default();
                members.row([
                    member.name.clone(),
                    list(&assignment.partitions),
                    list(&assignment.revoking),
                    list(&assignment.pending),
                    member.expires_at_ms.to_string(),
                ]);
            }
            members.print(2);
            let mut partitions = Table::new(["partition", "owner", "since generation", "assignee", "ack floor", "lag"])
                .right([0, 2, 4, 5]);
            for p in &info.partitions {
                let or_none = |name: &str| if name.is_empty() { "-".to_string() } else { name.to_string() };
                partitions.row([
                    p.partition.to_string(),
                    or_none(&p.owner),
                    p.granted_at.to_string(),
                    or_none(&p.assignee),
                    p.ack_floor.to_string(),
                    p.lag.to_string(),
                ]);
            }
            partitions.print(2);
        }
        GroupCommand::Join {
            stream,
            group,
            member,
            strategy: name,
            session_timeout_ms,
            filter,
            count,
            no_ack,
            connect,
        } => {
            let member = member.unwrap_or_else(default_member);
            let options = MemberOptions {
                strategy: strategy(&name)?,
                session_timeout: Duration::from_millis(session_timeout_ms),
                heartbeat_every: Duration::from_millis((session_timeout_ms / 3).max(50)),
                config: v1::ConsumerConfig { filter_subject: filter, ..v1::ConsumerConfig::default() },
            };
            let mut printer = Printer;
            // A member keeps the cell the stream is on when it joins.
            let client = Route::new(&connect, Some(&stream)).await?.client().await?;
            let mut me = GroupMember::join(client, &stream, &group, &member, options, &mut printer).await?;
            println!("joined {group} on {stream} as {member} at generation {}", me.generation());
            let mut seen = 0u64;
            // Ctrl-C or SIGTERM: the member leaves the group (its partitions go to the others at once, not after
            // its session times out).
            let mut stop = std::pin::pin!(super::shutdown_signal());
            let outcome: anyhow::Result<()> = async {
                loop {
                    let deliveries = tokio::select! {
                        deliveries = me.fetch(256, &mut printer) => deliveries?,
                        () = &mut stop => return Ok(()),
                    };
                    if deliveries.is_empty() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    let mut acks = Vec::with_capacity(deliveries.len());
                    for delivery in deliveries {
                        let Some(message) = delivery.message else { continue };
                        let body = String::from_utf8_lossy(&message.payload);
                        println!(
                            "[{} p{} #{} x{}] {}",
                            message.subject, message.partition, message.seq, delivery.delivery_count, body
                        );
                        acks.push(v1::AckItem { partition: message.partition, seq: message.seq, ..Default::default() });
                        seen += 1;
                        if count > 0 && seen >= count {
                            break;
                        }
                    }
                    if !no_ack {
                        me.ack(acks).await?;
                    }
                    if count > 0 && seen >= count {
                        return Ok(());
                    }
                }
            }
            .await;
            me.leave(&mut printer).await?;
            println!("left {group}");
            outcome?;
        }
    }
    Ok(())
}

fn default_member() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "member".to_string() } else { host };
    format!("{host}-{}", std::process::id())
}

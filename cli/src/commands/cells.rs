//! `cellog cells`: a deployment of many cells, through its directory (`--directory`; in a dev folder, the dev cell;
//! otherwise the cell `--server` names): the cells and their addresses, where each stream is placed, moving a stream
//! to another cell, and mirrors of one cell's stream on another.

use clap::Subcommand;

use crate::Connect;
use crate::commands::directory;
use crate::table::Table;

#[derive(Subcommand)]
pub enum CellsCommand {
    /// Record a cell and its nodes' client addresses in the directory (replacing those it held).
    Put {
        cell: String,
        /// Its nodes' client addresses (HOST:PORT), one to nine.
        #[arg(required = true)]
        addresses: Vec<String>,
        #[command(flatten)]
        connect: Connect,
    },
    /// Every cell the directory records.
    Ls {
        #[command(flatten)]
        connect: Connect,
    },
    /// Place a stream on a cell (at ownership epoch 1). The stream itself is created on that cell.
    Place {
        stream: String,
        cell: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Where a stream lives: its cell, ownership epoch, and a move under way.
    Locate {
        stream: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Make a stream on one cell a mirror of a stream on another: ids, order and positions kept, recalls followed,
    /// the source's retention waiting for it. The mirror's cell copies and follows the source from then on.
    Mirror {
        /// The mirror's name on its cell.
        name: String,
        /// The cell that holds the mirror.
        #[arg(long)]
        on: String,
        /// The source: CELL/STREAM.
        #[arg(long, value_name = "CELL/STREAM")]
        from: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// A cell's mirrors: where each ends, its lag behind its source, whether the source answers, its last error.
    Mirrors {
        /// The cell.
        cell: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Move a stream to another cell: writes are refused while its messages are copied, then taken by the new cell.
    /// A move cut short is finished by running this again.
    Move {
        stream: String,
        /// The cell it moves to.
        #[arg(long)]
        to: String,
        #[command(flatten)]
        connect: Connect,
    },
}

#[allow(clippy::disallowed_methods, reason = "a move's duration, for the operator")]
pub async fn run(command: CellsCommand) -> anyhow::Result<()> {
    match command {
        CellsCommand::Put { cell, addresses, connect } => {
            let created = directory(&connect)?.put_cell(&cell, addresses).await?;
            println!("cell {cell} {}", if created { "recorded" } else { "updated" });
        }
        CellsCommand::Ls { connect } => {
            let mut table = Table::new(["CELL", "ADDRESSES"]);
            for cell in directory(&connect)?.list_cells().await? {
                table.row([cell.cell, cell.addresses.join(",")]);
            }
            table.print(0);
        }
        CellsCommand::Place { stream, cell, connect } => {
            let cells = cellog_client::Cells::new(directory(&connect)?, crate::commands::options(&connect)?);
            let placement = cells.place(&stream, &cell).await?;
            println!("{stream} placed on {} at epoch {}", placement.cell, placement.epoch);
        }
        CellsCommand::Locate { stream, connect } => {
            let location = directory(&connect)?.locate_stream(&stream).await?;
            let placement = location.placement.unwrap_or_default();
            let moving = placement.moving_from.map(|from| format!(" (moving from {from})")).unwrap_or_default();
            println!(
                "{stream} on {} at epoch {}{moving}: {}",
                placement.cell,
                placement.epoch,
                location.addresses.join(",")
            );
        }
        CellsCommand::Mirror { name, on, from, connect } => {
            let Some((cell, stream)) = from.split_once('/') else {
                anyhow::bail!("--from {from:?}: expected CELL/STREAM, e.g. east/orders");
            };
            let cells = cellog_client::Cells::new(directory(&connect)?, crate::commands::options(&connect)?);
            let created = cells.mirror(&name, &on, cell, stream).await?;
            let how = if created { "now mirrors" } else { "already mirrored" };
            println!("{on}/{name} {how} {cell}/{stream}");
        }
        CellsCommand::Mirrors { cell, connect } => {
            let cells = cellog_client::Cells::new(directory(&connect)?, crate::commands::options(&connect)?);
            let mut table =
                Table::new(["MIRROR", "SOURCE", "LAST SEQS", "LAG", "SOURCE STATE", "CATCH-UPS", "LAST ERROR"]);
            for mirror in cells.cell(&cell).await?.list_mirrors().await? {
                let state = match mirror.peer_state() {
                    cellog_client::proto::MirrorPeerState::MirrorPeerUp => "up",
                    cellog_client::proto::MirrorPeerState::MirrorPeerDown => "down",
                    cellog_client::proto::MirrorPeerState::MirrorPeerUnknown => "unknown",
                };
                let seqs: Vec<String> = mirror.last_seqs.iter().map(u64::to_string).collect();
                table.row([
                    mirror.name.clone(),
                    format!("{}/{}", mirror.source_cell, mirror.source_stream),
                    seqs.join(","),
                    mirror.lag.to_string(),
                    state.to_string(),
                    format!("{} snapshot, {} incremental", mirror.snapshots, mirror.increments),
                    mirror.last_error.clone(),
                ]);
            }
            table.print(0);
        }
        CellsCommand::Move { stream, to, connect } => {
            let directory = directory(&connect)?;
            let options = crate::commands::options(&connect)?;
            let started = std::time::Instant::now();
            let moved = match cellog_client::Cells::new(directory.clone(), options).move_stream(&stream, &to).await {
                Ok(moved) => moved,
                Err(error) => {
                    // Say whether the directory recorded the move: then running it again finishes it.
                    let location = match directory.locate_stream(&stream).await {
                        Ok(location) => location,
                        Err(asking) => anyhow::bail!(
                            "{error}\nwhether the directory records the move is not known ({asking}): `cellog cells \
                             locate {stream}` tells"
                        ),
                    };
                    let recorded = location.placement.and_then(|placement| {
                        placement.moving_from.filter(|_| placement.cell == to).map(|from| (from, placement.epoch))
                    });
                    match recorded {
                        Some((from, epoch)) => anyhow::bail!(
                            "{error}\nthe directory records the move of {stream} from {from} to {to} (epoch {epoch}) as \
                             under way: `cellog cells move {stream} --to {to}` again finishes it"
                        ),
                        None => anyhow::bail!("{error}\nthe directory records no move of {stream}: nothing changed"),
                    }
                }
            };
            match moved.from {
                None => println!("{stream} is on {to} already (epoch {})", moved.epoch),
                Some(from) => println!(
                    "{stream} moved from {from} to {to} at epoch {}: {} messages copied in {:.1} s, writes refused for \
                     {:.3} s",
                    moved.epoch,
                    moved.copied,
                    started.elapsed().as_secs_f64(),
                    moved.refused_for.as_secs_f64()
                ),
            }
        }
    }
    Ok(())
}

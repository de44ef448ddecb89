//! `cellog peer`: the peers of a stream, whose received watermark holds retention back.

use clap::Subcommand;

use crate::Connect;
use crate::commands::route::Route;

#[derive(Subcommand)]
pub enum PeerCommand {
    /// Register a peer (a mirror, another cell) of a stream: retention keeps every message it has not received.
    Add {
        stream: String,
        peer: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Record that a peer has received a partition up to a sequence.
    Progress {
        stream: String,
        peer: String,
        partition: u32,
        received_seq: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Unregister a peer: retention no longer waits for it.
    Rm {
        stream: String,
        peer: String,
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn run(command: PeerCommand) -> anyhow::Result<()> {
    match command {
        PeerCommand::Add { stream, peer, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, peer) = (&stream, &peer);
            route.call(|client| async move { client.register_peer(stream, peer).await }).await?;
            println!("peer {peer} of {stream} registered");
        }
        PeerCommand::Progress { stream, peer, partition, received_seq, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, peer) = (&stream, &peer);
            route
                .call(|client| async move { client.peer_progress(stream, peer, partition, received_seq).await })
                .await?;
            println!("peer {peer} of {stream} has partition {partition} up to {received_seq}");
        }
        PeerCommand::Rm { stream, peer, connect } => {
            let route = Route::new(&connect, Some(&stream)).await?;
            let (stream, peer) = (&stream, &peer);
            route.call(|client| async move { client.unregister_peer(stream, peer).await }).await?;
            println!("peer {peer} of {stream} unregistered");
        }
    }
    Ok(())
}

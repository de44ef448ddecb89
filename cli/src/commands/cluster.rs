//! `cellog cluster`: the cell's members and status, adding, promoting and removing nodes.

use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::{client, client_of};
use crate::table::Table;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// The cell as the first reachable node sees it.
    Status {
        /// Also the digest of the node's whole state, to compare replicas: the node encodes and hashes its state for
        /// it, holding applies back meanwhile (seconds for millions of messages), so ask only when comparing.
        #[arg(long)]
        digest: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Add a node as a learner (it catches up, then can be promoted).
    Add {
        node_id: u64,
        raft_addr: String,
        client_addr: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Make a learner a voter.
    Promote {
        node_id: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Remove a node from the cell.
    Remove {
        node_id: u64,
        #[command(flatten)]
        connect: Connect,
    },
}

fn print_status(status: &v1::ClusterStatusResponse) {
    println!(
        "node {} is {} in term {}; leader {}{}",
        status.node_id,
        status.state,
        status.term,
        status.leader_id.map_or("unknown".to_string(), |id| format!("node {id} at {}", status.leader_addr)),
        if status.repairing { " (repairing: catching up lost entries)" } else { "" }
    );
    if let Some(index) = status.apply_halted_at {
        println!("  applying halted at entry {index}, as asked (--halt-apply-at): no writes, no linearizable reads");
    }
    let index = |index: Option<u64>| index.map_or("none".to_string(), |index| index.to_string());
    // Only `cluster status --digest` asks for the digest.
    let digest =
        if status.state_digest.is_empty() { String::new() } else { format!(", state digest {}", status.state_digest) };
    println!("  log index {}, applied {}{digest}", index(status.last_log_index), index(status.applied_index));
    let mut table = Table::new(["id", "role", "client", "raft", "matched"]).right([4]);
    for node in &status.nodes {
        table.row([
            node.id.to_string(),
            if node.voter { "voter" } else { "learner" }.to_string(),
            node.client_addr.clone(),
            node.raft_addr.clone(),
            node.matched_index.map_or("-".to_string(), |index| index.to_string()),
        ]);
    }
    table.print(2);
}

pub async fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status { digest, connect } => {
            // Status is about one node, so ask each in turn until one answers.
            let mut last_error = anyhow::anyhow!("no node address given");
            for server in &connect.server {
                let client = client_of(&connect, vec![server.clone()])?;
                let status =
                    if digest { client.cluster_status_with_digest().await } else { client.cluster_status().await };
                match status {
                    Ok(status) => {
                        print_status(&status);
                        return Ok(());
                    }
                    Err(error) => last_error = anyhow::Error::from(error).context(format!("asking {server}")),
                }
            }
            return Err(last_error);
        }
        ClusterCommand::Add { node_id, raft_addr, client_addr, connect } => {
            print_status(&client(&connect)?.add_learner(node_id, &raft_addr, &client_addr).await?);
        }
        ClusterCommand::Promote { node_id, connect } => {
            print_status(&client(&connect)?.promote(node_id).await?);
        }
        ClusterCommand::Remove { node_id, connect } => {
            print_status(&client(&connect)?.remove_node(node_id).await?);
        }
    }
    Ok(())
}

//! `cellog keys`: this cell's key and the keyring of other cells' keys, in a node's data directory.

use anyhow::Context;
use clap::Subcommand;

use crate::table::Table;

/// Where `cellog keys` looks: the node's data directory.
#[derive(clap::Args)]
pub struct KeysDir {
    /// The node's data directory.
    #[arg(long, env = "CELLOG_DATA_DIR", default_value = "cellog-data")]
    data_dir: std::path::PathBuf,
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Print this cell's fingerprint and public key (to import on other cells).
    Show {
        #[command(flatten)]
        dir: KeysDir,
    },
    /// Add another cell's public key (armored or binary) to the keyring.
    Import {
        /// The key file.
        file: std::path::PathBuf,
        #[command(flatten)]
        dir: KeysDir,
    },
    /// List the keyring: each known cell and its key's fingerprint.
    List {
        #[command(flatten)]
        dir: KeysDir,
    },
}

pub fn run(command: KeysCommand) -> anyhow::Result<()> {
    use cellog_envelope::{CellKey, Keyring};
    let own = |dir: &KeysDir| -> anyhow::Result<CellKey> {
        CellKey::load(&dir.data_dir)?.with_context(|| {
            format!(
                "no cell key in {} yet; a node makes it when it first starts there",
                dir.data_dir.join("keys").display()
            )
        })
    };
    match command {
        KeysCommand::Show { dir } => {
            let key = own(&dir)?;
            println!("cell {} fingerprint {}", key.cell(), key.fingerprint());
            print!("{}", key.public_armored());
        }
        KeysCommand::Import { file, dir } => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let own = CellKey::load(&dir.data_dir)?;
            let mut keyring = Keyring::open(&dir.data_dir)?;
            let peer = keyring.import(&bytes, own.as_ref())?;
            println!("imported cell {} fingerprint {}", peer.cell, peer.fingerprint);
        }
        KeysCommand::List { dir } => {
            let keyring = Keyring::open(&dir.data_dir)?;
            let mut table = Table::new(["cell", "fingerprint"]);
            for peer in keyring.list() {
                table.row([peer.cell.clone(), peer.fingerprint.clone()]);
            }
            table.print(0);
        }
    }
    Ok(())
}

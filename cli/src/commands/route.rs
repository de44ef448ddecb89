//! Where a command about one stream goes when a directory places streams on many cells: to the cell the directory
//! places it on, or to the cell `--cell` or `--server` names; and from a cell the stream left (`MOVED`) to the cell it
//! names. Whenever the cell that answered is not the one the command was pointed at, the user is told which.

use std::sync::Mutex;

use cellog_client::{Cells, Client, ClientError};

use crate::Connect;
use crate::commands::{client, directory, options};

/// How many times one call follows `MOVED` from cell to cell before giving up (a stream moving again and again).
const MAX_FOLLOWS: usize = 8;

/// Where one command's calls about a stream go.
pub struct Route {
    /// The client of the cell the command was pointed at: `--cell`'s, or `--server`'s.
    first: Client,
    /// The deployment, through its directory: the placed stream's cell, and where `MOVED` leads.
    cells: Cells,
    /// The stream, when the command named no cell or server and the directory places it: its calls go where the
    /// directory says.
    placed: Option<String>,
    /// The cell that answered last, as told to the user.
    told: Mutex<Option<String>>,
}

impl Route {
    /// The route of a command about `stream` (a publish names only a subject, and has none unless given).
    pub async fn new(connect: &Connect, stream: Option<&str>) -> anyhow::Result<Route> {
        let cells = Cells::new(directory(connect)?, options(connect)?);
        let first = match &connect.to_cell {
            Some(cell) => cells.cell(cell).await?,
            None => client(connect)?,
        };
        // Pointed at a cell or at servers of its own: the command goes there first. Otherwise (the default servers,
        // or the directory's) the directory is asked where the stream is; a stream it does not place is on the
        // servers' own cell.
        let pointed = connect.to_cell.is_some()
            || (connect.server.join(",") != crate::DEV_SERVERS && connect.server != connect.directory);
        let placed = match stream {
            Some(stream) if !pointed => match cells.directory().locate_stream(stream).await {
                Ok(_) => Some(stream.to_string()),
                // Not placed, or not this caller's to ask: the servers' own cell answers for it.
                Err(error) if matches!(error.reason(), Some("NOT_PLACED" | "PERMISSION_DENIED")) => None,
                Err(error) => return Err(error.into()),
            },
            _ => None,
        };
        Ok(Route { first, cells, placed, told: Mutex::new(connect.to_cell.clone()) })
    }

    /// Runs `call` where the stream is, telling the user which cell answered when it is not the one pointed at.
    pub async fn call<T, F, Fut>(&self, call: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        if let Some(stream) = &self.placed {
            let (cell, answer) = self.cells.call_on(stream, call).await?;
            self.tell(&cell);
            return Ok(answer);
        }
        // `MOVED` is a refusal: nothing was written, so the call is made again on the cell it names.
        let mut client = self.first.clone();
        for _ in 0..MAX_FOLLOWS {
            match call(client).await {
                Err(error) if error.reason() == Some("MOVED") => {
                    let Some(cell) = error.detail().map(|detail| detail.cell.clone()).filter(|cell| !cell.is_empty())
                    else {
                        return Err(error.into());
                    };
                    client = self.cells.cell(&cell).await.map_err(|asking| {
                        anyhow::anyhow!("{error}\nasking the directory for cell {cell:?}'s addresses: {asking}")
                    })?;
                    self.tell(&cell);
                }
                answer => return Ok(answer?),
            }
        }
        anyhow::bail!("the stream moved {MAX_FOLLOWS} times during one call; try again")
    }

    /// The client of the cell the stream is on now, for a call kept open (a subscription).
    pub async fn client(&self) -> anyhow::Result<Client> {
        self.call(|client| async move { Ok::<_, ClientError>(client) }).await
    }

    /// Tells the user on standard error that `cell` answered, once for each change of cell.
    fn tell(&self, cell: &str) {
        let mut told = self.told.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if told.as_deref() != Some(cell) {
            eprintln!("cell {cell} answered");
            *told = Some(cell.to_string());
        }
    }
}

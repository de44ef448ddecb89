//! Many cells from a client's side: [`Cells`] routes each stream's calls to the cell the deployment's directory
//! places it on, keeps the routes it learned, and learns again when a cell answers that the stream moved; and moves a
//! stream from one cell to another ([`Cells::move_stream`]), the fenced handover the cells enforce.
//!
//! A route is asked of the directory once per stream and then kept: calls to streams whose routes are known go on
//! while the directory is unavailable. While a move is under way the route is the cell it moves from, which takes
//! writes until it is fenced. A cell a stream left refuses its writes with `MOVED`, naming the new owner, where the
//! call goes next; a cell it is moving to refuses them with `STREAM_MOVING` until it has caught up, which [`Client`]
//! retries after the pause the cell advises.

#![allow(
    clippy::disallowed_methods,
    reason = "how long a move refused writes, on the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_proto::v1;

use crate::client::{Client, ClientError, ClientOptions};

/// How many times one call follows a stream to another cell before it gives up (a stream moving again and again).
const MAX_REROUTES: usize = 8;
/// How long a call waits before it asks the directory again, after the cell its route named did not hold the stream.
const STALE_ROUTE_PAUSE: Duration = Duration::from_millis(100);
/// Bytes of messages one copy of a move carries at most: far below a command's limit, so a copy is never refused
/// for its size, and small enough that one copy commits quickly beside the receiving cell's load.
const COPY_BYTES: usize = 1024 * 1024;
/// Messages one read of a move asks for.
const COPY_READ: u32 = 1024;

/// A deployment's cells, as one client sees them: the directory, a client per cell, and the routes learned.
#[derive(Clone)]
pub struct Cells {
    directory: Client,
    options: ClientOptions,
    known: Arc<Mutex<Known>>,
}

#[derive(Default)]
struct Known {
    /// Each stream's cell, as the directory last said.
    routes: BTreeMap<String, String>,
    /// A client per cell, with the addresses it was made from.
    clients: BTreeMap<String, (Vec<String>, Client)>,
}

/// What a move did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The stream's ownership epoch from now on.
    pub epoch: u64,
    /// The cell it moved from; `None` when it was on the cell asked for already (a move finished before).
    pub from: Option<String>,
    /// Messages copied to the new cell (those it already held are not counted).
    pub copied: u64,
    /// Where each partition ended on the old cell when it was fenced: the new cell's writes follow them.
    pub through: Vec<u64>,
    /// How long writes were refused: from the fence's call to the new cell's acceptance.
    pub refused_for: Duration,
}

impl Cells {
    /// A deployment whose directory `directory` reaches; clients of its cells are made with `options`.
    pub fn new(directory: Client, options: ClientOptions) -> Self {
        Cells { directory, options, known: Arc::new(Mutex::new(Known::default())) }
    }

    /// The directory's client.
    pub fn directory(&self) -> &Client {
        &self.directory
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The client of `cell` at `addresses`, made again when the addresses changed.
    fn client_at(&self, cell: &str, addresses: Vec<String>) -> Result<Client, ClientError> {
        let mut known = self.known();
        if let Some((held, client)) = known.clients.get(cell)
            && *held == addresses
        {
            return Ok(client.clone());
        }
        let client = Client::new(addresses.clone(), self.options.clone())?;
        known.clients.insert(cell.to_string(), (addresses, client.clone()));
        Ok(client)
    }

    /// The client of `cell`, asking the directory for its addresses if this client has none yet.
    pub async fn cell(&self, cell: &str) -> Result<Client, ClientError> {
        if let Some((_, client)) = self.known().clients.get(cell) {
            return Ok(client.clone());
        }
        let addresses = self.addresses(cell).await?;
        self.client_at(cell, addresses)
    }

    /// The addresses the directory records for `cell` now.
    async fn addresses(&self, cell: &str) -> Result<Vec<String>, ClientError> {
        let cells = self.directory.list_cells().await?;
        cells.into_iter().find(|c| c.cell == cell).map(|c| c.addresses).ok_or_else(|| ClientError::Status {
            code: tonic::Code::NotFound,
            detail: v1::ErrorDetail {
                reason: "CELL_NOT_FOUND".to_string(),
                message: format!("the directory records no cell {cell:?}"),
                cell: cell.to_string(),
                ..v1::ErrorDetail::default()
            },
        })
    }

    /// The cell `stream` is on and its client: the route learned before, or the directory's answer.
    pub async fn route(&self, stream: &str) -> Result<(String, Client), ClientError> {
        let cell = self.known().routes.get(stream).cloned();
        if let Some(cell) = cell {
            return Ok((cell.clone(), self.cell(&cell).await?));
        }
        let location = self.directory.locate_stream(stream).await?;
        let placement = location.placement.unwrap_or_default();
        // While a move is under way the old owner takes writes until it is fenced, and then names the new one.
        let (cell, client) = match placement.moving_from {
            Some(from) => {
                let client = self.cell(&from).await?;
                (from, client)
            }
            None => {
                let client = self.client_at(&placement.cell, location.addresses)?;
                (placement.cell, client)
            }
        };
        self.known().routes.insert(stream.to_string(), cell.clone());
        Ok((cell, client))
    }

    /// Routes `stream` to `cell` from now on: where a cell that refused it with `MOVED` said it went.
    fn learn(&self, stream: &str, cell: &str) {
        self.known().routes.insert(stream.to_string(), cell.to_string());
    }

    /// Forgets the route of `stream`: the next call asks the directory again.
    pub fn forget(&self, stream: &str) {
        self.known().routes.remove(stream);
    }

    /// Runs `call` against the cell that owns `stream`, following it to another cell when the one asked answers
    /// `MOVED`. A call whose earlier attempt may have landed on the old cell is followed only if a repeat changes
    /// nothing (a publish with a message id: the ids moved with the stream, so the new cell answers the repeat as a
    /// duplicate).
    pub async fn call<T, F, Fut>(&self, stream: &str, call: F) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        Ok(self.call_on(stream, call).await?.1)
    }

    /// [`Cells::call`], answering also which cell answered.
    pub async fn call_on<T, F, Fut>(&self, stream: &str, call: F) -> Result<(String, T), ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut last = None;
        for _ in 0..MAX_REROUTES {
            let (cell, client) = self.route(stream).await?;
            match call(client).await {
                Err(error) if error.reason() == Some("MOVED") => {
                    match error.detail().map(|detail| detail.cell.as_str()).filter(|cell| !cell.is_empty()) {
                        Some(cell) => self.learn(stream, cell),
                        None => self.forget(stream),
                    }
                    last = Some(error);
                }
                // The route may be newer than the stream: a move recorded in the directory a moment before the cell
                // it names received the stream. Asked again after a pause; a stream that is nowhere fails the same.
                Err(error) if matches!(error.reason(), Some("NO_STREAM_FOR_SUBJECT" | "STREAM_NOT_FOUND")) => {
                    self.forget(stream);
                    last = Some(error);
                    tokio::time::sleep(STALE_ROUTE_PAUSE).await;
                }
                answer => return answer.map(|answer| (cell, answer)),
            }
        }
        Err(last.expect("the loop ran"))
    }

    /// Publishes to `stream` on whichever cell owns it. Without a message id, a publish that may have landed
    /// unanswered is not repeated elsewhere ([`Client::publish`] does not repeat it either).
    pub async fn publish(&self, stream: &str, request: v1::PublishRequest) -> Result<v1::PublishAck, ClientError> {
        self.call(stream, |client| {
            let request = request.clone();
            async move { client.publish(request).await }
        })
        .await
    }

    /// Moves `stream` to cell `to`: the directory records the move (or the one under way to `to` is taken up where
    /// it stopped), `to` receives the stream (created there as it is on the old cell), what the old cell holds is
    /// copied at its positions while it still takes writes, the old cell is fenced, what came meanwhile is copied,
    /// `to` accepts the stream once caught up, and the directory records the move done. Every step repeated is
    /// answered as before, so a move cut short (this process dying, a leader crashing) is finished by calling this
    /// again; a stream already on `to` is answered with nothing moved. Writes are refused only between the fence
    /// and the acceptance: `MOVED` on the old cell (which [`Cells::call`] follows to the cell it names),
    /// `STREAM_MOVING` on the new one (which [`Client`] retries).
    pub async fn move_stream(&self, stream: &str, to: &str) -> Result<Moved, ClientError> {
        let location = self.directory.locate_stream(stream).await?;
        let placement = location.placement.unwrap_or_default();
        let (epoch, from) = match &placement.moving_from {
            Some(from) if placement.cell == to => (placement.epoch, from.clone()),
            Some(from) => {
                return Err(move_in_progress(format!(
                    "stream {stream:?} is moving from cell {from:?} to cell {:?}; finish that move first",
                    placement.cell
                )));
            }
            None if placement.cell == to => {
                let (epoch, through, refused_for) = (placement.epoch, Vec::new(), Duration::ZERO);
                return Ok(Moved { epoch, from: None, copied: 0, through, refused_for });
            }
            None => {
                // Checked before the directory records anything: a move of a stream its cell does not hold could
                // never be finished, and would leave the directory saying it is under way.
                self.cell(to).await?;
                held_on(&self.cell(&placement.cell).await?, stream, &placement.cell).await?;
                let moved = self.directory.move_placement(stream, to, placement.epoch).await?;
                (moved.epoch, placement.cell.clone())
            }
        };
        let (source, target) = (self.cell(&from).await?, self.cell(to).await?);
        let config = source.stream_info(stream).await?.config;
        target.receive_stream(stream, epoch, &from, config).await?;
        // First what the old cell holds now, while it still takes writes; then, fenced, what came meanwhile. Writes
        // are refused only for the second copy.
        let mut copied = 0;
        let now = source.ownership(stream).await?.last_seqs;
        copied += copy(&source, &target, stream, epoch, &now).await?;
        let fencing = tokio::time::Instant::now();
        let fenced = source.fence_stream(stream, epoch, to).await?;
        let through = fenced.last_seqs;
        copied += copy(&source, &target, stream, epoch, &through).await?;
        // Where every partition ended on the old cell, also where its last messages were removed before the copy.
        target.ingest(stream, epoch, vec![], through.clone()).await?;
        target.accept_stream(stream, epoch, through.clone()).await?;
        let refused_for = fencing.elapsed();
        self.directory.finish_move(stream, epoch).await?;
        Ok(Moved { epoch, from: Some(from), copied, through, refused_for })
    }
}

impl Cells {
    /// Places `stream`, which cell `cell` holds, on `cell` in the directory (the same placement again is answered
    /// alike). A stream the cell does not hold is refused before the directory records anything (`STREAM_NOT_FOUND`,
    /// naming the cell).
    pub async fn place(&self, stream: &str, cell: &str) -> Result<v1::Placement, ClientError> {
        held_on(&self.cell(cell).await?, stream, cell).await?;
        self.directory.place_stream(stream, cell).await
    }

    /// Creates `name` on cell `on` as a mirror of `stream` on cell `from`: both cells' addresses from the directory,
    /// the mirror's config the source's. Answers whether it was created (false: the same mirror existed, its source's
    /// addresses now the directory's). `on`'s leader then copies the source and keeps following it.
    pub async fn mirror(&self, name: &str, on: &str, from: &str, stream: &str) -> Result<bool, ClientError> {
        let addresses = self.addresses(from).await?;
        let (source, target) = (self.cell(from).await?, self.cell(on).await?);
        let config = source.stream_info(stream).await?.config.unwrap_or_default();
        target.create_mirror(name, config, from, stream, addresses).await
    }
}

/// Whether cell `cell` (reached by `client`) holds `stream`: a refusal that names the cell when it does not.
async fn held_on(client: &Client, stream: &str, cell: &str) -> Result<(), ClientError> {
    match client.stream_info(stream).await {
        Ok(_) => Ok(()),
        Err(ClientError::Status { code, detail }) if detail.reason == "STREAM_NOT_FOUND" => Err(ClientError::Status {
            code,
            detail: v1::ErrorDetail {
                message: format!("cell {cell:?} holds no stream {stream:?}: create it there first"),
                cell: cell.to_string(),
                ..detail
            },
        }),
        Err(other) => Err(other),
    }
}

/// Copies each partition of `stream` from `source` to `target` (receiving it at `epoch`), from where the target ends
/// to `ends`; answers how many messages it appended.
async fn copy(source: &Client, target: &Client, stream: &str, epoch: u64, ends: &[u64]) -> Result<u64, ClientError> {
    let held = target.ownership(stream).await?.last_seqs;
    let mut copied = 0;
    for (partition, &end) in ends.iter().enumerate() {
        let mut next = held.get(partition).copied().unwrap_or(0) + 1;
        while next <= end {
            let read = source.read(stream, partition as u32, next, COPY_READ, false).await?.messages;
            let Some(last) = read.last().map(|m| m.seq) else { break };
            let mut batch = Vec::new();
            let mut bytes = 0;
            for message in read.into_iter().filter(|m| m.recalled_at_ms.is_none() && m.seq <= end) {
                bytes += message.payload.len() + message.subject.len();
                batch.push(message);
                if bytes >= COPY_BYTES {
                    let batch = std::mem::take(&mut batch);
                    copied += u64::from(target.ingest(stream, epoch, batch, Vec::new()).await?.appended);
                    bytes = 0;
                }
            }
            if !batch.is_empty() {
                copied += u64::from(target.ingest(stream, epoch, batch, Vec::new()).await?.appended);
            }
            next = last + 1;
        }
    }
    Ok(copied)
}

fn move_in_progress(message: String) -> ClientError {
    ClientError::Status {
        code: tonic::Code::FailedPrecondition,
        detail: v1::ErrorDetail { reason: "MOVE_IN_PROGRESS".to_string(), message, ..v1::ErrorDetail::default() },
    }
}

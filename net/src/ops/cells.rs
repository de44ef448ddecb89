//! The directory of cells and streams' placements, and messages copied into a stream that moves here.

use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert;

impl Write for v1::PutCellRequest {
    type Reply = v1::PutCellResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::PutCell { cell: self.cell, addresses: self.addresses })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::CellPut { created } => Ok(v1::PutCellResponse { created }),
            other => Err(other),
        }
    }
}

impl Write for v1::UnplaceStreamRequest {
    type Reply = v1::UnplaceStreamResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::Unplace { stream: self.stream })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::Unplaced => Ok(v1::UnplaceStreamResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::IngestMessagesRequest {
    type Reply = v1::IngestMessagesResponse;
    fn command(self) -> Result<Command, Status> {
        let messages = self.messages.into_iter().map(convert::ingested).collect();
        Ok(Command::Ingest { stream: self.stream, epoch: self.epoch, messages, through: self.through })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::Ingested { appended, last_seqs } => Ok(v1::IngestMessagesResponse { appended, last_seqs }),
            other => Err(other),
        }
    }
}

//! Mirrors between cells: creating one, and the source's record of a mirror as a peer.

use cellog_core::mirror::MirrorSource;
use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert;

impl Write for v1::CreateMirrorRequest {
    type Reply = v1::CreateMirrorResponse;
    fn command(self) -> Result<Command, Status> {
        let config = convert::stream_config(self.config)?;
        let source =
            MirrorSource { cell: self.source_cell, stream: self.source_stream, addresses: self.source_addresses };
        Ok(Command::CreateMirror { name: self.name, config, source })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::StreamCreated { created } => Ok(v1::CreateMirrorResponse { created }),
            other => Err(other),
        }
    }
}

impl Write for v1::RegisterMirrorRequest {
    type Reply = v1::RegisterMirrorResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::RegisterMirror { stream: self.stream, peer: self.peer })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PeerRegistered => Ok(v1::RegisterMirrorResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::MirrorProgressRequest {
    type Reply = v1::MirrorProgressResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::MirrorProgress {
            stream: self.stream,
            peer: self.peer,
            received: self.received,
            recalls_applied: self.recalls_applied,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PeerProgressed => Ok(v1::MirrorProgressResponse {}),
            other => Err(other),
        }
    }
}

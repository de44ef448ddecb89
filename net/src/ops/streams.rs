//! Streams and their registered peers, and recall.

use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert;

impl Write for v1::CreateStreamRequest {
    type Reply = v1::CreateStreamResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::CreateStream { name: self.name, config: convert::stream_config(self.config)? })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::StreamCreated { created } => Ok(v1::CreateStreamResponse { created }),
            other => Err(other),
        }
    }
}

impl Write for v1::UpdateStreamRequest {
    type Reply = v1::UpdateStreamResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::UpdateStream { name: self.name, config: convert::stream_config(self.config)? })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::StreamUpdated => Ok(v1::UpdateStreamResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::DeleteStreamRequest {
    type Reply = v1::DeleteStreamResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::DeleteStream { name: self.name })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::StreamDeleted => Ok(v1::DeleteStreamResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::RecallRequest {
    type Reply = v1::RecallResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::Recall { stream: self.stream, partition: self.partition, seq: self.seq })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::Recalled => Ok(v1::RecallResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::RegisterPeerRequest {
    type Reply = v1::RegisterPeerResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::RegisterPeer { stream: self.stream, peer: self.peer })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PeerRegistered => Ok(v1::RegisterPeerResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::PeerProgressRequest {
    type Reply = v1::PeerProgressResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::PeerProgress {
            stream: self.stream,
            peer: self.peer,
            partition: self.partition,
            received_seq: self.received_seq,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PeerProgressed => Ok(v1::PeerProgressResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::UnregisterPeerRequest {
    type Reply = v1::UnregisterPeerResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::UnregisterPeer { stream: self.stream, peer: self.peer })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PeerUnregistered => Ok(v1::UnregisterPeerResponse {}),
            other => Err(other),
        }
    }
}

//! Consumers.

use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert;

impl Write for v1::CreateConsumerRequest {
    type Reply = v1::CreateConsumerResponse;
    fn command(self) -> Result<Command, Status> {
        let config = convert::consumer_config(self.config)?;
        Ok(Command::CreateConsumer { stream: self.stream, name: self.name, config })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::ConsumerCreated { created } => Ok(v1::CreateConsumerResponse { created }),
            other => Err(other),
        }
    }
}

impl Write for v1::UpdateConsumerRequest {
    type Reply = v1::UpdateConsumerResponse;
    fn command(self) -> Result<Command, Status> {
        let config = convert::consumer_config(self.config)?;
        Ok(Command::UpdateConsumer { stream: self.stream, name: self.name, config })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::ConsumerUpdated => Ok(v1::UpdateConsumerResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::DeleteConsumerRequest {
    type Reply = v1::DeleteConsumerResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::DeleteConsumer { stream: self.stream, name: self.name })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::ConsumerDeleted => Ok(v1::DeleteConsumerResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::CommitCursorRequest {
    type Reply = v1::CommitCursorResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::CommitCursor {
            stream: self.stream,
            consumer: self.consumer,
            partition: self.partition,
            next_seq: self.next_seq,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        super::cursor_committed(outcome)
    }
}

//! Consumer groups: joining, heartbeats, leaving, and a member's commit of its cursor.

use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert;

impl Write for v1::JoinGroupRequest {
    type Reply = v1::GroupAssignment;
    fn command(self) -> Result<Command, Status> {
        let session_timeout_ms = match self.session_timeout_ms {
            0 => convert::DEFAULT_SESSION_TIMEOUT_MS,
            timeout => timeout,
        };
        Ok(Command::JoinGroup {
            stream: self.stream,
            group: self.group,
            member: self.member,
            strategy: convert::strategy(self.strategy)?,
            session_timeout_ms,
            config: convert::consumer_config(self.config)?,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        super::assignment(outcome)
    }
}

impl Write for v1::HeartbeatRequest {
    type Reply = v1::GroupAssignment;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::Heartbeat {
            stream: self.stream,
            group: self.group,
            member: self.member,
            generation: self.generation,
            released: self.released,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        super::assignment(outcome)
    }
}

impl Write for v1::LeaveGroupRequest {
    type Reply = v1::LeaveGroupResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::LeaveGroup { stream: self.stream, group: self.group, member: self.member })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::GroupLeft { was_member } => Ok(v1::LeaveGroupResponse { was_member }),
            other => Err(other),
        }
    }
}

impl Write for v1::MemberCommitRequest {
    type Reply = v1::CommitCursorResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::MemberCommit {
            stream: self.stream,
            group: self.group,
            member: self.member,
            generation: self.generation,
            partition: self.partition,
            next_seq: self.next_seq,
        })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        super::cursor_committed(outcome)
    }
}

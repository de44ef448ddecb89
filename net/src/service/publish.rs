//! Publishing: a batch's requests submitted in the caller's order, each answered as one message, and a single
//! publish's ack.

use cellog_client::status::to_item_error;
use cellog_core::{Actor, Command, Outcome};
use cellog_proto::v1;
use cellog_raft::Answer;
use cellog_raft::storage::Storage;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use super::{CellogService, unexpected};
use crate::convert;

/// One request of a `PublishBatch` call, handed to Raft and waiting to be answered.
pub(super) enum Batch {
    /// Its messages, in order, and their room in the call's window.
    Submitted(Vec<Pending>, OwnedSemaphorePermit),
    /// The call ends here with this error.
    Ended(Status),
}

/// Waits for one submitted publish of a batch.
pub(super) enum Pending {
    Submitted(Answer),
    /// Its principal may not publish it: refused alone, the batch goes on.
    Refused(Status),
    /// It could not be proposed: the batch ends here.
    Failed(Status),
}

impl<S: Storage + Clone> CellogService<S> {
    /// Hands publishes of a batch to Raft as `actor`, together and in order, so that they share entries.
    pub(super) async fn submit_publishes(&self, actor: &Actor, requests: Vec<v1::PublishRequest>) -> Vec<Pending> {
        let commands = requests.into_iter().map(|request| Ok(Command::Publish(convert::publish(request))));
        self.submit_group(self.admit_all(actor, commands)).await.0
    }

    /// Waits for publishes of a batch in order and answers each as its item.
    pub(super) async fn publish_results(&self, pending: Vec<Pending>) -> Vec<v1::PublishResult> {
        let mut results = Vec::with_capacity(pending.len());
        for next in pending {
            results.push(self.publish_result(next).await);
        }
        results
    }

    /// Waits for one publish of a batch and answers it as its item.
    pub(super) async fn publish_result(&self, pending: Pending) -> v1::PublishResult {
        let outcome = match pending {
            Pending::Submitted(answer) => self.answered(answer.wait().await),
            Pending::Refused(status) | Pending::Failed(status) => Err(status),
        };
        let result = match self.publish_answer(outcome) {
            Ok(ack) => v1::publish_result::Result::Ack(ack),
            Err(status) => v1::publish_result::Result::Error(to_item_error(&status)),
        };
        v1::PublishResult { result: Some(result) }
    }

    #[cfg(not(madsim))]
    /// Publishes `requests` as `actor` in their order, together as one `PublishBatch` request is, and answers each in
    /// place (the HTTP API's batch). If the node could not propose them, each answers that error.
    pub(crate) async fn publish_all(&self, actor: &Actor, requests: Vec<v1::PublishRequest>) -> Vec<v1::PublishResult> {
        let pending = self.submit_publishes(actor, requests).await;
        self.publish_results(pending).await
    }

    pub(super) fn publish_answer(&self, outcome: Result<Outcome, Status>) -> Result<v1::PublishAck, Status> {
        match outcome {
            Ok(Outcome::Published(ack)) => {
                self.metrics.published.inc();
                Ok(convert::publish_ack_to_wire(&ack))
            }
            Ok(Outcome::Staged { index, duplicate }) => {
                Ok(v1::PublishAck { duplicate, staged_index: Some(index), ..v1::PublishAck::default() })
            }
            Ok(other) => Err(unexpected(&other)),
            Err(status) => {
                self.metrics.publish_rejected.inc();
                Err(status)
            }
        }
    }
}

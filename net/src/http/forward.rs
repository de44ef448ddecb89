//! Passing a JSON call that reached a follower on to the leader: the call goes to the leader's client port over gRPC
//! with the caller's credential (never this node's certificate, so it runs as the caller and nothing more), and its
//! answer, or its error, is the answer. Only a call the follower refused as `NOT_LEADER` is passed on, which it
//! refused before proposing anything, so nothing is applied twice; the leader's own `NOT_LEADER` is not passed on
//! again. A leader that cannot be reached leaves the follower's `NOT_LEADER` (naming it) as the answer.

use std::sync::Mutex;

use cellog_client::ClientTls;
use cellog_client::status::detail_of;
use cellog_proto::v1::cellog_client::CellogClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Where and how this node reaches its leader's client port.
pub(crate) struct Forward {
    /// The cell's CA, when the client port is served over TLS; no identity: the call carries the caller's.
    tls: Option<ClientTls>,
    /// The client of the leader last passed to, by its client address.
    cached: Mutex<Option<(String, CellogClient<Channel>)>>,
}

impl Forward {
    pub(crate) fn new(ca_pem: Option<Vec<u8>>) -> Self {
        Forward { tls: ca_pem.map(|ca_pem| ClientTls { ca_pem, identity: None }), cached: Mutex::new(None) }
    }

    /// The leader's client address, if `status` is a follower's `NOT_LEADER` naming one.
    pub(crate) fn leader_of(status: &Status) -> Option<String> {
        let detail = detail_of(status);
        (detail.reason == "NOT_LEADER" && !detail.leader_addr.is_empty()).then_some(detail.leader_addr)
    }

    /// A client of the node at `addr`'s client port.
    pub(crate) fn client(&self, addr: &str) -> Option<CellogClient<Channel>> {
        let mut cached = self.cached.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((at, client)) = cached.as_ref()
            && at == addr
        {
            return Some(client.clone());
        }
        let client = cellog_client::node_api(addr, self.tls.as_ref()).ok()?;
        *cached = Some((addr.to_string(), client.clone()));
        Some(client)
    }

    /// The leader's answer, unless it could not be reached: then the follower's refusal `refused`.
    pub(crate) fn answer<T>(refused: Status, passed: Result<tonic::Response<T>, Status>) -> Result<T, Status> {
        match passed {
            Ok(answer) => Ok(answer.into_inner()),
            // A transport failure carries no reason of the cell's: the leader was not reached.
            Err(status) if status.code() == Code::Unavailable && status.details().is_empty() => Err(refused),
            Err(status) => Err(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_leader_leaves_the_refusal_and_a_reached_one_answers() {
        let refused = || cellog_client::status::failed(Code::Unavailable, "NOT_LEADER", "node 2 leads");
        // A transport failure (no cell reason): the follower's refusal.
        let unreached: Result<tonic::Response<()>, Status> = Err(Status::unavailable("connection refused"));
        let answer = Forward::answer(refused(), unreached).expect_err("refused");
        assert_eq!(detail_of(&answer).reason, "NOT_LEADER");
        // The leader's own refusals and answers are the answer.
        let own = cellog_client::status::failed(Code::NotFound, "STREAM_NOT_FOUND", "no stream x");
        let answer = Forward::answer(refused(), Err::<tonic::Response<()>, _>(own)).expect_err("refused");
        assert_eq!(detail_of(&answer).reason, "STREAM_NOT_FOUND");
        let busy = cellog_client::status::failed(Code::Unavailable, "NOT_LEADER", "node 3 leads now");
        let answer = Forward::answer(refused(), Err::<tonic::Response<()>, _>(busy)).expect_err("refused");
        assert_eq!(answer.message(), "node 3 leads now");
        assert_eq!(Forward::answer(refused(), Ok(tonic::Response::new(7))).expect("answered"), 7);
    }

    #[test]
    fn only_a_not_leader_naming_the_leader_is_passed_on() {
        let named = cellog_client::status::status(
            Code::Unavailable,
            cellog_proto::v1::ErrorDetail {
                reason: "NOT_LEADER".into(),
                leader_addr: "10.0.0.2:7401".into(),
                ..Default::default()
            },
        );
        assert_eq!(Forward::leader_of(&named).as_deref(), Some("10.0.0.2:7401"));
        let unnamed = cellog_client::status::failed(Code::Unavailable, "NOT_LEADER", "no leader yet");
        assert_eq!(Forward::leader_of(&unnamed), None);
        let other = cellog_client::status::failed(Code::Unavailable, "LEADER_CHANGED", "the leader changed");
        assert_eq!(Forward::leader_of(&other), None);
    }
}

//! Consumer groups over real loopback gRPC, on a one-node cell: members join and split a stream's partitions, fetch
//! and subscribe only their own, a stale generation's ack is refused with NOT_OWNER naming the current generation,
//! group info shows owners and lag, and a member that leaves hands its partitions over.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]

mod common;
use common::{one_node, scrape};

use std::collections::BTreeSet;
use std::time::Duration;

use cellog_client::group::{GroupMember, MemberOptions, Rebalance};
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError};
use tonic::Code;

const PARTITIONS: u32 = 4;

/// Records what a member was told.
#[derive(Default)]
struct Heard {
    assigned: Vec<u32>,
    revoked: Vec<u32>,
}

impl Rebalance for Heard {
    fn assigned(&mut self, partitions: &[u32]) {
        self.assigned.extend(partitions);
    }
    fn revoked(&mut self, partitions: &[u32]) {
        self.revoked.extend(partitions);
    }
}

fn options() -> MemberOptions {
    MemberOptions {
        strategy: v1::GroupStrategy::StrategyCooperativeSticky,
        session_timeout: Duration::from_secs(10),
        heartbeat_every: Duration::from_millis(100),
        config: v1::ConsumerConfig::default(),
    }
}

async fn orders(client: &Client) {
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], partitions: PARTITIONS, ..Default::default() };
    client.create_stream("orders", config).await.expect("the stream");
    for i in 0..40 {
        let request = v1::PublishRequest {
            subject: format!("orders.{i}"),
            key: Some(format!("customer-{i}").into_bytes().into()),
            payload: format!("order {i}").into_bytes().into(),
            ..Default::default()
        };
        client.publish(request).await.expect("a publish");
    }
}

/// Heartbeats every member until none has anything left to give up or wait for.
async fn settle(members: &mut [(&mut GroupMember, &mut Heard)], client: &Client) {
    for _ in 0..20 {
        for (member, heard) in members.iter_mut() {
            member.heartbeat(*heard).await.expect("a heartbeat");
        }
        if !client.group_info("orders", "billing").await.expect("the group").rebalancing {
            return;
        }
    }
    panic!("the group did not settle");
}

fn partitions_of(deliveries: &[v1::Delivery]) -> BTreeSet<u32> {
    deliveries.iter().filter_map(|d| d.message.as_ref()).map(|m| m.partition).collect()
}

#[tokio::test]
async fn members_split_the_partitions_and_a_stale_generation_is_refused() {
    let (node, client) = one_node("groups").await;
    orders(&client).await;

    let mut heard_a = Heard::default();
    let mut a = GroupMember::join(client.clone(), "orders", "billing", "a", options(), &mut heard_a).await.unwrap();
    assert_eq!(heard_a.assigned, vec![0, 1, 2, 3], "the first member owns everything");
    let generation_alone = a.generation();

    let mut heard_b = Heard::default();
    let mut b = GroupMember::join(client.clone(), "orders", "billing", "b", options(), &mut heard_b).await.unwrap();
    settle(&mut [(&mut a, &mut heard_a), (&mut b, &mut heard_b)], &client).await;
    let (mine_a, mine_b) = (a.partitions().clone(), b.partitions().clone());
    assert_eq!(mine_a.len() + mine_b.len(), PARTITIONS as usize);
    assert!(mine_a.is_disjoint(&mine_b), "{mine_a:?} and {mine_b:?}");
    assert_eq!(heard_a.revoked.iter().copied().collect::<BTreeSet<u32>>(), mine_b, "a gave up what b got");

    // Each fetches only its own partitions.
    let got_a = a.fetch(100, &mut heard_a).await.unwrap();
    let got_b = b.fetch(100, &mut heard_b).await.unwrap();
    assert_eq!(got_a.len() + got_b.len(), 40);
    assert!(partitions_of(&got_a).is_subset(&mine_a) && partitions_of(&got_b).is_subset(&mine_b));

    // An ack of b's delivery at a generation older than b's grant is refused, naming the current generation.
    let m = got_b[0].message.clone().unwrap();
    let stale = client
        .member_ack(
            "orders",
            "billing",
            "b",
            generation_alone,
            vec![v1::AckItem { partition: m.partition, seq: m.seq, ..Default::default() }],
        )
        .await
        .unwrap();
    match &stale[0].result {
        Some(v1::ack_result::Result::Error(error)) => {
            let detail = error.detail.clone().unwrap();
            assert_eq!((error.code, detail.reason.as_str()), (Code::FailedPrecondition as i32, "NOT_OWNER"));
            assert_eq!(detail.generation, b.generation());
        }
        other => panic!("expected NOT_OWNER, got {other:?}"),
    }
    // At its own generation it lands; a's ack of a partition it does not own is refused.
    let items = cellog_client::acks_of;
    assert!(
        b.ack(items(&got_b)).await.unwrap().iter().all(|r| matches!(r.result, Some(v1::ack_result::Result::State(_))))
    );
    let foreign = a.ack(items(&got_b[..1])).await.unwrap();
    assert!(
        matches!(&foreign[0].result, Some(v1::ack_result::Result::Error(e)) if e.detail.as_ref().unwrap().reason == "NOT_OWNER")
    );

    let info = client.group_info("orders", "billing").await.unwrap();
    assert_eq!((info.members.len(), info.strategy), (2, v1::GroupStrategy::StrategyCooperativeSticky as i32));
    for p in &info.partitions {
        let owner = if mine_a.contains(&p.partition) { "a" } else { "b" };
        assert_eq!(p.owner, owner);
        let lag_expected = if owner == "b" { 0 } else { p.lag };
        assert_eq!(p.lag, lag_expected, "b acked everything it got");
    }
    assert_eq!(client.list_groups("orders").await.unwrap().len(), 1);
    // The node's metrics show the group: two members, its generation, its membership changes and what a has not acked.
    let text = scrape(node.metrics_addr.expect("metrics served")).await;
    let labels = r#"{stream="orders",group="billing"}"#;
    for line in [
        format!("cellog_group_members{labels} 2"),
        format!("cellog_group_generation{labels} {}", b.generation()),
        format!("cellog_group_rebalancing{labels} 0"),
        format!("cellog_group_rebalances_total{labels} {}", info.rebalances),
        format!("cellog_group_lag{labels} {}", got_a.len()),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }

    // A plain fetch of the group's consumer is refused.
    let plain = client.fetch("orders", "billing", "x", 1).await;
    assert!(matches!(plain, Err(ClientError::Status { code: Code::InvalidArgument, .. })), "{plain:?}");

    // b leaves and a owns everything again; a's subscription pushes a message published after that.
    assert!(b.leave(&mut heard_b).await.unwrap());
    settle(&mut [(&mut a, &mut heard_a)], &client).await;
    assert_eq!(a.partitions().len(), PARTITIONS as usize);
    a.ack(items(&got_a)).await.unwrap();
    let mut subscription = a.subscribe(16).await.unwrap();
    let request = v1::PublishRequest { subject: "orders.late".into(), payload: "late".into(), ..Default::default() };
    client.publish(request).await.unwrap();
    let pushed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let delivery = subscription.message().await.expect("the stream").expect("a delivery");
            if delivery.message.as_ref().is_some_and(|m| m.subject == "orders.late") {
                return delivery;
            }
        }
    })
    .await
    .expect("pushed within 10 s");
    assert_eq!(pushed.delivery_count, 1);
}

#[tokio::test]
async fn bad_group_calls_get_typed_errors() {
    let (_node, client) = one_node("groups-bad").await;
    orders(&client).await;
    let join = |member: &str, strategy: v1::GroupStrategy, session_timeout_ms: u64| v1::JoinGroupRequest {
        stream: "orders".into(),
        group: "g".into(),
        member: member.into(),
        strategy: strategy as i32,
        session_timeout_ms,
        config: None,
    };
    client.join_group(join("a", v1::GroupStrategy::StrategyRange, 0)).await.unwrap();
    let reason = |result: Result<v1::GroupAssignment, ClientError>| match result {
        Err(ClientError::Status { detail, .. }) => detail.reason,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(reason(client.join_group(join("b", v1::GroupStrategy::StrategySticky, 0)).await), "INVALID_CONFIG");
    assert_eq!(reason(client.join_group(join("b", v1::GroupStrategy::StrategyRange, 5)).await), "INVALID_ARGUMENT");
    assert_eq!(reason(client.join_group(join("bad name!", v1::GroupStrategy::StrategyRange, 0)).await), "INVALID_NAME");
    let mut bad_enum = join("b", v1::GroupStrategy::StrategyRange, 0);
    bad_enum.strategy = 99;
    assert_eq!(reason(client.join_group(bad_enum).await), "INVALID_ARGUMENT");
    assert_eq!(reason(client.heartbeat("orders", "g", "nobody", 1, vec![]).await), "UNKNOWN_MEMBER");
    assert_eq!(reason(client.heartbeat("orders", "nope", "a", 1, vec![]).await), "GROUP_NOT_FOUND");
    assert_eq!(reason(client.heartbeat("orders", "g", "a", 1, vec![PARTITIONS]).await), "INVALID_ARGUMENT");
}

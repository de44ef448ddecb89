//! A cell of in-process nodes on simulated disks, over real loopback gRPC: the client follows the leader from a
//! follower, membership changes online, subscriptions respect their window, transactions commit whole.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientOptions};
use cellog_net::{Limits, NodeConfig, RaftTiming, RunningNode};
use cellog_raft::SystemClock;
use cellog_raft::storage::SimDisk;
use tonic::Code;

mod common;

fn config(id: u64, bootstrap: bool) -> NodeConfig {
    let any = "127.0.0.1:0".parse().expect("an address");
    NodeConfig {
        cell: "cell".to_string(),
        id,
        data_dir: std::env::temp_dir(),
        client_addr: any,
        raft_addr: any,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers: Vec::new(),
        bootstrap,
        timing: RaftTiming {
            heartbeat_ms: 50,
            election_timeout_ms: 300,
            snapshot_every: 1000,
            keep_logs: 1000,
            ..RaftTiming::default()
        },
        mail: None,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: cellog_net::auth::Callers { insecure: true, cell: None, rate: None, scrape_token: None },
        root_token: None,
        tls: None,
        limits: Limits::DEFAULT,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    }
}

async fn start(config: &NodeConfig) -> RunningNode<SimDisk> {
    RunningNode::start(config, SimDisk::new(config.id), Arc::new(SystemClock)).await.expect("the node starts")
}

fn client_of(node: &RunningNode<SimDisk>) -> Client {
    Client::new([node.client_addr.to_string()], ClientOptions::default()).expect("a client")
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn leader_ready(client: &Client) {
    wait_for("a leader", async || {
        client.cluster_status().await.is_ok_and(|status| status.leader_id.is_some() && status.applied_index.is_some())
    })
    .await;
}

fn consumer_config() -> v1::ConsumerConfig {
    v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() }
}

fn stream_config(subject: &str) -> v1::StreamConfig {
    v1::StreamConfig { subjects: vec![subject.to_string()], ..Default::default() }
}

fn message(subject: &str, body: &str) -> v1::PublishRequest {
    v1::PublishRequest { subject: subject.to_string(), payload: Bytes::from(body.to_string()), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_online_and_clients_follow_the_leader() {
    let any = "127.0.0.1:0".parse().expect("an address");
    let first = start(&NodeConfig { metrics_addr: Some(any), ..config(1, true) }).await;
    let founder = client_of(&first);
    leader_ready(&founder).await;
    founder.create_stream("s", stream_config("s.>")).await.expect("created");
    for n in 0..20 {
        founder.publish(message("s.a", &format!("m{n}"))).await.expect("published");
    }

    // Two more nodes join: added as learners (catching up), then promoted.
    let second = start(&config(2, false)).await;
    let third = start(&NodeConfig { metrics_addr: Some(any), ..config(3, false) }).await;
    for node in [&second, &third] {
        let status = founder
            .add_learner(node.node.id(), &node.raft_addr.to_string(), &node.client_addr.to_string())
            .await
            .expect("learner added");
        assert!(status.nodes.iter().any(|member| member.id == node.node.id() && !member.voter));
        founder.promote(node.node.id()).await.expect("promoted");
    }
    let status = founder.cluster_status().await.expect("status");
    assert_eq!(status.nodes.iter().filter(|member| member.voter).count(), 3, "{status:?}");

    // A client that knows only a follower is sent to the leader and its writes land.
    let follower = client_of(&third);
    let ack = follower.publish(message("s.a", "via a follower")).await.expect("published through the leader");
    assert_eq!(ack.seq, 21);
    assert_eq!(follower.current_addr(), first.client_addr.to_string(), "the client moved to the leader");
    // Reads too, and a local read of the follower shows what it has applied.
    wait_for("the follower to apply", async || {
        client_of(&third).read("s", 0, 21, 10, true).await.is_ok_and(|response| response.messages.len() == 1)
    })
    .await;

    // The leader times its AppendEntries' round trips, and a follower its answers to them.
    let count = async |node: &RunningNode<SimDisk>, metric: &str| -> u64 {
        let text = common::scrape(node.metrics_addr.expect("metrics served")).await;
        let line = text.lines().find(|line| line.starts_with(&format!("{metric}_count "))).expect("the metric");
        line.rsplit(' ').next().and_then(|count| count.parse().ok()).expect("a count")
    };
    assert!(count(&first, "cellog_raft_append_round_trip_seconds").await > 0);
    assert!(count(&third, "cellog_raft_append_answer_seconds").await > 0);

    // A follower refuses a write it cannot forward, naming the leader.
    let direct = Client::new(
        [third.client_addr.to_string()],
        ClientOptions { retry_for: Duration::ZERO, discover: false, ..ClientOptions::default() },
    )
    .expect("a client");
    match direct.publish(message("s.a", "no retries")).await {
        Err(cellog_client::ClientError::Status { code, detail }) => {
            assert_eq!((code, detail.reason.as_str()), (tonic::Code::Unavailable, "NOT_LEADER"));
            assert_eq!(detail.leader_addr, first.client_addr.to_string());
            assert_eq!(detail.leader_id, 1);
        }
        other => panic!("expected NOT_LEADER, got {other:?}"),
    }

    // The third node is removed; the cell goes on with two.
    let status = founder.remove_node(3).await.expect("removed");
    assert!(status.nodes.iter().all(|member| member.id != 3), "{status:?}");
    founder.publish(message("s.a", "after removal")).await.expect("published");
    let digests = async |node: &RunningNode<SimDisk>| node.node.digest().expect("no panic interrupted applying");
    wait_for("replicas to agree", async || digests(&first).await == digests(&second).await).await;

    for node in [first, second, third] {
        node.stop().await.expect("a clean stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_respect_their_window_and_transactions_commit_whole() {
    let node = start(&config(1, true)).await;
    let client = client_of(&node);
    leader_ready(&client).await;
    client.create_stream("jobs", stream_config("jobs.>")).await.expect("created");
    let requests: Vec<_> = (0..100).map(|n| message("jobs.x", &format!("job-{n}"))).collect();
    for result in client.publish_batch(requests, 32).await {
        result.result.expect("published");
    }
    client.create_consumer("jobs", "workers", consumer_config()).await.expect("consumer");

    // The consumer's limits change online; its filter does not.
    let wider = v1::ConsumerConfig { ack_wait_ms: Some(90_000), ..consumer_config() };
    client.update_consumer("jobs", "workers", wider).await.expect("updated");
    assert_eq!(
        client.consumer_info("jobs", "workers").await.expect("info").config.and_then(|c| c.ack_wait_ms),
        Some(90_000)
    );
    let refiltered = v1::ConsumerConfig { filter_subject: Some("jobs.a".into()), ..consumer_config() };
    let refused = client.update_consumer("jobs", "workers", refiltered).await.expect_err("the filter is fixed");
    assert_eq!(refused.reason(), Some("INVALID_CONFIG"));

    // With a window of 8 and no acks, the subscription stops at 8.
    let mut stream = client.subscribe("jobs", "workers", "w1", 8).await.expect("subscribed");
    let mut first = Vec::new();
    for _ in 0..8 {
        first.push(stream.message().await.expect("a delivery").expect("open"));
    }
    let nothing = tokio::time::timeout(Duration::from_millis(400), stream.message()).await;
    assert!(nothing.is_err(), "a ninth delivery arrived with eight unacknowledged: {nothing:?}");

    // Acking lets the rest through, in order, each once.
    let mut seqs: Vec<u64> = first.iter().map(|delivery| delivery.message.as_ref().expect("a message").seq).collect();
    // One call's acks are answered each in place, in order: a kind no version defines and a sequence never delivered
    // are refused alone, and the rest land.
    let mut acks: Vec<v1::AckItem> = seqs.iter().map(|&seq| v1::AckItem { seq, ..Default::default() }).collect();
    acks.insert(2, v1::AckItem { seq: 1000, ..Default::default() });
    acks.insert(5, v1::AckItem { seq: seqs[7], kind: 99, ..Default::default() });
    let results = client.ack("jobs", "workers", acks).await.expect("acked");
    let answers: Vec<String> = results
        .iter()
        .map(|result| match &result.result {
            Some(v1::ack_result::Result::State(_)) if !result.already_done => "acked".to_string(),
            Some(v1::ack_result::Result::Error(error)) => error.detail.as_ref().expect("a detail").reason.clone(),
            other => format!("{other:?} already done: {}", result.already_done),
        })
        .collect();
    let mut expected = vec!["acked"; 8];
    expected.insert(2, "NOT_DELIVERED");
    expected.insert(5, "INVALID_ARGUMENT");
    assert_eq!(answers, expected);
    while seqs.len() < 100 {
        let delivery = stream.message().await.expect("a delivery").expect("open");
        let seq = delivery.message.expect("a message").seq;
        seqs.push(seq);
        client.ack("jobs", "workers", vec![v1::AckItem { seq, ..Default::default() }]).await.expect("acked");
    }
    assert_eq!(seqs, (1..=100).collect::<Vec<u64>>());
    drop(stream);

    // A transaction across two subjects is invisible until its commit, then visible whole.
    let producer = client.init_producer("tx", 0).await.expect("a producer");
    client.begin(producer).await.expect("begun");
    for subject in ["jobs.a", "jobs.b"] {
        let mut request = message(subject, "staged");
        request.transaction = Some(producer);
        let staged = client.publish(request).await.expect("staged");
        assert!(staged.staged_index.is_some());
    }
    assert_eq!(client.stream_info("jobs").await.expect("info").messages, 100, "nothing visible before the commit");
    let committed = client.commit(producer).await.expect("committed");
    assert_eq!(committed.messages.iter().map(|ack| ack.seq).collect::<Vec<_>>(), vec![101, 102]);
    // A retried commit gets the first commit's answer.
    assert_eq!(client.commit(producer).await.expect("the same answer").messages, committed.messages);
    node.stop().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_subscriptions_write_nothing_and_a_publish_is_pushed_to_them() {
    let node = start(&config(1, true)).await;
    let client = client_of(&node);
    leader_ready(&client).await;
    client.create_stream("events", stream_config("events.>")).await.expect("created");
    let mut subscriptions = Vec::new();
    for n in 0..20 {
        let name = format!("c{n}");
        client.create_consumer("events", &name, consumer_config()).await.expect("consumer");
        subscriptions.push(client.subscribe("events", &name, "m", 16).await.expect("subscribed"));
    }
    // One more whose filter matches nothing that will be published.
    let only_b = v1::ConsumerConfig { filter_subject: Some("events.b".into()), ..consumer_config() };
    client.create_consumer("events", "only-b", only_b).await.expect("consumer");
    let mut filtered = client.subscribe("events", "only-b", "m", 16).await.expect("subscribed");

    // Three seconds idle: at most the leader's idle ticks (one per two seconds) reach the log, and no fetch.
    let applied = async || client.cluster_status().await.expect("status").applied_index.expect("an index");
    let before = applied().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_entries = applied().await - before;
    assert!(idle_entries <= 2, "21 idle subscriptions wrote {idle_entries} entries in 3 s");

    // A publish reaches every subscription of a consumer it matches, once, without polling.
    client.publish(message("events.a", "hello")).await.expect("published");
    for subscription in &mut subscriptions {
        let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.message())
            .await
            .expect("pushed within 10 s")
            .expect("a delivery")
            .expect("open");
        assert_eq!(delivery.message.expect("a message").payload, Bytes::from("hello"));
    }
    // The filtered consumer gets nothing, and its cursor moves past what it does not match all the same.
    wait_for("the filtered consumer's lag to clear", async || {
        client.consumer_info("events", "only-b").await.expect("info").lag_total == 0
    })
    .await;
    let nothing = tokio::time::timeout(Duration::from_millis(300), filtered.message()).await;
    assert!(nothing.is_err(), "the filtered subscription got a message it does not match: {nothing:?}");
    node.stop().await.expect("a clean stop");
}

/// A client on a connection of its own (it looks for no other members) that takes a refusal as final.
fn impatient_client_of(node: &RunningNode<SimDisk>) -> Client {
    let options = ClientOptions {
        retry_backpressure: false,
        discover: false,
        retry_for: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    Client::new([node.client_addr.to_string()], options).expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_bounds_its_connections_and_the_calls_on_each() {
    let limits = Limits { max_connections: 2, max_calls_per_connection: 1, ..Limits::DEFAULT };
    let node = start(&NodeConfig { limits, ..config(1, true) }).await;
    let first = impatient_client_of(&node);
    leader_ready(&first).await;
    first.create_stream("jobs", stream_config("jobs.>")).await.expect("created");
    first.create_consumer("jobs", "workers", consumer_config()).await.expect("consumer");

    // Two connections are served; a third is closed as it is accepted (its calls fail without an answer, and the
    // publish it carried is not written), until one of the others closes and a new one comes in under the limit.
    let second = impatient_client_of(&node);
    second.stream_info("jobs").await.expect("the second connection is served");
    let third = impatient_client_of(&node);
    let refused = third.publish(message("jobs.1", "x")).await.expect_err("a third connection is past two");
    // No answer of the node's: a transport failure (the client names it by its code).
    let closed = matches!(refused.code(), Some(Code::Unavailable | Code::Cancelled | Code::Unknown));
    assert!(closed && refused.detail().is_some_and(|detail| detail.leader_addr.is_empty()), "{refused}");
    first.stream_info("jobs").await.expect("the first connection is still served");
    assert_eq!(first.stream_info("jobs").await.expect("info").messages, 0, "the refused publish wrote nothing");
    drop((second, third));
    wait_for("a new connection under the limit", async || impatient_client_of(&node).stream_info("jobs").await.is_ok())
        .await;

    // One call at a time on a connection: with a subscription open, the connection's next call waits for it.
    let subscription = first.subscribe("jobs", "workers", "w1", 8).await.expect("subscribed");
    let waiting = tokio::time::timeout(Duration::from_millis(300), first.stream_info("jobs")).await;
    assert!(waiting.is_err(), "a second call ran beside an open subscription: {waiting:?}");
    drop(subscription);
    first.stream_info("jobs").await.expect("served once the subscription closed");
    node.stop().await.expect("a clean stop");
}

/// A call the node cannot answer within its request timeout is cut off there, and the caller is told that it does
/// not know the outcome (the publish it carried may still land). Its retry with the same message id lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_request_timeout_is_cut_off_and_its_retry_lands_once() {
    let limits = Limits { request_timeout: Duration::from_millis(300), ..Limits::DEFAULT };
    let disk = SimDisk::new(1);
    let config = NodeConfig { limits, ..config(1, true) };
    let node = RunningNode::start(&config, disk.clone(), Arc::new(SystemClock)).await.expect("the node starts");
    let client = impatient_client_of(&node);
    leader_ready(&client).await;
    client.create_stream("s", stream_config("s.>")).await.expect("created");
    // Every sync now takes two seconds: a publish waits for one, far past the node's timeout.
    disk.set_sync_delay(Duration::from_secs(2));
    let once = Client::new(
        [node.client_addr.to_string()],
        ClientOptions { retry_for: Duration::ZERO, discover: false, ..ClientOptions::default() },
    )
    .expect("a client");
    let request = v1::PublishRequest { msg_id: Some("slow-1".into()), ..message("s.a", "slow") };
    let cut = once.publish(request.clone()).await.expect_err("cut off by the node's request timeout");
    assert!(
        matches!(cut.code(), Some(tonic::Code::Cancelled | tonic::Code::DeadlineExceeded)),
        "expected the node's timeout, got {cut}"
    );
    assert!(cut.outcome_unknown(), "a publish cut off may have landed: {cut}");
    disk.set_sync_delay(Duration::ZERO);
    // The publish was proposed before it was cut off: it lands when its sync ends, and its retry finds it there.
    wait_for("the cut-off publish to land", async || {
        client.read("s", 0, 1, 10, false).await.is_ok_and(|response| !response.messages.is_empty())
    })
    .await;
    let retried = client.publish(request).await.expect("the retry is answered");
    assert!(retried.duplicate, "{retried:?}");
    let stored = client.read("s", 0, 1, 10, false).await.expect("reads").messages;
    let ids: Vec<Option<&str>> = stored.iter().map(|m| m.msg_id.as_deref()).collect();
    assert_eq!(ids, [Some("slow-1")], "stored once");
    assert_eq!(retried.seq, stored[0].seq);
    node.stop().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_bounds_its_subscriptions() {
    let node =
        start(&NodeConfig { limits: Limits { max_subscriptions: 2, ..Limits::DEFAULT }, ..config(1, true) }).await;
    let client = impatient_client_of(&node);
    leader_ready(&client).await;
    client.create_stream("jobs", stream_config("jobs.>")).await.expect("created");
    client.create_consumer("jobs", "workers", consumer_config()).await.expect("consumer");
    let first = client.subscribe("jobs", "workers", "a", 8).await.expect("the first subscription");
    let _second = client.subscribe("jobs", "workers", "b", 8).await.expect("the second subscription");
    let refused = client.subscribe("jobs", "workers", "c", 8).await.expect_err("a third subscription is past two");
    assert_eq!(refused.reason(), Some("TOO_MANY_SUBSCRIPTIONS"), "{refused}");
    // A subscription's place is freed when its subscriber leaves.
    drop(first);
    wait_for("a subscription under the limit", async || client.subscribe("jobs", "workers", "c", 8).await.is_ok())
        .await;
    node.stop().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fails_stops_serving_and_says_why() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let disk = SimDisk::new(9);
    let node = RunningNode::start(&config(1, true), disk.clone(), Arc::new(SystemClock)).await.expect("starts");
    let client = client_of(&node);
    leader_ready(&client).await;
    client.create_stream("s", stream_config("s.>")).await.expect("created");
    let health = async |service: &str| {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", node.client_addr))
            .expect("a url")
            .connect()
            .await
            .expect("connects");
        let mut health = HealthClient::new(channel);
        let request = HealthCheckRequest { service: service.to_string() };
        health.check(request).await.expect("a health answer").into_inner().status
    };
    assert_eq!(health("cellog.v1.Cellog").await, ServingStatus::Serving as i32);
    assert_eq!(health("").await, ServingStatus::Serving as i32);

    disk.fail_next_io();
    let refused = client.publish(message("s.a", "lost")).await;
    assert!(refused.is_err(), "a publish whose write failed is not acknowledged: {refused:?}");
    let reason = tokio::time::timeout(Duration::from_secs(10), node.failed()).await.expect("the failure is reported");
    assert!(reason.contains("raft stopped"), "{reason}");
    wait_for("NOT_SERVING", async || health("cellog.v1.Cellog").await == ServingStatus::NotServing as i32).await;
    assert_eq!(health("").await, ServingStatus::NotServing as i32, "the server as a whole too");
    let _ = node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_of_the_same_name_is_told_apart_by_its_id() {
    // Two cells of the same name, each founded on its own: each made an id of its own.
    let ours = start(&config(1, true)).await;
    let theirs = start(&config(5, true)).await;
    let client = client_of(&ours);
    leader_ready(&client).await;
    leader_ready(&client_of(&theirs)).await;
    let our_id = ours.node.identity().id().expect("the founder made the cell's id");
    let their_id = theirs.node.identity().id().expect("the founder made the cell's id");
    assert_ne!(our_id, their_id);

    // A new node learns our cell's id from our leader's first entries.
    let new = start(&config(2, false)).await;
    assert_eq!(new.node.identity().id(), None);
    client.add_learner(2, &new.raft_addr.to_string(), &new.client_addr.to_string()).await.expect("learner added");
    wait_for("the new node to learn the cell's id", async || new.node.identity().id() == Some(our_id)).await;

    // The other cell's node, added to ours by mistake, refuses our leader's entries: nothing of ours reaches it,
    // and its own cell is untouched.
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        client.add_learner(5, &theirs.raft_addr.to_string(), &theirs.client_addr.to_string()),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let view = theirs.node.cluster_view();
    assert_eq!(view.members.iter().map(|member| member.id).collect::<Vec<_>>(), vec![5], "{view:?}");
    assert_eq!(theirs.node.identity().id(), Some(their_id));
    let status = client.cluster_status().await.expect("status");
    let stranger = status.nodes.iter().find(|member| member.id == 5).expect("added as a learner");
    assert_eq!(stranger.matched_index, None, "nothing of ours reached it");

    for node in [ours, theirs, new] {
        node.stop().await.expect("a clean stop");
    }
}

/// Below the free-disk watermark the leader refuses what would grow the store (a publish, a batch, a new stream) with
/// `STORAGE_FULL`, writing nothing, and goes on serving reads, consumers and deletes; with room again, writes resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_that_grow_the_store_and_serves_the_rest() {
    let disk = SimDisk::new(7);
    let (node, client) = common::one_node_on("full", disk.clone()).await;
    // A client that sheds load itself: a refusal for a full disk comes back at once rather than after retries.
    let options = ClientOptions { retry_backpressure: false, ..ClientOptions::default() };
    drop(client);
    let client = Client::new([node.client_addr.to_string()], options).expect("a client");
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    client.create_stream("orders", config).await.expect("a stream");
    let publish = |n: u32| v1::PublishRequest {
        subject: format!("orders.{n}"),
        payload: Bytes::from_static(b"x"),
        ..Default::default()
    };
    let ack = client.publish(publish(1)).await.expect("room on the disk");
    let wait_out = || tokio::time::sleep(cellog_raft::FREE_BYTES_EVERY + Duration::from_millis(50));

    disk.set_free_bytes(Some(4096));
    wait_out().await;
    let refused = client.publish(publish(2)).await.expect_err("the disk is full");
    assert_eq!(refused.reason(), Some("STORAGE_FULL"), "{refused}");
    assert!(refused.to_string().contains("4096 bytes free"), "{refused}");
    for item in client.publish_batch(vec![publish(3), publish(4)], 2).await {
        let refused = item.result.expect_err("a batch is refused too");
        assert_eq!(refused.reason(), Some("STORAGE_FULL"), "{refused}");
    }
    let config = v1::StreamConfig { subjects: vec!["audit.>".into()], ..Default::default() };
    let refused = client.create_stream("audit", config).await.expect_err("no new stream either");
    assert_eq!(refused.reason(), Some("STORAGE_FULL"), "{refused}");
    // Nothing was written; reads, consumers and recalls go on.
    let info = client.stream_info("orders").await.expect("reads go on");
    assert_eq!(info.messages, 1);
    assert_eq!(client.list_streams().await.expect("listed").len(), 1);
    let read = client.read("orders", ack.partition, ack.seq, 10, false).await.expect("read").messages;
    assert_eq!(read.len(), 1);
    let consumer = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() };
    client.create_consumer("orders", "work", consumer).await.expect("a consumer is small");
    let fetched = client.fetch("orders", "work", "m", 10).await.expect("fetches go on");
    assert_eq!(fetched.len(), 1);
    client.recall("orders", ack.partition, ack.seq).await.expect("a recall frees room");

    disk.set_free_bytes(None);
    wait_out().await;
    client.publish(publish(5)).await.expect("room again");
    node.stop().await.expect("stops");
}

/// A subscriber that does not read holds up its subscription's fetching once the node holds
/// `SUBSCRIPTION_BUFFER_BYTES` of payload for it, whatever its window: the deliveries wait in the cell, not in the
/// node's memory; as it reads, the rest come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_holds_its_subscription_to_a_byte_budget() {
    let (node, client) = common::one_node("budget").await;
    let config =
        v1::StreamConfig { subjects: vec!["big.>".into()], max_payload_bytes: Some(4 << 20), ..Default::default() };
    client.create_stream("big", config).await.expect("a stream");
    let consumer = v1::ConsumerConfig { ack_wait_ms: Some(600_000), ..Default::default() };
    client.create_consumer("big", "slow", consumer).await.expect("a consumer");
    let size = 2 * 1024 * 1024;
    let total = 40u64;
    for n in 0..total {
        let request = v1::PublishRequest {
            subject: format!("big.{n}"),
            payload: Bytes::from(vec![b'x'; size]),
            ..Default::default()
        };
        client.publish(request).await.expect("published");
    }
    let mut deliveries = client.subscribe("big", "slow", "m", 64).await.expect("subscribed");
    deliveries.message().await.expect("a delivery").expect("one");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = client.consumer_info("big", "slow").await.expect("info").pending;
    let budget = cellog_net::service::SUBSCRIPTION_BUFFER_BYTES / size as u64;
    // The budget, plus what HTTP/2's flow-control windows took off the subscription's queue (a few MiB); without the
    // budget, all forty would be delivered at once.
    assert!(u64::from(held) <= budget + 5, "{held} delivered to a subscriber that read one");
    let mut read = 1;
    while read < total {
        deliveries.message().await.expect("a delivery").expect("one");
        read += 1;
    }
    assert_eq!(client.consumer_info("big", "slow").await.expect("info").pending as u64, total);
    node.stop().await.expect("stops");
}

//! The HTTP port of a node over real HTTP: every route of the JSON API, its errors, a follower's answer, the live
//! tails over server-sent events and WebSocket, the OpenAPI document and the console.

#![cfg(not(madsim))]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cellog_client::{Client, ClientOptions};
use cellog_net::{NodeConfig, Peer, RaftTiming, RunningNode};
use cellog_proto::v1;
use cellog_raft::storage::SimDisk;
use cellog_raft::{NodeAddrs, SystemClock};
use common::{Events, free_addr, http, http_with, one_node};
use futures::StreamExt;
use serde_json::{Value, json};

fn b64(text: &str) -> String {
    STANDARD.encode(text)
}

fn payload_of(message: &Value) -> String {
    String::from_utf8(STANDARD.decode(message["payload"].as_str().expect("a payload")).expect("base64")).expect("UTF-8")
}

fn http_addr(node: &RunningNode<SimDisk>) -> SocketAddr {
    node.metrics_addr.expect("the node serves HTTP")
}

/// `call` answered 200; its JSON.
async fn ok(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Value {
    let answer = http(addr, method, path, body).await;
    assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body);
    answer.json()
}

#[tokio::test]
async fn every_route_of_the_json_api_answers() {
    let (node, _client) = one_node("http-routes").await;
    let addr = http_addr(&node);

    // Streams.
    let stream = json!({ "name": "orders", "config": { "subjects": ["orders.>"], "partitions": 2 } });
    assert_eq!(ok(addr, "POST", "/v1/streams", Some(stream.clone())).await["created"], true);
    assert_eq!(ok(addr, "POST", "/v1/streams", Some(stream)).await["created"], false, "creating it again is no change");
    let update = json!({ "config": { "subjects": ["orders.>"], "partitions": 2, "max_messages": "1000" } });
    ok(addr, "PUT", "/v1/streams/orders", Some(update)).await;
    let info = ok(addr, "GET", "/v1/streams/orders", None).await;
    assert_eq!(info["config"]["max_messages"], "1000");
    let list = ok(addr, "GET", "/v1/streams", None).await;
    assert_eq!(list["streams"][0]["name"], "orders");

    // Messages: one, a batch, a read, a recall.
    let one = json!({ "subject": "orders.eu", "payload": b64("first"), "msg_id": "o-1", "key": b64("k") });
    let ack = ok(addr, "POST", "/v1/messages", Some(one.clone())).await;
    assert_eq!(
        (ack["stream"].as_str(), ack["seq"].as_str(), ack["duplicate"].as_bool()),
        (Some("orders"), Some("1"), Some(false))
    );
    let again = ok(addr, "POST", "/v1/messages", Some(one)).await;
    assert_eq!((again["seq"].clone(), again["duplicate"].clone()), (ack["seq"].clone(), json!(true)));
    let partition = ack["partition"].as_u64().expect("a partition");
    let batch = json!({ "messages": [
        { "subject": "orders.eu", "payload": b64("second"), "key": b64("k") },
        { "subject": "elsewhere", "payload": b64("nowhere") },
        { "subject": "orders.eu", "payload": b64("third"), "key": b64("k") },
    ] });
    let results = ok(addr, "POST", "/v1/messages/batch", Some(batch)).await;
    let results = results["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["ack"]["seq"], "2");
    assert_eq!(results[1]["error"]["detail"]["reason"], "NO_STREAM_FOR_SUBJECT", "{results:?}");
    assert_eq!(results[2]["ack"]["seq"], "3", "a refused item does not stop the batch, and order is kept");
    let read =
        ok(addr, "GET", &format!("/v1/streams/orders/partitions/{partition}/messages?from_seq=2&max=10"), None).await;
    let messages = read["messages"].as_array().expect("messages");
    assert_eq!(messages.iter().map(payload_of).collect::<Vec<_>>(), ["second", "third"]);
    ok(addr, "DELETE", &format!("/v1/streams/orders/partitions/{partition}/messages/3"), None).await;
    let read =
        ok(addr, "GET", &format!("/v1/streams/orders/partitions/{partition}/messages?from_seq=3&local=true"), None)
            .await;
    assert!(read["messages"][0]["recalled_at_ms"].is_string(), "{read}");

    // Consumers.
    let consumer = json!({ "name": "audit", "config": { "ack_wait_ms": "30000" } });
    ok(addr, "POST", "/v1/streams/orders/consumers", Some(consumer)).await;
    ok(addr, "PUT", "/v1/streams/orders/consumers/audit", Some(json!({ "config": { "ack_wait_ms": "20000" } }))).await;
    assert_eq!(ok(addr, "GET", "/v1/streams/orders/consumers/audit", None).await["config"]["ack_wait_ms"], "20000");
    assert_eq!(ok(addr, "GET", "/v1/streams/orders/consumers", None).await["consumers"][0]["name"], "audit");
    let fetched = ok(addr, "POST", "/v1/streams/orders/consumers/audit/fetch", Some(json!({ "max": 10 }))).await;
    let deliveries = fetched["deliveries"].as_array().expect("deliveries").clone();
    assert_eq!(deliveries.len(), 3, "{fetched}");
    assert!(deliveries[2]["message"]["recalled_at_ms"].is_string(), "a recalled message is delivered as its tombstone");
    let acks: Vec<Value> = deliveries
        .iter()
        .map(|d| json!({ "partition": d["message"]["partition"], "seq": d["message"]["seq"], "kind": "ACK_APPLIED" }))
        .collect();
    let acked = ok(addr, "POST", "/v1/streams/orders/consumers/audit/ack", Some(json!({ "acks": acks }))).await;
    assert!(acked["results"].as_array().expect("results").iter().all(|r| r["state"].is_string()), "{acked}");
    let cursor = json!({ "partition": partition, "next_seq": "4" });
    ok(addr, "POST", "/v1/streams/orders/consumers/audit/cursor", Some(cursor)).await;
    ok(addr, "DELETE", "/v1/streams/orders/consumers/audit", None).await;

    // A consumer group.
    let join = json!({ "member": "w1", "strategy": "STRATEGY_COOPERATIVE_STICKY", "session_timeout_ms": "30000" });
    let assignment = ok(addr, "POST", "/v1/streams/orders/groups/billing/join", Some(join)).await;
    let generation = assignment["generation"].clone();
    assert_eq!(assignment["partitions"], json!([0, 1]));
    let member = json!({ "member": "w1", "generation": generation });
    ok(addr, "POST", "/v1/streams/orders/groups/billing/heartbeat", Some(member.clone())).await;
    let fetched = ok(addr, "POST", "/v1/streams/orders/groups/billing/fetch", Some(member.clone())).await;
    let first = &fetched["deliveries"][0]["message"];
    let ack = json!({ "member": "w1", "generation": generation, "acks": [{ "partition": first["partition"], "seq": first["seq"] }] });
    ok(addr, "POST", "/v1/streams/orders/groups/billing/ack", Some(ack)).await;
    let commit = json!({ "member": "w1", "generation": generation, "partition": partition, "next_seq": "4" });
    ok(addr, "POST", "/v1/streams/orders/groups/billing/cursor", Some(commit)).await;
    assert_eq!(ok(addr, "GET", "/v1/streams/orders/groups", None).await["groups"][0]["name"], "billing");
    assert_eq!(ok(addr, "GET", "/v1/streams/orders/groups/billing", None).await["members"][0]["name"], "w1");
    ok(addr, "POST", "/v1/streams/orders/groups/billing/leave", Some(json!({ "member": "w1" }))).await;

    // Peers.
    ok(addr, "POST", "/v1/streams/orders/peers", Some(json!({ "peer": "mirror" }))).await;
    let progress = json!({ "partition": partition, "received_seq": "2" });
    ok(addr, "POST", "/v1/streams/orders/peers/mirror/progress", Some(progress)).await;
    ok(addr, "DELETE", "/v1/streams/orders/peers/mirror", None).await;

    // A transaction: staged, then committed whole.
    let producer = ok(addr, "POST", "/v1/producers", Some(json!({ "transactional_id": "tx" }))).await;
    let id = producer["producer_id"].as_str().expect("an id").to_string();
    ok(addr, "POST", &format!("/v1/producers/{id}/begin"), Some(json!({ "epoch": producer["epoch"] }))).await;
    let transaction = producer.clone();
    let staged = json!({ "subject": "orders.us", "payload": b64("staged"), "transaction": transaction });
    let staged = ok(addr, "POST", "/v1/messages", Some(staged)).await;
    assert_eq!(staged["staged_index"], 0, "{staged}");
    ok(addr, "POST", &format!("/v1/producers/{id}/prepare"), Some(json!({ "epoch": transaction["epoch"] }))).await;
    let committed =
        ok(addr, "POST", &format!("/v1/producers/{id}/commit"), Some(json!({ "epoch": transaction["epoch"] }))).await;
    assert_eq!(committed["messages"].as_array().map(Vec::len), Some(1), "{committed}");
    let next = committed["next"].clone();
    ok(addr, "POST", &format!("/v1/producers/{id}/begin"), Some(json!({ "epoch": next["epoch"] }))).await;
    ok(addr, "POST", &format!("/v1/producers/{id}/abort"), Some(json!({ "epoch": next["epoch"] }))).await;

    // The cluster.
    let status = ok(addr, "GET", "/v1/cluster?digest_parts=true", None).await;
    assert_eq!((status["node_id"].as_str(), status["state"].as_str()), (Some("1"), Some("Leader")));
    assert!(status["digest_parts"].as_array().is_some_and(|parts| !parts.is_empty()));
    assert_eq!(status["state_digest"].as_str().map(str::len), Some(64), "{status}");
    let unknown = http(addr, "POST", "/v1/cluster/nodes/9/promote", None).await;
    assert!(unknown.status >= 400, "{}", unknown.body);
    let removed = ok(addr, "DELETE", "/v1/cluster/nodes/9", None).await;
    assert_eq!(
        removed["nodes"].as_array().map(Vec::len),
        Some(1),
        "removing a node that is not a member changes nothing"
    );
    let learner = json!({ "node_id": "2", "raft_addr": "not an address", "client_addr": "127.0.0.1:1" });
    assert!(http(addr, "POST", "/v1/cluster/learners", Some(learner)).await.status >= 400);

    // Principals and tokens.
    let grants = json!({ "grants": { "publish": ["orders.eu.*"], "consume": ["orders/audit"] } });
    assert_eq!(ok(addr, "PUT", "/v1/principals/billing", Some(grants)).await["created"], true);
    let digest = STANDARD.encode([7u8; 32]);
    ok(addr, "POST", "/v1/principals/billing/tokens", Some(json!({ "token_sha256": digest }))).await;
    let principals = ok(addr, "GET", "/v1/principals", None).await;
    let billing =
        principals["principals"].as_array().expect("principals").iter().find(|p| p["name"] == "billing").cloned();
    assert_eq!(billing.map(|p| p["tokens"].clone()), Some(json!(1)));
    ok(addr, "POST", "/v1/tokens/revoke", Some(json!({ "token_sha256": digest }))).await;
    ok(addr, "DELETE", "/v1/principals/billing", None).await;
    assert_eq!(ok(addr, "GET", "/v1/whoami", None).await["name"], "root");

    ok(addr, "DELETE", "/v1/streams/orders", None).await;
    assert_eq!(http(addr, "GET", "/v1/streams/orders", None).await.status, 404);
    let _ = node.stop().await;
}

#[tokio::test]
async fn bad_requests_get_typed_json_errors() {
    let (node, _client) = one_node("http-errors").await;
    let addr = http_addr(&node);
    let error = |answer: &common::Answer| answer.json()["error"].clone();

    let answer = http_with(addr, "POST", "/v1/streams", &[], b"{not json".to_vec()).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (400, Some("BAD_JSON")), "{}", answer.body);
    assert_eq!(error(&answer)["code"], "INVALID_ARGUMENT");
    let answer = http(addr, "POST", "/v1/streams", Some(json!({ "name": "s", "colour": "red" }))).await;
    assert_eq!(answer.status, 400, "an unknown field is refused, not ignored: {}", answer.body);
    assert!(error(&answer)["message"].as_str().is_some_and(|m| m.contains("colour")), "{}", answer.body);
    let answer =
        http(addr, "POST", "/v1/streams", Some(json!({ "name": "bad name!", "config": { "subjects": ["x"] } }))).await;
    assert_eq!(answer.status, 400, "{}", answer.body);

    let answer = http(addr, "GET", "/v1/streams/missing", None).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (404, Some("STREAM_NOT_FOUND")), "{}", answer.body);
    assert_eq!(answer.header("cellog-reason"), Some("STREAM_NOT_FOUND"));
    let answer = http(addr, "POST", "/v1/messages", Some(json!({ "subject": "nowhere", "payload": "" }))).await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    let answer = http(addr, "POST", "/v1/messages", Some(json!({ "subject": "x", "payload": "not base64!" }))).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = http(addr, "GET", "/v1/streams/s/partitions/zero/messages", None).await;
    assert_eq!(answer.status, 400, "a partition that is not a number: {}", answer.body);
    let answer = http(addr, "GET", "/v1/cluster?digest_parts=maybe", None).await;
    assert_eq!(answer.status, 400, "{}", answer.body);

    let answer = http(addr, "GET", "/v1/nothing/here", None).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (404, Some("NO_ROUTE")));
    let answer = http(addr, "PATCH", "/v1/streams", None).await;
    assert_eq!(answer.status, 404);
    let answer = http(addr, "POST", "/v1/streams/orders", None).await;
    assert_eq!((answer.status, answer.header("allow")), (405, Some("GET, PUT, DELETE")));
    let answer = http_with(addr, "GET", "/v1/streams", &[], b"{}".to_vec()).await;
    assert_eq!(answer.status, 400, "a GET takes no body: {}", answer.body);

    let huge = vec![b' '; cellog_net::http::MAX_BODY_BYTES + 1];
    let answer = http_with(addr, "POST", "/v1/messages", &[], huge).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (413, Some("TOO_LARGE")), "{}", answer.body);
    let many: Vec<Value> = (0..=cellog_net::http::MAX_BATCH).map(|_| json!({ "subject": "x" })).collect();
    let answer = http(addr, "POST", "/v1/messages/batch", Some(json!({ "messages": many }))).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (400, Some("TOO_MANY_MESSAGES")));

    let answer = http(addr, "GET", "/v1/streams/missing/tail", None).await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    let answer = http_with(addr, "GET", "/v1/streams", &[("authorization", "Basic abc")], Vec::new()).await;
    assert_eq!((answer.status, error(&answer)["code"].as_str()), (401, Some("UNAUTHENTICATED")));
    // A WebSocket tail is not opened from another site's page; the console's page says what it may load.
    // (The requests name the host `cellog`.)
    let other = [("origin", "https://elsewhere.example")];
    let answer = http_with(addr, "GET", "/v1/streams/missing/tail/ws", &other, Vec::new()).await;
    assert_eq!((answer.status, error(&answer)["reason"].as_str()), (403, Some("CROSS_ORIGIN")), "{}", answer.body);
    let same = [("origin", "http://cellog")];
    let answer = http_with(addr, "GET", "/v1/streams/missing/tail/ws", &same, Vec::new()).await;
    assert_ne!(answer.status, 403, "the node's own origin: {}", answer.body);
    let page = http(addr, "GET", "/console", None).await;
    let policy = page.header("content-security-policy").unwrap_or_default();
    assert!(policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"), "{policy}");
    let _ = node.stop().await;
}

fn config(id: u64, addrs: &[(SocketAddr, SocketAddr, SocketAddr)]) -> NodeConfig {
    let (client, raft, http) = addrs[(id - 1) as usize];
    let peers = (1..=addrs.len() as u64)
        .filter(|peer| *peer != id)
        .map(|peer| {
            let (client, raft, _) = addrs[(peer - 1) as usize];
            Peer { id: peer, node: NodeAddrs { raft_addr: raft.to_string(), client_addr: client.to_string() } }
        })
        .collect();
    NodeConfig {
        cell: "http-cell".to_string(),
        id,
        data_dir: std::env::temp_dir(),
        client_addr: client,
        raft_addr: raft,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: Some(http),
        peers,
        bootstrap: true,
        timing: RaftTiming { heartbeat_ms: 50, election_timeout_ms: 300, ..RaftTiming::default() },
        mail: None,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: cellog_net::auth::Callers { insecure: true, cell: None, rate: None, scrape_token: None },
        root_token: None,
        tls: None,
        limits: cellog_net::Limits::DEFAULT,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    }
}

#[tokio::test]
async fn a_follower_passes_calls_to_the_leader_and_tails_from_its_own_replica() {
    let addrs: Vec<_> = (0..3).map(|_| (free_addr(), free_addr(), free_addr())).collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let config = config(id, &addrs);
        nodes.push(RunningNode::start(&config, SimDisk::new(id), Arc::new(SystemClock)).await.expect("started"));
    }
    let client =
        Client::new(addrs.iter().map(|(client, _, _)| client.to_string()), ClientOptions::default()).expect("a client");
    let mut leader = None;
    for _ in 0..200 {
        if let Ok(status) = client.cluster_status().await
            && let Some(id) = status.leader_id
            && status.applied_index.is_some()
        {
            leader = Some(id);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let leader = leader.expect("a leader");
    let stream = v1::StreamConfig { subjects: vec!["f.>".into()], partitions: 1, ..Default::default() };
    client.create_stream("f", stream).await.expect("created");
    let follower = nodes.iter().find(|node| node.node.id() != leader).expect("a follower");

    // A follower passes a write on to the leader and answers with its answer; its tail reads its own replica.
    let follower_addr = http_addr(follower);
    let mut tail = Events::open(follower_addr, "/v1/streams/f/tail", &[]).await;
    let message = json!({ "subject": "f.a", "payload": b64("through a follower"), "msg_id": "a-1" });
    let ack = ok(follower_addr, "POST", "/v1/messages", Some(message.clone())).await;
    assert_eq!((ack["seq"].as_str(), ack["duplicate"].as_bool()), (Some("1"), Some(false)), "{ack}");
    let again = ok(follower_addr, "POST", "/v1/messages", Some(message)).await;
    assert_eq!((again["seq"].as_str(), again["duplicate"].as_bool()), (Some("1"), Some(true)), "{again}");
    let batch = json!({ "messages": [
        { "subject": "f.b", "payload": b64("batch 1") },
        { "subject": "nowhere", "payload": b64("refused") },
        { "subject": "f.b", "payload": b64("batch 2") },
    ] });
    let results = ok(follower_addr, "POST", "/v1/messages/batch", Some(batch)).await["results"].clone();
    assert_eq!(results[0]["ack"]["seq"], "2", "{results}");
    assert_eq!(results[1]["error"]["detail"]["reason"], "NO_STREAM_FOR_SUBJECT", "{results}");
    assert_eq!(results[2]["ack"]["seq"], "3", "{results}");
    // The leader's refusal is the answer.
    let exists = json!({ "name": "f", "config": { "subjects": ["other.>"] } });
    let answer = http(follower_addr, "POST", "/v1/streams", Some(exists)).await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    let mut payloads = Vec::new();
    while payloads.len() < 3 {
        let event = tail.next().await.expect("an event");
        assert_eq!(event.event, "message");
        payloads.push(payload_of(&event.data));
    }
    assert_eq!(payloads, ["through a follower", "batch 1", "batch 2"]);
    for node in nodes {
        let _ = node.stop().await;
    }
}

fn common_publish(subject: &str, body: &str) -> v1::PublishRequest {
    v1::PublishRequest { subject: subject.into(), payload: body.as_bytes().to_vec().into(), ..Default::default() }
}

#[tokio::test]
async fn a_tail_pushes_what_is_published_and_resumes_without_a_gap_or_a_repeat() {
    let (node, client) = one_node("http-tail").await;
    let addr = http_addr(&node);
    let stream = v1::StreamConfig { subjects: vec!["t.>".into()], partitions: 3, ..Default::default() };
    client.create_stream("t", stream).await.expect("created");
    client.publish(common_publish("t.old", "before the tail")).await.expect("published");

    // From now: what was there before is not sent; a filter leaves out other subjects.
    let mut sse = Events::open(addr, "/v1/streams/t/tail?subject=t.eu.*", &[]).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/streams/t/tail/ws")).await.expect("a WebSocket");
    for i in 0..6 {
        let subject = if i % 2 == 0 { format!("t.eu.{i}") } else { format!("t.us.{i}") };
        client.publish(common_publish(&subject, &format!("m{i}"))).await.expect("published");
    }
    let mut filtered = Vec::new();
    for _ in 0..3 {
        let event = sse.next().await.expect("an event");
        filtered.push(payload_of(&event.data));
    }
    filtered.sort();
    assert_eq!(filtered, ["m0", "m2", "m4"]);
    let mut all = Vec::new();
    while all.len() < 6 {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame").expect("open");
        if let tokio_tungstenite::tungstenite::Message::Text(text) = frame.expect("a frame") {
            let event: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(event["event"], "message");
            all.push(payload_of(&event["data"]));
        }
    }
    all.sort();
    assert_eq!(all, ["m0", "m1", "m2", "m3", "m4", "m5"]);
    ws.close(None).await.expect("closed");

    // From the start, then cut after three events; resumed from the last id it gets exactly the rest.
    let mut first = Events::open(addr, "/v1/streams/t/tail?from_seq=1", &[]).await;
    let mut seen = Vec::new();
    let mut last_id = String::new();
    for _ in 0..3 {
        let event = first.next().await.expect("an event");
        last_id = event.id.clone().expect("an id");
        seen.push(payload_of(&event.data));
    }
    drop(first);
    client.publish(common_publish("t.late", "after the cut")).await.expect("published");
    let mut resumed = Events::open(addr, "/v1/streams/t/tail", &[("last-event-id", &last_id)]).await;
    while seen.len() < 8 {
        seen.push(payload_of(&resumed.next().await.expect("an event").data));
    }
    seen.sort();
    let mut expected: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    expected.extend(["after the cut".to_string(), "before the tail".to_string()]);
    expected.sort();
    assert_eq!(seen, expected, "nothing missed, nothing repeated");

    // A tail that falls too far behind is told so and closed.
    let mut slow = Events::open(addr, "/v1/streams/t/tail?from_seq=1&max_behind=2", &[]).await;
    let event = slow.next().await.expect("an event");
    assert_eq!(event.event, "lagged", "{event:?}");
    assert!(slow.next().await.is_none(), "the stream ends after lagged");

    // A bad position is refused.
    let answer = http_with(addr, "GET", "/v1/streams/t/tail", &[("last-event-id", "0:1")], Vec::new()).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let _ = node.stop().await;
}

#[tokio::test]
async fn the_openapi_document_and_the_console_are_served() {
    let (node, client) = one_node("http-docs").await;
    let addr = http_addr(&node);
    let document = ok(addr, "GET", "/v1/openapi.json", None).await;
    assert_eq!(document["openapi"], "3.1.0");
    assert!(document["paths"]["/v1/messages"]["post"]["requestBody"].is_object());
    let page = http(addr, "GET", "/console", None).await;
    assert!(page.status == 200 && page.body.contains("console.js"), "{}", page.body);
    let script = http(addr, "GET", "/console/console.js", None).await;
    assert_eq!(script.header("content-type"), Some("text/javascript; charset=utf-8"));
    let stream = v1::StreamConfig { subjects: vec!["m.>".into()], ..Default::default() };
    client.create_stream("m", stream).await.expect("created");
    let join = json!({ "member": "w1", "strategy": "STRATEGY_RANGE", "session_timeout_ms": "30000" });
    ok(addr, "POST", "/v1/streams/m/groups/billing/join", Some(join)).await;
    let overview = ok(addr, "GET", "/console/overview", None).await;
    assert_eq!(overview["cluster"]["state"], "Leader");
    let entry = &overview["streams"][0];
    assert_eq!(entry["stream"]["name"], "m", "{overview}");
    assert_eq!(entry["groups"][0]["name"], "billing", "{overview}");
    assert_eq!(entry["groups"][0]["members"][0]["name"], "w1", "{overview}");
    assert_eq!(http(addr, "GET", "/", None).await.status, 303);

    // The metrics count open tails and the node's resident memory.
    let _tail = Events::open(addr, "/v1/streams/m/tail", &[]).await;
    let metrics = http(addr, "GET", "/metrics", None).await.body;
    let figure = |name: &str| -> i64 {
        let line = metrics.lines().find(|line| line.starts_with(&format!("{name} "))).expect(name);
        line[name.len() + 1..].trim().parse().expect("a number")
    };
    assert_eq!(figure("cellog_http_tails"), 1, "{metrics}");
    assert!(figure("cellog_resident_memory_bytes") > 1 << 20, "{metrics}");
    let _ = node.stop().await;
}

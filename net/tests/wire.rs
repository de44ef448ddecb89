//! The client API over real loopback gRPC, on a one-node cell: bad input gets its documented status code and detail
//! and leaves the data untouched; health, reflection and metrics answer.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]

mod common;
use common::one_node;

use bytes::{Buf, BufMut, Bytes};
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError, ClientOptions};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

fn expect_error<T: std::fmt::Debug>(result: Result<T, ClientError>, code: Code, reason: &str) -> v1::ErrorDetail {
    match result {
        Err(ClientError::Status { code: got, detail }) => {
            assert_eq!((got, detail.reason.as_str()), (code, reason), "{detail:?}");
            assert!(!detail.message.is_empty());
            detail
        }
        other => panic!("expected {code:?} {reason}, got {other:?}"),
    }
}

fn stream_config(subjects: &[&str]) -> v1::StreamConfig {
    v1::StreamConfig { subjects: subjects.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

fn publish(subject: &str, payload: &[u8]) -> v1::PublishRequest {
    v1::PublishRequest { subject: subject.to_string(), payload: Bytes::copy_from_slice(payload), ..Default::default() }
}

/// Sends raw bytes as a request body, to see what a node does with garbage.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

async fn raw_call(addr: &str, method: &'static str, body: Bytes) -> Result<Bytes, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connected");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
    grpc.unary(tonic::Request::new(body), path, RawCodec).await.map(tonic::Response::into_inner)
}

#[tokio::test]
async fn bad_input_gets_typed_errors_and_changes_nothing() {
    let (node, client) = one_node("wire").await;
    client.create_stream("orders", stream_config(&["orders.>"])).await.expect("created");
    client.publish(publish("orders.1", b"first")).await.expect("published");
    let before = client.stream_info("orders").await.expect("info");
    let digest_before = client.cluster_status_with_digest().await.expect("status").state_digest;

    // Invalid names and subjects.
    expect_error(
        client.create_stream("bad name!", stream_config(&["x.>"])).await,
        Code::InvalidArgument,
        "INVALID_NAME",
    );
    expect_error(client.create_stream("x", stream_config(&["a..b"])).await, Code::InvalidArgument, "INVALID_SUBJECT");
    expect_error(client.publish(publish("orders.*", b"wild")).await, Code::InvalidArgument, "INVALID_SUBJECT");
    expect_error(client.create_stream("empty", stream_config(&[])).await, Code::InvalidArgument, "INVALID_CONFIG");
    // A different config under an existing name; a filter overlapping another stream's.
    expect_error(client.create_stream("orders", stream_config(&["other.>"])).await, Code::AlreadyExists, "CONFLICT");
    expect_error(
        client.create_stream("shadow", stream_config(&["orders.eu.>"])).await,
        Code::FailedPrecondition,
        "SUBJECT_OVERLAP",
    );

    // Oversized payloads: over the stream's limit, and over the wire's.
    let big = vec![0u8; 1024 * 1024 + 1];
    expect_error(client.publish(publish("orders.1", &big)).await, Code::InvalidArgument, "PAYLOAD_TOO_LARGE");
    let huge = Bytes::from(prost::Message::encode_to_vec(&publish(
        "orders.1",
        &vec![0u8; cellog_client::limits::MAX_CLIENT_MESSAGE],
    )));
    let status =
        raw_call(&node.client_addr.to_string(), "/cellog.v1.Cellog/Publish", huge).await.expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");

    // Unknown streams and consumers.
    expect_error(client.stream_info("missing").await, Code::NotFound, "STREAM_NOT_FOUND");
    expect_error(client.publish(publish("nowhere.1", b"x")).await, Code::NotFound, "NO_STREAM_FOR_SUBJECT");
    expect_error(client.fetch("orders", "nobody", "", 1).await, Code::NotFound, "CONSUMER_NOT_FOUND");
    expect_error(client.read("missing", 0, 1, 10, false).await, Code::NotFound, "STREAM_NOT_FOUND");

    // Wrong expected sequence carries the actual one.
    let mut conditional = publish("orders.1", b"cond");
    conditional.expected_last_seq = Some(7);
    let detail = expect_error(client.publish(conditional).await, Code::FailedPrecondition, "WRONG_LAST_SEQUENCE");
    assert_eq!(detail.last_seq, 1);

    // Wrong epochs: an older instance of a producer is fenced, and says which epoch is current.
    let old = client.init_producer("billing", 0).await.expect("a producer");
    let new = client.init_producer("billing", 0).await.expect("a newer instance");
    let detail = expect_error(client.begin(old).await, Code::FailedPrecondition, "FENCED");
    assert_eq!(detail.current_epoch, new.epoch);
    let mut staged = publish("orders.1", b"zombie");
    staged.transaction = Some(old);
    expect_error(client.publish(staged).await, Code::FailedPrecondition, "FENCED");
    expect_error(
        client.commit(v1::ProducerRef { producer_id: 999, epoch: 0 }).await,
        Code::NotFound,
        "PRODUCER_NOT_FOUND",
    );

    // Garbage in fields: an enum value no version defines, and bytes that are not a message at all.
    let mut config = stream_config(&["weird.>"]);
    config.retention = 42;
    let detail = expect_error(client.create_stream("weird", config).await, Code::InvalidArgument, "INVALID_ARGUMENT");
    assert!(detail.message.contains("retention"), "{detail:?}");
    let ack = v1::AckItem { kind: 99, ..Default::default() };
    let results = client.ack("orders", "nobody", vec![ack]).await.expect("an answer per item");
    assert!(
        matches!(&results[0].result, Some(v1::ack_result::Result::Error(error)) if error.code == Code::InvalidArgument as i32)
    );
    let garbage = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x80]);
    let status =
        raw_call(&node.client_addr.to_string(), "/cellog.v1.Cellog/Publish", garbage).await.expect_err("refused");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    // A subject that is not UTF-8 does not decode either.
    let not_utf8 = Bytes::from_static(&[0x0a, 0x02, 0xc3, 0x28]);
    let status =
        raw_call(&node.client_addr.to_string(), "/cellog.v1.Cellog/Publish", not_utf8).await.expect_err("refused");
    assert_eq!(status.code(), Code::Internal, "{status:?}");

    // None of it changed the stream (the producer registrations are the only state the calls above created).
    let after = client.stream_info("orders").await.expect("info");
    assert_eq!(before, after);
    let messages = client.read("orders", 0, 1, 100, false).await.expect("read").messages;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].payload, Bytes::from_static(b"first"));
    assert_ne!(digest_before, "", "a digest is reported when asked for");
    let plain = client.cluster_status().await.expect("status");
    assert_eq!((plain.state_digest.as_str(), plain.digest_parts.len()), ("", 0), "and only then");
    node.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn health_reflection_and_metrics_answer() {
    let (node, client) = one_node("wire").await;
    client.create_stream("m", stream_config(&["m.>"])).await.expect("created");
    client.publish(publish("m.1", b"x")).await.expect("published");
    // A message key over its cap: RESOURCE_EXHAUSTED naming the cap, counted by cap.
    let long_key = v1::PublishRequest { key: Some(Bytes::from(vec![b'k'; 1025])), ..publish("m.2", b"x") };
    let detail = expect_error(client.publish(long_key).await, Code::ResourceExhausted, "CAP_REACHED");
    assert!(detail.message.contains("key") && detail.message.contains("1024"), "{detail:?}");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.client_addr))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connected");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest { service: "cellog.v1.Cellog".to_string() })
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(serving.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers.message().await.expect("an answer").expect("one message");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|service| service.name).collect();
    assert!(names.contains(&"cellog.v1.Cellog".to_string()), "{names:?}");

    // The older version too, which many tools still ask.
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as AlphaClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResponse;
    let request = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(AlphaRequest::ListServices(String::new())),
    };
    let mut answers = AlphaClient::new(channel)
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("v1alpha reflection answers")
        .into_inner();
    let answer = answers.message().await.expect("an answer").expect("one message");
    let Some(AlphaResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    assert!(list.service.iter().any(|service| service.name == "cellog.v1.Cellog"), "{list:?}");

    let text = common::scrape(node.metrics_addr.expect("metrics served")).await;
    for metric in [
        "cellog_published_total 1",
        "cellog_commit_latency_seconds_count",
        "cellog_fsync_latency_seconds_count",
        "cellog_raft_is_leader 1",
        "cellog_consumer_lag_max",
        "cellog_oldest_unacked_age_seconds",
        "cellog_raft_applied_index",
        "cellog_caps_reached_key_bytes_total 1",
        "cellog_caps_reached_dedup_ids_total 0",
    ] {
        assert!(text.contains(metric), "{metric} missing from:\n{text}");
    }
    node.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn a_lagging_peer_holds_retention_back_until_it_reports_progress() {
    let (node, client) = one_node("wire").await;
    let mut config = stream_config(&["feed.>"]);
    config.max_messages = Some(3);
    client.create_stream("feed", config).await.expect("created");
    client.register_peer("feed", "mirror").await.expect("registered");
    client.register_peer("feed", "mirror").await.expect("registering again changes nothing");
    for i in 1..=3 {
        client.publish(publish("feed.a", format!("m{i}").as_bytes())).await.expect("published");
    }

    // Full, and the oldest message is one the mirror has not received: refused, naming the mirror (a client that
    // gives up quickly sees the refusal instead of waiting for room).
    let impatient = Client::new(
        [node.client_addr.to_string()],
        ClientOptions { retry_for: std::time::Duration::from_millis(300), ..ClientOptions::default() },
    )
    .expect("a client");
    let detail =
        expect_error(impatient.publish(publish("feed.a", b"m4")).await, Code::ResourceExhausted, "STORAGE_FULL");
    assert_eq!(detail.lagging_peer, "mirror");
    assert!(detail.message.contains("mirror"), "{detail:?}");

    // Bad progress reports change nothing.
    expect_error(client.peer_progress("feed", "nobody", 0, 1).await, Code::NotFound, "PEER_NOT_FOUND");
    expect_error(client.peer_progress("feed", "mirror", 0, 99).await, Code::InvalidArgument, "INVALID_ARGUMENT");
    expect_error(client.peer_progress("feed", "mirror", 5, 1).await, Code::InvalidArgument, "INVALID_ARGUMENT");
    expect_error(client.peer_progress("missing", "mirror", 0, 1).await, Code::NotFound, "STREAM_NOT_FOUND");
    expect_error(client.register_peer("feed", "bad name!").await, Code::InvalidArgument, "INVALID_NAME");

    // The mirror has the first two: room for two more, and the two it has are the ones that go.
    client.peer_progress("feed", "mirror", 0, 2).await.expect("progress");
    client.peer_progress("feed", "mirror", 0, 1).await.expect("an older report is harmless");
    client.publish(publish("feed.a", b"m4")).await.expect("room now");
    client.publish(publish("feed.a", b"m5")).await.expect("room now");
    let seqs: Vec<u64> =
        client.read("feed", 0, 1, 100, false).await.expect("read").messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![3, 4, 5]);
    let info = client.stream_info("feed").await.expect("info");
    assert_eq!(info.peers.len(), 1);
    assert_eq!((info.peers[0].name.as_str(), info.peers[0].received.as_slice()), ("mirror", &[2u64][..]));
    expect_error(impatient.publish(publish("feed.a", b"m6")).await, Code::ResourceExhausted, "STORAGE_FULL");

    // Once unregistered, retention no longer waits for it.
    client.unregister_peer("feed", "mirror").await.expect("unregistered");
    expect_error(client.unregister_peer("feed", "mirror").await, Code::NotFound, "PEER_NOT_FOUND");
    client.publish(publish("feed.a", b"m6")).await.expect("the oldest goes");
    let seqs: Vec<u64> =
        client.read("feed", 0, 1, 100, false).await.expect("read").messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![4, 5, 6]);
    node.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn large_messages_are_answered_within_the_wire_limit_and_none_is_counted_unsent() {
    let (node, client) = one_node("wire").await;
    let config = v1::StreamConfig { max_payload_bytes: Some(8 * 1024 * 1024), ..stream_config(&["big.>"]) };
    client.create_stream("big", config).await.expect("a stream");
    let consumer = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() };
    client.create_consumer("big", "c", consumer).await.expect("a consumer");
    // Seven messages of 7 MiB: 49 MiB, three times what one answer may carry.
    for n in 0..7u8 {
        client.publish(publish("big.x", &vec![n; 7 * 1024 * 1024])).await.expect("published");
    }
    // Each fetch answers what fits and leaves the rest undelivered: every message arrives once, in order, and the
    // consumer counts exactly the deliveries it answered.
    let mut seen = Vec::new();
    for _ in 0..20 {
        let deliveries = client.fetch("big", "c", "m", 100).await.expect("a fetch within the wire limit");
        if deliveries.is_empty() {
            break;
        }
        seen.extend(deliveries.iter().map(|d| {
            let message = d.message.as_ref().expect("a message");
            assert_eq!(d.delivery_count, 1);
            (message.seq, message.payload[0])
        }));
    }
    assert_eq!(seen, (1..=7).map(|seq| (seq, (seq - 1) as u8)).collect::<Vec<_>>());
    let info = client.consumer_info("big", "c").await.expect("info");
    assert_eq!((info.delivered, info.pending), (7, 7));
    // A read goes on from where the last answer stopped.
    let mut next = 1;
    while next <= 7 {
        let messages = client.read("big", 0, next, 100, false).await.expect("a read within the wire limit").messages;
        assert!(!messages.is_empty());
        next = messages.last().expect("a message").seq + 1;
    }
    node.stop().await.expect("stops");
}

/// Every result of a `PublishBatch` call, in order, until the call ends, and how it ended.
async fn batch_results(addr: &str, requests: Vec<v1::PublishBatchRequest>) -> (Vec<v1::PublishResult>, Option<Code>) {
    let mut client = v1::cellog_client::CellogClient::connect(format!("http://{addr}")).await.expect("connected");
    let mut answers = client.publish_batch(futures::stream::iter(requests)).await.expect("a call").into_inner();
    let mut results = Vec::new();
    loop {
        match answers.message().await {
            Ok(Some(answer)) => results.extend(answer.results),
            Ok(None) => return (results, None),
            Err(status) => return (results, Some(status.code())),
        }
    }
}

#[tokio::test]
async fn a_publish_batch_call_answers_each_message_in_order_and_bounds_a_request() {
    let (node, client) = one_node("wire").await;
    client.create_stream("orders", stream_config(&["orders.>"])).await.expect("created");
    let addr = node.client_addr.to_string();
    let batch = |messages: Vec<v1::PublishRequest>| v1::PublishBatchRequest { messages };
    // Requests of several messages, an empty one, and a refused message among the others: one result per message
    // sent, in the order sent, across however many answers carry them.
    let requests = vec![
        batch((0..3).map(|n| publish("orders.a", format!("{n}").as_bytes())).collect()),
        batch(Vec::new()),
        batch(vec![publish("orders.a", b"3"), publish("orders.*", b"refused"), publish("orders.a", b"4")]),
        batch((5..10).map(|n| publish("orders.b", format!("{n}").as_bytes())).collect()),
    ];
    let (results, ended) = batch_results(&addr, requests).await;
    assert_eq!(ended, None, "the call ends well");
    assert_eq!(results.len(), 11);
    let mut seqs = Vec::new();
    for (n, result) in results.into_iter().enumerate() {
        match result.result {
            Some(v1::publish_result::Result::Ack(ack)) => seqs.push(ack.seq),
            Some(v1::publish_result::Result::Error(error)) if n == 4 => {
                assert_eq!(error.detail.expect("a detail").reason, "INVALID_SUBJECT")
            }
            other => panic!("message {n} was answered {other:?}"),
        }
    }
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "stored in the order sent");
    let stored = client.read("orders", 0, 1, 100, false).await.expect("a read").messages;
    let payloads: Vec<_> =
        stored.iter().map(|message| String::from_utf8_lossy(&message.payload).into_owned()).collect();
    assert_eq!(payloads, (0..10).map(|n| n.to_string()).collect::<Vec<_>>());

    // A request over the bound ends the call with INVALID_ARGUMENT, and none of its messages is stored.
    let limit = cellog_client::limits::MAX_PUBLISH_BATCH;
    let over = batch((0..=limit).map(|_| publish("orders.a", b"over")).collect());
    let (results, ended) = batch_results(&addr, vec![batch(vec![publish("orders.a", b"10")]), over]).await;
    assert_eq!((results.len(), ended), (1, Some(Code::InvalidArgument)));
    assert_eq!(client.stream_info("orders").await.expect("info").messages, 11);
    // One at the bound is taken whole.
    let (results, ended) =
        batch_results(&addr, vec![batch((0..limit).map(|_| publish("orders.a", b"at")).collect())]).await;
    assert_eq!((results.len(), ended), (limit, None));
    assert!(results.iter().all(|result| matches!(result.result, Some(v1::publish_result::Result::Ack(_)))));
    node.stop().await.expect("stops");
}

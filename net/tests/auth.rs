//! Principals over real loopback gRPC, on a one-node cell that requires a credential: the root token the node was
//! given, principals made with it, and what each may do. A refused call is UNAUTHENTICATED or PERMISSION_DENIED
//! (naming the grant) and writes nothing.

// Real sockets and tokio: not a simulation test.
#![cfg(not(madsim))]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError, ClientOptions, token};
use cellog_net::auth::{Callers, PrincipalRate};
use cellog_net::{NodeConfig, RaftTiming, RunningNode};
use cellog_raft::SystemClock;
use cellog_raft::storage::SimDisk;

const ROOT_TOKEN: &str = "cellog_root-token-of-the-auth-test-0123456789abcdef";

async fn secure_node() -> RunningNode<SimDisk> {
    secure_node_with(None).await
}

/// The same, limiting each principal but root to `rate`.
async fn secure_node_with(rate: Option<PrincipalRate>) -> RunningNode<SimDisk> {
    secure_node_limited(rate, cellog_net::Limits::DEFAULT).await
}

/// The same, with `limits`.
async fn secure_node_limited(rate: Option<PrincipalRate>, limits: cellog_net::Limits) -> RunningNode<SimDisk> {
    let any = "127.0.0.1:0".parse().expect("an address");
    let config = NodeConfig {
        cell: "auth".to_string(),
        id: 1,
        data_dir: std::env::temp_dir(),
        client_addr: any,
        raft_addr: any,
        advertise_client_addr: None,
        advertise_raft_addr: None,
        metrics_addr: None,
        peers: Vec::new(),
        bootstrap: true,
        timing: RaftTiming { heartbeat_ms: 50, election_timeout_ms: 200, ..RaftTiming::default() },
        mail: None,
        past: cellog_raft::Past::Unknown,
        cell_id: None,
        callers: Callers { insecure: false, cell: None, rate, scrape_token: None },
        root_token: Some(ROOT_TOKEN.to_string()),
        tls: None,
        limits,
        mirrors: cellog_net::mirror::MirrorOptions::default(),
        apply: cellog_raft::ApplyControl::default(),
    };
    RunningNode::start(&config, SimDisk::new(11), Arc::new(SystemClock)).await.expect("the node starts")
}

fn client(node: &RunningNode<SimDisk>, token: Option<&str>) -> Client {
    let options = ClientOptions {
        retry_for: Duration::from_secs(10),
        token: token.map(str::to_string),
        ..ClientOptions::default()
    };
    Client::new([node.client_addr.to_string()], options).expect("a client")
}

fn reason<T: std::fmt::Debug>(result: Result<T, ClientError>) -> String {
    match result {
        Err(error) => error.reason().unwrap_or("no reason").to_string(),
        Ok(value) => panic!("expected a refusal, got {value:?}"),
    }
}

fn grants(publish: &[&str], subscribe: &[&str], consume: &[&str]) -> v1::Grants {
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
    v1::Grants {
        publish: strings(publish),
        subscribe: strings(subscribe),
        consume: strings(consume),
        ..Default::default()
    }
}

fn publish(subject: &str) -> v1::PublishRequest {
    v1::PublishRequest { subject: subject.to_string(), payload: Bytes::from_static(b"x"), ..Default::default() }
}

/// Who `root` is, once the node has installed the root token it was given (it does so once it leads), or `None`
/// if it never did.
async fn root_token_works(root: &Client) -> Option<v1::Principal> {
    for _ in 0..200 {
        if let Ok(principal) = root.who_am_i().await {
            return Some(principal);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// A principal with a fresh token.
async fn principal(root: &Client, name: &str, grants: v1::Grants) -> String {
    root.put_principal(name, grants).await.expect("a principal");
    let made = token::from_random(token::hash(name));
    root.add_token(name, token::hash(&made)).await.expect("its token");
    made
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_runs_as_a_principal_with_its_grants() {
    let node = secure_node().await;
    let root = client(&node, Some(ROOT_TOKEN));
    // The node installs its root token once it leads.
    assert_eq!(root_token_works(&root).await.expect("the root token works").name, "root");

    // No credential, a token the cell does not know, a malformed one: UNAUTHENTICATED.
    assert_eq!(reason(client(&node, None).list_streams().await), "UNAUTHENTICATED");
    assert_eq!(reason(client(&node, Some("cellog_nobody-knows-me")).list_streams().await), "UNAUTHENTICATED");

    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let config = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() };
    root.create_consumer("orders", "billing", config).await.expect("a consumer");
    let alice = principal(&root, "alice", grants(&["orders.eu.*"], &["orders.>"], &["orders/billing"])).await;
    let bob = principal(&root, "bob", grants(&["orders.us.*"], &[], &[])).await;
    let (alice, bob) = (client(&node, Some(&alice)), client(&node, Some(&bob)));

    // A publish outside the grants is refused, naming the grant, and writes nothing.
    let refused = bob.publish(publish("orders.eu.1")).await.expect_err("outside bob's grants");
    assert_eq!(refused.reason(), Some("PERMISSION_DENIED"));
    assert!(refused.to_string().contains("publish on \"orders.eu.1\""), "{refused}");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 0);

    // A header named like the node's (`Cellog-*`, in any case) is refused and writes nothing; the sender is
    // stamped by the cell.
    let mut forged = publish("orders.eu.1");
    forged.headers.insert("cellog-sender".to_string(), "root".to_string());
    let refused = alice.publish(forged).await.expect_err("a forged sender");
    assert_eq!(refused.reason(), Some("PERMISSION_DENIED"));
    assert!(refused.to_string().contains("\"cellog-sender\""), "{refused}");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 0);
    let ack = alice.publish(publish("orders.eu.1")).await.expect("inside alice's grants");
    let stored = alice.read("orders", ack.partition, ack.seq, 1, false).await.expect("alice reads").messages;
    assert_eq!(stored[0].headers.get("Cellog-Sender").map(String::as_str), Some("alice"));

    // Reading needs subscribe grants covering the stream; admin calls need admin.
    assert_eq!(reason(bob.read("orders", 0, 1, 10, false).await), "PERMISSION_DENIED");
    assert_eq!(reason(bob.delete_stream("orders").await), "PERMISSION_DENIED");
    assert_eq!(
        reason(bob.put_principal("bob", v1::Grants { admin: true, ..Default::default() }).await),
        "PERMISSION_DENIED"
    );
    // Membership changes need cluster admin; so do the state's digests (which encode the whole state while applying
    // waits) and the members' peer addresses. Anyone learns the members' client addresses (a client routes by them).
    assert_eq!(reason(alice.remove_node(1).await), "PERMISSION_DENIED");
    assert_eq!(reason(alice.cluster_status_with_digest().await), "PERMISSION_DENIED");
    assert_eq!(reason(alice.cluster_status_with_parts().await), "PERMISSION_DENIED");
    let seen = alice.cluster_status().await.expect("status");
    assert!(seen.nodes.iter().all(|node| node.raft_addr.is_empty() && !node.client_addr.is_empty()), "{seen:?}");
    let full = root.cluster_status_with_digest().await.expect("status");
    assert!(!full.state_digest.is_empty() && full.nodes.iter().all(|node| !node.raft_addr.is_empty()), "{full:?}");

    // Only a principal that may consume a consumer acknowledges its deliveries.
    let deliveries = alice.fetch("orders", "billing", "m", 1).await.expect("alice fetches");
    let delivered = deliveries[0].message.as_ref().expect("a message");
    let item = v1::AckItem { partition: delivered.partition, seq: delivered.seq, ..Default::default() };
    assert_eq!(reason(bob.fetch("orders", "billing", "m", 1).await), "PERMISSION_DENIED");
    let item_reason = |result: &v1::AckResult| match &result.result {
        Some(v1::ack_result::Result::Error(error)) => error.detail.as_ref().map(|d| d.reason.clone()),
        _ => None,
    };
    let bobs = bob.ack("orders", "billing", vec![item]).await.expect("an answer per item");
    assert_eq!(item_reason(&bobs[0]).as_deref(), Some("PERMISSION_DENIED"), "{bobs:?}");
    let alices = alice.ack("orders", "billing", vec![item]).await.expect("an answer per item");
    assert!(matches!(alices[0].result, Some(v1::ack_result::Result::State(_))), "{alices:?}");

    // A revoked token stops working at once.
    let carol = principal(&root, "carol", grants(&["orders.>"], &[], &[])).await;
    let carol_client = client(&node, Some(&carol));
    carol_client.publish(publish("orders.us.1")).await.expect("carol publishes");
    root.revoke_token(token::hash(&carol)).await.expect("revoked");
    assert_eq!(reason(carol_client.publish(publish("orders.us.2")).await), "UNAUTHENTICATED");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 2);

    let listed: Vec<String> = root.list_principals().await.expect("listed").into_iter().map(|p| p.name).collect();
    assert_eq!(listed, ["alice", "bob", "carol", "root"]);
    node.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_keep_to_their_own_names() {
    let node = secure_node().await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    // Two tenants' admins, each with every grant of its tenant, make the same stream and consumer.
    let mut tenants = Vec::new();
    for tenant in ["acme", "beta"] {
        let all = v1::Grants { admin: true, ..grants(&[">"], &[">"], &["*/*"]) };
        let made = principal(&root, &format!("{tenant}/ops"), all).await;
        let admin = client(&node, Some(&made));
        let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
        admin.create_stream("orders", config).await.expect("the tenant's stream");
        let config = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() };
        admin.create_consumer("orders", "work", config).await.expect("the tenant's consumer");
        tenants.push(admin);
    }
    let (acme, beta) = (&tenants[0], &tenants[1]);
    assert_eq!(acme.who_am_i().await.expect("who").name, "acme/ops");

    // A message of one tenant is that tenant's alone, named as the tenant names it.
    let ack = acme.publish(publish("orders.1")).await.expect("acme publishes");
    assert_eq!(ack.stream, "orders");
    let listed = |streams: Vec<v1::StreamInfo>| -> Vec<(String, u64)> {
        streams.into_iter().map(|s| (s.name, s.messages)).collect()
    };
    assert_eq!(listed(acme.list_streams().await.expect("listed")), [("orders".to_string(), 1)]);
    assert_eq!(listed(beta.list_streams().await.expect("listed")), [("orders".to_string(), 0)]);
    let info = acme.stream_info("orders").await.expect("info");
    assert_eq!(info.config.expect("a config").subjects, ["orders.>"]);
    let read = acme.read("orders", ack.partition, ack.seq, 1, false).await.expect("acme reads").messages;
    assert_eq!(read[0].subject, "orders.1");
    assert_eq!(read[0].headers.get("Cellog-Sender").map(String::as_str), Some("acme/ops"));
    let fetched = acme.fetch("orders", "work", "m", 10).await.expect("acme fetches");
    assert_eq!(fetched[0].message.as_ref().expect("a message").subject, "orders.1");
    assert!(beta.fetch("orders", "work", "m", 10).await.expect("beta fetches").is_empty());
    let consumers = acme.list_consumers("orders").await.expect("consumers");
    assert_eq!(consumers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["work"]);

    // Another tenant's stream cannot be named: the name is taken in the caller's own tenant.
    assert_eq!(reason(beta.stream_info("acme/orders").await), "STREAM_NOT_FOUND");
    assert_eq!(reason(beta.read("acme/orders", 0, 1, 10, false).await), "STREAM_NOT_FOUND");
    assert_eq!(reason(beta.publish(publish("@acme.orders.2")).await), "NO_STREAM_FOR_SUBJECT");
    assert_eq!(reason(beta.delete_stream("acme/orders").await), "STREAM_NOT_FOUND");
    // A tenant's principal holds no cluster admin.
    assert_eq!(reason(acme.remove_node(1).await), "PERMISSION_DENIED");
    // Where a stream lives is looked up in the caller's own tenant: acme finds its `orders` by that name, and beta
    // finds nothing of acme's.
    root.put_cell("home", vec!["127.0.0.1:1".to_string()]).await.expect("a cell");
    root.place_stream("acme/orders", "home").await.expect("placed");
    let located = acme.locate_stream("orders").await.expect("acme locates its stream");
    assert_eq!(located.placement.expect("a placement").stream, "orders");
    assert_eq!(reason(beta.locate_stream("orders").await), "NOT_PLACED");
    assert_eq!(reason(beta.locate_stream("acme/orders").await), "NOT_PLACED");

    // The cell's operator sees both by their stored names, and root's `>` reaches no tenant's subjects.
    let all = listed(root.list_streams().await.expect("listed"));
    assert_eq!(all, [("acme/orders".to_string(), 1), ("beta/orders".to_string(), 0)]);
    assert_eq!(reason(root.publish(publish("@acme.orders.3")).await), "PERMISSION_DENIED");
    assert_eq!(root.stream_info("acme/orders").await.expect("info").messages, 1);
    node.stop().await.expect("stops");
}

/// A tenant is held to its quotas over the wire: RESOURCE_EXHAUSTED naming the tenant's quota, nothing written; a
/// tenant reads its own quotas and usage alone; only a cluster admin sets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_held_to_its_quotas() {
    let node = secure_node().await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    let all = v1::Grants { admin: true, ..grants(&[">"], &[">"], &["*/*"]) };
    let acme = client(&node, Some(&principal(&root, "acme/ops", all.clone()).await));
    let beta = client(&node, Some(&principal(&root, "beta/ops", all).await));
    for tenant in [&acme, &beta] {
        let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
        tenant.create_stream("orders", config).await.expect("the tenant's stream");
    }
    let quotas = v1::Quotas { max_streams: Some(1), max_messages: Some(2), ..Default::default() };
    assert_eq!(reason(acme.set_quotas(Some("acme"), quotas).await), "PERMISSION_DENIED");
    root.set_quotas(Some("acme"), quotas).await.expect("root sets acme's quotas");
    for n in 0..2 {
        acme.publish(publish(&format!("orders.{n}"))).await.expect("within the quota");
    }
    let refused = acme.publish(publish("orders.2")).await.expect_err("past the quota");
    assert_eq!(refused.reason(), Some("TENANT_QUOTA_EXCEEDED"), "{refused}");
    assert!(refused.to_string().contains("TenantMessages limit of 2"), "{refused}");
    let config = v1::StreamConfig { subjects: vec!["audit.>".into()], ..Default::default() };
    assert_eq!(reason(acme.create_stream("audit", config).await), "TENANT_QUOTA_EXCEEDED");
    assert_eq!(acme.stream_info("orders").await.expect("info").messages, 2, "the refused publish wrote nothing");
    assert_eq!(acme.list_streams().await.expect("listed").len(), 1, "the refused stream was not made");
    beta.publish(publish("orders.9")).await.expect("another tenant has no quota");

    let mine = acme.quotas().await.expect("acme reads its own");
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].tenant.as_str(), mine[0].streams, mine[0].messages), ("acme", 1, 2));
    assert_eq!(mine[0].quotas, Some(quotas));
    let every = root.quotas().await.expect("root reads all");
    let holders: Vec<(&str, u64)> = every.iter().map(|h| (h.tenant.as_str(), h.messages)).collect();
    assert_eq!(holders, [("", 3), ("acme", 2)], "the cell first, then each tenant with a quota");
    let carol = client(&node, Some(&principal(&root, "carol", grants(&[">"], &[], &[])).await));
    assert_eq!(reason(carol.quotas().await), "PERMISSION_DENIED");

    // Deliveries awaiting an ack are capped too: one at a time across acme's consumers, counted in its usage.
    let capped = v1::Quotas { max_in_flight: Some(1), ..quotas };
    root.set_quotas(Some("acme"), capped).await.expect("root caps acme's deliveries");
    for consumer in ["one", "two"] {
        acme.create_consumer("orders", consumer, v1::ConsumerConfig::default()).await.expect("a consumer");
    }
    let first = acme.fetch("orders", "one", "m", 10).await.expect("a fetch");
    assert_eq!(first.len(), 1, "one delivery under the cap");
    assert!(acme.fetch("orders", "two", "m", 10).await.expect("a fetch").is_empty(), "no room for another");
    let mine = acme.quotas().await.expect("acme reads its own");
    assert_eq!(mine[0].in_flight, 1);
    let message = first[0].message.as_ref().expect("a message");
    let ack = v1::AckItem { partition: message.partition, seq: message.seq, ..Default::default() };
    acme.ack("orders", "one", vec![ack]).await.expect("acked");
    assert_eq!(acme.fetch("orders", "two", "m", 10).await.expect("a fetch").len(), 1, "the ack made room");
    let zero = v1::Quotas { max_in_flight_per_subject: Some(0), ..Default::default() };
    assert_eq!(reason(root.set_quotas(Some("acme"), zero).await), "INVALID_ARGUMENT");
    node.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_but_root_is_held_to_its_rate() {
    let node = secure_node_with(Some(PrincipalRate { per_second: 4, burst: 5 })).await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let token = principal(&root, "busy", grants(&["orders.>"], &["orders.>"], &[])).await;
    // A caller that sheds load itself gets the refusal at once: the burst goes through, the next is refused with
    // when to retry, and writes nothing.
    let shedding = Client::new(
        [node.client_addr.to_string()],
        ClientOptions { token: Some(token.clone()), retry_backpressure: false, ..ClientOptions::default() },
    )
    .expect("a client");
    for n in 0..5 {
        shedding.publish(publish(&format!("orders.{n}"))).await.expect("within the burst");
    }
    let refused = shedding.publish(publish("orders.5")).await.expect_err("over the rate");
    assert_eq!(refused.reason(), Some("RATE_LIMITED"), "{refused}");
    match &refused {
        ClientError::Status { code, detail } => {
            assert_eq!(*code, tonic::Code::ResourceExhausted);
            assert!(detail.retry_after_ms > 0 && detail.retry_after_ms <= 250, "{detail:?}");
            assert!(detail.message.contains("\"busy\""), "{detail:?}");
        }
        other => panic!("expected a status, got {other:?}"),
    }
    // A read costs the leader a round too, and counts against the same rate.
    let read = shedding.stream_info("orders").await.expect_err("a read over the rate");
    assert_eq!(read.reason(), Some("RATE_LIMITED"), "{read}");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 5);
    // Root is never limited, and a client that retries is let through as the bucket refills.
    for n in 0..20 {
        root.publish(publish(&format!("orders.root.{n}"))).await.expect("root is not limited");
    }
    client(&node, Some(&token)).publish(publish("orders.6")).await.expect("admitted after the advised pause");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 26);
    node.stop().await.expect("stops");
}

/// A mirror's token needs no cluster admin of its source: a principal with a mirror grant on one stream registers as
/// its mirror, reads it for the mirror, sees its info and reports progress, and is refused everything else, writing
/// nothing. Only a cluster admin grants one, and the listing shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_grant_reads_one_stream_for_its_mirror_and_nothing_else() {
    let node = secure_node().await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    for (name, subjects) in [("orders", "orders.>"), ("audit", "audit.>")] {
        let config = v1::StreamConfig { subjects: vec![subjects.into()], ..Default::default() };
        root.create_stream(name, config).await.expect("a stream");
    }
    for subject in ["orders.1", "orders.2", "audit.1"] {
        root.publish(publish(subject)).await.expect("published");
    }
    let west = client(&node, Some(&principal(&root, "west-mirror", v1::Grants::default()).await));
    let ops = client(&node, Some(&principal(&root, "ops", v1::Grants { admin: true, ..Default::default() }).await));
    assert_eq!(reason(west.mirror_read("orders", "west", vec![0], 10, 0).await), "PERMISSION_DENIED");
    assert_eq!(reason(ops.grant_mirror("west-mirror", &["orders".to_string()]).await), "PERMISSION_DENIED");
    assert_eq!(reason(west.grant_mirror("west-mirror", &["orders".to_string()]).await), "PERMISSION_DENIED");
    root.grant_mirror("west-mirror", &["orders".to_string()]).await.expect("root grants it");

    west.register_mirror("orders", "west").await.expect("registers as the stream's mirror");
    let read = west.mirror_read("orders", "west", vec![0], 10, 0).await.expect("reads the stream for its mirror");
    assert_eq!(read.messages.len(), 2);
    assert_eq!(west.stream_info("orders").await.expect("sees the stream it mirrors").messages, 2);
    west.mirror_progress("orders", "west", vec![2], 0).await.expect("reports its progress");

    let audit_before = root.stream_info("audit").await.expect("info");
    assert_eq!(reason(west.mirror_read("audit", "west", vec![0], 10, 0).await), "PERMISSION_DENIED");
    assert_eq!(reason(west.register_mirror("audit", "west").await), "PERMISSION_DENIED");
    assert_eq!(reason(west.stream_info("audit").await), "PERMISSION_DENIED");
    assert_eq!(reason(west.publish(publish("orders.3")).await), "PERMISSION_DENIED");
    assert_eq!(reason(west.delete_stream("orders").await), "PERMISSION_DENIED");
    assert_eq!(reason(west.list_principals().await), "PERMISSION_DENIED");
    assert_eq!(root.stream_info("audit").await.expect("info"), audit_before, "the refused calls wrote nothing");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 2);

    let listed = root.list_principals().await.expect("listed");
    let mirror = listed.iter().find(|p| p.name == "west-mirror").map(|p| p.mirror.clone());
    assert_eq!(mirror, Some(vec!["orders".to_string()]));
    root.grant_mirror("west-mirror", &[]).await.expect("taken away");
    assert_eq!(reason(west.mirror_read("orders", "west", vec![0], 10, 0).await), "PERMISSION_DENIED");
    node.stop().await.expect("stops");
}

/// A client that sheds load itself, as `token`'s bearer: a refusal comes back at once.
fn shedding(node: &RunningNode<SimDisk>, token: &str) -> Client {
    let options =
        ClientOptions { token: Some(token.to_string()), retry_backpressure: false, ..ClientOptions::default() };
    Client::new([node.client_addr.to_string()], options).expect("a client")
}

/// Beside each principal's own rate, a tenant's principals share the tenant's, and every caller but root shares the
/// cell's: a refusal names the bucket that ran out and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_and_the_whole_cell_are_held_to_their_rates() {
    let limits = cellog_net::Limits {
        tenant_rate: Some(PrincipalRate { per_second: 1, burst: 3 }),
        cell_rate: Some(PrincipalRate { per_second: 1, burst: 6 }),
        ..cellog_net::Limits::DEFAULT
    };
    let node = secure_node_limited(None, limits).await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let writer = v1::Grants { admin: true, ..grants(&[">"], &[">"], &[]) };
    let ops = shedding(&node, &principal(&root, "acme/ops", writer.clone()).await);
    let dev = shedding(&node, &principal(&root, "acme/dev", writer.clone()).await);
    let carol = shedding(&node, &principal(&root, "carol", grants(&["orders.>"], &["orders.>"], &[])).await);
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    // The tenant's stream costs acme one command of its three.
    ops.create_stream("orders", config).await.expect("the tenant's stream");
    ops.publish(publish("orders.1")).await.expect("within the tenant's burst");
    dev.publish(publish("orders.2")).await.expect("within the tenant's burst");
    let refused = dev.publish(publish("orders.3")).await.expect_err("over the tenant's rate");
    assert_eq!(refused.reason(), Some("RATE_LIMITED"), "{refused}");
    assert!(refused.to_string().contains("tenant \"acme\""), "{refused}");
    // A principal of the cell is not acme's, but every caller shares the cell's six: acme took three.
    for n in 0..3 {
        carol.publish(publish(&format!("orders.{n}"))).await.expect("within the cell's burst");
    }
    let refused = carol.publish(publish("orders.9")).await.expect_err("over the cell's rate");
    assert!(refused.to_string().contains("the cell is over its rate"), "{refused}");
    assert_eq!(root.stream_info("orders").await.expect("info").messages, 3, "the refused publishes wrote nothing");
    assert_eq!(root.stream_info("acme/orders").await.expect("info").messages, 2);
    root.publish(publish("orders.root")).await.expect("root is held to no rate");
    node.stop().await.expect("stops");
}

/// One subject's publishes are held to the subject rate, all of a tenant's principals together, while the tenant's
/// other subjects go on; a refused publish (in a batch too) writes nothing; another tenant's subject of the same name
/// has a bucket of its own, and root is not limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_subject_is_held_to_the_subject_rate() {
    let limits = cellog_net::Limits {
        subject_rate: Some(PrincipalRate { per_second: 1, burst: 2 }),
        ..cellog_net::Limits::DEFAULT
    };
    let node = secure_node_limited(None, limits).await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    let writer = v1::Grants { admin: true, ..grants(&[">"], &[">"], &[]) };
    let ops = shedding(&node, &principal(&root, "acme/ops", writer.clone()).await);
    let dev = shedding(&node, &principal(&root, "acme/dev", writer.clone()).await);
    let beta = shedding(&node, &principal(&root, "beta/ops", writer).await);
    for tenant in [&ops, &beta, &root] {
        let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
        tenant.create_stream("orders", config).await.expect("the tenant's stream");
    }
    ops.publish(publish("orders.hot")).await.expect("within the subject's burst");
    dev.publish(publish("orders.hot")).await.expect("within the subject's burst");
    let refused = dev.publish(publish("orders.hot")).await.expect_err("over the subject's rate");
    assert_eq!(refused.reason(), Some("RATE_LIMITED"), "{refused}");
    assert!(refused.to_string().contains("subject \"orders.hot\""), "{refused}");
    let batch = ops.publish_batch(vec![publish("orders.hot"), publish("orders.cold")], 16).await;
    let refused_items: Vec<bool> = batch.iter().map(|item| item.result.is_err()).collect();
    assert_eq!(refused_items, [true, false], "the hot subject's item is refused, the cold one's goes on");
    dev.publish(publish("orders.cold")).await.expect("another subject has its own bucket");
    beta.publish(publish("orders.hot")).await.expect("another tenant's subject has its own bucket");
    assert_eq!(root.stream_info("acme/orders").await.expect("info").messages, 4, "the refused publishes wrote nothing");
    for _ in 0..5 {
        root.publish(publish("orders.hot")).await.expect("root is held to no rate");
    }
    node.stop().await.expect("stops");
}

/// One principal holds at most `max_subscriptions_per_principal` subscriptions on a node: its next is refused (and
/// proposes nothing), another principal's are its own, root is not capped, and a closed one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_but_root_holds_at_most_its_subscriptions() {
    let limits = cellog_net::Limits { max_subscriptions_per_principal: 2, ..cellog_net::Limits::DEFAULT };
    let node = secure_node_limited(None, limits).await;
    let root = client(&node, Some(ROOT_TOKEN));
    root_token_works(&root).await;
    let config = v1::StreamConfig { subjects: vec!["orders.>".into()], ..Default::default() };
    root.create_stream("orders", config).await.expect("a stream");
    let config = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..Default::default() };
    root.create_consumer("orders", "billing", config).await.expect("a consumer");
    let consumer = grants(&[], &["orders.>"], &["orders/billing"]);
    let (alice, bob) = (principal(&root, "alice", consumer.clone()).await, principal(&root, "bob", consumer).await);
    let (alice, bob) = (client(&node, Some(&alice)), client(&node, Some(&bob)));

    let first = alice.subscribe("orders", "billing", "a1", 8).await.expect("alice's first");
    let _second = alice.subscribe("orders", "billing", "a2", 8).await.expect("alice's second");
    let applied = root.cluster_status().await.expect("status").applied_index;
    let refused = alice.subscribe("orders", "billing", "a3", 8).await.map(|_| ()).expect_err("alice's third");
    assert_eq!(refused.reason(), Some("TOO_MANY_SUBSCRIPTIONS"), "{refused}");
    assert!(refused.to_string().contains("principal \"alice\""), "{refused}");
    assert_eq!(root.cluster_status().await.expect("status").applied_index, applied, "the refusal proposed nothing");
    let _bobs = bob.subscribe("orders", "billing", "b1", 8).await.expect("bob's are his own");
    let mut roots = Vec::new();
    for n in 0..3 {
        roots.push(root.subscribe("orders", "billing", &format!("r{n}"), 8).await.expect("root is not capped"));
    }
    drop(first);
    let mut again = None;
    for _ in 0..100 {
        match alice.subscribe("orders", "billing", "a4", 8).await {
            Ok(subscription) => {
                again = Some(subscription);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(again.is_some(), "a closed subscription makes room for another");
    node.stop().await.expect("stops");
}

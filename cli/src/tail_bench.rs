//! `cellog bench tail`: a node's live tails over HTTP (server-sent events). First TAILS tails are held open and the
//! node's resident memory is read before and after (its `/metrics`), giving the memory a tail costs; then messages
//! are published one at a time over gRPC and each is timed from the publish call to its event on one more tail.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, AUTHORIZATION, HOST};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::bench_kit::{Report, Workload, progress, recreate, report_error, request};
use crate::commands::{client, tls, token};

#[derive(clap::Args, Clone, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    workload: Workload,
    /// The HTTP address (HOST:PORT) of the node whose tails are measured (`cellog dev`'s first node by default).
    #[arg(long, default_value = "127.0.0.1:7601")]
    http: String,
    /// Tails held open meanwhile, each on a connection of its own.
    #[arg(long, default_value_t = 1000)]
    tails: usize,
    /// The held tails follow the measured subject too, so every message goes to each of them (checked at the end);
    /// without it their filter matches nothing published.
    #[arg(long)]
    fanout: bool,
}

/// The node's HTTP port: over TLS, verified with the cell's CA, when the connection options name one (`--ca`, or the
/// dev cell's), in plaintext otherwise.
struct HttpPort {
    addr: String,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl HttpPort {
    fn new(addr: String, tls: Option<&cellog_client::ClientTls>) -> anyhow::Result<Self> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::CertificateDer;
        use tokio_rustls::rustls::pki_types::pem::PemObject;

        let Some(tls) = tls else { return Ok(HttpPort { addr, tls: None }) };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
            roots.add(cert.context("the CA certificate")?).context("the CA certificate")?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(HttpPort { addr, tls: Some(tokio_rustls::TlsConnector::from(Arc::new(config))) })
    }

    /// Sends `request` on a connection of its own and returns the answer, its body still to read.
    async fn send(&self, request: hyper::Request<Empty<Bytes>>) -> anyhow::Result<hyper::Response<Incoming>> {
        let addr = &self.addr;
        let socket = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr} (past ~1000 tails, raise `ulimit -n`)"))?;
        socket.set_nodelay(true)?;
        match &self.tls {
            None => exchange(socket, request).await,
            Some(connector) => {
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
                    .with_context(|| format!("{host:?} is not a host name or address"))?;
                let stream = connector.connect(name, socket).await.with_context(|| format!("TLS to {addr}"))?;
                exchange(stream, request).await
            }
        }
    }
}

/// One request over `io`, HTTP/1.1.
async fn exchange<I>(io: I, request: hyper::Request<Empty<Bytes>>) -> anyhow::Result<hyper::Response<Incoming>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(connection);
    Ok(sender.send_request(request).await?)
}

/// `request` with the caller's token, if any.
fn with_token(request: hyper::http::request::Builder, token: Option<&str>) -> hyper::http::request::Builder {
    match token {
        Some(token) => request.header(AUTHORIZATION, format!("{}{token}", cellog_client::token::BEARER)),
        None => request,
    }
}

/// An open server-sent event stream.
struct Events {
    body: Incoming,
    buffer: Vec<u8>,
}

impl Events {
    /// Opens the tail at `path` of the node at `port`.
    async fn open(port: &HttpPort, path: &str, token: Option<&str>) -> anyhow::Result<Events> {
        let request = hyper::Request::get(path).header(HOST, &port.addr).header(ACCEPT, "text/event-stream");
        let answer = port.send(with_token(request, token).body(Empty::<Bytes>::new())?).await?;
        let status = answer.status();
        if !status.is_success() {
            let body = answer.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(Events { body: answer.into_body(), buffer: Vec::new() })
    }

    /// The name and data of the next event (comments skipped), or `None` when the stream ended.
    async fn next(&mut self) -> anyhow::Result<Option<(String, String)>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let (mut name, mut data) = ("message".to_string(), String::new());
                for line in String::from_utf8_lossy(&block).lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        name = value.trim().to_string();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a heartbeat
                }
                return Ok(Some((name, data)));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next message event; a `lagged` or `error` event fails.
    async fn message(&mut self) -> anyhow::Result<String> {
        match self.next().await? {
            Some((name, data)) if name == "message" => Ok(data),
            Some((name, data)) => bail!("the tail sent {name}: {data}"),
            None => bail!("the tail ended"),
        }
    }
}

/// The value of the unlabelled metric `name` on the node's `/metrics` (read with the caller's token: a cluster
/// admin's, as the dev cell's root token is).
async fn metric(port: &HttpPort, name: &str, token: Option<&str>) -> anyhow::Result<f64> {
    let request = with_token(hyper::Request::get("/metrics").header(HOST, &port.addr), token);
    let answer = port.send(request.body(Empty::<Bytes>::new())?).await?;
    let status = answer.status();
    let body = answer.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        bail!("GET {}/metrics: {status}: {text}", port.addr);
    }
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .with_context(|| format!("{}/metrics has no {name}", port.addr))?;
    Ok(value.trim().parse()?)
}

pub async fn run(args: TailArgs) -> anyhow::Result<Report> {
    let TailArgs { workload, http, tails, fanout } = args;
    let count = workload.count.unwrap_or(2_000);
    let client = client(&workload.connect)?;
    let token = token(&workload.connect)?;
    let http = HttpPort::new(http, tls(&workload.connect)?.as_ref())?;
    recreate(&client, &workload).await?;
    let head = workload.subject.split_once('.').map_or(workload.subject.as_str(), |(head, _)| head).to_string();
    let filter = if fanout { workload.subject.clone() } else { format!("{head}.idle") };
    let path = |subject: &str| format!("/v1/streams/{}/tail?subject={subject}", workload.stream);

    // The held tails, each drained by a task of its own that counts the messages it gets.
    const RESIDENT: &str = "cellog_resident_memory_bytes";
    let before = metric(&http, RESIDENT, token.as_deref()).await?;
    let bar = progress(tails as u64, "tails");
    let received: Vec<Arc<AtomicU64>> = (0..tails).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut drains = Vec::with_capacity(tails);
    for counter in &received {
        let mut events = Events::open(&http, &path(&filter), token.as_deref()).await.context("a held tail")?;
        let counter = counter.clone();
        drains.push(tokio::spawn(async move {
            while events.message().await.is_ok() {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Scraped once the node has settled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = metric(&http, RESIDENT, token.as_deref()).await?;
    let open = metric(&http, "cellog_http_tails", token.as_deref()).await?;
    let per_tail = if tails == 0 { 0.0 } else { (after - before) / tails as f64 / 1024.0 };
    println!(
        "tails: {tails} held open (the node counts {open}); node resident {:.1} MiB before, {:.1} MiB after: \
         {per_tail:.1} KiB per tail (tails={tails} kib_per_tail={per_tail:.1})",
        before / 1048576.0,
        after / 1048576.0
    );

    // One message at a time, timed from the publish call until its event arrives on the measured tail.
    let mut measured = Events::open(&http, &path(&workload.subject), token.as_deref()).await?;
    let payload = Bytes::from(vec![b'x'; workload.size]);
    let bar = progress(count, "tail");
    let (mut latencies, mut errors, mut first_error) = (Vec::with_capacity(count as usize), 0, None);
    let started = Instant::now();
    for index in 0..count {
        let sent = Instant::now();
        let event = async {
            let event = tokio::time::timeout(Duration::from_secs(10), measured.message()).await;
            (event, sent.elapsed())
        };
        let (published, (event, latency)) = tokio::join!(client.publish(request(&workload, &payload, index)), event);
        if let Err(error) = published {
            errors += 1;
            first_error.get_or_insert(error);
            break;
        }
        event.context("no event within 10 s")??;
        latencies.push(latency);
        bar.inc(1);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    report_error(first_error);

    if fanout {
        // Every held tail gets every message.
        let deadline = Instant::now() + Duration::from_secs(60);
        let short = || received.iter().filter(|counter| counter.load(Ordering::Relaxed) < count).count();
        while short() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let short = short();
        println!("fanout: {} of {tails} held tails got all {count} messages", tails - short);
        if short > 0 {
            bail!("{short} held tails missed messages");
        }
    }
    for drain in drains {
        drain.abort();
    }
    let bytes = latencies.len() as u64 * workload.size as u64;
    Ok(Report { what: "tail", messages: latencies.len() as u64, bytes, elapsed, latencies, errors })
}

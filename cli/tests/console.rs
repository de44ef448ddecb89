//! The web console in a real browser: headless Chromium, driven over WebDriver by chromedriver (Debian's `chromium`
//! and `chromium-driver`, which `ci/install-deps` installs), opens the console of a running `cellog dev`, tails a
//! stream, publishes from the page, and sees the message in the tail, the stream's count change, and the consumers
//! and consumer groups listed. It keeps a screenshot (`cellog-console.png` in the temp directory;
//! `CELLOG_UPDATE_SCREENSHOT=1` writes `docs/console.png`). `CELLOG_SKIP_BROWSER=1` skips it on a machine without
//! Chromium; anywhere else a missing browser fails it.

// The node binary runs on RocksDB.
#![cfg(feature = "node")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// One HTTPS request with a JSON body to the dev cell's HTTP port on `port`, verified with the dev CA `ca` (by curl,
/// which `ci/install-deps` installs), its answer's status and JSON.
fn node_request(ca: &std::path::Path, port: u16, method: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let output = std::process::Command::new("curl")
        .args(["-s", "--cacert"])
        .arg(ca)
        .args(["-X", method, "-H", &format!("Authorization: Bearer {token}"), "-H", "Content-Type: application/json"])
        .args(["-d", &body.to_string(), "-w", "\n%{http_code}", &format!("https://127.0.0.1:{port}{path}")])
        .output()
        .expect("curl runs (ci/install-deps installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), serde_json::from_str(body).unwrap_or(Value::Null))
}

/// One HTTP/1.1 request with a JSON body, its answer's status and JSON (connection closed after it).
fn request(port: u16, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connected");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("a timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).expect("sent");
    // Read by the answer's length: a WebDriver server may keep the connection open whatever the request asked.
    let mut answer = Vec::new();
    let mut buffer = [0u8; 8192];
    let (head, body) = loop {
        let read = stream.read(&mut buffer).expect("an answer");
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let lower = head.to_ascii_lowercase();
            let length = lower
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|length| length.trim().parse::<usize>().ok());
            let whole = match length {
                Some(length) => body.len() >= length,
                None if lower.contains("transfer-encoding: chunked") => body.ends_with("0\r\n\r\n"),
                None => read == 0,
            };
            if whole || read == 0 {
                break (head.to_string(), body.to_string());
            }
        } else if read == 0 {
            break (text, String::new());
        }
    };
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(&body) } else { body };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn unchunk(mut body: &str) -> String {
    let mut text = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        text.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    text
}

/// A WebDriver session.
struct Browser {
    port: u16,
    session: String,
}

impl Browser {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, answer) = request(self.port, method, &path, None, body.as_ref());
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer["value"].clone()
    }

    fn element(&self, css: &str) -> String {
        let found = self.call("POST", "/element", Some(json!({ "using": "css selector", "value": css })));
        found
            .as_object()
            .and_then(|found| found.values().next())
            .and_then(Value::as_str)
            .expect("an element")
            .to_string()
    }

    fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css);
        self.call("POST", &format!("/element/{element}/clear"), Some(json!({})));
        self.call("POST", &format!("/element/{element}/value"), Some(json!({ "text": text })));
    }

    fn click(&self, css: &str) {
        let element = self.element(css);
        self.call("POST", &format!("/element/{element}/click"), Some(json!({})));
    }

    fn text(&self, css: &str) -> String {
        let element = self.element(css);
        self.call("GET", &format!("/element/{element}/text"), None).as_str().unwrap_or("").to_string()
    }

    /// Waits up to 20 s for the text of `css` to satisfy `done`.
    #[allow(clippy::disallowed_methods, reason = "a test's deadline on the wall clock")]
    fn wait_for(&self, css: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text(css);
            if done(&text) {
                return text;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{what}: {css} reads {text:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn the_console_shows_a_published_message_in_its_tail_and_counts() {
    if common::switch("CELLOG_SKIP_BROWSER") {
        eprintln!("CELLOG_SKIP_BROWSER=1: the browser test is skipped");
        return;
    }
    let driver_port = common::free_port();
    let mut driver = std::process::Command::new("chromedriver")
        .arg(format!("--port={driver_port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromedriver runs (ci/install-deps installs chromium and chromium-driver)");
    let dir = tempfile::tempdir().expect("a temp dir");
    let base_port = common::free_base_port();
    let (mut dev, lines) = common::dev(dir.path(), base_port);
    let console = lines
        .iter()
        .find_map(|line| line.strip_prefix("console: "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("cellog dev prints the console's address")
        .to_string();
    let http_port = base_port + 201;
    let ca = dir.path().join("certs/ca.pem");
    let token = std::fs::read_to_string(dir.path().join("root.token")).expect("the root token");
    let token = token.trim();

    // A stream to watch, made over the JSON API.
    let stream = json!({ "name": "demo", "config": { "subjects": ["demo.>"], "partitions": 2 } });
    let mut created = (0, Value::Null);
    for _ in 0..50 {
        created = node_request(&ca, http_port, "POST", "/v1/streams", token, &stream);
        if created.0 == 200 {
            break;
        }
        // Node 1 may not lead: the answer names the leader, whose HTTP port is 200 past its client port.
        std::thread::sleep(Duration::from_millis(200));
    }
    let http_port = match created.1["error"]["leader_addr"].as_str() {
        Some(leader) => {
            let client_port: u16 = leader.rsplit(':').next().and_then(|port| port.parse().ok()).expect("a port");
            let answer = node_request(&ca, client_port + 200, "POST", "/v1/streams", token, &stream);
            assert_eq!(answer.0, 200, "{}", answer.1);
            client_port + 200
        }
        None => {
            assert_eq!(created.0, 200, "{}", created.1);
            http_port
        }
    };
    let console = console.replace(&format!(":{}/", base_port + 201), &format!(":{http_port}/"));
    // A durable consumer and a consumer group with a member, for the console's tables.
    let made = [
        ("/v1/streams/demo/consumers", json!({ "name": "audit", "config": {} })),
        ("/v1/streams/demo/groups/billing/join", json!({ "member": "worker-1", "session_timeout_ms": "600000" })),
    ];
    for (path, body) in made {
        let answer = node_request(&ca, http_port, "POST", path, token, &body);
        assert_eq!(answer.0, 200, "{path}: {}", answer.1);
    }

    let mut session = (0, Value::Null);
    for _ in 0..50 {
        let capabilities = json!({ "capabilities": { "alwaysMatch": { "browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            // The dev cell serves HTTPS with certificates of its own CA, which this browser profile does not hold.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1200",
                     "--ignore-certificate-errors"]
        } } } });
        session = std::panic::catch_unwind(|| request(driver_port, "POST", "/session", None, Some(&capabilities)))
            .unwrap_or((0, Value::Null));
        if session.0 == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(session.0, 200, "a browser session: {}", session.1);
    let browser = Browser {
        port: driver_port,
        session: session.1["value"]["sessionId"].as_str().expect("a session id").to_string(),
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        browser.call("POST", "/url", Some(json!({ "url": console })));
        browser.wait_for("#streams tbody", "the stream is listed", |text| text.contains("demo"));
        let before = browser.text("td[data-messages=\"demo\"]");
        assert_eq!(before, "0");
        browser.type_into("#tail-stream", "demo");
        browser.click("#tail-start");
        browser.wait_for("#tail-state", "the tail is open", |text| text.starts_with("tailing demo"));
        browser.type_into("#publish-subject", "demo.browser");
        browser.type_into("#publish-payload", "hello from the browser");
        browser.click("#publish");
        browser.wait_for("#publish-result", "the publish is acknowledged", |text| text.starts_with("published: demo"));
        browser.wait_for("#tail", "the message is in the tail", |text| text.contains("hello from the browser"));
        browser.wait_for("td[data-messages=\"demo\"]", "the count changes", |text| text == "1");
        browser.wait_for("#consumers tbody", "the consumers are listed", |text| text.contains("audit"));
        browser.wait_for("#groups tbody", "the group is listed with its member", |text| {
            text.contains("billing") && text.contains("worker-1") && text.contains("settled")
        });
        browser.call("POST", "/execute/sync", Some(json!({ "script": "window.scrollTo(0, 0)", "args": [] })));
        let png = browser.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD.decode(png.as_str().expect("base64")).expect("a PNG");
        let kept = std::env::temp_dir().join("cellog-console.png");
        std::fs::write(&kept, &png).expect("the screenshot is written");
        eprintln!("the console's screenshot: {}", kept.display());
        if std::env::var_os("CELLOG_UPDATE_SCREENSHOT").is_some() {
            let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console.png");
            std::fs::write(docs, &png).expect("docs/console.png is written");
        }
    }));
    let _ = request(driver_port, "DELETE", &format!("/session/{}", browser.session), None, None);
    let _ = driver.kill();
    let _ = driver.wait();
    assert!(common::terminate(&mut dev).success());
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

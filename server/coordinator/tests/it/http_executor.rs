//! The HTTP node executor against a real HTTP server on 127.0.0.1.
//!
//! The only traffic these tests make goes to loopback. Every other address in
//! here is a target the executor must refuse before connecting.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use composer_coordinator::http::{
    AddressClass, HttpExecutor, HttpExecutorConfig, HttpOutcome, classify,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "0190f4a2-7c3e-7d1a-9b2e-4f5a6b7c8d9e";
const MAX_RESPONSE: usize = 16 * 1024;

fn executor(allow_private_networks: bool, allow_loopback: bool) -> HttpExecutor {
    HttpExecutor::new(HttpExecutorConfig {
        allow_private_networks,
        allow_loopback,
        default_timeout: Duration::from_secs(5),
        max_response_bytes: MAX_RESPONSE,
        max_request_bytes: 1024,
    })
    .expect("client builds")
}

/// `(code, message, retryable)` of a failure; panics on a completion.
fn failure(outcome: HttpOutcome) -> (String, String, bool) {
    match outcome {
        HttpOutcome::Failed {
            code,
            message,
            retryable,
        } => (code, message, retryable),
        HttpOutcome::Completed(output) => panic!("expected a failure, got {output}"),
    }
}

fn completed(outcome: HttpOutcome) -> Value {
    match outcome {
        HttpOutcome::Completed(output) => output,
        HttpOutcome::Failed { code, message, .. } => {
            panic!("expected completion, got {code}: {message}")
        }
    }
}

/// One request as the server saw it; header names lowercased.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A tiny HTTP/1.1 server, written by hand so each route can misbehave
/// exactly as the test needs: one request per connection.
struct TestServer {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&log)));
            }
        });
        Self { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn serve(mut stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let path = request.path.clone();
    seen.lock().expect("lock").push(request);
    // A client that hangs up early (size limit, timeout) is expected.
    let _ = respond(&mut stream, &path).await;
}

async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

fn reply(status: &str, extra_headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{extra_headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn respond(stream: &mut TcpStream, path: &str) -> std::io::Result<()> {
    let json = "content-type: application/json\r\n";
    let text = "content-type: text/plain; charset=utf-8\r\n";
    let response = match path {
        "/json" => reply("200 OK", json, r#"{"ok":true,"items":[1,2]}"#),
        "/json-as-text" => reply("200 OK", text, r#"{"n":5}"#),
        "/text" => reply("200 OK", &format!("{text}x-trace: abc\r\n"), "hello world"),
        "/created" => reply("201 Created", "", ""),
        "/status/503" => reply("503 Service Unavailable", text, "database is down"),
        "/status/429" => reply("429 Too Many Requests", text, "slow down"),
        "/status/404" => reply("404 Not Found", json, r#"{"error":"no such order"}"#),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            reply("200 OK", text, "too late")
        }
        "/big-declared" => {
            let body = "x".repeat(1024 * 1024);
            reply("200 OK", text, &body)
        }
        "/big-chunked" => {
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await?;
            let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
            for _ in 0..1024 {
                stream.write_all(chunk.as_bytes()).await?;
            }
            return stream.write_all(b"0\r\n\r\n").await;
        }
        "/redirect/json" => reply("302 Found", "location: /json\r\n", ""),
        "/redirect/metadata" => reply(
            "302 Found",
            "location: http://169.254.169.254/latest/meta-data/\r\n",
            "",
        ),
        "/redirect/mapped-metadata" => reply(
            "307 Temporary Redirect",
            "location: http://[::ffff:a9fe:a9fe]/latest/meta-data/\r\n",
            "",
        ),
        _ => reply("404 Not Found", "", ""),
    };
    stream.write_all(response.as_bytes()).await
}

#[tokio::test]
async fn completes_with_status_headers_and_body_and_sends_the_key_and_node_headers() {
    let server = TestServer::start().await;
    let http = executor(false, true);

    let output = completed(
        http.execute(
            &json!({
                "method": "POST",
                "url": server.url("/json"),
                "headers": { "X-Api-Key": "secret", "X-Attempt-Note": 7 },
                "body": { "order": "o-1", "amount": 12.5 },
            }),
            KEY,
        )
        .await,
    );
    assert_eq!(output["status"], 200);
    assert_eq!(output["body"], json!({"ok": true, "items": [1, 2]}));
    assert_eq!(output["headers"]["content-type"], "application/json");

    let text = completed(
        http.execute(&json!({"url": server.url("/text")}), KEY)
            .await,
    );
    assert_eq!(text["body"], "hello world", "a text body stays text");
    assert_eq!(
        text["headers"]["x-trace"], "abc",
        "header names are lowercased"
    );

    let untyped = completed(
        http.execute(&json!({"url": server.url("/json-as-text")}), KEY)
            .await,
    );
    assert_eq!(
        untyped["body"],
        json!({"n": 5}),
        "a body that parses as JSON is JSON"
    );

    let empty = completed(
        http.execute(
            &json!({"method": "put", "url": server.url("/created")}),
            KEY,
        )
        .await,
    );
    assert_eq!(empty["status"], 201);
    assert_eq!(empty["body"], Value::Null, "an empty body is null");

    // A string body under a non-JSON content type is sent as it is.
    completed(
        http.execute(
            &json!({
                "method": "POST",
                "url": server.url("/json"),
                "headers": { "Content-Type": "text/plain" },
                "body": "raw text",
            }),
            KEY,
        )
        .await,
    );

    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    let post = &seen[0];
    assert_eq!(
        (post.method.as_str(), post.path.as_str()),
        ("POST", "/json")
    );
    assert_eq!(post.header("x-api-key"), Some("secret"));
    assert_eq!(post.header("x-attempt-note"), Some("7"));
    assert_eq!(post.header("content-type"), Some("application/json"));
    let sent: Value = serde_json::from_slice(&post.body).expect("JSON body");
    assert_eq!(sent, json!({"order": "o-1", "amount": 12.5}));
    assert!(
        seen.iter()
            .all(|s| s.header("idempotency-key") == Some(KEY)),
        "every request, every attempt, carries the task id: {seen:?}"
    );
    assert_eq!(seen[3].method, "PUT", "methods are case-insensitive");
    assert_eq!(seen[4].header("content-type"), Some("text/plain"));
    assert_eq!(seen[4].body, b"raw text");
}

#[tokio::test]
async fn statuses_map_to_retryable_and_final_failures() {
    let server = TestServer::start().await;
    let http = executor(false, true);

    let (code, message, retryable) = failure(
        http.execute(&json!({"url": server.url("/status/503")}), KEY)
            .await,
    );
    assert_eq!((code.as_str(), retryable), ("HTTP_5XX", true));
    assert!(
        message.contains("503") && message.contains("database is down"),
        "{message}"
    );

    let (code, message, retryable) = failure(
        http.execute(&json!({"url": server.url("/status/429")}), KEY)
            .await,
    );
    assert_eq!((code.as_str(), retryable), ("HTTP_429", true));
    assert!(
        message.contains("429") && message.contains("slow down"),
        "{message}"
    );

    let (code, message, retryable) = failure(
        http.execute(&json!({"url": server.url("/status/404")}), KEY)
            .await,
    );
    assert_eq!((code.as_str(), retryable), ("HTTP_4XX", false));
    assert!(
        message.contains("404") && message.contains("no such order"),
        "{message}"
    );
}

#[tokio::test]
async fn network_errors_and_timeouts_are_retryable() {
    let server = TestServer::start().await;
    let http = executor(false, true);

    // A port nobody listens on: bind one, then let it go.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let (code, message, retryable) = failure(
        http.execute(&json!({"url": format!("http://127.0.0.1:{port}/")}), KEY)
            .await,
    );
    assert_eq!(
        (code.as_str(), retryable),
        ("HTTP_NETWORK", true),
        "{message}"
    );
    assert!(
        !message.contains(&port.to_string()),
        "no URL in messages: {message}"
    );
    let (code, _, retryable) = failure(
        http.execute(
            &json!({"url": server.url("/slow"), "timeout": "300ms"}),
            KEY,
        )
        .await,
    );
    assert_eq!((code.as_str(), retryable), ("TIMEOUT", true));

    let impatient = HttpExecutor::new(HttpExecutorConfig {
        allow_loopback: true,
        default_timeout: Duration::from_millis(300),
        ..HttpExecutorConfig::default()
    })
    .expect("client builds");
    let (code, _, retryable) = failure(
        impatient
            .execute(&json!({"url": server.url("/slow")}), KEY)
            .await,
    );
    assert_eq!((code.as_str(), retryable), ("TIMEOUT", true));
    let (code, _, _) = failure(
        impatient
            .execute(&json!({"url": server.url("/slow"), "timeout": 200}), KEY)
            .await,
    );
    assert_eq!(code, "TIMEOUT", "a number is milliseconds");
}

#[tokio::test]
async fn oversized_responses_are_refused() {
    let server = TestServer::start().await;
    let http = executor(false, true);

    for path in ["/big-declared", "/big-chunked"] {
        let (code, message, retryable) =
            failure(http.execute(&json!({"url": server.url(path)}), KEY).await);
        assert_eq!(
            (code.as_str(), retryable),
            ("HTTP_RESPONSE_TOO_LARGE", false),
            "{path}: {message}"
        );
        assert!(message.contains(&MAX_RESPONSE.to_string()), "{message}");
    }

    // HEAD declares the length of a body it does not send.
    let head = completed(
        http.execute(
            &json!({"method": "HEAD", "url": server.url("/big-declared")}),
            KEY,
        )
        .await,
    );
    assert_eq!(head["status"], 200);
    assert_eq!(head["headers"]["content-length"], "1048576");
    assert_eq!(head["body"], Value::Null);
}

#[tokio::test]
async fn metadata_and_other_forbidden_addresses_are_refused_before_connecting() {
    // Everything allowed that can be: these stay refused anyway.
    let http = executor(true, true);
    let targets = [
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/latest/meta-data/", // 169.254.169.254 as one number
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",
        "http://100.100.100.200/",
        "http://[fe80::1]/",
        "http://0.0.0.0:80/",
        "http://[::]/",
        "https://224.0.0.1/",
        "http://255.255.255.255/",
    ];
    for url in targets {
        let (code, message, retryable) = failure(
            http.execute(&json!({"url": url, "timeout": "10s"}), KEY)
                .await,
        );
        assert_eq!(
            (code.as_str(), retryable),
            ("SSRF_BLOCKED", false),
            "{url}: {message}"
        );
        assert!(message.contains("always refused"), "{url}: {message}");
    }
    let (_, message, _) = failure(
        http.execute(
            &json!({"url": "http://169.254.169.254/latest/meta-data/"}),
            KEY,
        )
        .await,
    );
    assert!(
        message.contains("169.254.169.254") && message.contains("link-local"),
        "{message}"
    );
}

#[tokio::test]
async fn loopback_is_reached_only_when_allowed() {
    let server = TestServer::start().await;
    let closed = executor(true, false);

    let (code, message, retryable) = failure(
        closed
            .execute(&json!({"url": server.url("/json")}), KEY)
            .await,
    );
    assert_eq!((code.as_str(), retryable), ("SSRF_BLOCKED", false));
    assert!(
        message.contains("127.0.0.1") && message.contains("--http-allow-loopback"),
        "{message}"
    );

    // A name is checked on the addresses it resolves to.
    let by_name = format!("http://localhost:{}/json", server.port);
    let (code, message, _) = failure(closed.execute(&json!({"url": &by_name}), KEY).await);
    assert_eq!(code, "SSRF_BLOCKED", "{message}");
    assert!(message.contains("host localhost resolves to"), "{message}");
    assert!(server.seen().is_empty(), "nothing reached the server");

    let open = executor(false, true);
    let output = completed(
        open.execute(&json!({"url": server.url("/json")}), KEY)
            .await,
    );
    assert_eq!(output["status"], 200);
    let output = completed(open.execute(&json!({"url": &by_name}), KEY).await);
    assert_eq!(output["status"], 200);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn redirects_go_through_the_guard() {
    let server = TestServer::start().await;
    let http = executor(true, true);

    let output = completed(
        http.execute(&json!({"url": server.url("/redirect/json")}), KEY)
            .await,
    );
    assert_eq!(output["status"], 200);
    assert_eq!(output["body"]["ok"], true);

    for path in ["/redirect/metadata", "/redirect/mapped-metadata"] {
        let (code, message, retryable) = failure(
            http.execute(
                &json!({"method": "POST", "url": server.url(path), "body": {"a": 1}}),
                KEY,
            )
            .await,
        );
        assert_eq!(
            (code.as_str(), retryable),
            ("SSRF_BLOCKED", false),
            "{path}: {message}"
        );
        assert!(message.contains("always refused"), "{message}");
    }
    let paths: Vec<String> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        [
            "/redirect/json",
            "/json",
            "/redirect/metadata",
            "/redirect/mapped-metadata"
        ]
    );
}

#[tokio::test]
async fn bad_inputs_fail_for_good_naming_the_field() {
    let server = TestServer::start().await;
    let http = executor(false, true);
    let url = server.url("/json");
    let cases = [
        (json!({"method": "GET"}), "url"),
        (json!({"url": 42}), "url"),
        (json!({"url": "not a url"}), "url"),
        (json!({"url": "ftp://127.0.0.1/file"}), "url"),
        (json!({"url": "file:///etc/passwd"}), "url"),
        (json!({"url": &url, "method": "FETCH"}), "method"),
        (json!({"url": &url, "method": ["GET"]}), "method"),
        (json!({"url": &url, "headers": ["a"]}), "headers"),
        (
            json!({"url": &url, "headers": {"X-Bad": "a\r\nInjected: 1"}}),
            "headers.X-Bad",
        ),
        (
            json!({"url": &url, "headers": {"bad name": "a"}}),
            "headers.bad name",
        ),
        (
            json!({"url": &url, "headers": {"X-Obj": {"a": 1}}}),
            "headers.X-Obj",
        ),
        (
            json!({"url": &url, "headers": {"Idempotency-Key": "mine"}}),
            "headers.Idempotency-Key",
        ),
        (
            json!({"url": &url, "headers": {"Host": "internal.example"}}),
            "headers.Host",
        ),
        (json!({"url": &url, "timeout": "soon"}), "timeout"),
        (json!({"url": &url, "timeout": -5}), "timeout"),
        (json!({"url": &url, "timeout": 1e300}), "timeout"),
        (json!({"url": &url, "body": "x".repeat(2000)}), "body"),
        (json!("http://127.0.0.1/"), "input"),
    ];
    for (input, field) in cases {
        let (code, message, retryable) = failure(http.execute(&input, KEY).await);
        assert_eq!(
            (code.as_str(), retryable),
            ("HTTP_BAD_REQUEST", false),
            "{input}: {message}"
        );
        assert!(
            message.starts_with(&format!("{field}: ")),
            "{input}: {message}"
        );
    }
    assert!(server.seen().is_empty(), "no bad request was sent");
}

#[test]
fn addresses_are_classified() {
    use AddressClass::{Loopback, Public};
    let forbidden = |ip: &str| {
        matches!(
            classify(ip.parse().expect("ip")),
            AddressClass::Forbidden(_)
        )
    };
    let private = |ip: &str| matches!(classify(ip.parse().expect("ip")), AddressClass::Private(_));
    let class = |ip: &str| classify(ip.parse::<IpAddr>().expect("ip"));

    for ip in [
        "169.254.169.254",
        "169.254.0.1",
        "100.100.100.200",
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "::",
        "fe80::1",
        "febf::1",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:169.254.169.254",
        "::ffff:0.0.0.0",
        "::ffff:100.100.100.200",
        "::169.254.169.254",
        "64:ff9b::169.254.169.254",
    ] {
        assert!(forbidden(ip), "{ip} is always refused");
    }
    for ip in [
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.255",
        "fc00::1",
        "fd12:3456::1",
        "fec0::1",
        "::ffff:10.1.2.3",
        "::ffff:192.168.0.1",
    ] {
        assert!(private(ip), "{ip} is private");
    }
    for ip in ["127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1"] {
        assert_eq!(class(ip), Loopback, "{ip}");
    }
    for ip in [
        "8.8.8.8",
        "1.1.1.1",
        "172.15.255.255",
        "172.32.0.1",
        "100.63.255.255",
        "100.128.0.1",
        "169.253.255.255",
        "192.169.0.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "fe00::1",
    ] {
        assert_eq!(class(ip), Public, "{ip}");
    }
}

//! End-to-end: the browser dashboard's files on the server's one port,
//! beside gRPC and grpc-web (decision 0013). Requests are written by hand
//! over TCP, so paths reach the server exactly as sent (an HTTP client
//! library would normalise `/../` and `%2e%2e` away).

use std::{collections::HashMap, path::PathBuf};

use composer_proto::v1::{
    GetServerInfoRequest, ListRunsRequest, run_service_client::RunServiceClient,
    server_service_client::ServerServiceClient,
};
use composer_testkit::ServerProcess;
use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; \
     base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

const INDEX: &str =
    "<!doctype html><title>Composer</title><script type=module src=/assets/index-Ab12.js></script>";
const SCRIPT: &str = "console.log('dashboard')";
const SECRET: &str = "TOP SECRET, outside the dashboard's folder";

fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

/// A built dashboard in `<tmp>/dist`, and a secret file beside `dist`
/// that no request may reach.
fn built_dashboard() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    let dist = root.path().join("dist");
    std::fs::create_dir_all(dist.join("assets")).expect("mkdir");
    std::fs::write(dist.join("index.html"), INDEX).expect("write");
    std::fs::write(dist.join("assets/index-Ab12.js"), SCRIPT).expect("write");
    std::fs::write(dist.join("assets/index-Cd34.css"), "body{}").expect("write");
    std::fs::write(dist.join("logo.svg"), "<svg/>").expect("write");
    std::fs::write(root.path().join("secret.txt"), SECRET).expect("write");
    // a link inside the folder to a file outside it is not followed out
    std::os::unix::fs::symlink(root.path().join("secret.txt"), dist.join("link.txt"))
        .expect("symlink");
    root
}

async fn serve_dashboard(dir: &std::path::Path, extra: &[&str]) -> ServerProcess {
    let dir = dir.to_str().expect("utf-8 path");
    let mut args = vec!["--dashboard-dir", dir];
    args.extend_from_slice(extra);
    ServerProcess::start(&composer_binary(), &args).await
}

/// An HTTP/1.1 answer.
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// Sends `method path` as written, over a fresh connection, and reads the
/// whole answer.
async fn request(addr: &str, method: &str, path: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let text = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(text.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn assert_security_headers(answer: &Answer, what: &str) {
    assert_eq!(answer.header("content-security-policy"), CSP, "{what}");
    assert_eq!(answer.header("x-content-type-options"), "nosniff", "{what}");
    assert_eq!(answer.header("referrer-policy"), "no-referrer", "{what}");
}

#[tokio::test]
async fn pages_fall_back_to_index_and_assets_are_served_with_their_types() {
    let dashboard = built_dashboard();
    let server = serve_dashboard(&dashboard.path().join("dist"), &[]).await;
    let addr = &server.addr;

    for page in ["/", "/runs", "/runs/0193a-b/nodes/", "/workflows?name=x"] {
        let answer = request(addr, "GET", page).await;
        assert_eq!(answer.status, 200, "{page}");
        assert_eq!(answer.body, INDEX, "{page} is the dashboard's index");
        assert_eq!(answer.header("content-type"), "text/html; charset=utf-8");
        assert_eq!(answer.header("cache-control"), "no-cache", "{page}");
        assert_security_headers(&answer, page);
    }

    let script = request(addr, "GET", "/assets/index-Ab12.js").await;
    assert_eq!(script.status, 200);
    assert_eq!(script.body, SCRIPT);
    assert_eq!(
        script.header("content-type"),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(
        script.header("cache-control"),
        "public, max-age=31536000, immutable",
        "hashed assets are cached for good"
    );
    assert_security_headers(&script, "script");
    let style = request(addr, "GET", "/assets/index-Cd34.css").await;
    assert_eq!(style.header("content-type"), "text/css; charset=utf-8");
    let logo = request(addr, "GET", "/logo.svg").await;
    assert_eq!(logo.header("content-type"), "image/svg+xml");
    assert_eq!(logo.header("cache-control"), "no-cache", "not hashed");

    let missing = request(addr, "GET", "/assets/gone-Zz99.js").await;
    assert_eq!(missing.status, 404, "a missing file is not the index");
    assert_security_headers(&missing, "404");

    let head = request(addr, "HEAD", "/").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.body, "", "HEAD has no body");
    assert_eq!(head.header("content-length"), INDEX.len().to_string());

    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let refused = request(addr, method, "/runs").await;
        assert_eq!(refused.status, 405, "{method}");
        assert_eq!(refused.header("allow"), "GET, HEAD");
        assert_security_headers(&refused, method);
    }
}

/// A path shaped like a gRPC method (`/<a.b>/<c>`) goes to the gRPC stack,
/// which refuses a plain HTTP request with a 400 of its own: that answer
/// carries the headers too.
#[tokio::test]
async fn answers_of_the_grpc_stack_to_plain_http_carry_the_security_headers() {
    let dashboard = built_dashboard();
    let server = serve_dashboard(&dashboard.path().join("dist"), &[]).await;
    for (method, path) in [
        ("GET", "/.git/config"),
        ("GET", "/composer.v1.RunService/GetRun"),
        ("HEAD", "/composer.v1.RunService/GetRun"),
        ("POST", "/composer.v1.RunService/GetRun"),
        ("GET", "/grpc.health.v1.Health/Check"),
    ] {
        let answer = request(&server.addr, method, path).await;
        assert!(
            (400..500).contains(&answer.status),
            "{method} {path}: {}",
            answer.status
        );
        assert_security_headers(&answer, &format!("{method} {path}"));
    }
}

#[tokio::test]
async fn paths_that_leave_the_dashboard_folder_are_refused() {
    let dashboard = built_dashboard();
    let server = serve_dashboard(&dashboard.path().join("dist"), &[]).await;
    for path in [
        "/../secret.txt",
        "/assets/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E%2Fsecret.txt",
        "/assets/%2e%2e/%2e%2e/secret.txt",
        "/..%5csecret.txt",
        "//etc/passwd",
        "/%2Fetc%2Fpasswd",
        "/link.txt",
    ] {
        let answer = request(&server.addr, "GET", path).await;
        assert!(
            answer.status == 400 || answer.status == 404,
            "{path}: {}",
            answer.status
        );
        assert!(!answer.body.contains("SECRET"), "{path} leaked the file");
        assert!(!answer.body.contains("root:"), "{path} leaked /etc/passwd");
        assert_security_headers(&answer, path);
    }
}

#[tokio::test]
async fn without_a_built_dashboard_a_page_says_how_to_build_it() {
    let empty = tempfile::tempdir().expect("tempdir");
    let missing = empty.path().join("not-built");
    for dir in [empty.path(), missing.as_path()] {
        let server = serve_dashboard(dir, &[]).await;
        let page = request(&server.addr, "GET", "/runs/x").await;
        assert_eq!(page.status, 200);
        assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
        assert!(page.body.contains("make build"), "{}", page.body);
        assert!(page.body.contains("npm ci &amp;&amp; npm run build"));
        assert!(
            !page.body.contains("<script"),
            "the CSP allows no inline script"
        );
        assert_security_headers(&page, "not built");
        let asset = request(&server.addr, "GET", "/assets/index-Ab12.js").await;
        assert_eq!(asset.status, 404);
    }
}

/// The dashboard sits outside authentication: its files need no token,
/// while every RPC still does; gRPC and grpc-web answer on the same port.
#[tokio::test]
async fn grpc_and_grpc_web_still_answer_beside_the_dashboard() {
    let dashboard = built_dashboard();
    let secret = "a-dashboard-test-secret-of-32-bytes-or-more";
    let server = serve_dashboard(&dashboard.path().join("dist"), &["--auth-secret", secret]).await;

    let page = request(&server.addr, "GET", "/").await;
    assert_eq!(page.status, 200, "no token needed for the files");
    assert_eq!(page.body, INDEX);

    let channel = tonic::transport::Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let info = ServerServiceClient::new(channel.clone())
        .get_server_info(GetServerInfoRequest {})
        .await;
    assert_eq!(
        info.expect_err("gRPC still needs a token").code(),
        tonic::Code::Unauthenticated
    );
    let listed = RunServiceClient::new(channel)
        .list_runs(ListRunsRequest::default())
        .await;
    assert_eq!(
        listed.expect_err("no token").code(),
        tonic::Code::Unauthenticated
    );

    let mut body = vec![0u8, 0, 0, 0, 0];
    body.extend(GetServerInfoRequest {}.encode_to_vec());
    let web = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client")
        .post(format!(
            "{}/composer.v1.ServerService/GetServerInfo",
            server.url()
        ))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await
        .expect("grpc-web request");
    assert_eq!(
        web.status(),
        200,
        "grpc-web reaches the server, not the files"
    );
    assert_eq!(
        web.headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()),
        Some("16"),
        "UNAUTHENTICATED without a token, as before"
    );
    assert!(web.headers().get("content-security-policy").is_none());
}

#[tokio::test]
async fn grpc_and_grpc_web_calls_succeed_on_the_dashboard_port() {
    let dashboard = built_dashboard();
    let server = serve_dashboard(&dashboard.path().join("dist"), &[]).await;
    let info = ServerServiceClient::connect(server.url())
        .await
        .expect("connect")
        .get_server_info(GetServerInfoRequest {})
        .await
        .expect("GetServerInfo over gRPC")
        .into_inner();
    assert_eq!(info.protocol_version, composer_proto::PROTOCOL_VERSION);

    let mut body = vec![0u8, 0, 0, 0, 0];
    body.extend(GetServerInfoRequest {}.encode_to_vec());
    let web = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("client")
        .post(format!(
            "{}/composer.v1.ServerService/GetServerInfo",
            server.url()
        ))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(body)
        .send()
        .await
        .expect("grpc-web request");
    assert_eq!(web.status(), 200);
    assert_eq!(
        web.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/grpc-web+proto")
    );
    let bytes = web.bytes().await.expect("body");
    let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    let decoded = composer_proto::v1::GetServerInfoResponse::decode(&bytes[5..5 + len])
        .expect("a GetServerInfoResponse frame");
    assert_eq!(decoded.protocol_version, composer_proto::PROTOCOL_VERSION);
}

//! The browser dashboard's files, served on the gRPC port: a tower layer
//! outside authentication (static files need no token) that answers GET
//! and HEAD requests which are not gRPC or grpc-web, and passes every other
//! request through unchanged (decision 0013).
//!
//! - `/` and any path without a file extension: `index.html` (the
//!   dashboard routes on the client);
//! - a path with an extension: that file, or 404;
//! - no dashboard built: a small page saying how to build it;
//! - another method on a non-gRPC path: 405.
//!
//! Every answer carries the Content-Security-Policy of decision 0013,
//! `nosniff` and `no-referrer`; so does every answer of the port that is
//! not a gRPC one (a plain HTTP 400 for a GET of `/a.b/c`, a path shaped
//! like a gRPC method). `index.html` is never cached; Vite's hashed files
//! under `assets/` are cached for a year.

use std::{
    borrow::Cow,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use percent_encoding::percent_decode_str;
use tonic::body::Body;
use tower::{Layer, Service};

/// The policy every dashboard answer carries: scripts, styles and
/// connections only from this origin, no inline script, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// What hashed assets (Vite's `assets/` folder) are cached for.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The page served when no dashboard was built.
const NOT_BUILT_PAGE: &str = include_str!("dashboard_not_built.html");

/// `dashboard/dist`, embedded at compile time in release builds. The folder
/// may be missing (a fresh clone without npm): the binary then embeds
/// nothing and serves [`NOT_BUILT_PAGE`].
#[derive(rust_embed::Embed)]
#[folder = "../../dashboard/dist"]
#[allow_missing = true]
struct Embedded;

/// Where the dashboard's files come from.
#[derive(Debug, Clone)]
pub enum DashboardFiles {
    /// The files embedded in the binary.
    Embedded,
    /// A folder read at each request (`--dashboard-dir`, and debug builds).
    Directory(PathBuf),
}

impl DashboardFiles {
    /// The files `composer serve` uses without `--dashboard-dir`: release
    /// builds serve what they embedded; debug builds read the repository's
    /// `dashboard/dist` from disk, so a rebuilt dashboard shows at the next
    /// reload without rebuilding the server.
    pub fn for_this_build() -> Self {
        if cfg!(debug_assertions) {
            Self::Directory(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dashboard/dist"))
        } else {
            Self::Embedded
        }
    }

    /// The bytes of `relative` (already checked by [`resolve`]), if present.
    async fn read(&self, relative: &str) -> Option<Cow<'static, [u8]>> {
        match self {
            Self::Embedded => Embedded::get(relative).map(|file| file.data),
            Self::Directory(root) => read_inside(root, relative).await.map(Cow::Owned),
        }
    }
}

/// Reads `relative` under `root`, refusing anything that resolves outside
/// it (a symbolic link included) and anything that is not a file.
async fn read_inside(root: &Path, relative: &str) -> Option<Vec<u8>> {
    let root = tokio::fs::canonicalize(root).await.ok()?;
    let path = tokio::fs::canonicalize(root.join(relative)).await.ok()?;
    if !path.starts_with(&root) || !tokio::fs::metadata(&path).await.ok()?.is_file() {
        return None;
    }
    tokio::fs::read(path).await.ok()
}

/// What a request path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A file, by its path relative to the dashboard's folder.
    File(String),
    /// A page of the dashboard: `index.html`.
    Page,
}

/// Why a path is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum PathError {
    /// Not valid UTF-8 once percent-decoded.
    #[error("the path is not UTF-8")]
    NotUtf8,
    /// An empty, `.` or `..` segment, a backslash, a NUL or a drive colon.
    #[error("the path leaves the dashboard's folder")]
    Traversal,
}

/// Maps a request path (percent-encoded) to what it names, refusing any
/// path that could name something outside the dashboard's folder.
fn resolve(raw_path: &str) -> Result<Target, PathError> {
    let decoded = percent_decode_str(raw_path)
        .decode_utf8()
        .map_err(|_| PathError::NotUtf8)?;
    let relative = decoded.strip_prefix('/').unwrap_or(&decoded);
    if relative.is_empty() {
        return Ok(Target::Page);
    }
    let segments: Vec<&str> = relative.split('/').collect();
    let unsafe_segment = |s: &&str| matches!(*s, "" | "." | "..") || s.contains(['\\', '\0', ':']);
    // a trailing slash leaves an empty last segment: a page, like `/runs/`
    let (last, parents) = segments.split_last().ok_or(PathError::Traversal)?;
    if parents.iter().any(unsafe_segment) || (!last.is_empty() && unsafe_segment(last)) {
        return Err(PathError::Traversal);
    }
    if last.contains('.') {
        Ok(Target::File(relative.to_owned()))
    } else {
        Ok(Target::Page)
    }
}

/// True for gRPC and grpc-web requests: a `application/grpc*` content type,
/// or a path shaped `/<package>.<Service>/<Method>`. These pass through.
fn is_grpc<B>(request: &Request<B>) -> bool {
    let grpc_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    grpc_type || is_grpc_path(request.uri().path())
}

fn is_grpc_path(path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    match (segments.next(), segments.next(), segments.next()) {
        (Some(service), Some(method), None) => {
            service.contains('.') && !method.is_empty() && !method.contains('.')
        }
        _ => false,
    }
}

/// The Content-Type of a file, by its extension.
fn content_type(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, e)| e).unwrap_or_default();
    match extension.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "webmanifest" => "application/manifest+json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "avif" => "image/avif",
        "ico" => "image/x-icon",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "otf" => "font/otf",
        "wasm" => "application/wasm",
        "txt" => "text/plain; charset=utf-8",
        "xml" => "application/xml",
        _ => "application/octet-stream",
    }
}

/// Hashed build output may be cached for good; anything else is checked
/// with the server at each use.
fn cache_control(path: &str) -> &'static str {
    if path.starts_with("assets/") {
        IMMUTABLE
    } else {
        "no-cache"
    }
}

/// An answer with the headers every dashboard answer carries.
fn answer(
    status: StatusCode,
    content_type: &'static str,
    cache: &'static str,
    body: Cow<'static, [u8]>,
    head: bool,
) -> Response<Body> {
    let length = body.len();
    let body = if head {
        Body::empty()
    } else {
        Body::new(http_body_util::Full::new(match body {
            Cow::Borrowed(bytes) => Bytes::from_static(bytes),
            Cow::Owned(bytes) => Bytes::from(bytes),
        }))
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    add_security_headers(headers);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    response
}

/// The headers every answer a browser may render carries: the policy,
/// `nosniff` and `no-referrer` (kept where already set).
pub fn add_security_headers(headers: &mut http::HeaderMap) {
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    for (name, value) in fixed {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
}

/// Adds the security headers to an answer that is not gRPC's (tonic's
/// plain HTTP refusals of requests it cannot serve).
fn secure_unless_grpc(response: &mut Response<Body>) {
    let grpc = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        add_security_headers(response.headers_mut());
    }
}

fn text(status: StatusCode, message: &'static str, head: bool) -> Response<Body> {
    answer(
        status,
        "text/plain; charset=utf-8",
        "no-cache",
        Cow::Borrowed(message.as_bytes()),
        head,
    )
}

/// The answer to a GET or HEAD of `raw_path`.
async fn serve_path(files: &DashboardFiles, raw_path: &str, head: bool) -> Response<Body> {
    match resolve(raw_path) {
        Err(_) => text(StatusCode::BAD_REQUEST, "bad path\n", head),
        Ok(Target::File(path)) => match files.read(&path).await {
            Some(bytes) => answer(
                StatusCode::OK,
                content_type(&path),
                cache_control(&path),
                bytes,
                head,
            ),
            None => text(StatusCode::NOT_FOUND, "not found\n", head),
        },
        Ok(Target::Page) => {
            let page = files
                .read("index.html")
                .await
                .unwrap_or(Cow::Borrowed(NOT_BUILT_PAGE.as_bytes()));
            answer(
                StatusCode::OK,
                "text/html; charset=utf-8",
                "no-cache",
                page,
                head,
            )
        }
    }
}

fn method_not_allowed() -> Response<Body> {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed\n",
        false,
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

/// The layer; see the module's documentation.
#[derive(Clone, Debug)]
pub struct DashboardLayer {
    files: Arc<DashboardFiles>,
}

impl DashboardLayer {
    /// Serves `files`.
    pub fn new(files: DashboardFiles) -> Self {
        Self {
            files: Arc::new(files),
        }
    }
}

impl<S> Layer<S> for DashboardLayer {
    type Service = Dashboard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Dashboard {
            inner,
            files: Arc::clone(&self.files),
        }
    }
}

/// The service [`DashboardLayer`] wraps around the gRPC stack.
#[derive(Clone, Debug)]
pub struct Dashboard<S> {
    inner: S,
    files: Arc<DashboardFiles>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> Service<Request<B>> for Dashboard<S>
where
    S: Service<Request<B>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if is_grpc(&request) {
            let answered = self.inner.call(request);
            return Box::pin(async move {
                let mut response = answered.await?;
                secure_unless_grpc(&mut response);
                Ok(response)
            });
        }
        let method = request.method().clone();
        if method != Method::GET && method != Method::HEAD {
            return Box::pin(async { Ok(method_not_allowed()) });
        }
        let files = Arc::clone(&self.files);
        let path = request.uri().path().to_owned();
        Box::pin(async move { Ok(serve_path(&files, &path, method == Method::HEAD).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_pages_and_files() {
        assert_eq!(resolve("/"), Ok(Target::Page));
        assert_eq!(resolve(""), Ok(Target::Page));
        assert_eq!(resolve("/runs/0193-abc"), Ok(Target::Page));
        assert_eq!(resolve("/runs/"), Ok(Target::Page));
        assert_eq!(
            resolve("/assets/index-Bq1.js"),
            Ok(Target::File("assets/index-Bq1.js".to_owned()))
        );
        assert_eq!(
            resolve("/favicon.ico"),
            Ok(Target::File("favicon.ico".to_owned()))
        );
    }

    #[test]
    fn paths_that_could_leave_the_folder_are_refused() {
        for path in [
            "/../etc/passwd",
            "/assets/../../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/%2E%2E%2Fetc%2Fpasswd",
            "//etc/passwd",
            "/%2Fetc/passwd",
            "/assets/./x.js",
            "/..%5c..%5cwindows%5cwin.ini",
            "/C:/windows/win.ini",
            "/a%00.js",
            "/..",
        ] {
            assert_eq!(resolve(path), Err(PathError::Traversal), "{path}");
        }
        assert_eq!(resolve("/%ff.js"), Err(PathError::NotUtf8));
    }

    #[test]
    fn grpc_paths_are_recognised_and_dashboard_paths_are_not() {
        assert!(is_grpc_path("/composer.v1.RunService/ListRuns"));
        assert!(is_grpc_path("/grpc.health.v1.Health/Check"));
        assert!(!is_grpc_path("/"));
        assert!(!is_grpc_path("/runs/abc"));
        assert!(!is_grpc_path("/assets/index-Bq1.js"));
        assert!(!is_grpc_path("/favicon.ico"));
    }

    #[test]
    fn hashed_assets_are_immutable_and_the_rest_revalidated() {
        assert_eq!(cache_control("assets/index-Bq1.js"), IMMUTABLE);
        assert_eq!(cache_control("index.html"), "no-cache");
        assert_eq!(cache_control("favicon.ico"), "no-cache");
        assert_eq!(
            content_type("assets/a.JS"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type("x.unknown"), "application/octet-stream");
    }
}

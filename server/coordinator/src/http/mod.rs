//! The server's own HTTP work: the executor behind HTTP nodes (this
//! module) and the worker that leases their tasks ([`worker`]).
//!
//! The engine turns an HTTP node into a task on the reserved queue
//! [`HTTP_QUEUE`] whose input is
//! `{method, url, headers, body, timeout}`; the server's own HTTP worker
//! leases it like any worker and hands the input to [`HttpExecutor::execute`],
//! then reports the [`HttpOutcome`] with CompleteTask or FailTask.
//!
//! What an attempt does:
//! - sends `Idempotency-Key: <task id>` (the same on every attempt) and the
//!   node's headers, the body as JSON unless the node chose a content type;
//! - connects only to addresses the [SSRF guard](guard) allows, checked as
//!   they are resolved and again for every redirect (at most
//!   [`MAX_REDIRECTS`]);
//! - completes with `{status, headers, body}` on 2xx and 3xx; fails
//!   retryably on 5xx, 429, network errors and timeouts, and for good on
//!   other 4xx, bad input, refused addresses and oversized responses.

mod guard;
mod request;
pub mod worker;

use std::error::Error as _;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Client, Response, StatusCode, redirect};
use serde_json::{Map, Value, json};
use tracing::debug;

pub use guard::{AddressClass, AddressPolicy, Blocked, classify};
pub use request::{BadRequest, IDEMPOTENCY_KEY};

use request::HttpRequest;

use crate::secrets::SecretValues;

/// The reserved queue HTTP nodes are dispatched on.
pub const HTTP_QUEUE: &str = "_http";

/// Redirects followed before the 3xx itself becomes the result.
pub const MAX_REDIRECTS: usize = 5;

/// How much of an error response's body is read for the failure message.
const ERROR_BODY_READ: usize = 4 * 1024;
/// How much of it the message quotes.
const ERROR_EXCERPT_CHARS: usize = 200;

/// The error codes an HTTP attempt fails with.
pub mod codes {
    /// 5xx: retryable.
    pub const HTTP_5XX: &str = "HTTP_5XX";
    /// 429 Too Many Requests: retryable.
    pub const HTTP_429: &str = "HTTP_429";
    /// Any other 4xx: not retryable.
    pub const HTTP_4XX: &str = "HTTP_4XX";
    /// A status outside 100..=599 or an informational final status: not retryable.
    pub const HTTP_UNEXPECTED_STATUS: &str = "HTTP_UNEXPECTED_STATUS";
    /// Connection refused or reset, DNS failure...: retryable.
    pub const HTTP_NETWORK: &str = "HTTP_NETWORK";
    /// No complete response within the timeout: retryable.
    pub const TIMEOUT: &str = "TIMEOUT";
    /// The response body passed `max_response_bytes`: not retryable.
    pub const HTTP_RESPONSE_TOO_LARGE: &str = "HTTP_RESPONSE_TOO_LARGE";
    /// The node's input cannot be sent: not retryable.
    pub const HTTP_BAD_REQUEST: &str = "HTTP_BAD_REQUEST";
    /// The target address is refused by the SSRF guard: not retryable.
    pub const SSRF_BLOCKED: &str = "SSRF_BLOCKED";
    /// A secret the node uses cannot be read (not set, or the server has no
    /// key for it): retryable, as setting it or giving the key mends it.
    pub const SECRET_UNAVAILABLE: &str = "SECRET_UNAVAILABLE";
}

/// The request input with its secrets filled in the url, header values
/// and body (nowhere else: the method and timeout never hold one).
fn fill_request(input: &Value, secrets: &SecretValues) -> Value {
    let mut filled = input.clone();
    if let Some(map) = filled.as_object_mut() {
        for field in ["url", "headers", "body"] {
            if let Some(value) = map.get_mut(field) {
                *value = secrets.fill(value);
            }
        }
        map.remove("secrets");
    }
    filled
}

/// How the executor may reach out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpExecutorConfig {
    /// Allow 10/8, 172.16/12, 192.168/16, 100.64/10 and fc00::/7.
    pub allow_private_networks: bool,
    /// Allow 127/8 and ::1.
    pub allow_loopback: bool,
    /// The timeout of an attempt whose node sets none: from the first
    /// connection to the last byte of the response.
    pub default_timeout: Duration,
    /// Responses whose body is longer are refused; no more is ever read.
    pub max_response_bytes: usize,
    /// Request bodies longer than this are refused before sending.
    pub max_request_bytes: usize,
}

impl Default for HttpExecutorConfig {
    /// Public addresses only, 30s, 10 MiB each way.
    fn default() -> Self {
        Self {
            allow_private_networks: false,
            allow_loopback: false,
            default_timeout: Duration::from_secs(30),
            max_response_bytes: 10 * 1024 * 1024,
            max_request_bytes: 10 * 1024 * 1024,
        }
    }
}

impl HttpExecutorConfig {
    /// The address policy this configuration asks for.
    pub fn address_policy(&self) -> AddressPolicy {
        AddressPolicy {
            allow_private_networks: self.allow_private_networks,
            allow_loopback: self.allow_loopback,
        }
    }
}

/// The HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the http client: {0}")]
pub struct HttpSetupError(#[from] reqwest::Error);

/// What one attempt came to: what the worker reports.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpOutcome {
    /// For CompleteTask: `{status, headers, body}`.
    Completed(Value),
    /// For FailTask.
    Failed {
        /// One of [`codes`].
        code: String,
        /// For people: the status and a body excerpt, or what went wrong.
        message: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
}

impl HttpOutcome {
    fn failed(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self::Failed {
            code: code.to_owned(),
            message: message.into(),
            retryable,
        }
    }

    fn blocked(blocked: &Blocked) -> Self {
        Self::failed(codes::SSRF_BLOCKED, blocked.to_string(), false)
    }

    /// The outcome with every secret value written `[secret NAME]`: what
    /// an endpoint echoed is never stored.
    fn redacted(self, secrets: &SecretValues) -> Self {
        if secrets.is_empty() {
            return self;
        }
        match self {
            Self::Completed(output) => Self::Completed(secrets.redact(&output)),
            Self::Failed {
                code,
                message,
                retryable,
            } => Self::Failed {
                code,
                message: secrets.redact_text(&message),
                retryable,
            },
        }
    }
}

/// Runs HTTP node attempts. Holds one client, so connections are reused;
/// build it once and share it.
#[derive(Debug, Clone)]
pub struct HttpExecutor {
    client: Client,
    config: HttpExecutorConfig,
}

impl HttpExecutor {
    /// Builds the client: rustls, the guarded resolver, guarded redirects,
    /// no proxies (a proxy would connect on our behalf, past the guard).
    pub fn new(config: HttpExecutorConfig) -> Result<Self, HttpSetupError> {
        let policy = config.address_policy();
        let redirects = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS
                || !matches!(attempt.url().scheme(), "http" | "https")
            {
                return attempt.stop();
            }
            match policy.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(blocked) => attempt.error(blocked),
            }
        });
        let client = Client::builder()
            .dns_resolver(guard::GuardedResolver { policy })
            .redirect(redirects)
            .no_proxy()
            .referer(false)
            .user_agent(concat!("composer/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, config })
    }

    /// The configuration this executor was built with.
    pub fn config(&self) -> &HttpExecutorConfig {
        &self.config
    }

    /// Runs one attempt of an HTTP node that uses no secret. `idempotency_key`
    /// is the task id. Never panics, whatever the input; every failure is an
    /// outcome.
    pub async fn execute(&self, input: &Value, idempotency_key: &str) -> HttpOutcome {
        self.execute_with_secrets(input, idempotency_key, &SecretValues::default())
            .await
    }

    /// [`HttpExecutor::execute`] with `secrets` filling the `${secrets.NAME}`
    /// of the url, header values and body; their values are redacted from
    /// the outcome before it leaves.
    pub async fn execute_with_secrets(
        &self,
        input: &Value,
        idempotency_key: &str,
        secrets: &SecretValues,
    ) -> HttpOutcome {
        let outcome = if secrets.is_empty() {
            self.execute_filled(input, idempotency_key).await
        } else {
            let filled = fill_request(input, secrets);
            self.execute_filled(&filled, idempotency_key).await
        };
        outcome.redacted(secrets)
    }

    async fn execute_filled(&self, input: &Value, idempotency_key: &str) -> HttpOutcome {
        let request =
            match HttpRequest::from_input(input, idempotency_key, self.config.max_request_bytes) {
                Ok(request) => request,
                Err(bad) => {
                    return HttpOutcome::failed(codes::HTTP_BAD_REQUEST, bad.to_string(), false);
                }
            };
        // IP literals never reach the resolver: check them before anything.
        if let Err(blocked) = self.config.address_policy().check_url(&request.url) {
            return HttpOutcome::blocked(&blocked);
        }
        let timeout = request.timeout.unwrap_or(self.config.default_timeout);
        let method = request.method.clone();
        let outcome = match tokio::time::timeout(timeout, self.send(request)).await {
            Ok(outcome) => outcome,
            Err(_) => HttpOutcome::failed(
                codes::TIMEOUT,
                format!("no complete response within {timeout:?}"),
                true,
            ),
        };
        // no host in the log: a url may carry a secret
        match &outcome {
            HttpOutcome::Completed(output) => {
                debug!(%method, status = %output["status"], "http node completed");
            }
            HttpOutcome::Failed {
                code, retryable, ..
            } => {
                debug!(%method, %code, retryable, "http node failed");
            }
        }
        outcome
    }

    async fn send(&self, request: HttpRequest) -> HttpOutcome {
        let mut builder = self
            .client
            .request(request.method, request.url)
            .headers(request.headers);
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let response = match builder.send().await {
            Ok(response) => response,
            Err(error) => return request_error(error),
        };
        let status = response.status();
        let headers = headers_json(response.headers());
        let code = status.as_u16();

        if status.is_success() || status.is_redirection() {
            let bytes = match read_body(response, self.config.max_response_bytes).await {
                Ok(Body::Complete(bytes)) => bytes,
                Ok(Body::TooLarge) => {
                    return HttpOutcome::failed(
                        codes::HTTP_RESPONSE_TOO_LARGE,
                        format!(
                            "HTTP {code}: the response body is over the limit of {} bytes",
                            self.config.max_response_bytes
                        ),
                        false,
                    );
                }
                Err(error) => return request_error(error),
            };
            return HttpOutcome::Completed(json!({
                "status": code,
                "headers": headers,
                "body": body_json(&bytes),
            }));
        }

        let (failure_code, retryable) = match code {
            429 => (codes::HTTP_429, true),
            500..=599 => (codes::HTTP_5XX, true),
            400..=499 => (codes::HTTP_4XX, false),
            _ => (codes::HTTP_UNEXPECTED_STATUS, false),
        };
        // The status decides; the body only adds an excerpt, so read little
        // of it and never let it change the verdict.
        let (bytes, truncated) = read_prefix(response, ERROR_BODY_READ).await;
        let excerpt = excerpt(&bytes, truncated);
        HttpOutcome::failed(
            failure_code,
            format!("HTTP {}{excerpt}", status_text(status)),
            retryable,
        )
    }
}

/// Maps an error from sending or reading: the guard's refusal wherever it
/// sits in the chain, then timeouts, then everything else as network.
fn request_error(error: reqwest::Error) -> HttpOutcome {
    // The URL may carry secrets in its query; messages go to run history.
    let error = error.without_url();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = source {
        if let Some(blocked) = e.downcast_ref::<Blocked>() {
            return HttpOutcome::blocked(blocked);
        }
        source = e.source();
    }
    if error.is_timeout() {
        return HttpOutcome::failed(codes::TIMEOUT, error_chain(&error), true);
    }
    if error.is_builder() {
        return HttpOutcome::failed(codes::HTTP_BAD_REQUEST, error_chain(&error), false);
    }
    HttpOutcome::failed(codes::HTTP_NETWORK, error_chain(&error), true)
}

/// `error: cause: cause`, since reqwest's own text hides the cause.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

enum Body {
    Complete(Vec<u8>),
    TooLarge,
}

/// Reads the body, stopping as soon as it passes `limit`.
async fn read_body(mut response: Response, limit: usize) -> Result<Body, reqwest::Error> {
    // The body's own length, not the header's: a HEAD or 304 response
    // declares the resource's length but has no body.
    if response
        .content_length()
        .is_some_and(|len| len > limit as u64)
    {
        return Ok(Body::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if chunk.len() > limit.saturating_sub(bytes.len()) {
            return Ok(Body::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body::Complete(bytes))
}

/// Reads at most `limit` bytes of the body, and whether there was more;
/// a body that breaks off is kept as far as it came.
async fn read_prefix(mut response: Response, limit: usize) -> (Vec<u8>, bool) {
    let mut bytes = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = limit.saturating_sub(bytes.len());
        if chunk.len() > room {
            bytes.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return (bytes, true);
        }
        bytes.extend_from_slice(&chunk);
    }
    (bytes, false)
}

/// `{lowercased name: value}`; repeated headers joined with `, `.
fn headers_json(headers: &HeaderMap) -> Value {
    let mut map = Map::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        match map.get_mut(name.as_str()) {
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                map.insert(name.as_str().to_owned(), Value::String(value.into_owned()));
            }
        }
    }
    Value::Object(map)
}

/// The body as JSON if it parses as JSON, else as text; null when empty.
fn body_json(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// `: <first characters of the body>` for a failure message.
fn excerpt(bytes: &[u8], truncated: bool) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return String::new();
    }
    let mut short: String = text.chars().take(ERROR_EXCERPT_CHARS).collect();
    if truncated || short.len() < text.len() {
        short.push('…');
    }
    format!(": {short}")
}

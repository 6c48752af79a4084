//! Reading an HTTP task's input into a request, refusing what cannot be sent.

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::Value;

/// The header that carries the task id, the same on every attempt.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Headers the executor owns: a node may not set them.
const RESERVED_HEADERS: &[(&str, &str)] = &[
    (IDEMPOTENCY_KEY, "is set by the engine to the task id"),
    ("host", "is taken from the url"),
    ("content-length", "is computed from the body"),
    ("transfer-encoding", "is managed by the HTTP client"),
    ("connection", "is managed by the HTTP client"),
    ("keep-alive", "is managed by the HTTP client"),
    ("proxy-connection", "is managed by the HTTP client"),
    ("te", "is managed by the HTTP client"),
    ("trailer", "is managed by the HTTP client"),
    ("upgrade", "is managed by the HTTP client"),
];

const METHODS: &[Method] = &[
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

/// A problem with the task's input, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct BadRequest {
    /// The field, as a path: `url`, `headers.X-Api-Key`, `timeout`...
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> BadRequest {
    BadRequest {
        field: field.into(),
        problem: problem.into(),
    }
}

/// A request ready to send.
#[derive(Debug)]
pub(crate) struct HttpRequest {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
}

impl HttpRequest {
    /// Reads `{method, url, headers, body, timeout}`. A missing or null
    /// `method` is GET; a null `body` is no body.
    pub(crate) fn from_input(
        input: &Value,
        idempotency_key: &str,
        max_request_bytes: usize,
    ) -> Result<Self, BadRequest> {
        let Value::Object(fields) = input else {
            return Err(bad("input", "must be an object with at least `url`"));
        };
        let field = |name: &str| fields.get(name).filter(|v| !v.is_null());

        let method = parse_method(field("method"))?;
        let url = parse_url(field("url"))?;
        let mut headers = parse_headers(field("headers"))?;
        let key = HeaderValue::from_str(idempotency_key)
            .map_err(|_| bad("idempotency_key", "is not a valid header value"))?;
        headers.insert(IDEMPOTENCY_KEY, key);

        let body = match field("body") {
            None => None,
            Some(body) => Some(encode_body(body, &mut headers, max_request_bytes)?),
        };
        let timeout = field("timeout").map(parse_timeout).transpose()?;
        Ok(Self {
            method,
            url,
            headers,
            body,
            timeout,
        })
    }
}

fn parse_method(value: Option<&Value>) -> Result<Method, BadRequest> {
    let Some(value) = value else {
        return Ok(Method::GET);
    };
    let Value::String(text) = value else {
        return Err(bad("method", "must be a string such as \"POST\""));
    };
    let upper = text.trim().to_ascii_uppercase();
    METHODS
        .iter()
        .find(|m| m.as_str() == upper)
        .cloned()
        .ok_or_else(|| {
            bad(
                "method",
                format!("`{text}` is not one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            )
        })
}

fn parse_url(value: Option<&Value>) -> Result<Url, BadRequest> {
    let Some(value) = value else {
        return Err(bad("url", "is required"));
    };
    let Value::String(text) = value else {
        return Err(bad("url", "must be a string"));
    };
    let url =
        Url::parse(text.trim()).map_err(|e| bad("url", format!("is not a valid URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(
            "url",
            format!(
                "scheme `{}` is not allowed, only http and https",
                url.scheme()
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("url", "has no host"));
    }
    Ok(url)
}

fn parse_headers(value: Option<&Value>) -> Result<HeaderMap, BadRequest> {
    let mut headers = HeaderMap::new();
    let Some(value) = value else {
        return Ok(headers);
    };
    let Value::Object(entries) = value else {
        return Err(bad("headers", "must be an object of header name to value"));
    };
    for (name, value) in entries {
        let field = format!("headers.{name}");
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(&field, "is not a valid header name"))?;
        if let Some((_, why)) = RESERVED_HEADERS.iter().find(|(n, _)| *n == header.as_str()) {
            return Err(bad(&field, format!("may not be set by a node: it {why}")));
        }
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(bad(&field, "value must be a string")),
        };
        let value = HeaderValue::from_str(&text).map_err(|_| {
            bad(
                &field,
                "value holds characters not allowed in a header (control characters or line breaks)",
            )
        })?;
        headers.append(header, value);
    }
    Ok(headers)
}

/// Encodes the body as JSON, and says so unless the node chose a content
/// type. A string body under a non-JSON content type is sent as it is.
fn encode_body(
    body: &Value,
    headers: &mut HeaderMap,
    max_request_bytes: usize,
) -> Result<Vec<u8>, BadRequest> {
    let declared_json = match headers.get(CONTENT_TYPE) {
        None => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            true
        }
        Some(value) => is_json_type(value),
    };
    let bytes = match body {
        Value::String(text) if !declared_json => text.clone().into_bytes(),
        other => serde_json::to_vec(other).map_err(|e| bad("body", e.to_string()))?,
    };
    if bytes.len() > max_request_bytes {
        return Err(bad(
            "body",
            format!(
                "is {} bytes, over the limit of {max_request_bytes} bytes",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// Whether a content type names JSON (`application/json`, `…+json`).
pub(crate) fn is_json_type(value: &HeaderValue) -> bool {
    value
        .to_str()
        .map(|v| v.to_ascii_lowercase().contains("json"))
        .unwrap_or(false)
}

fn parse_timeout(value: &Value) -> Result<Duration, BadRequest> {
    let duration = match value {
        Value::Number(n) => {
            let ms = n.as_f64().unwrap_or(f64::NAN);
            if !(ms.is_finite() && ms > 0.0) {
                return Err(bad("timeout", "must be a positive number of milliseconds"));
            }
            Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| bad("timeout", "is too large"))?
        }
        Value::String(text) => parse_duration(text).map_err(|problem| bad("timeout", problem))?,
        _ => {
            return Err(bad(
                "timeout",
                "must be milliseconds or a duration such as \"30s\"",
            ));
        }
    };
    if duration.is_zero() {
        return Err(bad("timeout", "must be more than zero"));
    }
    Ok(duration)
}

/// Parses durations like `30s`, `500ms`, `1m30s`, `1.5h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("is an empty duration".to_owned());
    }
    let invalid = || format!("`{text}` is not a duration such as \"30s\", \"500ms\" or \"1m30s\"");
    let mut seconds = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        seconds += value * scale;
        rest = after;
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_the_rest() {
        let ok = [
            ("30s", 30_000),
            ("500ms", 500),
            ("1m30s", 90_000),
            ("1.5h", 5_400_000),
            (" 2m ", 120_000),
        ];
        for (text, ms) in ok {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for text in ["", "30", "s", "-5s", "5x", "1e400s", "5 s", "..s", "3ſ"] {
            assert!(parse_duration(text).is_err(), "{text} should be refused");
        }
    }
}

//! Statuses that tonic itself produces, before a handler runs, put right:
//! a request that does not decode (malformed protobuf, invalid UTF-8 in a
//! string, nesting past the decoder's depth limit) is the caller's mistake,
//! INVALID_ARGUMENT, not INTERNAL; a request over the message limit is
//! RESOURCE_EXHAUSTED naming the flag that sets it, not OUT_OF_RANGE. And
//! no message, whoever wrote it, carries more than [`MAX_MESSAGE_BYTES`]
//! of text back to the caller, so an error never echoes a large input.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use http::{HeaderValue, Request, Response};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use tower::{Layer, Service};

/// The longest `grpc-message` a caller gets, in bytes of text.
pub const MAX_MESSAGE_BYTES: usize = 512;

/// What gRPC percent-encodes in `grpc-message` (everything outside
/// printable ASCII, and `%`).
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%').add(0x7f);

/// The layer; see the module's documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportStatusLayer;

impl<S> Layer<S> for TransportStatusLayer {
    type Service = TransportStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TransportStatus { inner }
    }
}

/// The service [`TransportStatusLayer`] wraps.
#[derive(Clone, Debug)]
pub struct TransportStatus<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<Request<B>> for TransportStatus<S>
where
    S: Service<Request<B>, Response = Response<R>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            rewrite(response.headers_mut());
            Ok(response)
        })
    }
}

/// Rewrites a trailers-only status (the form every error before a handler,
/// and every unary error, takes).
fn rewrite(headers: &mut http::HeaderMap) {
    let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()) else {
        return;
    };
    let code = code.to_owned();
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|v| percent_decode_str(v).decode_utf8_lossy().into_owned())
        .unwrap_or_default();
    let (code, message) = match (code.as_str(), message) {
        ("13", m) if m.starts_with("failed to decode Protobuf message") => (
            "3".to_owned(),
            format!("the request is not a valid message of its type: {m}"),
        ),
        ("11", m) if m.contains("message length too large") => (
            "8".to_owned(),
            "the request is larger than this server accepts (--max-message-bytes): \
             send a large payload through BlobService (the SDKs do so by themselves)"
                .to_owned(),
        ),
        (_, m) if m.len() > MAX_MESSAGE_BYTES => (code, m),
        _ => return,
    };
    if let Ok(code) = HeaderValue::from_str(&code) {
        headers.insert("grpc-status", code);
    }
    let clipped = clip(&message, MAX_MESSAGE_BYTES);
    let encoded = utf8_percent_encode(&clipped, GRPC_MESSAGE).to_string();
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
}

/// At most `max` bytes of `text`, cut on a character boundary, marked.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &str, message: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_str(code).expect("code"));
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(&utf8_percent_encode(message, GRPC_MESSAGE).to_string())
                .expect("message"),
        );
        rewrite(&mut headers);
        headers
    }

    fn message(headers: &http::HeaderMap) -> String {
        let raw = headers["grpc-message"].to_str().expect("ascii");
        percent_decode_str(raw).decode_utf8_lossy().into_owned()
    }

    #[test]
    fn a_request_that_does_not_decode_is_invalid_argument() {
        let headers = status("13", "failed to decode Protobuf message: invalid wire type");
        assert_eq!(headers["grpc-status"], "3");
        assert!(message(&headers).contains("invalid wire type"));
    }

    #[test]
    fn a_request_over_the_limit_is_resource_exhausted_naming_the_flag() {
        let headers = status(
            "11",
            "Error, decoded message length too large: found 5242880 bytes, the limit is: 4194304 bytes",
        );
        assert_eq!(headers["grpc-status"], "8");
        assert!(message(&headers).contains("--max-message-bytes"));
    }

    #[test]
    fn long_messages_are_clipped_and_others_left_alone() {
        let long = format!("run {} not found", "é".repeat(10_000));
        let headers = status("5", &long);
        assert_eq!(headers["grpc-status"], "5");
        let clipped = message(&headers);
        assert!(clipped.len() < MAX_MESSAGE_BYTES + 40, "{}", clipped.len());
        assert!(clipped.ends_with("bytes in all)"));
        let short = status("5", "run x not found");
        assert_eq!(message(&short), "run x not found");
        let internal = status("13", "something else");
        assert_eq!(internal["grpc-status"], "13");
    }
}

//! gRPC requests counted by method and status code, and timed until the
//! response starts: one tower layer, not code in each handler. A method
//! label is a known method's path or `unknown`, so a caller inventing
//! paths cannot grow the label set.

use std::{
    collections::HashSet,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use composer_coordinator::observe::metrics::{GRPC_REQUESTS, GRPC_SECONDS};
use http::{Request, Response};
use prost::Message;
use tower::{Layer, Service};

/// The layer; see the module's documentation.
#[derive(Clone, Debug)]
pub struct RequestMetricsLayer {
    known: Arc<HashSet<String>>,
}

impl RequestMetricsLayer {
    /// Counts the methods of `composer.v1`, health and reflection.
    pub fn new() -> Self {
        let mut known = HashSet::new();
        for set in [
            composer_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ] {
            known.extend(method_paths(set));
        }
        for version in ["v1", "v1alpha"] {
            known.insert(format!(
                "/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
            ));
        }
        Self {
            known: Arc::new(known),
        }
    }
}

impl Default for RequestMetricsLayer {
    fn default() -> Self {
        Self::new()
    }
}

/// `/package.Service/Method` for every method in an encoded descriptor set.
fn method_paths(encoded: &[u8]) -> Vec<String> {
    let Ok(set) = prost_types::FileDescriptorSet::decode(encoded) else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                paths.push(format!(
                    "/{}.{}/{}",
                    file.package(),
                    service.name(),
                    method.name()
                ));
            }
        }
    }
    paths
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            known: Arc::clone(&self.known),
        }
    }
}

/// The service [`RequestMetricsLayer`] wraps.
#[derive(Clone, Debug)]
pub struct RequestMetrics<S> {
    inner: S,
    known: Arc<HashSet<String>>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<Request<B>> for RequestMetrics<S>
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
        if !composer_coordinator::observe::metrics::enabled() {
            return Box::pin(self.inner.call(request));
        }
        let path = request.uri().path();
        let method = if self.known.contains(path) {
            path.to_owned()
        } else {
            "unknown".to_owned()
        };
        let began = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            // an error before any message is trailers-only: its status is
            // in the headers; otherwise the call went on as OK so far
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32);
            metrics::counter!(GRPC_REQUESTS, "method" => method.clone(), "code" => format!("{code:?}"))
                .increment(1);
            metrics::histogram!(GRPC_SECONDS, "method" => method)
                .record(began.elapsed().as_secs_f64());
            Ok(response)
        })
    }
}

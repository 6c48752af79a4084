//! A deadline on every call but the long poll: a database that is stopped
//! or frozen (its connections open, its answers never coming) turns into
//! UNAVAILABLE after `--db-timeout`, not a hang until the caller's own
//! deadline. Statements and pool waits have the same bound in the store;
//! this covers what those cannot see, a peer that never answers.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use tower::{Layer, Service};

/// Calls that wait on purpose and bound their own waiting (an upload
/// answers once its last chunk is in, and bounds the wait for each chunk;
/// a finished presigned upload is read whole, up to the payload limit,
/// from a store whose client bounds each request).
const EXEMPT_PATHS: [&str; 3] = [
    "/composer.v1.WorkerService/PollTasks",
    "/composer.v1.BlobService/UploadBlob",
    "/composer.v1.BlobService/FinishBlobUpload",
];

/// The layer; see the module's documentation.
#[derive(Clone, Copy, Debug)]
pub struct CallDeadlineLayer {
    timeout: Duration,
}

impl CallDeadlineLayer {
    /// Calls that have not answered within `timeout` are UNAVAILABLE.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for CallDeadlineLayer {
    type Service = CallDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallDeadline {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service [`CallDeadlineLayer`] wraps.
#[derive(Clone, Debug)]
pub struct CallDeadline<S> {
    inner: S,
    timeout: Duration,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<Request<B>> for CallDeadline<S>
where
    S: Service<Request<B>, Response = Response<R>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let exempt = EXEMPT_PATHS.contains(&request.uri().path());
        let future = self.inner.call(request);
        if exempt {
            return Box::pin(future);
        }
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, future).await {
                Ok(answered) => answered,
                Err(_) => {
                    tracing::warn!(?timeout, "a call outlived --db-timeout");
                    Ok(tonic::Status::unavailable(format!(
                        "the server could not answer within {timeout:?} (--db-timeout): \
                         its database is slow or unreachable; retry later"
                    ))
                    .into_http())
                }
            }
        })
    }
}

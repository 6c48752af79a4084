//! A response body that keeps a guard alive until the transport drops the
//! body, which it does after queueing the body's last frame: how a layer
//! holds something (a report's answer signal, a quota's place) for exactly
//! as long as the call's answer is being written.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

/// `body`, holding `guard` until it is dropped.
pub(crate) fn holding<G>(body: Body, guard: G) -> Body
where
    G: Send + Unpin + 'static,
{
    Body::new(HeldBody {
        body,
        _guard: guard,
    })
}

struct HeldBody<G> {
    body: Body,
    _guard: G,
}

impl<G: Unpin> HttpBody for HeldBody<G> {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

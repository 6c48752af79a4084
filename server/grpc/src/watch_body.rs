//! WatchRun's response body, written by Composer rather than tonic
//! (decision 0035).
//!
//! tonic encodes a stream's messages into one buffer that lives as long as
//! the stream and never shrinks: a stream that once sent a 200 KB run
//! keeps 200 KB until it closes, so 2,000 streams on a run that grew keep
//! 400 MB. WatchRun's messages come out of its handler already encoded, as
//! whole gRPC frames (most often one frame shared by every stream of the
//! run), and [`WatchBody`] hands each to the connection as it is: a stream
//! holds nothing between two messages.
//!
//! `RunService::watch_run` answers with a [`WatchSlot`] in the response's
//! extensions and, for tonic, a stream that would decode the frames.
//! [`send_watch_body`], a map of the response in the innermost layer, takes
//! the frames out of the slot and puts [`WatchBody`] in place of tonic's
//! body. tonic's body is kept, never polled, as long as the new one, so
//! whatever the handler tied to its stream lives as long as the call.
//! Without the layer, tonic decodes the frames and encodes them again:
//! slower, the same bytes on the wire.

use std::{
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use composer_proto::v1::WatchRunResponse;
use futures::{Stream, StreamExt};
use http::{HeaderMap, Response};
use http_body::{Body as HttpBody, Frame};
use prost::Message;
use tonic::{Status, body::Body};

/// The gRPC frame header: a compression flag, then the length (big-endian).
const HEADER_BYTES: usize = 5;

/// One WatchRun stream's messages, each a whole gRPC frame.
pub(crate) type Frames = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// The messages tonic would encode.
pub(crate) type Messages = Pin<Box<dyn Stream<Item = Result<WatchRunResponse, Status>> + Send>>;

/// `message` as an uncompressed gRPC frame, in a buffer of its exact size.
pub(crate) fn grpc_frame(message: &WatchRunResponse) -> Result<Vec<u8>, Status> {
    let length = message.encoded_len();
    let header_length = u32::try_from(length)
        .map_err(|_| Status::resource_exhausted("the run is too large for one message"))?;
    let mut frame = Vec::with_capacity(HEADER_BYTES + length);
    frame.push(0);
    frame.extend_from_slice(&header_length.to_be_bytes());
    message
        .encode(&mut frame)
        .map_err(|error| Status::internal(format!("encoding a snapshot: {error}")))?;
    Ok(frame)
}

/// Where `watch_run` leaves its frames for [`send_watch_body`].
#[derive(Clone)]
pub(crate) struct WatchSlot(Arc<Mutex<Option<Frames>>>);

impl WatchSlot {
    pub(crate) fn new(frames: Frames) -> Self {
        Self(Arc::new(Mutex::new(Some(frames))))
    }

    fn take(&self) -> Option<Frames> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// The stream for tonic: the frames decoded, if nothing took them.
    pub(crate) fn messages(&self) -> Messages {
        let slot = self.clone();
        let frames = futures::stream::once(async move { slot.take() })
            .filter_map(futures::future::ready)
            .flatten();
        Box::pin(frames.map(|frame| frame.and_then(decode)))
    }
}

fn decode(frame: Bytes) -> Result<WatchRunResponse, Status> {
    WatchRunResponse::decode(frame.slice(HEADER_BYTES.min(frame.len())..))
        .map_err(|error| Status::internal(format!("decoding a snapshot: {error}")))
}

/// The layer's function: a response with a [`WatchSlot`] gets a
/// [`WatchBody`] of its frames in place of tonic's body; any other response
/// passes untouched.
pub(crate) fn send_watch_body(mut response: Response<Body>) -> Response<Body> {
    let Some(slot) = response.extensions_mut().remove::<WatchSlot>() else {
        return response;
    };
    // a compressed answer is tonic's to encode
    if response.headers().contains_key("grpc-encoding") {
        return response;
    }
    let Some(frames) = slot.take() else {
        return response;
    };
    response.map(|handler_body| {
        Body::new(WatchBody {
            frames,
            _handler_body: handler_body,
            ended: false,
        })
    })
}

/// A WatchRun response body: each frame as it comes, then the status.
struct WatchBody {
    frames: Frames,
    /// tonic's body, never polled: what the handler tied to its stream
    /// lives as long as this body.
    _handler_body: Body,
    /// The trailers went out.
    ended: bool,
}

impl HttpBody for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let status = match ready!(this.frames.as_mut().poll_next(cx)) {
            Some(Ok(frame)) => return Poll::Ready(Some(Ok(Frame::data(frame)))),
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        this.ended = true;
        let mut trailers = HeaderMap::new();
        Poll::Ready(Some(
            status
                .add_header(&mut trailers)
                .map(|()| Frame::trailers(trailers)),
        ))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use composer_proto::v1::{HistoryEvent, Run};
    use http_body_util::BodyExt;

    use super::*;

    fn snapshot(run_id: &str) -> WatchRunResponse {
        WatchRunResponse {
            run: Some(Run {
                run_id: run_id.to_owned(),
                ..Default::default()
            }),
            events: vec![HistoryEvent {
                sequence: 1,
                ..Default::default()
            }],
        }
    }

    fn frames(messages: Vec<Result<WatchRunResponse, Status>>) -> Frames {
        Box::pin(futures::stream::iter(messages.into_iter().map(|message| {
            message.and_then(|m| grpc_frame(&m)).map(Bytes::from)
        })))
    }

    fn answer(slot: &WatchSlot) -> Response<Body> {
        let mut response = Response::new(Body::empty());
        response.extensions_mut().insert(slot.clone());
        response
    }

    #[tokio::test]
    async fn the_body_sends_each_frame_as_it_is_then_the_status() {
        let slot = WatchSlot::new(frames(vec![
            Ok(snapshot("a")),
            Ok(snapshot("b")),
            Err(Status::not_found("run b not found")),
        ]));
        let body = send_watch_body(answer(&slot)).into_body();
        let collected = body.collect().await.expect("a body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "5");
        let bytes = collected.to_bytes();
        let first = grpc_frame(&snapshot("a")).expect("frame");
        assert_eq!(&bytes[..first.len()], &first[..]);
        assert_eq!(
            decode(bytes.slice(first.len()..)).expect("b"),
            snapshot("b")
        );
        assert!(slot.take().is_none(), "the body took the frames");
    }

    #[tokio::test]
    async fn a_stream_that_ends_sends_an_ok_status() {
        let slot = WatchSlot::new(frames(vec![Ok(snapshot("a"))]));
        let collected = send_watch_body(answer(&slot))
            .into_body()
            .collect()
            .await
            .expect("a body");
        assert_eq!(collected.trailers().expect("trailers")["grpc-status"], "0");
    }

    #[tokio::test]
    async fn without_the_layer_tonic_gets_the_messages_decoded() {
        let slot = WatchSlot::new(frames(vec![Ok(snapshot("a")), Ok(snapshot("b"))]));
        let messages: Vec<_> = slot.messages().collect().await;
        assert_eq!(
            messages.into_iter().map(Result::ok).collect::<Vec<_>>(),
            vec![Some(snapshot("a")), Some(snapshot("b"))]
        );
    }

    #[test]
    fn other_answers_pass_untouched() {
        let response = send_watch_body(Response::new(Body::empty()));
        assert!(response.body().is_end_stream());
    }
}

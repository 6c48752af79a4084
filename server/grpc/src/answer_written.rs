//! Tells the coordinator when a report's answer has been written
//! (decision 0034): a report handler puts the report's
//! [`AnswerInFlight`] in its response's extensions, and this layer
//! ([`hold_in_body`]) keeps it in the response body, which the HTTP/2 connection drops after
//! queueing the body's last frame. A task the report's transaction handed
//! to a waiting poll goes out after that, so on one connection a worker
//! reads "done" before it reads the next step. Responses without one pass
//! untouched.

use composer_coordinator::dispatch::answer_sent::AnswerInFlight;
use http::Response;
use tonic::body::Body;

use crate::held_body::holding;

/// The response of a report call, holding its answer's signal until the
/// transport has written it.
pub(crate) fn hold_until_written<T>(
    mut response: tonic::Response<T>,
    in_flight: AnswerInFlight,
) -> tonic::Response<T> {
    response.extensions_mut().insert(in_flight);
    response
}

/// The layer's function: moves a response's [`AnswerInFlight`], if it has
/// one, from its extensions into its body (a plain map of the response,
/// so calls without one pay no allocation).
pub(crate) fn hold_in_body(mut response: Response<Body>) -> Response<Body> {
    let Some(in_flight) = response.extensions_mut().remove::<AnswerInFlight>() else {
        return response;
    };
    response.map(|body| holding(body, in_flight))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;

    use composer_coordinator::dispatch::answer_sent;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt, util::MapResponseLayer};

    use super::*;

    /// A handler's answer: a body of one frame, with the signal attached.
    async fn answer(in_flight: AnswerInFlight) -> Result<Response<Body>, Infallible> {
        let response = hold_until_written(
            tonic::Response::new(Body::new(http_body_util::Full::new(Bytes::from_static(
                b"done",
            )))),
            in_flight,
        );
        // as tonic turns its response into HTTP
        let (_, body, extensions) = response.into_parts();
        let mut http = Response::new(body);
        *http.extensions_mut() = extensions;
        Ok(http)
    }

    #[tokio::test]
    async fn the_answer_counts_as_sent_once_its_body_is_written_and_dropped() {
        let (in_flight, mut sent) = answer_sent::signal();
        let holder = std::sync::Mutex::new(Some(in_flight));
        let service =
            MapResponseLayer::new(hold_in_body).layer(tower::service_fn(move |_: Request<()>| {
                let in_flight = holder.lock().expect("holder").take().expect("one call");
                answer(in_flight)
            }));

        let response = service.oneshot(Request::new(())).await.expect("answered");
        assert!(
            response.extensions().get::<AnswerInFlight>().is_none(),
            "the signal moves from the extensions into the body"
        );
        assert!(
            !sent.is_written_now(),
            "not sent while the body is unwritten"
        );
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), Bytes::from_static(b"done"));
        assert!(
            sent.is_written_now(),
            "sent once the body is written and dropped"
        );
    }

    #[tokio::test]
    async fn a_response_without_a_signal_passes_untouched() {
        let service =
            MapResponseLayer::new(hold_in_body).layer(tower::service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Body::new(http_body_util::Full::new(
                    Bytes::from_static(b"plain"),
                ))))
            }));
        let response = service.oneshot(Request::new(())).await.expect("answered");
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), Bytes::from_static(b"plain"));
    }
}

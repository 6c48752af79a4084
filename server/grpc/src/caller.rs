//! Who is calling: the [`Caller`] the auth layer attached to the request.

use tonic::{Request, Status};

pub use crate::auth::Caller;

/// The caller of a request (set by the auth layer before routing).
pub fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the request carries no verified caller"))
}

/// The caller's W3C `traceparent` header, read only when the server exports
/// traces. A header of the wrong size is dropped unread; what it says is
/// parsed (strictly) where a span is opened under it.
pub fn traceparent<T>(request: &Request<T>) -> Option<String> {
    if !composer_coordinator::observe::traces::enabled() {
        return None;
    }
    let value = request.metadata().get("traceparent")?.to_str().ok()?;
    (value.len() == composer_coordinator::observe::traces::TRACEPARENT_LEN)
        .then(|| value.to_owned())
}

//! Who is calling: the [`Caller`] the auth layer attached to the request.

use tonic::{Request, Status};

pub use crate::auth::Caller;

/// The namespace of insecure mode.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The caller of a request (set by the auth layer before routing).
pub fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the request carries no verified caller"))
}

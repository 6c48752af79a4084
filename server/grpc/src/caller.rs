//! Who is calling. Until tokens are checked (the auth issue), every caller
//! acts in the `default` namespace as `anonymous`.

/// The namespace of callers without a token.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The identity a request acts as.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The namespace whose resources the call sees.
    pub namespace: String,
    /// The subject, recorded in history as the actor.
    pub subject: String,
}

/// The caller of a request.
pub fn caller<T>(_request: &tonic::Request<T>) -> Caller {
    Caller {
        namespace: DEFAULT_NAMESPACE.to_owned(),
        subject: "anonymous".to_owned(),
    }
}

//! Authentication and authorisation: a bearer JWT on every RPC but health
//! and reflection, checked before any service sees the request, and one
//! table saying which role may call which RPC.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderMap, Request, Response};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header, jwk::JwkSet};
use serde::Deserialize;
use tonic::Status;
use tower::{Layer, Service};

/// What a token's `roles` may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything, in every namespace.
    Admin,
    /// Definitions and run control in its namespace.
    Operator,
    /// Start runs, send events, read its namespace.
    Client,
    /// Read only.
    Reader,
    /// WorkerService only, for the queues its token lists.
    Worker,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 5] = [
        Role::Admin,
        Role::Operator,
        Role::Client,
        Role::Reader,
        Role::Worker,
    ];

    /// The claim text of the role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Client => "client",
            Role::Reader => "reader",
            Role::Worker => "worker",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

use Role::{Admin, Client, Operator, Reader, Worker};

const READ: &[Role] = &[Admin, Operator, Client, Reader];
const ANY: &[Role] = &[Admin, Operator, Client, Reader, Worker];

/// Which roles may call which RPC. The one table: the server enforces it
/// and the role tests are generated from it.
pub const RPC_ROLES: &[(&str, &[Role])] = &[
    ("/composer.v1.ServerService/GetServerInfo", ANY),
    (
        "/composer.v1.WorkflowService/RegisterWorkflow",
        &[Admin, Operator],
    ),
    ("/composer.v1.WorkflowService/ValidateWorkflow", READ),
    ("/composer.v1.WorkflowService/GetWorkflow", READ),
    ("/composer.v1.WorkflowService/ListWorkflows", READ),
    ("/composer.v1.WorkflowService/ListWorkflowVersions", READ),
    ("/composer.v1.WorkflowService/ReplayRun", READ),
    ("/composer.v1.WorkflowService/CheckWorkflowVersion", READ),
    (
        "/composer.v1.RunService/StartRun",
        &[Admin, Operator, Client],
    ),
    ("/composer.v1.RunService/GetRun", READ),
    ("/composer.v1.RunService/ListRuns", READ),
    ("/composer.v1.RunService/CountRuns", READ),
    ("/composer.v1.RunService/CancelRun", &[Admin, Operator]),
    ("/composer.v1.RunService/RetryRun", &[Admin, Operator]),
    ("/composer.v1.RunService/PauseRun", &[Admin, Operator]),
    ("/composer.v1.RunService/ResumeRun", &[Admin, Operator]),
    (
        "/composer.v1.RunService/SendEvent",
        &[Admin, Operator, Client],
    ),
    ("/composer.v1.RunService/GetRunHistory", READ),
    ("/composer.v1.RunService/BulkCancelRuns", &[Admin, Operator]),
    ("/composer.v1.RunService/BulkRetryRuns", &[Admin, Operator]),
    ("/composer.v1.RunService/BulkPauseRuns", &[Admin, Operator]),
    ("/composer.v1.RunService/BulkResumeRuns", &[Admin, Operator]),
    ("/composer.v1.RunService/MigrateRuns", &[Admin, Operator]),
    (
        "/composer.v1.BlobService/UploadBlob",
        &[Admin, Operator, Client, Worker],
    ),
    ("/composer.v1.BlobService/DownloadBlob", ANY),
    ("/composer.v1.BlobService/GetBlobUrl", ANY),
    (
        "/composer.v1.BlobService/StartBlobUpload",
        &[Admin, Operator, Client, Worker],
    ),
    (
        "/composer.v1.BlobService/FinishBlobUpload",
        &[Admin, Operator, Client, Worker],
    ),
    ("/composer.v1.SecretService/SetSecret", &[Admin, Operator]),
    ("/composer.v1.SecretService/ListSecrets", &[Admin, Operator]),
    (
        "/composer.v1.SecretService/DeleteSecret",
        &[Admin, Operator],
    ),
    ("/composer.v1.SecretService/RewrapSecretKeys", &[Admin]),
    ("/composer.v1.RunService/GetBulkOperation", READ),
    ("/composer.v1.RunService/ListBulkOperations", READ),
    (
        "/composer.v1.RunService/CancelBulkOperation",
        &[Admin, Operator],
    ),
    ("/composer.v1.RunService/WatchRun", READ),
    (
        "/composer.v1.ScheduleService/CreateSchedule",
        &[Admin, Operator],
    ),
    ("/composer.v1.ScheduleService/GetSchedule", READ),
    ("/composer.v1.ScheduleService/ListSchedules", READ),
    (
        "/composer.v1.ScheduleService/UpdateSchedule",
        &[Admin, Operator],
    ),
    (
        "/composer.v1.ScheduleService/PauseSchedule",
        &[Admin, Operator],
    ),
    (
        "/composer.v1.ScheduleService/ResumeSchedule",
        &[Admin, Operator],
    ),
    (
        "/composer.v1.ScheduleService/DeleteSchedule",
        &[Admin, Operator],
    ),
    (
        "/composer.v1.ScheduleService/TriggerSchedule",
        &[Admin, Operator],
    ),
    (
        "/composer.v1.QueueService/SetQueueRateLimit",
        &[Admin, Operator],
    ),
    ("/composer.v1.QueueService/GetQueueRateLimit", READ),
    ("/composer.v1.QueueService/ListQueueRateLimits", READ),
    (
        "/composer.v1.QueueService/DeleteQueueRateLimit",
        &[Admin, Operator],
    ),
    ("/composer.v1.WorkerService/PollTasks", &[Admin, Worker]),
    ("/composer.v1.WorkerService/Heartbeat", &[Admin, Worker]),
    ("/composer.v1.WorkerService/CompleteTask", &[Admin, Worker]),
    ("/composer.v1.WorkerService/FailTask", &[Admin, Worker]),
];

/// Paths that need no token: health checks and reflection.
fn is_public(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.") || path.starts_with("/grpc.reflection.")
}

/// The header an admin sets to act in another namespace.
pub const NAMESPACE_HEADER: &str = "x-composer-namespace";

/// The namespace of insecure mode.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The identity a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The namespace whose resources the call sees.
    pub namespace: String,
    /// The token's subject, recorded in history as the actor.
    pub subject: String,
    /// The token's roles.
    pub roles: Vec<Role>,
    /// For workers: the queues they may poll (`None`: any).
    pub queues: Option<HashSet<String>>,
    /// Which token this is, for per-token quotas: `jti:<jti>` when the
    /// token has a `jti`, else `<its namespace>/<its subject>`.
    pub token: String,
}

impl Caller {
    /// True when the caller holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// True when the caller may poll `queue`.
    pub fn may_poll(&self, queue: &str) -> bool {
        self.has(Admin)
            || self
                .queues
                .as_ref()
                .is_none_or(|q| q.contains(queue) || q.contains("*"))
    }
}

/// The claims Composer reads from a token.
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    /// Subject.
    pub sub: String,
    /// Namespace.
    pub ns: String,
    /// Roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Queues a worker may poll.
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    /// Token id: what per-token quotas count by, when present.
    #[serde(default)]
    pub jti: Option<String>,
}

/// One verification key, bound to the one algorithm it verifies, so a
/// token cannot pick another (algorithm confusion).
#[derive(Clone)]
pub struct VerificationKey {
    /// The key id, matched against a token's `kid` when both have one.
    pub kid: Option<String>,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The key.
    pub key: DecodingKey,
}

/// Why keys could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A PEM file is neither an RSA nor an Ed25519 public key.
    #[error("{0}: not an RSA or Ed25519 public key in PEM")]
    UnknownPem(String),
    /// A JWKS file could not be used.
    #[error("{0}: {1}")]
    Jwks(String, String),
    /// The secret is too short to be safe.
    #[error("the HS256 secret must be at least 32 bytes")]
    ShortSecret,
}

impl VerificationKey {
    /// An HS256 shared secret.
    pub fn hs256(secret: &[u8]) -> Result<Self, KeyError> {
        if secret.len() < 32 {
            return Err(KeyError::ShortSecret);
        }
        Ok(Self {
            kid: None,
            algorithm: Algorithm::HS256,
            key: DecodingKey::from_secret(secret)
                .map_err(|e| KeyError::Jwks("secret".into(), e.to_string()))?,
        })
    }

    /// An RS256 or EdDSA public key in PEM, recognised by its content.
    pub fn from_pem(name: &str, pem: &[u8]) -> Result<Self, KeyError> {
        if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
            return Ok(Self {
                kid: None,
                algorithm: Algorithm::RS256,
                key,
            });
        }
        if let Ok(key) = DecodingKey::from_ed_pem(pem) {
            return Ok(Self {
                kid: None,
                algorithm: Algorithm::EdDSA,
                key,
            });
        }
        Err(KeyError::UnknownPem(name.to_owned()))
    }

    /// Every usable key of a JWKS document (each needs `kid` and `alg`).
    pub fn from_jwks(name: &str, json: &str) -> Result<Vec<Self>, KeyError> {
        let set: JwkSet = serde_json::from_str(json)
            .map_err(|e| KeyError::Jwks(name.to_owned(), e.to_string()))?;
        set.keys
            .iter()
            .map(|jwk| {
                let algorithm = jwk
                    .common
                    .key_algorithm
                    .and_then(|a| a.to_string().parse::<Algorithm>().ok())
                    .ok_or_else(|| {
                        KeyError::Jwks(name.to_owned(), "every key needs an `alg`".to_owned())
                    })?;
                Ok(Self {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key: DecodingKey::from_jwk(jwk)
                        .map_err(|e| KeyError::Jwks(name.to_owned(), e.to_string()))?,
                })
            })
            .collect()
    }
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum AuthMode {
    /// No tokens: every call acts as an admin of `default` (explicitly
    /// chosen with `--insecure`; for local development only).
    Insecure,
    /// Tokens verified against these keys.
    Tokens {
        /// The keys.
        keys: Vec<VerificationKey>,
        /// Required `iss`, if set.
        issuer: Option<String>,
        /// Required `aud`, if set.
        audience: Option<String>,
        /// Clock leeway for `exp` and `nbf`, seconds.
        leeway_secs: u64,
    },
}

/// Checks a request's origin and token against the role table.
pub struct Authenticator {
    mode: AuthMode,
    allowed_origins: Vec<String>,
}

impl Authenticator {
    /// An authenticator in `mode`; browsers may call only from
    /// `allowed_origins`.
    pub fn new(mode: AuthMode, allowed_origins: Vec<String>) -> Self {
        Self {
            mode,
            allowed_origins,
        }
    }

    /// The caller of a request to `path`, or the status that refuses it.
    /// `Ok(None)`: a public path.
    pub fn authorize(&self, path: &str, headers: &HeaderMap) -> Result<Option<Caller>, Status> {
        // browsers name their page's origin; only configured ones may call,
        // and, where a token is needed anyway, the page this server served
        // (the dashboard): a token, never a cookie, is what grants access,
        // so a page elsewhere cannot borrow the user's
        if let Some(origin) = headers.get(http::header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default();
            let allowed = self.allowed_origins.iter().any(|a| a == origin)
                || (matches!(self.mode, AuthMode::Tokens { .. }) && same_origin(origin, headers));
            if !allowed {
                return Err(Status::permission_denied(
                    "this origin may not call the API (COMPOSER_CORS_ORIGINS)",
                ));
            }
        }
        if is_public(path) {
            return Ok(None);
        }
        let caller = match &self.mode {
            AuthMode::Insecure => Caller {
                namespace: DEFAULT_NAMESPACE.to_owned(),
                subject: "anonymous".to_owned(),
                roles: vec![Admin],
                queues: None,
                token: format!("{}/anonymous", DEFAULT_NAMESPACE),
            },
            AuthMode::Tokens {
                keys,
                issuer,
                audience,
                leeway_secs,
            } => {
                let token = bearer(headers)?;
                verify(
                    token,
                    keys,
                    issuer.as_deref(),
                    audience.as_deref(),
                    *leeway_secs,
                )?
            }
        };
        let allowed = RPC_ROLES
            .iter()
            .find(|(rpc, _)| *rpc == path)
            .map(|(_, roles)| *roles)
            .unwrap_or(&[Admin]);
        if !caller.roles.iter().any(|r| allowed.contains(r)) {
            return Err(Status::permission_denied(format!(
                "{} may not call {path}",
                caller
                    .roles
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        with_namespace_override(caller, headers).map(Some)
    }
}

/// An admin may act in another namespace by naming it in a header; the
/// name follows the name rule like every other.
fn with_namespace_override(mut caller: Caller, headers: &HeaderMap) -> Result<Caller, Status> {
    if !caller.has(Admin) {
        return Ok(caller);
    }
    let Some(value) = headers.get(NAMESPACE_HEADER) else {
        return Ok(caller);
    };
    let namespace = value.to_str().unwrap_or("\u{fffd}");
    if namespace.is_empty() {
        return Ok(caller);
    }
    composer_coordinator::names::check_name(namespace).map_err(|problem| {
        crate::status::invalid_field(NAMESPACE_HEADER, format!("namespace {problem}"))
    })?;
    caller.namespace = namespace.to_owned();
    Ok(caller)
}

/// True when `origin` names the host this request was sent to.
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let Some(origin_host) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    !host.is_empty() && origin_host.eq_ignore_ascii_case(host)
}

fn bearer(headers: &HeaderMap) -> Result<&str, Status> {
    let value = headers.get(http::header::AUTHORIZATION).ok_or_else(|| {
        Status::unauthenticated("missing authorization: send `authorization: Bearer <token>`")
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))
}

fn verify(
    token: &str,
    keys: &[VerificationKey],
    issuer: Option<&str>,
    audience: Option<&str>,
    leeway_secs: u64,
) -> Result<Caller, Status> {
    // an unknown `alg` (including `none`) fails to parse here
    let header = decode_header(token)
        .map_err(|e| Status::unauthenticated(format!("invalid token: {}", why_refused(&e))))?;
    let candidates = keys.iter().filter(|k| {
        k.algorithm == header.alg
            && (header.kid.is_none() || k.kid.is_none() || k.kid == header.kid)
    });
    let mut last_error = "no key for the token's algorithm".to_owned();
    for key in candidates {
        let mut validation = Validation::new(key.algorithm);
        validation.algorithms = vec![key.algorithm];
        validation.leeway = leeway_secs;
        validation.validate_nbf = true;
        // a configured issuer or audience is a required claim: a token
        // without it is as foreign as one with another value
        let mut required = vec!["exp", "sub"];
        match issuer {
            Some(iss) => {
                validation.set_issuer(&[iss]);
                required.push("iss");
            }
            None => validation.iss = None,
        }
        match audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        match decode::<Claims>(token, &key.key, &validation) {
            Ok(data) => return caller_of(data.claims),
            Err(error) => last_error = why_refused(&error),
        }
    }
    Err(Status::unauthenticated(format!(
        "invalid token: {last_error}"
    )))
}

/// Why a token was refused, in words for its holder: never the decoder's
/// own text (which names byte offsets and base64 symbols of the token).
fn why_refused(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "it has expired".to_owned(),
        ErrorKind::ImmatureSignature => "it is not valid yet (nbf)".to_owned(),
        ErrorKind::InvalidSignature => "its signature does not match the server's keys".to_owned(),
        ErrorKind::InvalidIssuer => "its issuer (iss) is not the one the server expects".to_owned(),
        ErrorKind::InvalidAudience => "its audience (aud) is not this server".to_owned(),
        ErrorKind::MissingRequiredClaim(claim) => format!("it lacks the `{claim}` claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("its `{claim}` claim is malformed"),
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::UnsupportedAlgorithm
        | ErrorKind::MissingAlgorithm => {
            "it is signed with an algorithm the server does not accept".to_owned()
        }
        _ => "it is not a well-formed JWT (three base64url parts: header, claims, signature)"
            .to_owned(),
    }
}

fn caller_of(claims: Claims) -> Result<Caller, Status> {
    if let Err(problem) = composer_coordinator::names::check_name(&claims.ns) {
        return Err(Status::unauthenticated(format!(
            "invalid token: namespace `ns` {problem}"
        )));
    }
    let roles: Vec<Role> = claims.roles.iter().filter_map(|r| Role::parse(r)).collect();
    if roles.is_empty() {
        return Err(Status::permission_denied("the token carries no known role"));
    }
    let token = match claims.jti.filter(|jti| !jti.is_empty()) {
        Some(jti) => format!("jti:{jti}"),
        None => format!("{}/{}", claims.ns, claims.sub),
    };
    Ok(Caller {
        namespace: claims.ns,
        subject: claims.sub,
        roles,
        queues: claims.queues.map(|q| q.into_iter().collect()),
        token,
    })
}

/// A tower layer that authenticates every request before routing.
#[derive(Clone)]
pub struct AuthLayer {
    authenticator: Arc<Authenticator>,
}

impl AuthLayer {
    /// A layer checking with `authenticator`.
    pub fn new(authenticator: Arc<Authenticator>) -> Self {
        Self { authenticator }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            authenticator: Arc::clone(&self.authenticator),
        }
    }
}

/// The service [`AuthLayer`] wraps around the router.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    authenticator: Arc<Authenticator>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> Service<Request<B>> for AuthService<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
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

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        match self
            .authenticator
            .authorize(request.uri().path(), request.headers())
        {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                let future = self.inner.call(request);
                Box::pin(future)
            }
            Err(status) => {
                let response = status.into_http::<R>();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

/// What a minted token says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NewToken {
    /// Subject.
    pub sub: String,
    /// Namespace.
    pub ns: String,
    /// Roles.
    pub roles: Vec<String>,
    /// Queues a worker may poll (omitted: any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Not before.
    pub nbf: u64,
    /// Expires.
    pub exp: u64,
    /// Issuer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// Audience.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

/// The key a token is signed with.
#[derive(Clone, Copy)]
pub enum SigningKey<'a> {
    /// An HS256 shared secret.
    Secret(&'a [u8]),
    /// An RSA or Ed25519 private key in PEM.
    Pem(&'a [u8]),
}

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// A role is not one of admin, operator, client, reader, worker.
    #[error("unknown role {0:?} (use admin, operator, client, reader or worker)")]
    UnknownRole(String),
    /// The key could not be used.
    #[error("signing key: {0}")]
    Key(String),
    /// The namespace breaks the name rule.
    #[error("namespace {0}")]
    Namespace(composer_coordinator::names::NameError),
}

/// Signs a token.
pub fn mint(token: &NewToken, key: SigningKey<'_>, kid: Option<&str>) -> Result<String, MintError> {
    if let Some(role) = token.roles.iter().find(|r| Role::parse(r).is_none()) {
        return Err(MintError::UnknownRole(role.clone()));
    }
    composer_coordinator::names::check_name(&token.ns).map_err(MintError::Namespace)?;
    let (algorithm, encoding) = match key {
        SigningKey::Secret(secret) => {
            if secret.len() < 32 {
                return Err(MintError::Key(
                    "the HS256 secret must be at least 32 bytes".to_owned(),
                ));
            }
            let key = jsonwebtoken::EncodingKey::from_secret(secret)
                .map_err(|e| MintError::Key(e.to_string()))?;
            (Algorithm::HS256, key)
        }
        SigningKey::Pem(pem) => match jsonwebtoken::EncodingKey::from_rsa_pem(pem) {
            Ok(key) => (Algorithm::RS256, key),
            Err(_) => (
                Algorithm::EdDSA,
                jsonwebtoken::EncodingKey::from_ed_pem(pem).map_err(|_| {
                    MintError::Key("not an RSA or Ed25519 private key in PEM".to_owned())
                })?,
            ),
        },
    };
    let mut header = jsonwebtoken::Header::new(algorithm);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, token, &encoding).map_err(|e| MintError::Key(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, value.parse().expect("host"));
        headers
    }

    #[test]
    fn a_page_served_by_this_host_is_its_own_origin() {
        assert!(same_origin(
            "http://127.0.0.1:7070",
            &host("127.0.0.1:7070")
        ));
        assert!(same_origin(
            "https://Composer.example.com",
            &host("composer.example.com")
        ));
    }

    #[test]
    fn another_host_or_port_or_scheme_is_not() {
        assert!(!same_origin(
            "http://127.0.0.1:7071",
            &host("127.0.0.1:7070")
        ));
        assert!(!same_origin(
            "http://evil.example",
            &host("composer.example.com")
        ));
        assert!(!same_origin("null", &host("composer.example.com")));
        assert!(!same_origin("file://", &host("")));
        assert!(!same_origin("http://127.0.0.1:7070", &HeaderMap::new()));
    }
}

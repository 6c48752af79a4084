//! Set-up shared by the end-to-end tests: the binary, servers on a Postgres
//! and Redis of their own (to wipe, freeze or count clients of), and the
//! tokens and channels of servers that check tokens. Each test binary uses
//! part of it.
#![allow(dead_code)]

pub mod cli;

use std::path::PathBuf;

use composer_cli::local_services::{LocalServices, LocalServicesOptions};
use composer_grpc::auth::{NewToken, SigningKey, mint};
use composer_proto::v1::{RegisterWorkflowRequest, workflow_service_client::WorkflowServiceClient};
use composer_testkit::ServerProcess;
use tonic::{Request, transport::Channel};

/// The secret of the servers these tests start with [`TOKEN_ARGS`].
pub const SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256-0123456789";

/// Server flags that make it check tokens signed by [`token`].
pub const TOKEN_ARGS: [&str; 4] = ["--auth-secret", SECRET, "--auth-audience", "composer"];

/// A loopback address nothing listens on yet (for a server's second port).
pub fn free_addr() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    probe.local_addr().expect("addr").to_string()
}

pub fn composer_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

/// A private Postgres and Redis, and the real server on them with `args`.
pub async fn server_on_private_services(args: &[&str]) -> (LocalServices, ServerProcess) {
    let services = LocalServices::start(LocalServicesOptions::default())
        .await
        .expect("private services");
    let server = ServerProcess::start_with(
        &composer_binary(),
        &services.database_url,
        &services.redis_url,
        args,
    )
    .await;
    (services, server)
}

/// A token of `namespace` for `subject` with `roles`, valid for an hour,
/// for a server started with [`TOKEN_ARGS`].
pub fn token(namespace: &str, subject: &str, roles: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let claims = NewToken {
        sub: subject.to_owned(),
        ns: namespace.to_owned(),
        roles: roles.iter().map(|role| (*role).to_owned()).collect(),
        queues: None,
        iat: now,
        nbf: now,
        exp: now + 3600,
        iss: None,
        aud: Some("composer".to_owned()),
    };
    mint(&claims, SigningKey::Secret(SECRET.as_bytes()), None).expect("mint")
}

/// `message` with `token` as its bearer.
pub fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// A channel to `server`.
pub async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

/// Registers `source` as `token`'s namespace.
pub async fn register(channel: &Channel, token: &str, source: &str) {
    WorkflowServiceClient::new(channel.clone())
        .register_workflow(authed(
            RegisterWorkflowRequest {
                source: source.to_owned(),
            },
            token,
        ))
        .await
        .expect("register");
}

/// The first field a BadRequest detail of `status` names ("" if none).
pub fn violated_field(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .and_then(|b| b.field_violations.first().map(|v| v.field.clone()))
        .unwrap_or_default()
}

//! Set-up shared by the end-to-end tests that need a Postgres and Redis of
//! their own (to wipe, freeze or count clients of).

use std::path::PathBuf;

use composer_cli::local_services::{LocalServices, LocalServicesOptions};
use composer_testkit::ServerProcess;

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

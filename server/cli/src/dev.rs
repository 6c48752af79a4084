//! `composer dev`: a private Postgres and Redis in a temporary folder, the
//! server on top, the addresses printed; Ctrl-C stops all of it.

use std::path::PathBuf;

use clap::Args;

use crate::{
    config::{BackendArgs, ServerArgs},
    local_services::{LocalServices, LocalServicesError, LocalServicesOptions},
    serve::{self, StartError},
};

/// Options of `composer dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Keep Postgres and Redis data in this folder (reused next time) instead
    /// of a temporary folder removed at exit.
    #[arg(long)]
    pub data: Option<PathBuf>,

    /// Start only Postgres and Redis, not the server (for test harnesses).
    #[arg(long)]
    pub no_server: bool,

    /// Write `COMPOSER_DATABASE_URL=...` and `COMPOSER_REDIS_URL=...` lines
    /// to this file once everything answers.
    #[arg(long)]
    pub env_file: Option<PathBuf>,

    #[command(flatten)]
    pub server: ServerArgs,
}

/// Why `composer dev` failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Postgres or Redis could not be started.
    #[error(transparent)]
    Services(#[from] LocalServicesError),
    /// The server could not start.
    #[error(transparent)]
    Server(#[from] StartError),
    /// The env file could not be written.
    #[error("--env-file {path}: {source}")]
    EnvFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs `composer dev` until Ctrl-C or SIGTERM.
pub async fn run(args: DevArgs) -> Result<(), DevError> {
    let services = LocalServices::start(LocalServicesOptions {
        data_dir: args.data.clone(),
    })
    .await?;
    let result = run_with(&args, &services).await;
    services.stop().await;
    result
}

async fn run_with(args: &DevArgs, services: &LocalServices) -> Result<(), DevError> {
    if let Some(path) = &args.env_file {
        let text = format!(
            "COMPOSER_DATABASE_URL={}\nCOMPOSER_REDIS_URL={}\n",
            services.database_url, services.redis_url
        );
        std::fs::write(path, text).map_err(|source| DevError::EnvFile {
            path: path.clone(),
            source,
        })?;
    }
    let kept = if services.keeps_data() {
        "kept"
    } else {
        "removed on exit"
    };
    if args.no_server {
        println!("Postgres  {}", services.database_url);
        println!("Redis     {}", services.redis_url);
        println!("data      {} ({kept})", services.root().display());
        serve::shutdown_signal().await;
        return Ok(());
    }

    let backend = BackendArgs {
        database_url: services.database_url.clone(),
        redis_url: services.redis_url.clone(),
    };
    let backends = serve::connect_backends(&backend, &args.server).await?;
    let listener = serve::bind(args.server.listen).await?;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    println!("Composer dev is running");
    println!("  gRPC + grpc-web  http://{addr}");
    println!("  Postgres         {}", services.database_url);
    println!("  Redis            {}", services.redis_url);
    println!("  data             {} ({kept})", services.root().display());
    println!("  try              grpcurl -plaintext {addr} list");
    println!("Press Ctrl-C to stop.");
    serve::run(
        &args.server,
        &backend,
        backends,
        listener,
        serve::shutdown_signal(),
    )
    .await?;
    Ok(())
}

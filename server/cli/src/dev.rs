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
    /// The dev key could not be made or the tokens minted.
    #[error("dev tokens: {0}")]
    Tokens(String),
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
        serve::shutdown_signal_then(services.killer()).await;
        return Ok(());
    }

    let backend = BackendArgs {
        database_url: services.database_url.clone(),
        redis_url: services.redis_url.clone(),
    };
    let mut server = args.server.clone();
    let tokens = dev_tokens(&mut server.auth, services.root())?;
    // large payloads next to the data, gone with it unless kept
    if server.blob_store.is_none() {
        let blobs = services.root().join("blobs");
        server.blob_store = Some(blobs.to_string_lossy().into_owned());
    }
    // metrics on in development, on a free loopback port unless one is set
    if server.metrics_listen.is_none() {
        server.metrics_listen = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|probe| probe.local_addr())
            .ok();
    }
    let backends = serve::connect_backends(&backend, &server).await?;
    let listener = serve::bind(server.listen).await?;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    allow_own_origin(&mut server, &listener);
    println!("Composer dev is running");
    println!("  gRPC + grpc-web  http://{addr}");
    match &tokens {
        // the fragment never reaches the server: the dashboard reads it
        Some((admin, _)) => println!("  dashboard        http://{addr}/#token={admin}"),
        None => println!("  dashboard        http://{addr}/"),
    }
    if let Some(metrics) = server.metrics_listen {
        println!("  metrics          http://{metrics}/metrics  (/healthz, /readyz)");
    }
    println!("  Postgres         {}", services.database_url);
    println!("  Redis            {}", services.redis_url);
    println!("  data             {} ({kept})", services.root().display());
    println!("  address          export COMPOSER_ADDRESS=http://{addr}");
    if let Some(path) = &args.env_file {
        let mut text = format!(
            "COMPOSER_DATABASE_URL={}\nCOMPOSER_REDIS_URL={}\nCOMPOSER_ADDRESS={addr}\n",
            services.database_url, services.redis_url
        );
        if let Some((admin, worker)) = &tokens {
            text.push_str(&format!(
                "COMPOSER_TOKEN={admin}\nCOMPOSER_WORKER_TOKEN={worker}\n"
            ));
        }
        std::fs::write(path, text).map_err(|source| DevError::EnvFile {
            path: path.clone(),
            source,
        })?;
    }
    let grpcurl = grpcurl_command();
    if let Some((admin, worker)) = &tokens {
        println!("  admin token      {admin}");
        println!("  worker token     {worker}");
        println!("  try              export COMPOSER_TOKEN={admin}");
        println!(
            "                   {grpcurl} -plaintext -H \"authorization: Bearer $COMPOSER_TOKEN\" {addr} list"
        );
        println!(
            "  more tokens      composer token --dev-data {} --sub me --role operator",
            services.root().display()
        );
    } else {
        println!("  try              {grpcurl} -plaintext {addr} list");
    }
    println!("Press Ctrl-C to stop.");
    serve::run(
        &server,
        &backend,
        backends,
        listener,
        serve::shutdown_signal_then(services.killer()),
    )
    .await?;
    Ok(())
}

/// The dashboard served on this port calls the API from this port's origin,
/// which the origin check refuses unless listed: list it (as typed in the
/// printed URL, and as `localhost` for a loopback address).
fn allow_own_origin(server: &mut ServerArgs, listener: &tokio::net::TcpListener) {
    let Ok(addr) = listener.local_addr() else {
        return;
    };
    server.cors_origins.push(format!("http://{addr}"));
    if addr.ip().is_loopback() {
        server
            .cors_origins
            .push(format!("http://localhost:{}", addr.port()));
    }
}

/// How to call grpcurl so that the printed command works as typed: by name
/// when it is on PATH, else the path of the copy `make setup` installs.
fn grpcurl_command() -> String {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("grpcurl").is_file()));
    if on_path {
        return "grpcurl".to_owned();
    }
    // the repository's own copy (`make dev` installs it), found from here
    // or from where this binary was built (`target/debug/composer`)
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    let places = std::env::current_dir().ok().into_iter().chain(exe_dir);
    for place in places {
        if let Some(found) = place
            .ancestors()
            .map(|dir| dir.join(".tools/bin/grpcurl"))
            .find(|path| path.is_file())
        {
            return found.display().to_string();
        }
    }
    println!(
        "  grpcurl          not found; go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest"
    );
    "grpcurl".to_owned()
}

/// Unless a key or `--insecure` was given, makes an HS256 secret (kept in the
/// data folder, so `--data` keeps tokens valid across restarts) and mints an
/// admin and a worker token for the `default` namespace, valid a day.
fn dev_tokens(
    auth: &mut crate::config::AuthArgs,
    root: &std::path::Path,
) -> Result<Option<(String, String)>, DevError> {
    if auth.insecure || !auth.auth_public_key.is_empty() || auth.auth_jwks.is_some() {
        return Ok(None);
    }
    let secret = match &auth.auth_secret {
        Some(secret) => secret.clone(),
        None => {
            let path = root.join(crate::auth::DEV_SECRET_FILE);
            let secret = match std::fs::read_to_string(&path) {
                Ok(existing) if existing.trim().len() >= 32 => existing.trim().to_owned(),
                _ => {
                    let fresh = format!(
                        "{}{}",
                        uuid::Uuid::new_v4().simple(),
                        uuid::Uuid::new_v4().simple()
                    );
                    std::fs::write(&path, &fresh).map_err(|e| DevError::Tokens(e.to_string()))?;
                    fresh
                }
            };
            auth.auth_secret = Some(secret.clone());
            secret
        }
    };
    let mint = |sub: &str, role: &str, queues: Option<Vec<String>>| {
        crate::auth::mint_token(&crate::auth::TokenArgs {
            sub: sub.to_owned(),
            ns: "default".to_owned(),
            role: vec![role.to_owned()],
            queues,
            ttl: std::time::Duration::from_secs(24 * 3600),
            auth_secret: Some(secret.clone()),
            private_key: None,
            dev_data: None,
            kid: None,
            issuer: auth.auth_issuer.clone(),
            audience: auth.auth_audience.clone(),
        })
        .map_err(|e| DevError::Tokens(e.to_string()))
    };
    Ok(Some((
        mint("dev-admin", "admin", None)?,
        mint("dev-worker", "worker", Some(vec!["*".to_owned()]))?,
    )))
}

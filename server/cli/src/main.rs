//! `composer`: the server, its dev mode, and admin subcommands.

use std::process::ExitCode;

// The server allocates a little for every message, row and event; glibc's
// malloc was a third of its CPU under load (BENCHMARKS.md, decision 0025).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, Parser, Subcommand};
use clap_complete::Shell;
use composer_cli::{
    admin::{
        self, EXIT_CODES_HELP, bulk::OperationCommand, queue::QueueCommand, run::RunCommand,
        schedule::ScheduleCommand, secret::SecretCommand, server::ServerCommand,
        workflow::WorkflowCommand as RemoteWorkflowCommand,
    },
    auth::{self, TokenArgs},
    config::{BackendArgs, LogFormat, ServerArgs},
    dev::{self, DevArgs},
    logging, serve,
    workflow_test::{self, WorkflowTestArgs},
};

#[derive(Debug, Parser)]
#[command(
    name = "composer",
    version,
    about = "Composer: a distributed workflow engine",
    after_help = EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve gRPC and grpc-web against Postgres and Redis.
    Serve {
        #[command(flatten)]
        backend: BackendArgs,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Start a private Postgres and Redis, migrate, and serve; Ctrl-C stops all.
    Dev(DevArgs),
    /// Mint a token signed with the configured key.
    Token(TokenArgs),
    /// Work with workflow definitions: on a server, or offline (`test`).
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Start, read and steer runs on a server.
    #[command(subcommand)]
    Run(RunCommand),
    /// Follow and stop bulk operations on runs (`run bulk-*` starts them).
    #[command(subcommand)]
    Operation(OperationCommand),
    /// Create, read, pause and fire schedules that start runs on a timetable.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Set and read queue settings: rate limits.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Set, list and delete the namespace's secrets (values are never shown).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Ask a server about itself.
    #[command(subcommand)]
    Server(ServerCommand),
    /// Print a shell completion script, e.g. `composer completions bash > /etc/bash_completion.d/composer`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        backend: BackendArgs,
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Debug, Subcommand)]
enum WorkflowCommand {
    /// Run a workflow in the simulator with scripted outcomes; no server needed.
    Test(WorkflowTestArgs),
    #[command(flatten)]
    Remote(RemoteWorkflowCommand),
}

fn main() -> ExitCode {
    let args = admin::global_flags::hoist(std::env::args_os().collect());
    match Cli::parse_from(args).command {
        Command::Token(args) => match auth::mint_token(&args) {
            Ok(token) => {
                println!("{token}");
                ExitCode::SUCCESS
            }
            Err(error) => fail(&error),
        },
        Command::Workflow(WorkflowCommand::Test(args)) => match workflow_test::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error),
        },
        Command::Workflow(WorkflowCommand::Remote(command)) => {
            admin::execute(admin::workflow::run(command))
        }
        Command::Run(command) => admin::execute(admin::run::run(command)),
        Command::Operation(command) => admin::execute(admin::bulk::run(command)),
        Command::Schedule(command) => admin::execute(admin::schedule::run(command)),
        Command::Queue(command) => admin::execute(admin::queue::run(command)),
        Command::Secret(command) => admin::execute(admin::secret::run(command)),
        Command::Server(command) => admin::execute(admin::server::run(command)),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "composer",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        command => serve_or_migrate(command),
    }
}

/// Threads for blocking work (blob files) at most.
const BLOCKING_THREADS: usize = 8;

/// The commands that run the server or touch its backends.
fn serve_or_migrate(command: Command) -> ExitCode {
    // made before the runtime and dropped after it: its HTTP client blocks
    let (exporter, mut trace_layer) = match trace_exporter(&command) {
        Ok(Some((exporter, layer))) => (Some(exporter), Some(layer)),
        Ok(None) => (None, None),
        Err(error) => return fail(&error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // the blocking threads write and read blob files (a sync each):
        // tokio's 512 grew to 200 under B1's 100 KB payloads, each thread
        // with an allocator heap of its own, and the server's memory with
        // them; a few dozen keep the disk busy
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error),
    };
    let result: anyhow::Result<()> = runtime.block_on(async move {
        match command {
            Command::Serve { backend, server } => {
                // refuse a server without authentication before touching anything
                auth::auth_mode(&server.auth)?;
                logging::init(server.log_format, &server.log, trace_layer.take());
                let backends = serve::connect_backends(&backend, &server).await?;
                let listener = serve::bind(server.listen).await?;
                serve::run(
                    &server,
                    &backend,
                    backends,
                    listener,
                    serve::shutdown_signal(),
                )
                .await?;
            }
            Command::Dev(args) => {
                // text for a person at a terminal; what the flags say (JSON by
                // default) when asked for, or when the log goes to a file
                let asked = std::env::var_os("COMPOSER_LOG_FORMAT").is_some()
                    || std::env::args().any(|arg| arg.starts_with("--log-format"));
                let format = if asked || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    args.server.log_format
                } else {
                    LogFormat::Text
                };
                logging::init(format, &args.server.log, trace_layer.take());
                dev::run(args).await?;
            }
            Command::Workflow(_)
            | Command::Token(_)
            | Command::Run(_)
            | Command::Operation(_)
            | Command::Schedule(_)
            | Command::Queue(_)
            | Command::Secret(_)
            | Command::Server(_)
            | Command::Completions { .. } => {}
            Command::Migrate { backend, server } => {
                logging::init(server.log_format, &server.log, None);
                serve::migrate(&backend, &server).await?;
                println!("migrations applied");
            }
        }
        Ok(())
    });
    // Do not wait for tasks still parked on long polls or timers.
    runtime.shutdown_background();
    drop(exporter);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&*error),
    }
}

/// The trace exporter a serving command asked for, if any.
fn trace_exporter(
    command: &Command,
) -> Result<
    Option<(composer_cli::traces::TraceExporter, TraceLayer)>,
    composer_cli::traces::TraceSetupError,
> {
    let server = match command {
        Command::Serve { server, .. } => server,
        Command::Dev(args) => &args.server,
        _ => return Ok(None),
    };
    let Some(endpoint) = server.otlp_endpoint.as_deref() else {
        return Ok(None);
    };
    composer_cli::traces::install(endpoint, server.otlp_sample_ratio).map(Some)
}

type TraceLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Prints one line, never a backtrace: the error names what to fix.
fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("composer: error: {error}");
    ExitCode::FAILURE
}

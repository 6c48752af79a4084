//! `composer-loadgen`: the server benchmarks of issue #7 (`make bench`,
//! `make bench-quick`). Starts Postgres and Redis with the dev settings,
//! measures the machine's floor with pgbench, then B1..B5 against release
//! servers, prints a table and appends it, dated, to BENCHMARKS.md. It
//! reports; it never fails on a time.

mod benches;
mod bulk;
mod chain;
mod listing;
mod noisy;
mod observability;
mod payload;
mod procs;
mod wal;
mod worker;
mod write_floor;

use std::{fmt::Write as _, path::PathBuf, time::Instant};

use anyhow::{Context, Result};
use benches::{
    Ctx, Dist, FanOut, Floor, Latency, Profile, SdkWorker, Throughput, Timers, WorkerKind,
};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "composer-loadgen",
    about = "Composer server benchmarks (issue #7)"
)]
struct Args {
    /// `quick` (about 6 minutes), `full` (about 30 minutes) or `check`
    /// (`make test`: every row in small windows, figures never quoted).
    #[arg(long, default_value = "quick")]
    profile: String,
    /// The release server binary.
    #[arg(long, default_value = "target/release/composer")]
    composer: PathBuf,
    /// A Python with the SDK installed (the Python-worker row is left out without it).
    #[arg(long)]
    python: Option<PathBuf>,
    /// The Go SDK's B1 worker, built (`bench/go_worker`).
    #[arg(long)]
    go_worker: Option<PathBuf>,
    /// The TypeScript SDK's B1 worker script (`bench/ts_worker/worker.mjs`),
    /// run with `node`; the SDK must be built.
    #[arg(long)]
    ts_worker: Option<PathBuf>,
    /// Append the dated table to this file.
    #[arg(long)]
    append: Option<PathBuf>,
    /// The command to quote with the results.
    #[arg(long, default_value = "composer-loadgen")]
    command: String,
    /// Only these sections (comma-separated:
    /// floor,b1,sdk,payload,b2,b3,b4,b7,b5,b6,obs,bulk,migrate,b8).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Sample the machine with perf for this many seconds during B1 (the
    /// full profile does 15).
    #[arg(long)]
    perf_secs: Option<u64>,
    /// Sample the machine with perf for this many seconds during every B5
    /// row, to see where several servers spend what one does not.
    #[arg(long)]
    perf_b5_secs: Option<u64>,
    /// Runs in flight in the B1 rows (200 in both profiles): to ask
    /// whether a deeper loop would change a row.
    #[arg(long)]
    in_flight: Option<usize>,
    /// Runs in flight in B5, over all servers (1,200 in both profiles).
    #[arg(long)]
    scale_in_flight: Option<usize>,
    /// B5's CPU budget per server, in cores (0.25 in both profiles); 0
    /// leaves the budgeted series out.
    #[arg(long)]
    server_cores: Option<f64>,
}

/// One B5 series: every server count, in rounds.
struct ScaleSeries {
    /// Each server's CPU budget; None: the machine's cores, shared.
    cores: Option<f64>,
    /// Each server count's median row.
    rows: Vec<Throughput>,
    /// For each count above one, its ratio to one server in each round.
    ratios: Vec<(usize, Vec<f64>)>,
}

#[derive(Default)]
struct Results {
    floor: Option<Floor>,
    b1: Option<Throughput>,
    /// The floor of B1's own row writes (after B1, from its rows).
    write_floor: Option<write_floor::WriteFloor>,
    sdk: Vec<Throughput>,
    sdk_notes: Vec<String>,
    latency: Option<Latency>,
    fan: Option<Vec<FanOut>>,
    timers: Option<Timers>,
    /// B5: with each server held to its CPU budget (the target's series,
    /// when the machine allows budgets), then on the machine's shared cores.
    scale: Vec<ScaleSeries>,
    listing: Option<listing::Listing>,
    observability: Option<observability::Observability>,
    bulk: Option<bulk::BulkCost>,
    migrate: Option<bulk::BulkCost>,
    payload: Option<Vec<payload::PayloadRow>>,
    chain: Option<chain::Chain>,
    noisy: Option<noisy::Noisy>,
    failures: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let mut profile = match args.profile.as_str() {
        "full" => Profile::full(),
        "check" => Profile::check(),
        _ => Profile::quick(),
    };
    if let Some(secs) = args.perf_secs {
        profile.perf_secs = secs;
    }
    if let Some(secs) = args.perf_b5_secs {
        profile.scale_perf_secs = secs;
    }
    if let Some(runs) = args.in_flight {
        profile.in_flight = runs.max(1);
    }
    if let Some(runs) = args.scale_in_flight {
        profile.scale_in_flight = runs.max(1);
    }
    if let Some(cores) = args.server_cores {
        profile.scale_server_cores = cores.max(0.0);
    }
    let repo = std::env::current_dir()?;
    let composer = repo.join(&args.composer);
    anyhow::ensure!(
        composer.is_file(),
        "{} not found: cargo build --release -p composer-cli",
        composer.display()
    );
    let out_dir = repo.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let began = Instant::now();
    let date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    eprintln!(
        "bench: profile {}, starting Postgres and Redis",
        profile.name
    );
    let backends = procs::Backends::start(&composer).await?;
    let (sdk_workers, sdk_notes) = sdk_workers(&args, &repo).await;
    let ctx = Ctx::new(composer, backends, profile, out_dir, sdk_workers, repo).await?;
    let run_all = async {
        let sdk_wanted = ["sdk", "py"].iter().any(|name| wanted(&args, name));
        let mut results = Results {
            // a left-out SDK row is news only where SDK rows were asked for
            sdk_notes: if sdk_wanted { sdk_notes } else { Vec::new() },
            ..Results::default()
        };
        sections(&ctx, &args, &mut results).await;
        results
    };
    let results = tokio::select! {
        results = run_all => results,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("bench: interrupted; stopping Postgres and Redis");
            let Ctx { backends, .. } = ctx;
            backends.stop().await;
            anyhow::bail!("interrupted");
        }
    };
    let statements = ctx.backends.statements;
    let Ctx { backends, .. } = ctx;
    backends.stop().await;
    let elapsed = began.elapsed().as_secs();
    let table = render(&results, statements);
    let details = render_details(&results);
    println!("\n{table}\n{details}");
    let machine = procs::machine();
    println!("machine: {machine}; took {elapsed} s");
    if let Some(path) = &args.append {
        let mut text = std::fs::read_to_string(path).unwrap_or_default();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let _ = write!(
            text,
            "\n### {date}: {} profile ({elapsed} s)\n\nMachine: {machine}. Command: `{}`\n\n{table}\n{details}",
            args.profile, args.command
        );
        std::fs::write(path, text).with_context(|| format!("append to {}", path.display()))?;
        println!("appended to {}", path.display());
    }
    // a section that could not run is a broken build, not a slow one
    anyhow::ensure!(
        results.failures.is_empty(),
        "{} benchmark section(s) failed: {}",
        results.failures.len(),
        results.failures.join("; ")
    );
    Ok(())
}

/// The SDK workers given that can run here, and a note for each left out.
async fn sdk_workers(args: &Args, repo: &std::path::Path) -> (Vec<SdkWorker>, Vec<String>) {
    let mut workers = Vec::new();
    let mut notes = Vec::new();
    let candidates = [
        (
            "Python SDK",
            args.python.as_ref().map(|python| {
                vec![
                    python.display().to_string(),
                    repo.join("bench/python_worker.py").display().to_string(),
                ]
            }),
            "no Python given (--python)",
        ),
        (
            "Go SDK",
            args.go_worker
                .as_ref()
                .map(|binary| vec![binary.display().to_string()]),
            "no Go worker given (--go-worker)",
        ),
        (
            "TypeScript SDK",
            args.ts_worker
                .as_ref()
                .map(|script| vec!["node".to_owned(), script.display().to_string()]),
            "no TypeScript worker given (--ts-worker)",
        ),
    ];
    for (name, command, missing) in candidates {
        let Some(command) = command else {
            notes.push(format!("{name}: {missing}"));
            continue;
        };
        match runnable(&command, repo).await {
            Ok(()) => workers.push(SdkWorker {
                name: name.to_owned(),
                command,
            }),
            Err(why) => notes.push(format!("{name}: {why}")),
        }
    }
    (workers, notes)
}

/// Whether `--only` asks for a section (no `--only`: every one).
fn wanted(args: &Args, name: &str) -> bool {
    args.only.is_empty() || args.only.iter().any(|o| o == name)
}

/// Checks that the worker's program starts (its usage error counts: it ran).
async fn runnable(command: &[String], repo: &std::path::Path) -> Result<(), String> {
    let (program, args) = command.split_first().ok_or("empty command")?;
    let mut probe = tokio::process::Command::new(program);
    probe.args(args).current_dir(repo);
    if program.ends_with("python") || program.contains("python3") {
        // the script needs the SDK: import it instead of running the script
        probe = tokio::process::Command::new(program);
        probe
            .args(["-c", "import composer; composer.Worker.register"])
            .current_dir(repo);
    }
    match probe.output().await {
        Ok(out) if out.status.success() || out.status.code() == Some(2) => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("it exited non-zero")
            .to_owned()),
        Err(e) => Err(format!("{program}: {e}")),
    }
}

async fn sections(ctx: &Ctx, args: &Args, results: &mut Results) {
    let want = |name: &str| wanted(args, name);
    macro_rules! section {
        ($name:expr, $body:expr) => {{
            let t = Instant::now();
            eprintln!("bench: {} ...", $name);
            let outcome = $body.await;
            eprintln!(
                "bench: {} done in {:.0} s",
                $name,
                t.elapsed().as_secs_f64()
            );
            match outcome {
                Ok(v) => Some(v),
                Err(e) => {
                    eprintln!("bench: {} failed: {e:#}", $name);
                    results.failures.push(format!("{}: {e:#}", $name));
                    None
                }
            }
        }};
    }
    let profile = ctx.profile.clone();
    if want("floor") {
        results.floor = section!("floor (pgbench)", benches::floor(ctx));
    }
    if want("b1") {
        results.b1 = section!("B1 Rust worker", benches::b1(ctx));
        if let Some(b1) = results.b1.clone() {
            results.write_floor = section!(
                "floor of B1's own writes (pgbench)",
                write_floor::write_floor(ctx, &b1)
            );
        }
    }
    if want("sdk") || want("py") {
        for sdk in ctx.sdk_workers.clone() {
            let label = format!("B1 {} worker", sdk.name);
            if let Some(row) = section!(
                label.as_str(),
                benches::throughput(
                    ctx,
                    &label,
                    1,
                    WorkerKind::Sdk(sdk),
                    profile.sdk_secs,
                    0,
                    &[]
                )
            ) {
                results.sdk.push(row);
            }
        }
    }
    if want("payload") {
        results.payload = section!("B1 with large payloads", payload::payload(ctx));
    }
    if want("b2") {
        results.latency = section!("B2 latency", benches::latency(ctx));
    }
    if want("b3") {
        results.fan = section!("B3 fan-out", benches::fan_out(ctx));
    }
    if want("b4") {
        results.timers = section!("B4 timers", benches::timers(ctx));
    }
    if want("b7") {
        results.chain = section!("B7 a long sequential run", chain::chain(ctx));
    }
    if want("b6") {
        results.listing = section!("B6 large history", listing::listing(ctx));
    }
    if want("obs") {
        results.observability = section!(
            "B1 with metrics and traces on",
            observability::observability(ctx)
        );
    }
    if want("bulk") {
        results.bulk = section!(
            "a bulk retry against live dispatch",
            bulk::bulk_cost(ctx, bulk::BulkBench::Retry)
        );
    }
    if want("migrate") {
        results.migrate = section!(
            "MigrateRuns against live dispatch",
            bulk::bulk_cost(ctx, bulk::BulkBench::Migrate)
        );
    }
    if want("b8") {
        results.noisy = section!("B8 noisy neighbours", noisy::noisy(ctx));
    }
    if want("b5") {
        let cores = ctx.profile.scale_server_cores;
        if cores > 0.0 && procs::cpu_budgets_work() {
            scale_out(ctx, results, Some(cores)).await;
        } else if cores > 0.0 {
            eprintln!(
                "bench: B5 per-server CPU budgets need a writable cgroup cpu controller; left out"
            );
        }
        scale_out(ctx, results, None).await;
    }
}

/// B5: one, two and three servers, in rounds that each start with the next
/// count, so that no count always runs first or always after another's
/// load; each count's median row counts, and each round gives a ratio.
/// With `cores`, each server is held to that much CPU, as servers on
/// machines of their own are (docs/decisions/0031).
async fn scale_out(ctx: &Ctx, results: &mut Results, cores: Option<f64>) {
    let counts = &ctx.profile.scale_servers;
    let rounds = ctx.profile.scale_rounds.max(1);
    let secs = (ctx.profile.measure_secs / rounds as u64).max(5);
    let mut rows: Vec<(usize, Throughput)> = Vec::new();
    for round in 0..rounds {
        for turn in 0..counts.len() {
            let n = counts[(round + turn) % counts.len()];
            let budget = cores
                .map(|c| format!(", {c} core each"))
                .unwrap_or_default();
            let label = format!("B5 {n} server{}{budget}", if n == 1 { "" } else { "s" });
            let t = Instant::now();
            eprintln!("bench: {label} (round {}) ...", round + 1);
            let load = benches::Load {
                kind: WorkerKind::Rust,
                measure_secs: secs,
                perf_secs: ctx.profile.scale_perf_secs,
                payload_bytes: 0,
                offload_bytes: 0,
                in_flight: ctx.profile.scale_in_flight,
                server_cores: cores,
                wal_breakdown: false,
            };
            let row = benches::throughput_of(ctx, &label, n, load, &[]).await;
            eprintln!("bench: {label} done in {:.0} s", t.elapsed().as_secs_f64());
            match row {
                Ok(row) => rows.push((round, row)),
                Err(e) => {
                    eprintln!("bench: {label} failed: {e:#}");
                    results.failures.push(format!("{label}: {e:#}"));
                }
            }
        }
    }
    let mut series = ScaleSeries {
        cores,
        rows: Vec::new(),
        ratios: Vec::new(),
    };
    for &n in counts {
        let mut of_count: Vec<&Throughput> = rows
            .iter()
            .filter(|(_, r)| r.servers == n)
            .map(|(_, r)| r)
            .collect();
        of_count.sort_by(|a, b| a.tasks_per_s.total_cmp(&b.tasks_per_s));
        if let Some(row) = of_count.get(of_count.len() / 2) {
            series.rows.push((*row).clone());
        }
    }
    let per_round = |round: usize, n: usize| {
        rows.iter()
            .find(|(r, row)| *r == round && row.servers == n)
            .map(|(_, row)| row.tasks_per_s)
    };
    for &n in counts.iter().filter(|&&n| n > 1) {
        let ratios = (0..rounds)
            .filter_map(|round| Some(per_round(round, n)? / per_round(round, 1)?))
            .collect();
        series.ratios.push((n, ratios));
    }
    if !series.rows.is_empty() {
        results.scale.push(series);
    }
}

/// The floor of B1's own writes: its throughput, its groups, and what it
/// cost Postgres.
fn write_floor_rows(t: &mut String, f: &write_floor::WriteFloor) {
    let g = &f.groups;
    let _ = writeln!(
        t,
        "| floor | pgbench, B1's own row writes (a B1 run's rows as the template) in B1's median groups: {}, {} tasks finished per event transaction; tasks leased {} ({} clients) | **{:.0} tasks/s** | | |",
        if g.start_in_event {
            format!(
                "{} runs started in each event transaction",
                g.runs_per_block
            )
        } else {
            format!("{} runs per start group", g.starts)
        },
        f.tasks_per_round,
        match g.lease {
            write_floor::LeaseAt::Arm => "as they are armed (written LEASED)".to_owned(),
            write_floor::LeaseAt::AfterArm => "in the transaction that armed them".to_owned(),
            write_floor::LeaseAt::Apart(batch) => format!("in batches of {batch}"),
        },
        f.clients,
        f.tasks_per_s
    );
    let _ = writeln!(
        t,
        "| floor | B1's own row writes: WAL bytes per task; Postgres CPU s per 1,000 tasks | {:.0}; {:.2} | | |",
        f.wal_bytes_per_task, f.pg_cpu
    );
}

/// B1's WAL beside the floor's, by relation: the check that the floor
/// writes what B1 writes.
fn write_floor_table(t: &mut String, b1: &Throughput, f: &write_floor::WriteFloor) {
    let (Some(ours), Some(theirs)) = (&b1.wal, &f.wal) else {
        return;
    };
    let s = &f.shapes;
    let _ = writeln!(
        t,
        "B1's transactions (pg_waldump, by the rows each transaction id wrote): median {:.0} runs per start group ({} groups), {:.0} runs per event group ({} groups), {:.0} tasks per lease batch ({} batches); tasks leased as armed {:.0} %, by an update where armed {:.0} %, in batches of their own {:.0} %; {:.0} % of the runs started in event groups.\n\nWAL per task by relation, B1 and the floor of its own writes (records per task by type):\n\n| relation | B1 bytes / task | floor bytes / task | B1 records | floor records |\n| --- | --- | --- | --- | --- |",
        s.starts.median,
        s.starts.transactions,
        s.events.median,
        s.events.transactions,
        s.leases.median,
        s.leases.transactions,
        100.0 * s.leases_at.at_arm,
        100.0 * s.leases_at.after_arm,
        100.0 * s.leases_at.apart,
        100.0 * s.starts_in_events,
    );
    let records = |share: Option<&wal::RelationShare>| {
        share.map_or(String::new(), |share| {
            share
                .records
                .iter()
                .take(5)
                .map(|(kind, count, _)| format!("{kind} {count:.2}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    };
    for share in ours.by_relation.iter().take(20) {
        // a day's history partition has the day in its name
        let key = |name: &str| {
            name.trim_end_matches(|c: char| c.is_ascii_digit())
                .to_owned()
        };
        let floor_share = theirs
            .by_relation
            .iter()
            .find(|other| key(&other.relation) == key(&share.relation));
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} | {} | {} |",
            share.relation,
            share.bytes_per_task,
            floor_share.map_or("–".to_owned(), |f| format!("{:.0}", f.bytes_per_task)),
            records(Some(share)),
            records(floor_share),
        );
    }
    let _ = writeln!(
        t,
        "| all | {:.0} | {:.0} | | |\n",
        b1.wal_bytes_per_task, f.wal_bytes_per_task
    );
}

/// The costliest statements of a throughput row (by execution time), per task.
fn statements_table(t: &mut String, row: &benches::Throughput) {
    if row.top_statements.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "Statements per task in {}, costliest first (pg_stat_statements):\n\n| calls / task | exec ms / task | statement |\n| --- | --- | --- |",
        row.label
    );
    for (q, calls, ms) in &row.top_statements {
        let short: String = q.chars().take(110).collect();
        let _ = writeln!(
            t,
            "| {calls:.2} | {ms:.3} | `{}` |",
            short.replace('|', "/")
        );
    }
    t.push('\n');
}

/// Where a row's WAL went, per task: by record type, then by relation.
fn wal_tables(t: &mut String, row: &benches::Throughput) {
    let Some(wal) = &row.wal else {
        return;
    };
    let _ = writeln!(
        t,
        "WAL per task in {} by record type, largest first (pg_waldump over the window; {:.0} bytes per task in all):\n\n| record type | records / task | record bytes / task | full-page-image bytes / task |\n| --- | --- | --- | --- |",
        row.label, row.wal_bytes_per_task
    );
    for share in wal.by_record.iter().take(20) {
        let _ = writeln!(
            t,
            "| {} | {:.2} | {:.0} | {:.0} |",
            share.record_type,
            share.records_per_task,
            share.record_bytes_per_task,
            share.fpi_bytes_per_task
        );
    }
    let _ = writeln!(
        t,
        "\nWAL per task in {} by relation (each record's first block; records without one by resource manager), largest first:\n\n| relation | bytes / task | of which: record type (records / task) bytes / task |\n| --- | --- | --- |",
        row.label
    );
    for share in wal.by_relation.iter().take(20) {
        let parts: Vec<String> = share
            .records
            .iter()
            .take(5)
            .map(|(kind, count, bytes)| format!("{kind} ({count:.2}) {bytes:.0}"))
            .collect();
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} |",
            share.relation,
            share.bytes_per_task,
            parts.join("; ")
        );
    }
    t.push('\n');
}

/// The SDK issues' targets, as a ratio to the Rust worker.
fn sdk_target(label: &str) -> Option<f64> {
    if label.contains("Go SDK") {
        Some(0.9)
    } else if label.contains("TypeScript SDK") {
        Some(0.7)
    } else {
        None
    }
}

/// B5's median rows, then each count's ratio to one server: of the
/// medians, and round by round (the target holds when every round meets
/// it). The target is the first series': the budgeted one, where there is.
fn scale_rows(t: &mut String, r: &Results, floor: Option<f64>, statements: bool) {
    for (index, series) in r.scale.iter().enumerate() {
        for row in &series.rows {
            throughput_rows(t, row, floor, false, statements);
        }
        let one = series
            .rows
            .iter()
            .find(|row| row.servers == 1)
            .map(|row| row.tasks_per_s);
        let what = match series.cores {
            Some(cores) => format!("B5 scale-out, {cores} core each"),
            None => "B5 scale-out, shared cores".to_owned(),
        };
        for (n, ratios) in &series.ratios {
            let Some(median_row) = series.rows.iter().find(|row| row.servers == *n) else {
                continue;
            };
            let Some(one) = one else {
                continue;
            };
            let shown: Vec<String> = ratios.iter().map(|x| format!("{x:.2}")).collect();
            let target = *n == 3 && index == 0;
            let _ = writeln!(
                t,
                "| {what} | {n} servers / 1 server, tasks/s: of the medians (each round) | {:.2} ({}) | {} | {} |",
                median_row.tasks_per_s / one,
                shown.join(", "),
                if target {
                    "≥ 1 (3 servers), every round"
                } else {
                    ""
                },
                if target {
                    verdict(!ratios.is_empty() && ratios.iter().all(|x| *x >= 1.0))
                } else {
                    ""
                },
            );
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets" } else { "**misses**" }
}

fn d3(d: &Dist) -> String {
    format!("{:.1} / {:.1} / {:.1} (n={})", d.p50, d.p99, d.max, d.n)
}

fn render(r: &Results, statements: bool) -> String {
    let mut t = String::from(
        "| benchmark | measure | result | target | verdict |\n| --- | --- | --- | --- | --- |\n",
    );
    let floor = r.floor.as_ref().map(|f| f.multi_tps);
    if let Some(f) = &r.floor {
        let _ = writeln!(
            t,
            "| floor | pgbench, the event transaction as 8 round trips ({} clients) | **{:.0} TPS** | | |",
            f.clients, f.multi_tps
        );
        let _ = writeln!(
            t,
            "| floor | the same writes as one statement (CTE) | {:.0} TPS | | |",
            f.cte_tps
        );
    }
    if let Some(f) = &r.write_floor {
        write_floor_rows(&mut t, f);
    }
    if let Some(row) = &r.b1 {
        throughput_rows(&mut t, row, floor, true, statements);
        if let Some(f) = &r.write_floor {
            let ratio = row.tasks_per_s / f.tasks_per_s;
            let _ = writeln!(
                t,
                "| {} | tasks/s as a ratio of the floor of its own writes (what the rest of the system costs of the machine's write capacity) | {ratio:.2} × | ≤ 1 (a floor) | {} |",
                row.label,
                if ratio <= 1.0 {
                    "a floor"
                } else {
                    "**not a floor**"
                }
            );
        }
    }
    for row in &r.sdk {
        throughput_rows(&mut t, row, floor, true, statements);
        if let Some(rust) = &r.b1 {
            let ratio = row.tasks_per_s / rust.tasks_per_s.max(f64::MIN_POSITIVE);
            let target = sdk_target(&row.label);
            let _ = writeln!(
                t,
                "| {} | tasks/s as a ratio to the Rust worker in this run | {ratio:.2} × | {} | {} |",
                row.label,
                target.map_or(String::new(), |x| format!("≥ {x} ×")),
                target.map_or("", |x| verdict(ratio >= x)),
            );
        }
    }
    for note in &r.sdk_notes {
        let _ = writeln!(t, "| B1 SDK worker | left out | {note} | | |");
    }
    if let Some(l) = &r.latency {
        let _ = writeln!(
            t,
            "| B2 latency ({:.1} runs/s) | StartRun → first task leased, ms p50 / p99 / max | {} | p50 ≤ 5 | {} |",
            l.rate,
            d3(&l.start_to_lease),
            verdict(l.start_to_lease.p50 <= 5.0)
        );
        let _ = writeln!(
            t,
            "| B2 latency | report → next task leased, ms p50 / p99 / max | {} | p50 ≤ 3, p99 ≤ 15 | {} |",
            d3(&l.dispatch),
            verdict(l.dispatch.p50 <= 3.0 && l.dispatch.p99 <= 15.0)
        );
        let _ = writeln!(
            t,
            "| B2 latency | whole run (3 tasks), ms p50 / p99 / max | {} | | |",
            d3(&l.whole_run)
        );
    }
    if let Some(fan) = &r.fan {
        for shape in ["FORK/JOIN", "MAP"] {
            let cases: Vec<&FanOut> = fan.iter().filter(|f| f.shape == shape).collect();
            for c in &cases {
                let tries: Vec<String> = c.tries.iter().map(|s| format!("{s:.2}")).collect();
                let _ = writeln!(
                    t,
                    "| B3 fan-out | {shape} of {} branches, start → run completed, the median of {} runs ({} s) | {:.2} s ({:.0} tasks/s) | | |",
                    c.branches,
                    c.tries.len(),
                    tries.join(", "),
                    c.secs,
                    c.branches as f64 / c.secs
                );
            }
            if let [small, large] = cases[..] {
                let ratio = large.secs / small.secs;
                let _ = writeln!(
                    t,
                    "| B3 fan-out | {shape} time ratio {} / {} | {ratio:.1} | ≤ 12 | {} |",
                    large.branches,
                    small.branches,
                    verdict(ratio <= 12.0)
                );
            }
        }
    }
    for wide in r
        .fan
        .iter()
        .flatten()
        .filter(|f| f.shape == benches::WIDE_MAP)
    {
        let _ = writeln!(
            t,
            "| B3 fan-out | MAP of {} elements (concurrency 10,000) on a server of its own, start → run completed; the server's peak RSS | {:.2} s ({:.0} tasks/s); {:.0} MiB | | |",
            wide.branches,
            wide.secs,
            wide.branches as f64 / wide.secs,
            wide.peak_rss_mib.unwrap_or_default()
        );
    }
    if let Some(tm) = &r.timers {
        let _ = writeln!(
            t,
            "| B4 timers | {} runs in a 2 s WAIT (started in {:.1} s, {} completed): due → fired, ms p50 / p99 / max | {} | p99 ≤ 500 | {} |",
            tm.runs,
            tm.start_secs,
            tm.completed,
            d3(&tm.lag),
            verdict(tm.lag.p99 <= 500.0 && tm.completed as usize == tm.runs)
        );
    }
    if let Some(rows) = &r.payload {
        payload_rows(&mut t, rows, r.b1.as_ref());
    }
    if let Some(chain) = &r.chain {
        chain_rows(&mut t, chain);
    }
    if !r.scale.is_empty() {
        scale_rows(&mut t, r, floor, statements);
    }
    if let Some(listing) = &r.listing {
        listing_rows(&mut t, listing);
    }
    if let Some(observed) = &r.observability {
        observability_rows(&mut t, observed);
    }
    for cost in [&r.bulk, &r.migrate].into_iter().flatten() {
        bulk_rows(&mut t, cost);
    }
    if let Some(noisy) = &r.noisy {
        noisy_rows(&mut t, noisy);
    }
    for f in &r.failures {
        let _ = writeln!(
            t,
            "| failed | {} | | | |",
            f.replace('|', "/").replace('\n', " ")
        );
    }
    t
}

/// 200 MB, as issue 39 writes it, in MiB.
const RSS_TARGET_MIB: f64 = 200e6 / 1_048_576.0;

/// Issue 39's targets with offload on: 100 KB ≥ 1,500 tasks/s, 1 MB ≥ 200;
/// WAL ≤ 0.05 bytes per payload byte; server RSS ≤ 200 MB (190.7 MiB).
fn payload_targets(t: &mut String, p: &payload::PayloadRow) {
    if !p.offload || p.bytes < 100_000 {
        return;
    }
    let l = &p.row.label;
    let floor = if p.bytes >= 1_000_000 { 200.0 } else { 1_500.0 };
    let _ = writeln!(
        t,
        "| {l} | targets: tasks/s; WAL per payload byte; peak server RSS | {:.0}; {:.3}; {:.0} MiB | ≥ {floor:.0}; ≤ 0.05; ≤ 190.7 MiB (200 MB) | {} |",
        p.row.tasks_per_s,
        p.wal_per_payload_byte(),
        p.row.peak_rss_mib,
        verdict(
            p.row.tasks_per_s >= floor
                && p.wal_per_payload_byte() <= 0.05
                && p.row.peak_rss_mib <= RSS_TARGET_MIB
        )
    );
}

fn payload_rows(t: &mut String, rows: &[payload::PayloadRow], b1: Option<&benches::Throughput>) {
    for p in rows {
        let l = &p.row.label;
        let vs_b1 = b1.map_or(String::new(), |b| {
            format!(
                "; {:.2} × B1's empty payloads",
                p.row.tasks_per_s / b.tasks_per_s.max(f64::MIN_POSITIVE)
            )
        });
        let _ = writeln!(
            t,
            "| {l} | tasks/s; payload MB/s (input to the worker + output back){vs_b1} | **{:.0}**; {:.1} MB/s | | |",
            p.row.tasks_per_s,
            p.megabytes_per_s()
        );
        let _ = writeln!(
            t,
            "| {l} | CPU s per 1,000 tasks: server / Postgres / Redis / load generator + worker; peak server RSS | {:.2} / {:.2} / {:.2} / {:.2}; {:.0} MiB | | |",
            p.row.server_cpu, p.row.pg_cpu, p.row.redis_cpu, p.row.client_cpu, p.row.peak_rss_mib
        );
        let _ = writeln!(
            t,
            "| {l} | WAL bytes per task (in payload sizes); per byte of payload moved | {:.0} ({:.1} ×); {:.3} | | |",
            p.row.wal_bytes_per_task,
            p.row.wal_bytes_per_task / p.bytes as f64,
            p.wal_per_payload_byte()
        );
        payload_targets(t, p);
        if p.row.errors > 0 {
            let _ = writeln!(
                t,
                "| {l} | StartRun / report errors | {} | 0 | **misses** |",
                p.row.errors
            );
        }
    }
}

fn chain_rows(t: &mut String, c: &chain::Chain) {
    let _ = writeln!(
        t,
        "| B7 long run | {} sequential TASK steps, start → run completed | {:.1} s ({:.0} steps/s) | | |",
        c.steps,
        c.secs,
        c.steps as f64 / c.secs
    );
    for (when, w) in [("early", &c.early), ("late", &c.late)] {
        let _ = writeln!(
            t,
            "| B7 long run | steps {}–{} ({when}): ms per step wall / server + Postgres CPU | {:.2} / {:.2} | | |",
            w.from, w.to, w.wall_ms, w.cpu_ms
        );
    }
    let ratio = c.late.cpu_ms / c.early.cpu_ms.max(f64::MIN_POSITIVE);
    let wall = c.late.wall_ms / c.early.wall_ms.max(f64::MIN_POSITIVE);
    let _ = writeln!(
        t,
        "| B7 long run | late / early, CPU per step (wall) | {ratio:.2} ({wall:.2}) | ≤ 1.2 (the same cost) | {} |",
        verdict(ratio <= 1.2)
    );
}

fn bulk_rows(t: &mut String, cost: &bulk::BulkCost) {
    let op = &cost.operation;
    let (name, what, done) = match cost.bench {
        bulk::BulkBench::Retry => ("bulk retry", "failed runs", "all retried once"),
        bulk::BulkBench::Migrate => ("migrate", "runs waiting in a task", "all moved once"),
    };
    let rpc = match cost.bench {
        bulk::BulkBench::Retry => "BulkRetryRuns",
        bulk::BulkBench::Migrate => "MigrateRuns",
    };
    let _ = writeln!(
        t,
        "| {name} | {} {what} created by StartRun | {:.1} s | | |",
        cost.runs, cost.create_secs
    );
    let _ = writeln!(
        t,
        "| {name} | {rpc}: matched / succeeded / skipped / failed | {} / {} / {} / {} | {done} | {} |",
        op.matched,
        op.succeeded,
        op.skipped,
        op.failed,
        verdict(op.succeeded == cost.runs as i64 && op.failed == 0)
    );
    if let Some(moved) = cost.moved {
        let runs = cost.runs as i64;
        let _ = writeln!(
            t,
            "| {name} | run_migrated entries / runs with one / runs on v2 (Postgres) | {} / {} / {} | {runs} each | {} |",
            moved.entries,
            moved.runs,
            moved.on_target,
            verdict(moved.entries == runs && moved.runs == runs && moved.on_target == runs)
        );
    }
    let _ = writeln!(
        t,
        "| {name} | operation start → end, s (runs/s) | {:.1} ({:.0}) | | |",
        cost.op_secs,
        cost.runs as f64 / cost.op_secs.max(0.001)
    );
    let _ = writeln!(
        t,
        "| {name} | B2 report → next task leased, idle, ms p50 / p99 / max | {} | | |",
        d3(&cost.idle)
    );
    let _ = writeln!(
        t,
        "| {name} | the same during the operation | {} | | |",
        d3(&cost.during)
    );
    let ratio = cost.p99_ratio();
    let _ = writeln!(
        t,
        "| {name} | p99 during / p99 idle | {ratio:.2} | ≤ 2 | {} |",
        verdict(ratio <= 2.0)
    );
}

fn noisy_rows(t: &mut String, n: &noisy::Noisy) {
    let quota = match &n.quotas {
        Some(_) => format!(
            "the aggressor's quota: {} writing calls/s, {} tasks armed/s ({})",
            noisy::AGGRESSOR_WRITES_PER_SECOND,
            noisy::AGGRESSOR_TASKS_PER_SECOND,
            noisy::QUOTAS_FILE_FLAG
        ),
        None => format!(
            "no {} on this server: the aggressor is unbounded",
            noisy::QUOTAS_FILE_FLAG
        ),
    };
    let _ = writeln!(
        t,
        "| B8 noisy neighbours | setup | namespaces `{}` (B2's open loop) and `{}`, each with its own tokens, on one server; {quota} | | |",
        noisy::VICTIM,
        noisy::AGGRESSOR
    );
    let _ = writeln!(
        t,
        "| B8 victim idle | report → next task leased, ms p50 / p99 / max | {} | | |",
        d3(&n.idle.dispatch)
    );
    let _ = writeln!(
        t,
        "| B8 victim idle | StartRun → first task leased, ms p50 / p99 / max; server CPU | {}; {:.2} cores | | |",
        d3(&n.idle.start_to_lease),
        n.idle_cores
    );
    for phase in &n.phases {
        let l = &phase.label;
        let (dispatch, start) = phase.ratios(&n.idle);
        for (what, d, ratio) in [
            (
                "report → next task leased",
                &phase.victim.dispatch,
                dispatch,
            ),
            (
                "StartRun → first task leased",
                &phase.victim.start_to_lease,
                start,
            ),
        ] {
            let _ = writeln!(
                t,
                "| B8 victim vs {l} | {what}, ms p50 / p99 / max; p99 / idle p99 | {}; {} | p99 ≤ 2 × idle | {} |",
                d3(d),
                ratio.map_or("no samples".to_owned(), |r| format!("**{r:.2} ×**")),
                verdict(ratio.is_some_and(|r| r <= 2.0))
            );
        }
        let (what, figures) = aggressor_figures(&phase.figures);
        // only the poisoned runs have a target of their own (issue 34)
        let target = match phase.figures.poison_contained() {
            Some(ok) => format!(
                " each run FAILED after ≤ {} deliveries | {} |",
                2 * noisy::POISON_MAX_ATTEMPTS,
                verdict(ok)
            ),
            None => " | |".to_owned(),
        };
        let _ = writeln!(
            t,
            "| B8 aggressor: {l} | {what}; server / load generator CPU over the {:.0} s window | {figures}; {:.2} / {:.2} cores |{target}",
            phase.secs, phase.server_cores, phase.client_cores,
        );
    }
}

/// What a B8 aggressor's figures measure, and the figures.
fn aggressor_figures(figures: &noisy::Figures) -> (String, String) {
    use noisy::Figures;
    match figures {
        Figures::Flood { calls, secs } => (
            "StartRun calls / accepted / throttled (RESOURCE_EXHAUSTED) / other errors; calls/s".to_owned(),
            format!(
                "{} / {} / **{}** / {}; {:.0}/s",
                calls.calls(),
                calls.accepted,
                calls.throttled,
                calls.other,
                calls.calls() as f64 / secs.max(f64::MIN_POSITIVE)
            ),
        ),
        Figures::Watch {
            asked,
            held,
            refused,
            failed,
            dropped,
            updates,
            open_secs,
        } => (
            "WatchRun streams asked / held / refused over a quota / failed / dropped by the server; messages after the first; opened in".to_owned(),
            format!(
                "{asked} / **{held}** / {refused} / {failed} / {dropped}; {updates}; {open_secs:.1} s"
            ),
        ),
        Figures::Cron { calls, latency } => (
            "CreateSchedule calls / created / refused (INVALID_ARGUMENT) / throttled / other errors; ms a call p50 / p99 / max".to_owned(),
            format!(
                "{} / {} / **{}** / {} / {}; {}",
                calls.calls(),
                calls.accepted,
                calls.invalid,
                calls.throttled,
                calls.other,
                d3(latency)
            ),
        ),
        Figures::Poison { runs, workers } => {
            let each: Vec<String> = runs
                .iter()
                .map(|r| {
                    let code = if r.code.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", r.code)
                    };
                    let secs = r.secs.map_or(String::new(), |s| format!(" in {s:.1} s"));
                    format!(
                        "{} (attempt {}) → {}{code}{secs}",
                        r.deliveries, r.last_attempt, r.status
                    )
                })
                .collect();
            (
                "each poisoned run: deliveries (last attempt) → status; workers started".to_owned(),
                format!("{}; {workers}", each.join(", ")),
            )
        }
        Figures::Backlog {
            asked,
            calls,
            fill_secs,
            depth,
        } => (
            "tasks asked / waiting in its queue; StartRun calls / accepted / throttled / other errors; filled in".to_owned(),
            format!(
                "{asked} / **{depth}**; {} / {} / {} / {}; {fill_secs:.1} s",
                calls.calls(),
                calls.accepted,
                calls.throttled,
                calls.other
            ),
        ),
    }
}

fn listing_rows(t: &mut String, listing: &listing::Listing) {
    let l = "B6 large history";
    let _ = writeln!(
        t,
        "| {l} | {} runs ({} of them with a B1 run's tasks, node states and history) written by INSERT ... SELECT, then VACUUM ANALYZE and CHECKPOINT | {:.1} s | | |",
        listing.runs, listing.history_runs, listing.load_secs
    );
    let _ = writeln!(
        t,
        "| {l} | disk per run: its `runs` row with the table's indexes / its tasks, node states and history with theirs | {:.0} B / {:.0} B | | |",
        listing.run_bytes, listing.history_bytes
    );
    for case in &listing.cases {
        let _ = writeln!(
            t,
            "| {l} | {} ({}{} runs), ms p50 / p99 / max | {} | p99 < 300 | {} |",
            case.label,
            case.rows,
            if case.more { "+" } else { "" },
            d3(&case.latency),
            verdict(case.latency.p99 < 300.0)
        );
    }
    let (empty, full) = (&listing.b1_empty, &listing.b1_full);
    let ratio = full.tasks_per_s / empty.tasks_per_s.max(f64::MIN_POSITIVE);
    let _ = writeln!(
        t,
        "| {l} | B1 tasks/s on the empty tables → on the full ones (same server, same window) | {:.0} → **{:.0}** = {ratio:.2} × | ≥ 0.9 × | {} |",
        empty.tasks_per_s,
        full.tasks_per_s,
        verdict(ratio >= 0.9)
    );
    let _ = writeln!(
        t,
        "| {l} | B1 WAL bytes per task, empty → full | {:.0} → {:.0} | | |",
        empty.wal_bytes_per_task, full.wal_bytes_per_task
    );
    let _ = writeln!(
        t,
        "| {l} | retention of the oldest day (the server's pass, batches of 200): runs deleted, seconds | {} runs in {:.1} s ({:.0} runs/s) | | |",
        listing.retention_runs,
        listing.retention_secs,
        listing.retention_runs as f64 / listing.retention_secs.max(f64::MIN_POSITIVE)
    );
}

fn throughput_rows(
    t: &mut String,
    row: &Throughput,
    floor: Option<f64>,
    full: bool,
    statements: bool,
) {
    let l = &row.label;
    let vs = floor.map(|f| row.tasks_per_s / f);
    let _ = writeln!(
        t,
        "| {l} | tasks/s (runs/s) | **{:.0}** ({:.0}){} | ≥ 0.6 × floor | {} |",
        row.tasks_per_s,
        row.runs_per_s,
        vs.map(|v| format!(" = {v:.2} × floor")).unwrap_or_default(),
        vs.map_or("", |v| verdict(v >= 0.6))
    );
    let xacts = row.commits_per_task + row.rollbacks_per_task;
    let _ = writeln!(
        t,
        "| {l} | Postgres transactions per task (commits + rollbacks) | {xacts:.2} ({:.2} + {:.2}) | ≤ 1.5 | {} |",
        row.commits_per_task,
        row.rollbacks_per_task,
        verdict(xacts <= 1.5)
    );
    let _ = writeln!(
        t,
        "| {l} | of these, transactions that wrote (transaction ids used per task) | {:.2} | | |",
        row.writes_per_task
    );
    let _ = writeln!(
        t,
        "| {l} | WAL bytes per task | {:.0} | | |",
        row.wal_bytes_per_task
    );
    if statements && let Some(s) = row.statements_per_task {
        let _ = writeln!(
            t,
            "| {l} | statements per task (pg_stat_statements, BEGIN/COMMIT included) | {s:.1} | | |"
        );
    }
    let _ = writeln!(
        t,
        "| {l} | CPU s per 1,000 tasks: server / Postgres / Redis / load generator + worker | {:.2} / {:.2} / {:.2} / {:.2} | server + Postgres ≤ 1.0 | {} |",
        row.server_cpu,
        row.pg_cpu,
        row.redis_cpu,
        row.client_cpu,
        verdict(row.server_cpu + row.pg_cpu <= 1.0)
    );
    if full {
        let _ = writeln!(
            t,
            "| {l} | peak server RSS (VmHWM) | {:.0} MiB | ≤ 150 MB | {} |",
            row.peak_rss_mib,
            verdict(row.peak_rss_mib * 1.048_576 <= 150.0)
        );
    }
    if row.errors > 0 {
        let _ = writeln!(
            t,
            "| {l} | StartRun / report errors | {} | 0 | **misses** |",
            row.errors
        );
    }
}

fn observability_rows(t: &mut String, observed: &observability::Observability) {
    let Some(off) = observed.variants.iter().find(|v| v.name == "off") else {
        return;
    };
    let rounds = off.tasks_per_s.len();
    for on in observed.variants.iter().filter(|v| v.name != "off") {
        let ratio = on.median() / off.median();
        let (what, target) = match on.name {
            "metrics" => ("metrics on (scraped every second)", Some(0.97)),
            _ => ("traces on (OTLP/HTTP to a receiver that drops them)", None),
        };
        let rounds_text = |v: &observability::Variant| {
            v.tasks_per_s
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            t,
            "| B1 {what} | tasks/s, median of {rounds} rounds taking turns with off: on ({}) / off ({}); server CPU s per 1,000 tasks on / off | **{ratio:.3} ×**; {:.2} / {:.2} | {} | {} |",
            rounds_text(on),
            rounds_text(off),
            on.median_cpu(),
            off.median_cpu(),
            target.map_or(String::new(), |t| format!("≥ {t} × (within 3 %)")),
            target.map_or("", |t| verdict(ratio >= t)),
        );
    }
    let _ = writeln!(
        t,
        "| B1 traces on | OTLP export requests / MB the receiver took | {} / {:.1} | | |",
        observed.otlp_requests,
        observed.otlp_bytes as f64 / 1e6
    );
}

fn render_details(r: &Results) -> String {
    let mut t = String::new();
    // B1, and the narrowest and widest B5: where one server and several differ
    let b5_ends: Vec<&Throughput> = r
        .scale
        .iter()
        .flat_map(|series| {
            let rows = &series.rows;
            rows.first()
                .into_iter()
                .chain(rows.last().filter(|_| rows.len() > 1))
        })
        .collect();
    for row in r.b1.iter().chain(b5_ends.iter().copied()) {
        statements_table(&mut t, row);
    }
    if let Some(row) = &r.b1 {
        wal_tables(&mut t, row);
        if let Some(f) = &r.write_floor {
            write_floor_table(&mut t, row, f);
        }
    }
    // B1 on the large history: what the full tables add to its WAL
    if let Some(listing) = &r.listing {
        wal_tables(&mut t, &listing.b1_empty);
        wal_tables(&mut t, &listing.b1_full);
    }
    // where the offloaded rows' Postgres time goes
    for p in r
        .payload
        .iter()
        .flatten()
        .filter(|p| p.offload && p.bytes >= 100_000)
    {
        statements_table(&mut t, &p.row);
        wal_tables(&mut t, &p.row);
        if let Some(perf) = &p.row.perf {
            let _ = writeln!(t, "perf during {}:\n\n```\n{}```\n", p.row.label, perf);
        }
    }
    for row in r.b1.iter().chain(b5_ends.iter().copied()) {
        if let Some(perf) = &row.perf {
            let _ = writeln!(t, "perf during {}:\n\n```\n{}```\n", row.label, perf);
        }
    }
    t
}

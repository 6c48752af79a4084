//! What observing the server costs: B1 with metrics off, with metrics on
//! (scraped every second, as Prometheus would), and with traces exported
//! to an OTLP/HTTP receiver that takes and drops them. The variants take
//! turns, round after round, each round starting with the next one, so
//! machine noise and what an earlier round left behind hit each alike; the
//! median of each is compared with "off".

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Result;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

use crate::benches::{self, Ctx, WorkerKind, median};

/// One variant's B1 rounds.
#[derive(Debug, Clone)]
pub struct Variant {
    /// off, metrics or traces.
    pub name: &'static str,
    /// tasks/s of each round.
    pub tasks_per_s: Vec<f64>,
    /// Server CPU seconds per 1,000 tasks, each round.
    pub server_cpu: Vec<f64>,
}

impl Variant {
    /// The median tasks/s.
    pub fn median(&self) -> f64 {
        median(&self.tasks_per_s)
    }

    /// The median server CPU seconds per 1,000 tasks.
    pub fn median_cpu(&self) -> f64 {
        median(&self.server_cpu)
    }
}

/// The three variants, plus what the trace receiver took.
#[derive(Debug, Clone)]
pub struct Observability {
    /// off, metrics, traces.
    pub variants: Vec<Variant>,
    /// OTLP requests and bytes the receiver took during the trace rounds.
    pub otlp_requests: u64,
    pub otlp_bytes: u64,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Answers every HTTP/1.1 request with an empty 200 (an empty OTLP export
/// response is a valid one), counting requests and body bytes.
async fn serve_sink(listener: TcpListener, requests: Arc<AtomicU64>, bytes: Arc<AtomicU64>) {
    while let Ok((stream, _)) = listener.accept().await {
        let (requests, bytes) = (Arc::clone(&requests), Arc::clone(&bytes));
        tokio::spawn(async move {
            let _ = answer_requests(stream, &requests, &bytes).await;
        });
    }
}

async fn answer_requests(
    stream: TcpStream,
    requests: &AtomicU64,
    bytes: &AtomicU64,
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if stream.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        requests.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(length as u64, Ordering::Relaxed);
        stream
            .get_mut()
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
            )
            .await?;
    }
}

/// Scrapes `/metrics` every second until dropped (aborted).
async fn scrape_every_second(port: u16) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = stream
                .write_all(b"GET /metrics HTTP/1.0\r\nhost: bench\r\n\r\n")
                .await;
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
        }
    }
}

/// B1 (Rust worker), `rounds` times each variant in turn.
pub async fn observability(ctx: &Ctx) -> Result<Observability> {
    let rounds = ctx.profile.observe_rounds;
    let requests = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let sink = TcpListener::bind("127.0.0.1:0").await?;
    let collector = format!("http://{}", sink.local_addr()?);
    let receiver = tokio::spawn(serve_sink(sink, Arc::clone(&requests), Arc::clone(&bytes)));
    let mut variants = ["off", "metrics", "traces"].map(|name| Variant {
        name,
        tasks_per_s: Vec::new(),
        server_cpu: Vec::new(),
    });
    let secs = ctx.profile.observe_secs;
    let count = variants.len();
    for round in 0..rounds {
        // each round starts with the next variant: no variant may always
        // come first, or always run after another's load
        for turn in 0..count {
            let variant = &mut variants[(round + turn) % count];
            let mut extra = Vec::new();
            let mut scraper = None;
            match variant.name {
                "metrics" => {
                    let port = free_port()?;
                    extra = vec!["--metrics-listen".to_owned(), format!("127.0.0.1:{port}")];
                    scraper = Some(tokio::spawn(scrape_every_second(port)));
                }
                "traces" => extra = vec!["--otlp-endpoint".to_owned(), collector.clone()],
                _ => {}
            }
            let label = format!("B1 {} (round {})", variant.name, round + 1);
            eprintln!("bench: {label}");
            let row = benches::throughput(ctx, &label, 1, WorkerKind::Rust, secs, 0, &extra).await;
            if let Some(scraper) = scraper {
                scraper.abort();
            }
            let row = row?;
            variant.tasks_per_s.push(row.tasks_per_s);
            variant.server_cpu.push(row.server_cpu);
        }
    }
    receiver.abort();
    Ok(Observability {
        variants: variants.to_vec(),
        otlp_requests: requests.load(Ordering::Relaxed),
        otlp_bytes: bytes.load(Ordering::Relaxed),
    })
}

//! B1 with large payloads: each run's input and each task's output are
//! `size` bytes of text that TOAST cannot compress away, so a payload's cost
//! is measured (and where throughput falls off).

use anyhow::Result;

use crate::benches::{Ctx, Load, Throughput, WorkerKind, throughput_of};

/// The offload threshold of the rows with offload on: the server's default.
const OFFLOAD_BYTES: usize = 64 * 1024;

/// One size's row, with offload on or off.
#[derive(Debug, Clone)]
pub struct PayloadRow {
    /// Bytes of the run's input, and of each task's output.
    pub bytes: usize,
    /// Values over 64 KiB went to the blob store, the worker moving them
    /// through BlobService (false: every value inline, in Postgres).
    pub offload: bool,
    /// The B1 measures at that size.
    pub row: Throughput,
}

impl PayloadRow {
    /// Payload megabytes moved per second: each task carries its input to
    /// the worker and its output back.
    pub fn megabytes_per_s(&self) -> f64 {
        self.row.tasks_per_s * 2.0 * self.bytes as f64 / 1e6
    }

    /// WAL bytes per byte of payload a task moves (its input and output).
    pub fn wal_per_payload_byte(&self) -> f64 {
        self.row.wal_bytes_per_task / (2.0 * self.bytes.max(1) as f64)
    }
}

/// B1 (Rust worker, one server) at each of the profile's payload sizes,
/// with offload on (the server's default) and off (`--payload-offload-bytes
/// 0`: every value inline, as before the blob store).
pub async fn payload(ctx: &Ctx) -> Result<Vec<PayloadRow>> {
    let mut rows = Vec::new();
    // BENCH_PAYLOAD_SIZES=1000000,100000: other sizes than the profile's
    let sizes: Vec<usize> = std::env::var("BENCH_PAYLOAD_SIZES")
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| ctx.profile.payload_sizes.clone());
    for &bytes in &sizes {
        for offload in [true, false] {
            let label = format!(
                "B1 payload {}, offload {}",
                size_label(bytes),
                if offload { "on" } else { "off" }
            );
            let load = Load {
                payload_bytes: bytes,
                offload_bytes: if offload { OFFLOAD_BYTES } else { 0 },
                // where an offloaded task's WAL goes: the references it
                // leaves in rows, and the blobs' own rows
                wal_breakdown: offload && bytes >= OFFLOAD_BYTES,
                ..Load::plain(
                    ctx,
                    WorkerKind::Rust,
                    ctx.profile.payload_secs,
                    std::env::var("BENCH_PAYLOAD_PERF_SECS")
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                )
            };
            let extra = if offload {
                Vec::new()
            } else {
                vec!["--payload-offload-bytes".to_owned(), "0".to_owned()]
            };
            let row = throughput_of(ctx, &label, 1, load, &extra).await?;
            rows.push(PayloadRow {
                bytes,
                offload,
                row,
            });
        }
    }
    Ok(rows)
}

/// `100 KB`, `1 MB`: decimal, as sizes are quoted.
pub fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1_000_000 => format!("{} MB", b / 1_000_000),
        b if b >= 1_000 => format!("{} KB", b / 1_000),
        b => format!("{b} B"),
    }
}

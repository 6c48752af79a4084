//! B1 with large payloads: each run's input and each task's output are
//! `size` bytes of text that TOAST cannot compress away, so a payload's cost
//! is measured (and where throughput falls off).

use anyhow::Result;

use crate::benches::{Ctx, Load, Throughput, WorkerKind, throughput_of};

/// One size's row.
#[derive(Debug, Clone)]
pub struct PayloadRow {
    /// Bytes of the run's input, and of each task's output.
    pub bytes: usize,
    /// The B1 measures at that size.
    pub row: Throughput,
}

impl PayloadRow {
    /// Payload megabytes moved per second: each task carries its input to
    /// the worker and its output back.
    pub fn megabytes_per_s(&self) -> f64 {
        self.row.tasks_per_s * 2.0 * self.bytes as f64 / 1e6
    }
}

/// B1 (Rust worker, one server) at each of the profile's payload sizes.
pub async fn payload(ctx: &Ctx) -> Result<Vec<PayloadRow>> {
    let mut rows = Vec::new();
    for &bytes in &ctx.profile.payload_sizes {
        let label = format!("B1 payload {}", size_label(bytes));
        let load = Load {
            kind: WorkerKind::Rust,
            measure_secs: ctx.profile.payload_secs,
            perf_secs: 0,
            payload_bytes: bytes,
            in_flight: ctx.profile.in_flight,
            server_cores: None,
        };
        let row = throughput_of(ctx, &label, 1, load, &[]).await?;
        rows.push(PayloadRow { bytes, row });
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

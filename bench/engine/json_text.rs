//! The server's passes over a large payload's JSON text, as it offloads a
//! run input: its length, whether it is over the offload threshold, and
//! the text itself. `composer_engine::json_text` against the serde_json
//! passes it replaced, on payloads shaped as B1's (`{"blob": <text>, "run":
//! <n>}`, text that needs no escape), on one dense with escapes and on
//! an array of floats.
//!
//! cargo bench -p composer-engine --bench json_text -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use composer_engine::json_text;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

/// The offload threshold's default.
const THRESHOLD: usize = 64 * 1024;

/// B1's payload: printable text that compresses badly.
fn payload(bytes: usize) -> Value {
    let text: String = (0..bytes)
        .map(|i| char::from(b'!' + ((i * 7919 + i / 97) % 90) as u8))
        .map(|c| if c == '"' || c == '\\' { 'x' } else { c })
        .collect();
    json!({ "blob": text, "run": 42 })
}

/// An embedding's worth of floats.
fn floats(bytes: usize) -> Value {
    let values: Vec<f64> = (0..bytes / 20).map(|i| (i as f64).sin() / 3.0).collect();
    json!({ "vector": values })
}

/// One byte in eight needs an escape.
fn escaped(bytes: usize) -> Value {
    json!({ "lines": "line of text\n\"quoted\"\t".repeat(bytes / 24) })
}

/// The three serde_json passes the offload made: the length counted through
/// a writer, the threshold check (written up to the threshold), the text.
fn serde_passes(value: &Value) -> Vec<u8> {
    struct Count(usize, usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            if self.0 > self.1 {
                return Err(std::io::Error::other("longer"));
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut length = Count(0, usize::MAX);
    serde_json::to_writer(&mut length, value).expect("counted");
    black_box(length.0);
    let over = serde_json::to_writer(&mut Count(0, THRESHOLD), value).is_err();
    black_box(over);
    serde_json::to_vec(value).expect("serialisable")
}

fn these_passes(value: &Value) -> Vec<u8> {
    black_box(json_text::len(value));
    black_box(json_text::longer_than(value, THRESHOLD));
    json_text::to_vec(value)
}

fn offload_passes(c: &mut Criterion) {
    let cases = [
        ("100 KB", payload(100_000)),
        ("1 MB", payload(1_000_000)),
        ("1 MB escaped", escaped(1_000_000)),
        ("1 MB of floats", floats(1_000_000)),
    ];
    let mut group = c.benchmark_group("offload passes");
    for (name, value) in &cases {
        assert_eq!(these_passes(value), serde_passes(value), "{name}");
        let bytes = serde_json::to_vec(value).expect("serialisable").len();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(format!("serde_json, {name}"), |b| {
            b.iter(|| serde_passes(black_box(value)))
        });
        group.bench_function(format!("json_text, {name}"), |b| {
            b.iter(|| these_passes(black_box(value)))
        });
    }
    group.finish();
}

criterion_group!(benches, offload_passes);
criterion_main!(benches);

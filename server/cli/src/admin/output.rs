//! What the admin commands print: aligned tables for people, and for
//! scripts the API's own messages as JSON (the proto3 JSON mapping with the
//! `.proto` field names, every field present), so `jq` paths are the API's.

use std::{
    fmt::Write as _,
    io::{self, Write},
    sync::OnceLock,
};

use clap::ValueEnum;
use composer_proto::v1;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value as Json;

use super::AdminError;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// The API's response message as JSON, for scripts and `jq`.
    Json,
}

/// A message of package `composer.v1` that can be printed as JSON.
pub trait ApiMessage: prost::Message {
    /// The message's full protobuf name.
    const NAME: &'static str;
}

macro_rules! api_messages {
    ($($message:ident),* $(,)?) => {
        $(impl ApiMessage for v1::$message {
            const NAME: &'static str = concat!("composer.v1.", stringify!($message));
        })*
    };
}

api_messages!(
    Run,
    RunReplay,
    HistoryEvent,
    WorkflowVersion,
    RegisterWorkflowResponse,
    ValidateWorkflowResponse,
    GetWorkflowResponse,
    ListWorkflowsResponse,
    ListWorkflowVersionsResponse,
    StartRunResponse,
    GetRunResponse,
    ListRunsResponse,
    CancelRunResponse,
    RetryRunResponse,
    PauseRunResponse,
    ResumeRunResponse,
    SendEventResponse,
    GetRunHistoryResponse,
    WatchRunResponse,
    GetServerInfoResponse,
    CreateScheduleResponse,
    GetScheduleResponse,
    SetQueueRateLimitResponse,
    GetQueueRateLimitResponse,
    ListQueueRateLimitsResponse,
    DeleteQueueRateLimitResponse,
    ListSchedulesResponse,
    UpdateScheduleResponse,
    PauseScheduleResponse,
    ResumeScheduleResponse,
    DeleteScheduleResponse,
    TriggerScheduleResponse,
    BulkOperation,
    ListBulkOperationsResponse,
    SetSecretResponse,
    ListSecretsResponse,
    DeleteSecretResponse,
    RewrapSecretKeysResponse,
);

fn descriptors() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(composer_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set built into this binary decodes")
    })
}

/// `message` as JSON: proto field names, enums by name, timestamps in
/// RFC 3339, `google.protobuf.Value` as plain JSON, default values present.
pub fn to_json<M: ApiMessage>(message: &M) -> Json {
    let descriptor = descriptors()
        .get_message_by_name(M::NAME)
        .expect("every ApiMessage is in the descriptor set");
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .expect("a message decodes with its own descriptor");
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false);
    let mut json = dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a protobuf message serializes as JSON");
    integral_numbers(&mut json);
    json
}

/// The message `json` holds, as [`to_json`] writes it (proto or JSON field
/// names, enums by name or number).
pub fn from_json<M: ApiMessage + Default>(json: &Json) -> Result<M, String> {
    let descriptor = descriptors()
        .get_message_by_name(M::NAME)
        .expect("every ApiMessage is in the descriptor set");
    let dynamic = DynamicMessage::deserialize(descriptor, json).map_err(|e| e.to_string())?;
    dynamic.transcode_to::<M>().map_err(|e| e.to_string())
}

/// `google.protobuf.Value` numbers are doubles; print `3`, not `3.0`, as
/// the server does when it hands the same JSON to a worker.
fn integral_numbers(json: &mut Json) {
    match json {
        Json::Number(number) => {
            if let Some(n) = number.as_f64().filter(|n| {
                number.is_f64() && n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15
            }) {
                *number = serde_json::Number::from(n as i64);
            }
        }
        Json::Array(items) => items.iter_mut().for_each(integral_numbers),
        Json::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// Prints `message` as indented JSON on standard output.
pub fn print_json<M: ApiMessage>(message: &M) -> Result<(), AdminError> {
    let text = serde_json::to_string_pretty(&to_json(message)).unwrap_or_default();
    print_text(&format!("{text}\n"))
}

/// Prints `message` as one line of JSON (for streams: one line per message).
pub fn print_json_line<M: ApiMessage>(message: &M) -> Result<(), AdminError> {
    print_text(&format!("{}\n", to_json(message)))
}

/// Writes `text` to standard output; a closed pipe (`| head`) is not an error.
pub fn print_text(text: &str) -> Result<(), AdminError> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            Err(AdminError::local("standard output", error))
        }
        _ => Ok(()),
    }
}

/// Rows under a header, each column as wide as its widest cell.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&'static str]) -> Self {
        Self {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, ending with a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let header = self.header.iter().map(|h| (*h).to_owned()).collect();
        std::iter::once(&header)
            .chain(&self.rows)
            .map(|row| line(row, &widths))
            .collect()
    }
}

fn line(cells: &[String], widths: &[usize]) -> String {
    let mut text = String::new();
    for (cell, width) in cells.iter().zip(widths) {
        let _ = write!(text, "{cell:<width$}  ");
    }
    format!("{}\n", text.trim_end())
}

/// `key: value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(key, value)| format!("{:<width$} {value}\n", format!("{key}:")))
        .collect()
}

/// A run status without its prefix: `COMPLETED`.
pub fn run_status(status: i32) -> &'static str {
    v1::RunStatus::try_from(status)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("RUN_STATUS_")
}

/// A node status without its prefix: `WAITING`.
pub fn node_status(status: i32) -> &'static str {
    v1::NodeStatus::try_from(status)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("NODE_STATUS_")
}

/// A time as `2026-11-30 15:04:05` (UTC), empty when absent.
pub fn time(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

/// A `google.protobuf.Value` as compact JSON text, empty when absent.
pub fn value(value: Option<&prost_types::Value>) -> String {
    value
        .and_then(|v| composer_grpc::convert::to_json(Some(v.clone()), "value").ok())
        .map(|json| json.to_string())
        .unwrap_or_default()
}

/// At most `max` characters, with `…` when cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// Labels as `k=v,k=v`, sorted by key.
pub fn labels(labels: &std::collections::HashMap<String, String>) -> String {
    let mut pairs: Vec<_> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(",")
}

/// A failure as `CODE: message`, empty when absent.
pub fn failure(failure: Option<&v1::Failure>) -> String {
    failure
        .map(|f| format!("{}: {}", f.code, f.message))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_columns_and_trims_line_ends() {
        let mut table = Table::new(&["ID", "STATUS"]);
        table.row(vec!["a-long-id".into(), "RUNNING".into()]);
        table.row(vec!["b".into(), String::new()]);
        assert_eq!(table.render(), "ID         STATUS\na-long-id  RUNNING\nb\n");
    }

    #[test]
    fn json_uses_proto_field_names_enum_names_and_plain_values() {
        let response = v1::GetRunResponse {
            run: Some(v1::Run {
                run_id: "r1".into(),
                status: v1::RunStatus::Completed as i32,
                output: Some(composer_grpc::convert::from_json(
                    &serde_json::json!({"n": 3}),
                )),
                create_time: Some(prost_types::Timestamp {
                    seconds: 1_796_000_000,
                    nanos: 0,
                }),
                ..Default::default()
            }),
        };
        let json = to_json(&response);
        assert_eq!(json["run"]["run_id"], "r1");
        assert_eq!(json["run"]["status"], "RUN_STATUS_COMPLETED");
        assert_eq!(json["run"]["output"], serde_json::json!({"n": 3}));
        assert_eq!(json["run"]["create_time"], "2026-11-30T00:53:20Z");
        assert_eq!(json["run"]["workflow_version"], 0, "defaults are present");
        assert_eq!(json["run"]["nodes"], serde_json::json!([]));
    }
}

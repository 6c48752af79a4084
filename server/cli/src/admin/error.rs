//! Why an admin command failed, and the one place that turns it into an exit
//! code and a message on standard error.

use std::fmt::Write as _;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The exit codes, as `composer --help` and docs/cli.md print them. A test
/// holds this text and [`AdminError::exit_code`] together.
pub const EXIT_CODES_HELP: &str = "\
Exit codes of the commands that call a server (workflow, run, operation, schedule, queue, server):
  0   ok
  1   the run ended FAILED or CANCELLED (run start --wait, run watch), or
      the bulk operation waited on did not succeed (--wait), or workflow
      replay / check found the new definition incompatible with a run
  2   usage: a bad flag or flag value
  3   a local file or standard input could not be read
  4   workflow replay / check: a history cannot be replayed (incomplete,
      or not what the run's own definition decides)
  10+ the server's gRPC status code:
      11 CANCELLED            12 UNKNOWN             13 INVALID_ARGUMENT
      14 DEADLINE_EXCEEDED    15 NOT_FOUND           16 ALREADY_EXISTS
      17 PERMISSION_DENIED    18 RESOURCE_EXHAUSTED  19 FAILED_PRECONDITION
      20 ABORTED              21 OUT_OF_RANGE        22 UNIMPLEMENTED
      23 INTERNAL             24 UNAVAILABLE         25 DATA_LOSS
      26 UNAUTHENTICATED
  An unreachable server is 24 (UNAVAILABLE); an invalid definition given to
  `workflow validate` is 13 (INVALID_ARGUMENT), as `workflow register` gets.";

/// Exit code of a run that ended FAILED or CANCELLED.
pub const EXIT_RUN_NOT_COMPLETED: u8 = 1;
/// Exit code of a replay that found the new definition incompatible.
pub const EXIT_INCOMPATIBLE: u8 = 1;
/// Exit code of a history that cannot be replayed.
pub const EXIT_UNREPLAYABLE: u8 = 4;
/// Exit code of a usage error (clap uses the same for its own).
pub const EXIT_USAGE: u8 = 2;
/// Exit code of a file or standard input that could not be read.
pub const EXIT_LOCAL: u8 = 3;
/// Added to a gRPC status code to make the exit code.
pub const EXIT_GRPC_BASE: u8 = 10;

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A flag value is wrong (`--input` is not JSON, `--address` is no URL).
    #[error("{0}")]
    Usage(String),
    /// A file, standard input or standard output failed.
    #[error("{what}: {source}")]
    Local {
        /// What was being read or written.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// No connection to the server could be made.
    #[error("cannot reach {address}: {reason}")]
    Unreachable {
        /// The address tried.
        address: String,
        /// The transport's reason.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{}", describe_status(.0))]
    Rpc(Box<Status>),
    /// A definition given to `workflow validate` has problems.
    #[error("the workflow is invalid:{}", problem_lines(.0))]
    Invalid(Vec<(String, String)>),
    /// A run the command waited on ended FAILED or CANCELLED.
    #[error("run {run_id} ended {status}{}", .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    RunNotCompleted {
        /// The run.
        run_id: String,
        /// `FAILED` or `CANCELLED`.
        status: &'static str,
        /// The run's error, `CODE message`, if any.
        reason: Option<String>,
    },
    /// The new definition cannot continue a replayed run (the verdict was
    /// printed).
    #[error("{0}")]
    Incompatible(String),
    /// A history could not be replayed: incomplete, not recorded by this
    /// engine, or not a history at all.
    #[error("cannot replay: {0}")]
    Unreplayable(String),
    /// A bulk operation the command waited on ended CANCELLED or FAILED.
    #[error("bulk operation {operation_id} ended {status}")]
    OperationNotSucceeded {
        /// The operation.
        operation_id: String,
        /// `CANCELLED` or `FAILED`.
        status: &'static str,
    },
}

impl From<Status> for AdminError {
    fn from(status: Status) -> Self {
        AdminError::Rpc(Box::new(status))
    }
}

impl AdminError {
    /// Reads `what` failed.
    pub fn local(what: impl Into<String>, source: std::io::Error) -> Self {
        AdminError::Local {
            what: what.into(),
            source,
        }
    }

    /// The process exit code for this error: the table of [`EXIT_CODES_HELP`].
    pub fn exit_code(&self) -> u8 {
        match self {
            AdminError::Usage(_) => EXIT_USAGE,
            AdminError::Local { .. } => EXIT_LOCAL,
            AdminError::Unreachable { .. } => grpc_exit_code(Code::Unavailable),
            AdminError::Rpc(status) => grpc_exit_code(status.code()),
            AdminError::Invalid(_) => grpc_exit_code(Code::InvalidArgument),
            AdminError::RunNotCompleted { .. } | AdminError::OperationNotSucceeded { .. } => {
                EXIT_RUN_NOT_COMPLETED
            }
            AdminError::Incompatible(_) => EXIT_INCOMPATIBLE,
            AdminError::Unreplayable(_) => EXIT_UNREPLAYABLE,
        }
    }
}

/// `10 + code`, so every gRPC code has an exit code of its own.
pub fn grpc_exit_code(code: Code) -> u8 {
    EXIT_GRPC_BASE + code as u8
}

/// The canonical name of a gRPC code, as grpcurl and the SDKs print it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `CODE: message`, then one indented line per field violation and the
/// error reason, if the status carries them.
fn describe_status(status: &Status) -> String {
    let mut text = format!("{}: {}", code_name(status.code()), status.message());
    if let Some(bad_request) = status.get_details_bad_request() {
        let violations = bad_request
            .field_violations
            .into_iter()
            .map(|v| (v.field, v.description))
            .collect::<Vec<_>>();
        text.push_str(&problem_lines(&violations));
    }
    if let Some(info) = status.get_details_error_info() {
        let _ = write!(text, "\n  reason: {}", info.reason);
    }
    text
}

fn problem_lines(problems: &[(String, String)]) -> String {
    problems
        .iter()
        .map(|(path, message)| format!("\n  {path}: {message}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CODES: [Code; 16] = [
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    #[test]
    fn the_help_text_lists_every_grpc_code_with_its_exit_code() {
        for code in ALL_CODES {
            let entry = format!("{} {}", grpc_exit_code(code), code_name(code));
            assert!(EXIT_CODES_HELP.contains(&entry), "missing `{entry}`");
        }
    }

    #[test]
    fn every_error_kind_has_its_documented_exit_code() {
        assert_eq!(AdminError::Usage("x".into()).exit_code(), 2);
        assert_eq!(
            AdminError::local("f", std::io::Error::other("x")).exit_code(),
            3
        );
        let failed = AdminError::RunNotCompleted {
            run_id: "r".into(),
            status: "FAILED",
            reason: None,
        };
        assert_eq!(failed.exit_code(), 1);
        assert_eq!(AdminError::Invalid(vec![]).exit_code(), 13);
        assert_eq!(AdminError::Incompatible("x".into()).exit_code(), 1);
        assert_eq!(AdminError::Unreplayable("x".into()).exit_code(), 4);
        assert_eq!(AdminError::from(Status::not_found("x")).exit_code(), 15);
        assert_eq!(
            AdminError::from(Status::unauthenticated("x")).exit_code(),
            26
        );
        let unreachable = AdminError::Unreachable {
            address: "a".into(),
            reason: "b".into(),
        };
        assert_eq!(unreachable.exit_code(), 24);
    }

    #[test]
    fn a_status_prints_its_code_message_and_field_violations() {
        let status = Status::with_error_details(
            Code::InvalidArgument,
            "bad workflow",
            tonic_types::ErrorDetails::with_bad_request_violation("nodes[0].type", "unknown"),
        );
        let text = AdminError::from(status).to_string();
        assert_eq!(
            text,
            "INVALID_ARGUMENT: bad workflow\n  nodes[0].type: unknown"
        );
    }
}

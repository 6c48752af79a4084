//! The admin CLI: `composer workflow ...`, `composer run ...`, `composer
//! operation ...`, `composer schedule ...`, `composer queue ...` and `composer server info`, over the public gRPC API only (never the database), so it
//! sees exactly what a token allows. One file per command group; the
//! connection, the output and the errors (with their exit codes) are shared.

pub mod bulk;
mod connect;
mod error;
pub mod global_flags;
mod output;
pub mod queue;
pub mod replay;
pub mod run;
pub mod schedule;
pub mod secret;
pub mod server;
pub mod status;
mod watch;
pub mod workflow;

use std::{future::Future, io::Read, path::Path, process::ExitCode};

use clap::Args;

pub use connect::{Api, ConnectArgs, DEFAULT_ADDRESS};
pub use error::{AdminError, EXIT_CODES_HELP};
pub use output::Format;

/// Flags every admin command takes: where, as whom, and how to print.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// Output format: `table` for people, `json` (the API's response) for scripts.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Runs an admin command to its end and turns the outcome into the exit
/// code of the table in [`EXIT_CODES_HELP`], the error on standard error.
pub fn execute(command: impl Future<Output = Result<(), AdminError>>) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AdminError::local("starting the runtime", e))
        .and_then(|runtime| runtime.block_on(command));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("composer: error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// The text of `path`, or of standard input when it is `-`.
pub fn read_source(path: &Path) -> Result<String, AdminError> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| AdminError::local("standard input", e))?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| AdminError::local(path.display().to_string(), e))
}

/// JSON given in a flag (`--input`), or read from a file (`--input-file`).
pub fn read_json(
    flag: &str,
    text: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<serde_json::Value>, AdminError> {
    let (text, origin) = match (text, file) {
        (Some(text), _) => (text.to_owned(), format!("--{flag}")),
        (None, Some(path)) => (read_source(path)?, format!("--{flag}-file")),
        (None, None) => return Ok(None),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| AdminError::Usage(format!("{origin} is not JSON: {e}")))
}

/// Parses `key=value` (`--label`).
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not key=value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_key_equals_value_and_the_value_may_hold_equals_signs() {
        assert_eq!(parse_label("env=prod"), Ok(("env".into(), "prod".into())));
        assert_eq!(parse_label("q=a=b"), Ok(("q".into(), "a=b".into())));
        assert_eq!(parse_label("k="), Ok(("k".into(), String::new())));
        assert!(parse_label("=v").is_err());
        assert!(parse_label("novalue").is_err());
    }

    #[test]
    fn bad_json_in_a_flag_is_a_usage_error_naming_the_flag() {
        let error = read_json("input", Some("{nope"), None).expect_err("not JSON");
        assert_eq!(error.exit_code(), 2);
        assert!(
            error.to_string().starts_with("--input is not JSON"),
            "{error}"
        );
        assert_eq!(read_json("input", None, None).ok(), Some(None));
    }
}

//! The `composer` binary run as a subprocess, as a user runs it.

use std::{path::PathBuf, process::Stdio, time::Duration};

use composer_testkit::ServerProcess;
use serde_json::Value as Json;
use tokio::{io::AsyncWriteExt, process::Command};

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_composer"))
}

/// `composer <args>` with no connection settings from the environment.
pub fn bare(args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("COMPOSER_ADDRESS")
        .env_remove("COMPOSER_TOKEN")
        .env_remove("COMPOSER_NAMESPACE")
        .env_remove("COMPOSER_CA_CERT")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// `composer <args> --address <server>`, with no connection settings
/// inherited from the environment.
pub fn composer(server: &ServerProcess, args: &[&str]) -> Command {
    let mut command = bare(args);
    command.args(["--address", &server.url()]);
    command
}

/// What a finished command left.
#[derive(Debug)]
pub struct Finished {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn json(&self) -> Json {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{self:#?}");
        self
    }
}

pub async fn finish(mut command: Command, stdin: Option<&str>) -> Finished {
    if stdin.is_some() {
        command.stdin(Stdio::piped());
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn composer");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
        drop(pipe);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("composer finished within a minute")
        .expect("composer ran");
    Finished {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub async fn cli(server: &ServerProcess, args: &[&str]) -> Finished {
    finish(composer(server, args), None).await
}

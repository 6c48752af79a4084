//! A real S3 API for tests: moto's server on a free loopback port
//! (installed into `.tools/moto` by scripts/setup.sh; decision 0046).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// A moto S3 server with one bucket; stopped when dropped.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bucket made at start.
    pub bucket: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `COMPOSER_TEST_MOTO_SERVER`, or the repository's `.tools/moto`.
fn moto_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("COMPOSER_TEST_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = repo.join(".tools/moto/bin/moto_server");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it installs moto, the S3 API these tests use)",
        path.display()
    );
    path
}

impl Moto {
    /// Starts moto and makes `bucket`.
    pub async fn start(bucket: &str) -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let child = Command::new(moto_binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_owned(),
        };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if let Ok(answer) = client
                .put(format!("{}/{bucket}", moto.endpoint))
                .send()
                .await
                && answer.status().is_success()
            {
                return moto;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("moto did not answer within 30 s");
    }

    /// The blob store's location in this bucket.
    pub fn location(&self) -> String {
        format!("s3://{}/composer", self.bucket)
    }

    /// The blob store's options for this server (object_store's names).
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
            ("aws_virtual_hosted_style_request", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

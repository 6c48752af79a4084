//! A throwaway Redis Cluster of masters without replicas: `redis-server`
//! processes on free loopback ports in a folder of their own, joined with
//! `redis-cli --cluster create`. Dropping it kills them and removes the
//! folder.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// How long the cluster may take to agree on its slots.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Ports a node is tried on before its start is a failure.
const START_ATTEMPTS: usize = 4;

/// The cluster's nodes, by index.
pub struct RedisCluster {
    dir: PathBuf,
    ports: Vec<u16>,
    processes: Vec<Option<Child>>,
}

impl RedisCluster {
    /// Starts `masters` nodes, creates the cluster, and waits until every
    /// node reports `cluster_state:ok`.
    pub async fn start(masters: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("composer-cluster-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("cluster folder");
        let mut ports: Vec<u16> = Vec::with_capacity(masters);
        while ports.len() < masters {
            ports.push(free_cluster_port(&ports));
        }
        let mut cluster = Self {
            dir,
            ports,
            processes: (0..masters).map(|_| None).collect(),
        };
        for index in 0..masters {
            cluster.start_node(index).await;
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = tokio::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .await
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        cluster.wait_ok().await;
        cluster
    }

    /// The ports of the nodes, by index.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`
    pub fn cluster_url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The URLs of the nodes at `indexes`, comma-separated.
    pub fn seed_urls(&self, indexes: &[usize]) -> String {
        indexes
            .iter()
            .map(|&i| format!("redis://127.0.0.1:{}", self.ports[i]))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills node `index` with SIGKILL (its data goes with it).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.processes[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `index` again on its port with its `nodes.conf`, so it
    /// takes its slots back, and waits until the cluster is ok.
    pub async fn restart(&mut self, index: usize) {
        self.kill(index);
        let child = self.spawn(index);
        self.processes[index] = Some(child);
        self.wait_answers(index).await;
        self.wait_ok().await;
    }

    /// What `redis-cli -p <port of index> <args>` prints.
    pub async fn cli(&self, index: usize, args: &[&str]) -> String {
        let output = tokio::process::Command::new("redis-cli")
            .args(["-p", &self.ports[index].to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("redis-cli runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The keys node `index` holds that match `pattern`.
    pub async fn keys_on(&self, index: usize, pattern: &str) -> Vec<String> {
        self.cli(index, &["--scan", "--pattern", pattern])
            .await
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect()
    }

    fn spawn(&self, index: usize) -> Child {
        let port = self.ports[index].to_string();
        let config = self.dir.join(format!("nodes-{index}.conf"));
        let log = self.dir.join(format!("redis-{index}.log"));
        Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            // a node down fails the whole cluster (no replicas) only after a
            // minute, longer than a test keeps one down
            .args(["--cluster-node-timeout", "60000"])
            .args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(&config)
            .args(["--save", "", "--appendonly", "no", "--logfile"])
            .arg(&log)
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server)")
    }

    /// Starts node `index` and waits until it answers; on another free
    /// port when the node exits first (another test took its port, or its
    /// bus port, between the pick and the bind).
    async fn start_node(&mut self, index: usize) {
        for _ in 0..START_ATTEMPTS {
            let mut child = self.spawn(index);
            if self.answers_before_exit(index, &mut child).await {
                self.processes[index] = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            self.ports[index] = free_cluster_port(&self.ports);
        }
        let log = std::fs::read_to_string(self.dir.join(format!("redis-{index}.log")))
            .unwrap_or_default();
        panic!(
            "node {index} of the Redis Cluster in {} did not start in {START_ATTEMPTS} attempts; its log ends:\n{}",
            self.dir.display(),
            log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
        );
    }

    /// Whether node `index` answers PING before its process exits, within
    /// [`READY_TIMEOUT`].
    async fn answers_before_exit(&self, index: usize, child: &mut Child) -> bool {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if self.cli(index, &["PING"]).await.trim() == "PONG" {
                return true;
            }
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    async fn wait_answers(&self, index: usize) {
        self.wait_for(|| async { self.cli(index, &["PING"]).await.trim() == "PONG" })
            .await;
    }

    /// Waits until every node says `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        self.wait_for(|| async {
            for index in 0..self.ports.len() {
                let info = self.cli(index, &["CLUSTER", "INFO"]).await;
                if !info.contains("cluster_state:ok") {
                    return false;
                }
            }
            true
        })
        .await;
    }

    async fn wait_for<F: std::future::Future<Output = bool>>(&self, check: impl Fn() -> F) {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while !check().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the Redis Cluster in {} was not ready within {READY_TIMEOUT:?}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for index in 0..self.processes.len() {
            self.kill(index);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port, none of `taken`, whose cluster bus port (the
/// port + 10000) is free too.
fn free_cluster_port(taken: &[u16]) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("local address").port();
        if port >= 55_000 || taken.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

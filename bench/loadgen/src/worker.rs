//! A fast Rust worker speaking the protocol: long-polls with as many tasks
//! as it has free slots, completes each task at once (a no-op handler) with
//! its lease token, and tells the benchmark what happened and when.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use composer_proto::v1::{
    CompleteTaskRequest, DownloadBlobRequest, PollTasksRequest, Task, UploadBlobRequest,
    blob_service_client::BlobServiceClient, worker_service_client::WorkerServiceClient,
};
use prost_types::{Struct, Value, value::Kind};
use tokio::{
    sync::{Semaphore, watch},
    task::JoinHandle,
};
use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};

/// Adds a caller's token to every call; [`Bearer::none`] adds nothing, for
/// servers that run without authentication (`--insecure`).
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// No token: the insecure server's anonymous admin of `default`.
    pub fn none() -> Self {
        Self(None)
    }

    /// `authorization: Bearer <token>` on every call.
    pub fn token(token: &str) -> Result<Self> {
        Ok(Self(Some(format!("Bearer {token}").parse()?)))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A connection whose calls carry a [`Bearer`].
pub type Authed = InterceptedService<Channel, Bearer>;

/// What the worker saw.
#[derive(Debug, Clone)]
pub enum WorkerEvent {
    /// A task reached the worker (leased).
    Leased {
        /// Run.
        run_id: String,
        /// Node.
        node: String,
        /// When the poll answer arrived.
        at: Instant,
    },
    /// A report was answered OK.
    Reported {
        /// Run.
        run_id: String,
        /// Task name.
        task_name: String,
        /// When the report was sent.
        sent: Instant,
        /// When the answer came.
        done: Instant,
    },
}

/// Called for every event (keep it cheap).
pub type Hook = Arc<dyn Fn(WorkerEvent) + Send + Sync>;

/// Counters.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Tasks leased.
    pub leased: AtomicU64,
    /// Reports answered OK.
    pub completed: AtomicU64,
    /// Reports refused or failed.
    pub report_errors: AtomicU64,
    /// Polls failed.
    pub poll_errors: AtomicU64,
}

/// Shape of a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Queue polled.
    pub queue: String,
    /// Polling loops per server.
    pub pollers_per_server: usize,
    /// HTTP/2 connections per server.
    pub connections_per_server: usize,
    /// Tasks held at once (polls ask for at most the free ones).
    pub slots: usize,
    /// Tasks one poll asks for at most.
    pub max_per_poll: usize,
    /// The size of the output each task reports, as `{"blob": "…"}`
    /// (0: an empty object).
    pub output_bytes: usize,
    /// Over this many bytes of JSON, an output is uploaded and reported as
    /// a reference, and the references in a task's input are downloaded,
    /// as the SDKs do (0: outputs go inline).
    pub offload_bytes: usize,
}

/// The output a worker reports for task `task_id`: an empty object, or
/// `{"blob": text, "task": task_id}` (so no two outputs are the same bytes).
fn output_of(text: &str, task_id: &str) -> Value {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    let mut fields = std::collections::BTreeMap::new();
    if !text.is_empty() {
        fields.insert("blob".to_owned(), string(text));
        fields.insert("task".to_owned(), string(task_id));
    }
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

/// A running worker; stop it with [`FastWorker::stop`].
pub struct FastWorker {
    /// Counters.
    pub stats: Arc<WorkerStats>,
    stop: watch::Sender<bool>,
    handles: Vec<JoinHandle<()>>,
}

/// Connects to `url` (a lazy channel: no I/O until used).
pub async fn channel(url: &str) -> Result<Channel> {
    Ok(Channel::from_shared(url.to_owned())?
        .tcp_nodelay(true)
        .connect()
        .await?)
}

impl FastWorker {
    /// Starts polling every server in `urls`.
    pub async fn start(urls: &[String], config: &WorkerConfig, hook: Option<Hook>) -> Result<Self> {
        Self::start_as(urls, config, hook, &Bearer::none()).await
    }

    /// [`start`](FastWorker::start), every call carrying `bearer`.
    pub async fn start_as(
        urls: &[String],
        config: &WorkerConfig,
        hook: Option<Hook>,
        bearer: &Bearer,
    ) -> Result<Self> {
        let stats = Arc::new(WorkerStats::default());
        let slots = Arc::new(Semaphore::new(config.slots));
        let blob_text: Arc<str> = incompressible_text(config.output_bytes).into();
        let (stop, stop_rx) = watch::channel(false);
        let mut handles = Vec::new();
        for (s, url) in urls.iter().enumerate() {
            let mut clients = Vec::new();
            let mut channels = Vec::new();
            for _ in 0..config.connections_per_server.max(1) {
                let connected = channel(url).await?;
                channels.push(connected.clone());
                clients.push(
                    WorkerServiceClient::with_interceptor(connected, bearer.clone())
                        .max_decoding_message_size(64 << 20)
                        .max_encoding_message_size(64 << 20),
                );
            }
            for p in 0..config.pollers_per_server {
                let poller = Poller {
                    client: clients[p % clients.len()].clone(),
                    worker_id: format!("bench-{s}-{p}"),
                    queue: config.queue.clone(),
                    max: config.max_per_poll.clamp(1, 100),
                    slots: Arc::clone(&slots),
                    stats: Arc::clone(&stats),
                    hook: hook.clone(),
                    blob_text: Arc::clone(&blob_text),
                    blobs: (config.offload_bytes > 0).then(|| BlobIo {
                        client: BlobServiceClient::with_interceptor(
                            channels[p % channels.len()].clone(),
                            bearer.clone(),
                        )
                        .max_decoding_message_size(64 << 20),
                        offload_bytes: config.offload_bytes,
                    }),
                };
                handles.push(tokio::spawn(poller.run(stop_rx.clone())));
            }
        }
        Ok(Self {
            stats,
            stop,
            handles,
        })
    }

    /// Stops polling; reports in flight are let finish for at most 5 s.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for handle in self.handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
        }
    }
}

#[derive(Clone)]
struct Poller {
    client: WorkerServiceClient<Authed>,
    worker_id: String,
    queue: String,
    max: usize,
    slots: Arc<Semaphore>,
    stats: Arc<WorkerStats>,
    hook: Option<Hook>,
    /// The output's `blob` string ("": none).
    blob_text: Arc<str>,
    /// Set: the worker moves payloads through BlobService.
    blobs: Option<BlobIo>,
}

/// What an SDK does with large payloads: download the references in a
/// task's input, upload a large output and report its reference.
#[derive(Clone)]
struct BlobIo {
    client: BlobServiceClient<Authed>,
    offload_bytes: usize,
}

/// A task's output as an SDK serializes its handler's result: once, from
/// the handler's own value (no copy of the payload before it); the same
/// value as [`output_of`].
#[derive(serde::Serialize)]
struct Output<'a> {
    blob: &'a str,
    task: &'a str,
}

impl BlobIo {
    /// Downloads every blob `input` refers to (the bytes are dropped: a
    /// handler would read them).
    async fn fetch_input(&mut self, input: &Value) -> Result<()> {
        let input = composer_grpc::convert::to_json(Some(input.clone()), "input")?;
        let digests = composer_engine::blob::references(&input)
            .into_iter()
            .filter_map(composer_engine::blob::reference_digest);
        for sha256 in digests {
            let request = DownloadBlobRequest {
                sha256: sha256.to_owned(),
                offset: 0,
            };
            let mut stream = self.client.download_blob(request).await?.into_inner();
            while let Some(chunk) = stream.message().await? {
                std::hint::black_box(chunk.data.len());
            }
        }
        Ok(())
    }

    /// The output to report ([`output_of`] of `blob_text`), uploaded when
    /// large.
    async fn output(&mut self, blob_text: &str, task_id: &str) -> Result<Value> {
        let output = Output {
            blob: blob_text,
            task: task_id,
        };
        let text = tonic::codegen::Bytes::from(serde_json::to_vec(&output)?);
        if blob_text.is_empty() || text.len() <= self.offload_bytes {
            return Ok(output_of(blob_text, task_id));
        }
        let chunks: Vec<UploadBlobRequest> = (0..text.len())
            .step_by(1 << 20)
            .map(|start| UploadBlobRequest {
                data: text.slice(start..text.len().min(start + (1 << 20))),
            })
            .collect();
        let blob = self
            .client
            .upload_blob(futures::stream::iter(chunks))
            .await?
            .into_inner()
            .blob
            .ok_or_else(|| anyhow::anyhow!("the upload returned no reference"))?;
        let size = u64::try_from(blob.size).unwrap_or_default();
        let reference = composer_engine::blob::reference(&blob.sha256, size, &blob.head);
        Ok(composer_grpc::convert::from_json(&reference))
    }
}

impl Poller {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let first = tokio::select! {
                permit = Arc::clone(&self.slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            let mut permits = vec![first];
            while permits.len() < self.max {
                match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let request = PollTasksRequest {
                confirm_receipt: false,
                worker_id: self.worker_id.clone(),
                queues: vec![self.queue.clone()],
                max_tasks: i32::try_from(permits.len()).unwrap_or(1),
                wait: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
            };
            let polled = tokio::select! {
                polled = self.client.poll_tasks(request) => polled,
                _ = stop.changed() => return,
            };
            let tasks = match polled {
                Ok(response) => response.into_inner().tasks,
                Err(_) => {
                    self.stats.poll_errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let at = Instant::now();
            for task in tasks {
                self.stats.leased.fetch_add(1, Ordering::Relaxed);
                if let Some(hook) = &self.hook {
                    hook(WorkerEvent::Leased {
                        run_id: task.run_id.clone(),
                        node: task.node_id.clone(),
                        at,
                    });
                }
                let permit = permits.pop();
                let mut client = self.client.clone();
                let stats = Arc::clone(&self.stats);
                let hook = self.hook.clone();
                let blob_text = Arc::clone(&self.blob_text);
                let blobs = self.blobs.clone();
                tokio::spawn(async move {
                    let output = match blobs {
                        Some(blobs) => match moved(blobs, &task, &blob_text).await {
                            Ok(output) => output,
                            Err(_) => {
                                stats.report_errors.fetch_add(1, Ordering::Relaxed);
                                drop(permit);
                                return;
                            }
                        },
                        None => output_of(&blob_text, &task.task_id),
                    };
                    complete(&mut client, task, output, &stats, hook.as_ref()).await;
                    drop(permit);
                });
            }
        }
    }
}

/// The input fetched and the output made ready, as an SDK would.
async fn moved(mut blobs: BlobIo, task: &Task, blob_text: &str) -> Result<Value> {
    if let Some(input) = &task.input {
        blobs.fetch_input(input).await?;
    }
    blobs.output(blob_text, &task.task_id).await
}

async fn complete(
    client: &mut WorkerServiceClient<Authed>,
    task: Task,
    output: Value,
    stats: &WorkerStats,
    hook: Option<&Hook>,
) {
    let sent = Instant::now();
    let result = client
        .complete_task(CompleteTaskRequest {
            task_id: task.task_id,
            attempt: task.attempt,
            lease_token: task.lease_token,
            output: Some(output),
        })
        .await;
    match result {
        Ok(_) => {
            stats.completed.fetch_add(1, Ordering::Relaxed);
            if let Some(hook) = hook {
                hook(WorkerEvent::Reported {
                    run_id: task.run_id,
                    task_name: task.task_name,
                    sent,
                    done: Instant::now(),
                });
            }
        }
        Err(_) => {
            stats.report_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `bytes` characters that compress about as badly as JSON data does
/// (six bits of entropy each), so TOAST compression cannot hide a payload.
pub(crate) fn incompressible_text(bytes: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..bytes)
        .map(|_| {
            // xorshift64: fixed, so every run writes the same bytes
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect()
}

//! A small worker speaking the gRPC worker protocol, for tests: it polls,
//! runs a scripted handler, heartbeats, reports with the lease token, and
//! logs every lease it got.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use composer_proto::v1::{
    CompleteTaskRequest, FailTaskRequest, HeartbeatRequest, PollTasksRequest, Task,
    worker_service_client::WorkerServiceClient,
};
use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::Value as Json;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// What the handler does with a task.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Report success with this output.
    Complete(Json),
    /// Report failure.
    Fail {
        /// Code.
        code: String,
        /// Retryable.
        retryable: bool,
    },
    /// Heartbeat for this long, then report success with the output.
    Slow(Duration, Json),
    /// Take the task and never report or heartbeat (a crashed worker).
    Vanish,
}

/// A lease the worker got: task id, attempt, lease token, node id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Task.
    pub task_id: String,
    /// Attempt.
    pub attempt: i32,
    /// Token.
    pub lease_token: String,
    /// Node.
    pub node_id: String,
    /// Task name.
    pub task_name: String,
    /// Input.
    pub input: Json,
}

type Handler = Arc<dyn Fn(&LeaseRecord) -> Outcome + Send + Sync>;

/// A running test worker; stops when dropped.
pub struct TestWorker {
    /// Every lease received, in order.
    pub leases: Arc<Mutex<Vec<LeaseRecord>>>,
    /// Reports refused, as (task id, attempt, gRPC code).
    pub refused: Arc<Mutex<Vec<(String, i32, tonic::Code)>>>,
    /// Tasks held now, and the most ever held at once.
    active: Arc<Mutex<(usize, usize)>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl TestWorker {
    /// Starts `pollers` polling loops on `queues` at `url`, each taking up
    /// to `max_tasks` per poll and handling tasks concurrently.
    pub async fn start(
        url: &str,
        queues: &[&str],
        pollers: usize,
        max_tasks: i32,
        handler: impl Fn(&LeaseRecord) -> Outcome + Send + Sync + 'static,
    ) -> Self {
        let channel = Channel::from_shared(url.to_owned())
            .expect("url")
            .connect()
            .await
            .expect("connect the test worker");
        let handler: Handler = Arc::new(handler);
        let leases = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let active = Arc::new(Mutex::new((0, 0)));
        let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
        let tasks = (0..pollers)
            .map(|index| {
                let client = WorkerServiceClient::new(channel.clone());
                let context = PollerContext {
                    client,
                    queues: queues.clone(),
                    worker_id: format!("test-worker-{index}"),
                    max_tasks,
                    handler: Arc::clone(&handler),
                    leases: Arc::clone(&leases),
                    refused: Arc::clone(&refused),
                    active: Arc::clone(&active),
                };
                tokio::spawn(context.run())
            })
            .collect();
        Self {
            leases,
            refused,
            active,
            tasks,
        }
    }

    /// The most tasks this worker held at once (leased, not yet reported).
    pub fn max_active(&self) -> usize {
        self.active.lock().expect("active").1
    }

    /// A copy of the leases so far.
    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.leases.lock().expect("leases").clone()
    }
}

#[derive(Clone)]
struct PollerContext {
    client: WorkerServiceClient<Channel>,
    queues: Vec<String>,
    worker_id: String,
    max_tasks: i32,
    handler: Handler,
    leases: Arc<Mutex<Vec<LeaseRecord>>>,
    refused: Arc<Mutex<Vec<(String, i32, tonic::Code)>>>,
    active: Arc<Mutex<(usize, usize)>>,
}

impl PollerContext {
    async fn run(mut self) {
        loop {
            let polled = self
                .client
                .poll_tasks(PollTasksRequest {
                    confirm_receipt: false,
                    worker_id: self.worker_id.clone(),
                    queues: self.queues.clone(),
                    max_tasks: self.max_tasks,
                    wait: Some(prost_types::Duration {
                        seconds: 2,
                        nanos: 0,
                    }),
                })
                .await;
            let tasks = match polled {
                Ok(response) => response.into_inner().tasks,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            for task in tasks {
                let context = self.clone();
                tokio::spawn(async move { context.handle(task).await });
            }
        }
    }

    async fn handle(mut self, task: Task) {
        let record = LeaseRecord {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            lease_token: task.lease_token.clone(),
            node_id: task.node_id.clone(),
            task_name: task.task_name.clone(),
            input: task.input.clone().map(json_of).unwrap_or(Json::Null),
        };
        self.leases.lock().expect("leases").push(record.clone());
        {
            let mut active = self.active.lock().expect("active");
            active.0 += 1;
            active.1 = active.1.max(active.0);
        }
        let outcome = (self.handler)(&record);
        let result = match outcome {
            Outcome::Vanish => return,
            Outcome::Complete(output) => self.complete(&task, output).await,
            Outcome::Slow(duration, output) => {
                let deadline = tokio::time::Instant::now() + duration;
                while tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let _ = self
                        .client
                        .heartbeat(HeartbeatRequest {
                            task_id: task.task_id.clone(),
                            attempt: task.attempt,
                            lease_token: task.lease_token.clone(),
                        })
                        .await;
                }
                self.complete(&task, output).await
            }
            Outcome::Fail { code, retryable } => self
                .client
                .fail_task(FailTaskRequest {
                    task_id: task.task_id.clone(),
                    attempt: task.attempt,
                    lease_token: task.lease_token.clone(),
                    error_code: code,
                    message: "scripted failure".to_owned(),
                    retryable,
                    details: None,
                })
                .await
                .map(|_| ()),
        };
        self.active.lock().expect("active").0 -= 1;
        if let Err(status) = result {
            self.refused
                .lock()
                .expect("refused")
                .push((task.task_id, task.attempt, status.code()));
        }
    }

    async fn complete(&mut self, task: &Task, output: Json) -> Result<(), tonic::Status> {
        self.client
            .complete_task(CompleteTaskRequest {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token.clone(),
                output: Some(value_of(&output)),
            })
            .await
            .map(|_| ())
    }
}

/// JSON as a protobuf Value.
pub fn value_of(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        Json::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), value_of(v)))
                .collect::<BTreeMap<_, _>>(),
        }),
    };
    Value { kind: Some(kind) }
}

/// A protobuf Value as JSON (integral numbers as integers).
pub fn json_of(value: Value) -> Json {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 1e15 => Json::from(n as i64),
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(n).map_or(Json::Null, Json::Number)
        }
        Some(Kind::StringValue(s)) => Json::String(s),
        Some(Kind::ListValue(list)) => Json::Array(list.values.into_iter().map(json_of).collect()),
        Some(Kind::StructValue(object)) => Json::Object(
            object
                .fields
                .into_iter()
                .map(|(k, v)| (k, json_of(v)))
                .collect(),
        ),
    }
}

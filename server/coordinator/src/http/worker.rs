//! The server's own worker for HTTP nodes: it takes `_http` tasks through
//! the same lease protocol as any SDK worker (poll, heartbeat, fenced
//! report), so HTTP steps get leases, retries and recovery like the rest.

use std::{collections::HashSet, sync::Arc, time::Duration};

use composer_store::tasks::{LeasedTask, TaskScope};
use tokio::sync::{Semaphore, watch};

use crate::{
    Coordinator, Reporter, TaskReport,
    dispatch::poll_hub::{PollHub, PollRequest},
    http::{HTTP_QUEUE, HttpExecutor, HttpOutcome, codes},
};

/// Settings of the HTTP worker.
#[derive(Debug, Clone)]
pub struct HttpWorkerConfig {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// How often to look for namespaces that appeared.
    pub namespace_refresh: Duration,
}

/// Serves `_http` tasks of every namespace with workflows until `shutdown`
/// flips; in-flight requests finish.
pub async fn run_http_worker(
    coordinator: Coordinator,
    hub: Arc<PollHub>,
    executor: Arc<HttpExecutor>,
    config: HttpWorkerConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut served: HashSet<String> = HashSet::new();
    while !*shutdown.borrow() {
        match coordinator.namespaces().await {
            Ok(namespaces) => {
                for namespace in namespaces {
                    if served.insert(namespace.clone()) {
                        tokio::spawn(serve_namespace(
                            coordinator.clone(),
                            Arc::clone(&hub),
                            Arc::clone(&executor),
                            Arc::clone(&slots),
                            namespace,
                            shutdown.clone(),
                        ));
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "http worker could not list namespaces"),
        }
        tokio::select! {
            () = tokio::time::sleep(config.namespace_refresh) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn serve_namespace(
    coordinator: Coordinator,
    hub: Arc<PollHub>,
    executor: Arc<HttpExecutor>,
    slots: Arc<Semaphore>,
    namespace: String,
    shutdown: watch::Receiver<bool>,
) {
    let queues = vec![HTTP_QUEUE.to_owned()];
    while !*shutdown.borrow() {
        let free = slots.available_permits().max(1);
        let tasks = hub
            .poll(
                &namespace,
                &queues,
                PollRequest {
                    worker_id: "composer-http-worker",
                    max: free,
                    wait: Duration::from_secs(5),
                    // in-process: its answer cannot be lost
                    confirm_receipt: false,
                },
            )
            .await
            // one internal queue: never past the namespace's queue limit
            .unwrap_or_default();
        coordinator.remember_leases(&tasks);
        for task in tasks {
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (coordinator, executor) = (coordinator.clone(), Arc::clone(&executor));
            tokio::spawn(async move {
                execute(&coordinator, &executor, task).await;
                drop(permit);
            });
        }
    }
}

async fn execute(coordinator: &Coordinator, executor: &HttpExecutor, task: LeasedTask) {
    // the server's own worker acts on its own queue and nothing else
    let scope = TaskScope {
        namespace: task.namespace.clone(),
        queues: Some(vec![HTTP_QUEUE.to_owned()]),
    };
    let task_id = task.id.to_string();
    let token = task.lease_token.to_string();
    let names = crate::secrets::values::declared_names(&task.input);
    let secrets = match coordinator.secret_values(&task.namespace, &names).await {
        Ok(secrets) => secrets,
        Err(error) => {
            let report = TaskReport::Failed {
                code: codes::SECRET_UNAVAILABLE.to_owned(),
                message: error.to_string(),
                // a secret set or a key given later lets a retry succeed
                retryable: true,
                details: None,
            };
            report_outcome(coordinator, &scope, &task, &token, report).await;
            return;
        }
    };
    let request = executor.execute_with_secrets(&task.input, &task_id, &secrets);
    tokio::pin!(request);
    let period = Duration::from_millis(
        u64::try_from(task.heartbeat_timeout_ms / 3)
            .unwrap_or(1000)
            .max(100),
    );
    let outcome = loop {
        tokio::select! {
            outcome = &mut request => break outcome,
            () = tokio::time::sleep(period) => {
                match coordinator.heartbeat(&scope, &task_id, task.attempt, &token).await {
                    Ok(answer) if answer.cancel_requested => return,
                    Ok(_) => {}
                    Err(crate::CoordinatorError::LeaseLost { .. }) => return,
                    Err(error) => tracing::warn!(%task_id, %error, "http heartbeat failed"),
                }
            }
        }
    };
    let report = match outcome {
        HttpOutcome::Completed(output) => TaskReport::Completed { output },
        HttpOutcome::Failed {
            code,
            message,
            retryable,
        } => TaskReport::Failed {
            code,
            message,
            retryable,
            details: None,
        },
    };
    report_outcome(coordinator, &scope, &task, &token, report).await;
}

async fn report_outcome(
    coordinator: &Coordinator,
    scope: &TaskScope,
    task: &LeasedTask,
    token: &str,
    report: TaskReport,
) {
    let task_id = task.id.to_string();
    let reported = coordinator
        .report(
            scope,
            &task_id,
            task.attempt,
            token,
            report,
            Reporter {
                actor: "worker:composer-http",
                traceparent: None,
                answer_sent: None,
            },
        )
        .await;
    if let Err(error) = reported {
        tracing::warn!(%task_id, attempt = task.attempt, %error, "http report not applied");
    }
}

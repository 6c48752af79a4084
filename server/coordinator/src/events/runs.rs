//! Run control: start, read, cancel, retry, send events.

use composer_engine::{Event, NodeKey, history::HistoryEventType};
use composer_store::{
    events,
    runs::{self, HistoryRow, HistoryWrite, NewRun, NodeRow, RunFilter, RunRow},
};
use serde_json::{Value as Json, json};
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    Coordinator,
    error::{CoordinatorError, FieldProblem},
    events::apply::{RunTxn, run_status_text, seed},
    events::bulk_step::BulkStep,
};

/// CountRuns counts up to this many matching runs and then says "more": a
/// count then costs about the same on ten million runs as on a hundred
/// thousand (decision 0052).
pub const RUN_COUNT_LIMIT: i64 = 100_000;

/// A StartRun request.
#[derive(Debug, Clone)]
pub struct StartRun {
    /// Namespace.
    pub namespace: String,
    /// Workflow.
    pub workflow_name: String,
    /// Version; None: the latest.
    pub version: Option<i32>,
    /// Input.
    pub input: Json,
    /// Optional idempotency key.
    pub idempotency_key: Option<String>,
    /// Labels (a JSON object of strings).
    pub labels: Json,
    /// Who asks.
    pub actor: String,
    /// The caller's W3C traceparent, if it sent one: the run's trace
    /// continues it (when traces are on).
    pub traceparent: Option<String>,
    /// Dispatch priority, 1 (lowest) to 5 (highest).
    pub priority: i16,
}

/// A run with its node states.
#[derive(Debug, Clone)]
pub struct RunView {
    /// The run.
    pub run: RunRow,
    /// Its nodes (empty when not asked for).
    pub nodes: Vec<NodeRow>,
    /// The type (TASK, HTTP, ...) of each node id of its workflow version.
    pub node_types: std::collections::HashMap<String, String>,
}

/// Where SendEvent delivers.
#[derive(Debug, Clone)]
pub enum EventTarget {
    /// One run.
    Run(Uuid),
    /// Runs waiting on a correlation key.
    Correlation(String),
}

impl EventTarget {
    /// `run:<id>` or `correlation:<key>`, as a request id records it.
    fn describe(&self) -> String {
        match self {
            EventTarget::Run(id) => format!("run:{id}"),
            EventTarget::Correlation(key) => format!("correlation:{key}"),
        }
    }
}

/// What SendEvent did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SendEventResult {
    /// Runs whose wait consumed the event.
    pub delivered: Vec<Uuid>,
    /// True when the event was kept for a later wait.
    pub stored: bool,
}

/// Where `input` breaks its workflow's input schema (none: no schema).
fn input_problems(workflow: &crate::workflows::LoadedWorkflow, input: &Json) -> Vec<FieldProblem> {
    let Some(schema) = &workflow.input_schema else {
        return Vec::new();
    };
    schema
        .iter_errors(input)
        .map(|e| FieldProblem {
            field: format!("input{}", pointer_to_path(&e.instance_path().to_string())),
            description: e.to_string(),
        })
        .collect()
}

fn parse_run_id(text: &str) -> Result<Uuid, CoordinatorError> {
    Uuid::parse_str(text).map_err(|_| CoordinatorError::RunNotFound(text.to_owned()))
}

impl Coordinator {
    /// Starts a run, or returns the run an idempotency key already names.
    ///
    /// One transaction of two statements: insert the run (which also checks
    /// that "the latest version" taken from the cache still is), then the
    /// write of its first event. A new run has no node state to read.
    pub async fn start_run(&self, request: StartRun) -> Result<(RunRow, bool), CoordinatorError> {
        let span = crate::observe::traces::start_run(
            request.traceparent.as_deref(),
            &request.namespace,
            &request.workflow_name,
        );
        let run_trace = crate::observe::traces::traceparent(&span);
        self.start_run_traced(request, run_trace)
            .instrument(span)
            .await
    }

    /// [`start_run`](Coordinator::start_run), whose spans hang under `run_trace`.
    async fn start_run_traced(
        &self,
        mut request: StartRun,
        run_trace: Option<String>,
    ) -> Result<(RunRow, bool), CoordinatorError> {
        let quotas = self.config.quotas.of(&request.namespace);
        let mut workflow = self.load_workflow(&request, false).await?;
        // held until the start ends, when what it armed has been counted
        let _reserved = self.task_rates.admit(
            &request.namespace,
            &quotas,
            workflow.armed_at_start(),
            std::time::Instant::now(),
        )?;
        self.check_input(
            &request,
            &workflow,
            crate::limits::cpu_pool::Admission::RefuseWhenFull,
        )
        .await?;
        request.input = self
            .accept_payload(
                &request.namespace,
                "input",
                std::mem::take(&mut request.input),
            )
            .await?;
        for _ in 0..3 {
            if let Some(started) = self
                .try_start_run(&request, &workflow, run_trace.clone())
                .await?
            {
                return Ok(started);
            }
            // a newer version was registered since the cache learnt "latest"
            workflow = self.workflow_to_start(&request, true).await?;
        }
        Err(CoordinatorError::Corrupt(format!(
            "workflow {:?}: its latest version kept changing",
            request.workflow_name
        )))
    }

    pub(crate) async fn workflow_to_start(
        &self,
        request: &StartRun,
        refresh: bool,
    ) -> Result<std::sync::Arc<crate::workflows::LoadedWorkflow>, CoordinatorError> {
        self.workflow_to_start_as(
            request,
            refresh,
            crate::limits::cpu_pool::Admission::RefuseWhenFull,
        )
        .await
    }

    /// [`workflow_to_start`](Coordinator::workflow_to_start), its input
    /// checked on the CPU pool as `admission` says (a schedule's fire is
    /// the server's own work: it waits).
    pub(crate) async fn workflow_to_start_as(
        &self,
        request: &StartRun,
        refresh: bool,
        admission: crate::limits::cpu_pool::Admission,
    ) -> Result<std::sync::Arc<crate::workflows::LoadedWorkflow>, CoordinatorError> {
        let workflow = self.load_workflow(request, refresh).await?;
        self.check_input(request, &workflow, admission).await?;
        Ok(workflow)
    }

    /// The version `request` names, or the latest one (`refresh`: asked
    /// of Postgres, not the cache); its input not checked yet.
    async fn load_workflow(
        &self,
        request: &StartRun,
        refresh: bool,
    ) -> Result<std::sync::Arc<crate::workflows::LoadedWorkflow>, CoordinatorError> {
        let workflow = match request.version {
            Some(version) => {
                self.workflows
                    .get(
                        &self.store,
                        &request.namespace,
                        &request.workflow_name,
                        Some(version),
                    )
                    .await?
            }
            None => {
                self.workflows
                    .latest(
                        &self.store,
                        &request.namespace,
                        &request.workflow_name,
                        refresh,
                    )
                    .await?
            }
        };
        Ok(workflow)
    }

    /// Checks the input against the workflow's schema: on the CPU pool
    /// when the schema runs regular expressions or the input is large
    /// (decision 0036), inline otherwise.
    async fn check_input(
        &self,
        request: &StartRun,
        workflow: &std::sync::Arc<crate::workflows::LoadedWorkflow>,
        admission: crate::limits::cpu_pool::Admission,
    ) -> Result<(), CoordinatorError> {
        if workflow.input_schema.is_none() {
            return Ok(());
        }
        // a schema checks values: references are read for it
        let resolved = if composer_engine::blob::holds_references(&request.input) {
            Some(self.resolved(&request.namespace, &request.input).await)
        } else {
            None
        };
        let input = resolved.as_ref().unwrap_or(&request.input);
        let costly = workflow.input_check_is_costly
            || resolved.is_some()
            || composer_engine::json_text::len(input) > crate::workflows::INLINE_INPUT_CHECK_BYTES;
        let problems = if costly {
            let (workflow, input) = (std::sync::Arc::clone(workflow), input.clone());
            self.workflows
                .cpu_pool()
                .run(&request.namespace, admission, move || {
                    input_problems(&workflow, &input)
                })
                .await?
        } else {
            input_problems(workflow, input)
        };
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CoordinatorError::InvalidArgument(problems))
        }
    }

    /// None: the workflow's latest version is not `workflow` any more.
    async fn try_start_run(
        &self,
        request: &StartRun,
        workflow: &std::sync::Arc<crate::workflows::LoadedWorkflow>,
        traceparent: Option<String>,
    ) -> Result<Option<(RunRow, bool)>, CoordinatorError> {
        let (mut run, record) = new_run_row(request, workflow, traceparent)?;
        let only_if_latest = request.version.is_none();
        // a run under a concurrency key locks its key's slot: a transaction
        let keyed = workflow.compiled.concurrency().is_some();
        let applied = if !keyed && crate::events::apply::start_writes_rows_only(workflow, &record) {
            // the usual start: one statement, in the next group's
            // transaction (or autocommitted alone)
            self.start_grouped(crate::events::group::NewStart {
                run: run.clone(),
                workflow: std::sync::Arc::clone(workflow),
                only_if_latest,
                actor: request.actor.clone(),
            })
            .await?
        } else {
            self.start_in_transaction(request, workflow, &run, only_if_latest)
                .await?
        };
        let Some(created_at) = applied.created_at else {
            return self.existing_run(request).await;
        };
        workflow.started_arming(applied.armed);
        run.created_at = created_at;
        run.updated_at = created_at;
        run.status = applied.status;
        run.output = applied.output;
        run.error = applied.error;
        run.concurrency_key = applied.concurrency_key;
        Ok(Some((run, true)))
    }

    /// Starts a run inside the caller's transaction `conn` (a schedule's
    /// fire): the same checks, rows and first event as [`start_run`], on
    /// the version `request` names or the latest one now. Returns the run
    /// id and, for a run it created, what to announce once the caller
    /// committed; an idempotency key already used returns that run's id
    /// and nothing to announce.
    ///
    /// [`start_run`]: Coordinator::start_run
    pub(crate) async fn start_run_on(
        &self,
        conn: &mut sqlx::PgConnection,
        request: &StartRun,
    ) -> Result<(Uuid, Option<crate::events::apply::Applied>), CoordinatorError> {
        let workflow = self
            .workflow_to_start_as(request, true, crate::limits::cpu_pool::Admission::Wait)
            .await?;
        let request = &StartRun {
            input: self
                .accept_payload(&request.namespace, "input", request.input.clone())
                .await?,
            ..request.clone()
        };
        // a fire has no caller's trace: a new one, when traces are on
        let span =
            crate::observe::traces::start_run(None, &request.namespace, &request.workflow_name);
        let (run, _) = new_run_row(
            request,
            &workflow,
            crate::observe::traces::traceparent(&span),
        )?;
        let run_id = run.id;
        match self
            .insert_and_start(conn, request, &workflow, &run, false)
            .await?
        {
            Some(applied) => Ok((run_id, Some(applied))),
            None => {
                let key = request.idempotency_key.as_deref().unwrap_or_default();
                let existing = runs::run_id_by_idempotency_key(conn, &request.namespace, key)
                    .await?
                    .ok_or_else(|| {
                        CoordinatorError::Corrupt(format!("idempotency key {key:?} names no run"))
                    })?;
                Ok((existing, None))
            }
        }
    }

    /// Admits `run` under its concurrency key (if its workflow declares
    /// one: `run` then says its key, its slot and QUEUED if it waits) and
    /// inserts it. A keyed admission runs in a savepoint, so a run not
    /// inserted (None) leaves no slot taken and no run told to cancel in
    /// the caller's transaction (a schedule's fire continues it).
    async fn admit_and_insert(
        &self,
        conn: &mut sqlx::PgConnection,
        workflow: &crate::workflows::LoadedWorkflow,
        input: &Json,
        run: &mut RunRow,
        only_if_latest: bool,
    ) -> Result<
        Option<(
            chrono::DateTime<chrono::Utc>,
            Option<crate::events::concurrency::Admitted>,
        )>,
        CoordinatorError,
    > {
        let Some((key, concurrency)) = crate::events::concurrency::run_key(workflow, input)? else {
            let created =
                runs::insert_run(conn, &top_level_insert(run, None), only_if_latest).await?;
            return Ok(created.map(|at| (at, None)));
        };
        let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
        let admitted = crate::events::concurrency::admit(
            &mut savepoint,
            &run.namespace,
            &run.workflow_name,
            key,
            concurrency,
            &self.quotas().of(&run.namespace),
        )
        .await?;
        run.concurrency_key = Some(admitted.key.clone());
        run.concurrency_holds = admitted.admission().holds;
        if admitted.queued() {
            run.status = composer_store::concurrency::QUEUED.to_owned();
        }
        let insert = top_level_insert(run, Some(admitted.admission()));
        let Some(created_at) = runs::insert_run(&mut savepoint, &insert, only_if_latest).await?
        else {
            savepoint.rollback().await?;
            return Ok(None);
        };
        savepoint.commit().await?;
        Ok(Some((created_at, Some(admitted))))
    }

    /// Inserts a top-level run on `conn` (admitted under its concurrency
    /// key, if its workflow declares one) and applies its first event:
    /// its start, or the cancel of a `cancel_new`; a QUEUED run gets none.
    /// None: not inserted (its idempotency key is taken, or a newer
    /// version exists when `only_if_latest`). The caller commits and
    /// announces.
    async fn insert_and_start(
        &self,
        conn: &mut sqlx::PgConnection,
        request: &StartRun,
        workflow: &std::sync::Arc<crate::workflows::LoadedWorkflow>,
        run: &RunRow,
        only_if_latest: bool,
    ) -> Result<Option<crate::events::apply::Applied>, CoordinatorError> {
        let mut run = run.clone();
        let Some((created_at, admitted)) = self
            .admit_and_insert(conn, workflow, &request.input, &mut run, only_if_latest)
            .await?
        else {
            return Ok(None);
        };
        let first = admitted
            .as_ref()
            .map_or(Some(Event::RunStarted), |a| a.first_event());
        let mut applied = match first {
            Some(event) => {
                let mut txn = RunTxn::new_run(self, run.clone(), std::sync::Arc::clone(workflow))?;
                txn.push(event, &request.actor);
                txn.finish(conn).await?
            }
            None => crate::events::apply::Applied {
                status: run.status.clone(),
                run_id: run.id,
                ..Default::default()
            },
        };
        if let Some(evicted) = admitted.as_ref().and_then(|a| a.evicted()) {
            applied.inbox_runs.push(evicted);
        }
        applied.created_at = Some(created_at);
        applied.concurrency_key = run.concurrency_key;
        Ok(Some(applied))
    }
}

/// The row (and engine record) of a run `request` would start.
/// The insert of a run started by a caller (no parent).
fn top_level_insert<'r>(run: &'r RunRow, concurrency: Option<runs::Admission<'r>>) -> NewRun<'r> {
    NewRun {
        id: run.id,
        namespace: &run.namespace,
        workflow_name: &run.workflow_name,
        workflow_version: run.workflow_version,
        status: &run.status,
        input: &run.input,
        labels: &run.labels,
        idempotency_key: run.idempotency_key.as_deref(),
        parent_run_id: None,
        parent_node: None,
        parent_attempt: None,
        record: &run.record,
        traceparent: run.traceparent.as_deref(),
        priority: run.priority,
        concurrency,
    }
}

fn new_run_row(
    request: &StartRun,
    workflow: &crate::workflows::LoadedWorkflow,
    traceparent: Option<String>,
) -> Result<(RunRow, composer_engine::RunRecord), CoordinatorError> {
    let run_id = Uuid::now_v7();
    let record = composer_engine::RunState::new(
        run_id.to_string(),
        &workflow.row.name,
        u32::try_from(workflow.row.version).unwrap_or_default(),
        request.input.clone(),
    )
    .run;
    let now = chrono::Utc::now();
    let run = RunRow {
        id: run_id,
        namespace: request.namespace.clone(),
        workflow_name: workflow.row.name.clone(),
        workflow_version: workflow.row.version,
        status: run_status_text(record.status),
        input: request.input.clone(),
        output: None,
        error: None,
        labels: request.labels.clone(),
        idempotency_key: request.idempotency_key.clone(),
        parent_run_id: None,
        parent_node: None,
        parent_attempt: None,
        record: crate::events::apply::stored_record(&record)?,
        created_at: now,
        updated_at: now,
        ended_at: None,
        traceparent,
        priority: request.priority,
        concurrency_key: None,
        concurrency_holds: false,
    };
    Ok((run, record))
}

impl Coordinator {
    /// A start that needs statements of its own (a concurrency key's slot,
    /// a wait for an event, a child run): insert, apply, commit.
    async fn start_in_transaction(
        &self,
        request: &StartRun,
        workflow: &std::sync::Arc<crate::workflows::LoadedWorkflow>,
        run: &RunRow,
        only_if_latest: bool,
    ) -> Result<crate::events::apply::Applied, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some(mut applied) = self
            .insert_and_start(&mut tx, request, workflow, run, only_if_latest)
            .await?
        else {
            tx.rollback().await?;
            return Ok(crate::events::apply::Applied::default());
        };
        tx.commit().await?;
        self.announce(&mut applied).await;
        Ok(applied)
    }

    /// The run a StartRun's idempotency key already names; None when it has
    /// none (the run was not inserted because a newer version exists).
    async fn existing_run(
        &self,
        request: &StartRun,
    ) -> Result<Option<(RunRow, bool)>, CoordinatorError> {
        let Some(key) = request.idempotency_key.as_deref() else {
            return Ok(None);
        };
        let mut conn = self.store.pool().acquire().await?;
        let Some(existing) =
            runs::run_id_by_idempotency_key(&mut conn, &request.namespace, key).await?
        else {
            return Ok(None);
        };
        let run = self.expect_run(Some(&request.namespace), existing).await?;
        Ok(Some((run, false)))
    }

    /// Opens a transaction holding the run's lock; NOT_FOUND outside its
    /// namespace.
    pub(crate) async fn lock_existing(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, RunRow), CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let run = runs::lock_run(&mut tx, namespace, run_id)
            .await?
            .ok_or_else(|| CoordinatorError::RunNotFound(run_id.to_string()))?;
        Ok((tx, run))
    }

    pub(crate) async fn expect_run(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
    ) -> Result<RunRow, CoordinatorError> {
        runs::get_run(self.store.pool(), namespace, run_id)
            .await?
            .ok_or_else(|| CoordinatorError::RunNotFound(run_id.to_string()))
    }

    /// A run and, if asked, its node states.
    pub async fn get_run(
        &self,
        namespace: Option<&str>,
        run_id: &str,
        with_nodes: bool,
    ) -> Result<RunView, CoordinatorError> {
        let run = self.expect_run(namespace, parse_run_id(run_id)?).await?;
        if !with_nodes {
            return Ok(RunView {
                run,
                nodes: Vec::new(),
                node_types: Default::default(),
            });
        }
        let mut nodes = runs::list_nodes(self.store.pool(), run.id).await?;
        // a MAP's rows of inputs waiting to start are the engine's, not nodes
        nodes.retain(|row| {
            row.key
                .parse::<NodeKey>()
                .is_ok_and(|key| !key.is_map_inputs())
        });
        let workflow = self
            .workflows
            .get(
                &self.store,
                &run.namespace,
                &run.workflow_name,
                Some(run.workflow_version),
            )
            .await?;
        let node_types = workflow
            .compiled
            .definition()
            .nodes
            .iter()
            .map(|node| (node.id.clone(), node.node_type.to_string()))
            .collect();
        assemble_outputs(&workflow.compiled, &mut nodes);
        settle_unfinished(&run.status, &mut nodes);
        Ok(RunView {
            run,
            nodes,
            node_types,
        })
    }

    /// One page of runs (see [`runs::list_runs`]).
    pub async fn list_runs(
        &self,
        namespace: &str,
        filter: &RunFilter,
        cursor: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<RunRow>, CoordinatorError> {
        Ok(runs::list_runs(self.store.pool(), namespace, filter, cursor, limit).await?)
    }

    /// Runs matching `filter` by stored status, counted up to
    /// [`RUN_COUNT_LIMIT`] (see [`runs::count_runs`]).
    pub async fn count_runs(
        &self,
        namespace: &str,
        filter: &RunFilter,
    ) -> Result<runs::RunCounts, CoordinatorError> {
        Ok(runs::count_runs(self.store.pool(), namespace, filter, RUN_COUNT_LIMIT).await?)
    }

    /// One page of a run's history after `after_seq`.
    pub async fn history(
        &self,
        namespace: Option<&str>,
        run_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<HistoryRow>, CoordinatorError> {
        let run = self.expect_run(namespace, parse_run_id(run_id)?).await?;
        Ok(runs::history_page(self.store.pool(), run.id, after_seq, limit).await?)
    }

    /// Cancels a run: tasks, timers and children; compensations; CANCELLED.
    pub async fn cancel_run(
        &self,
        namespace: Option<&str>,
        run_id: &str,
        reason: &str,
        actor: &str,
    ) -> Result<RunRow, CoordinatorError> {
        let run_id = parse_run_id(run_id)?;
        self.cancel_run_step(namespace, run_id, reason, actor, None)
            .await?;
        self.expect_run(namespace, run_id).await
    }

    /// CancelRun's transaction; with a bulk step, the step is recorded in
    /// it (see [`BulkStep`]).
    pub(crate) async fn cancel_run_step(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        reason: &str,
        actor: &str,
        step: Option<&BulkStep<'_>>,
    ) -> Result<(), CoordinatorError> {
        let (mut tx, mut run) = self.lock_existing(namespace, run_id).await?;
        if is_final(&run.status) {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "a run that ended cannot be cancelled",
            });
        }
        if let Some(step) = step {
            step.record(&mut tx).await?;
        }
        if run.status == composer_store::pause::PAUSED {
            // a cancel ends the pause: compensations it starts must run
            composer_store::pause::release_timers(&mut tx, run_id).await?;
            run.status = crate::events::apply::engine_status(&run)?;
        }
        if run.status == composer_store::concurrency::QUEUED {
            // it holds no slot and started nothing: a run never started is
            // CANCELLED, a queued retry withdrawn leaves the run FAILED
            run.status = crate::events::apply::engine_status(&run)?;
        }
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        txn.note(
            HistoryEventType::CancelRequestedBy,
            actor,
            json!({"reason": reason, "by": actor}),
        );
        txn.push(
            Event::CancelRequested {
                reason: reason.to_owned(),
            },
            actor,
        );
        txn.commit(tx).await?;
        Ok(())
    }

    /// Resumes a failed run from its failed (and interrupted) nodes.
    pub async fn retry_run(
        &self,
        namespace: Option<&str>,
        run_id: &str,
        actor: &str,
    ) -> Result<RunRow, CoordinatorError> {
        let run_id = parse_run_id(run_id)?;
        self.retry_run_step(namespace, run_id, actor, None).await?;
        self.expect_run(namespace, run_id).await
    }

    /// RetryRun's transaction; with a bulk step, the step is recorded in it.
    pub(crate) async fn retry_run_step(
        &self,
        namespace: Option<&str>,
        run_id: Uuid,
        actor: &str,
        step: Option<&BulkStep<'_>>,
    ) -> Result<(), CoordinatorError> {
        let (mut tx, mut run) = self.lock_existing(namespace, run_id).await?;
        if run.status != "FAILED" {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "only a FAILED run can be retried",
            });
        }
        if let Some(step) = step {
            step.record(&mut tx).await?;
        }
        let readmitted = self.readmit(&mut tx, &mut run).await?;
        if let Some(admitted) = readmitted.filter(|a| a.queued()) {
            let note = HistoryWrite {
                event_type: HistoryEventType::RetryRequestedBy.as_str().to_owned(),
                node_key: None,
                attempt: None,
                actor: actor.to_owned(),
                details: json!({"by": actor, "queued_for_key": admitted.key}),
            };
            runs::append_history(&mut tx, run_id, &run.namespace, &[note]).await?;
            tx.commit().await?;
            self.run_changed(run_id);
            self.after_commit(admitted.evicted().into_iter().collect())
                .await;
            return Ok(());
        }
        let interrupted: Vec<NodeKey> = runs::interrupted_nodes(&mut tx, run_id)
            .await?
            .iter()
            .filter_map(|k| k.parse().ok())
            .collect();
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        txn.note(
            HistoryEventType::RetryRequestedBy,
            actor,
            json!({"by": actor}),
        );
        txn.push(Event::RetryRequested { interrupted }, actor);
        txn.commit(tx).await?;
        Ok(())
    }

    /// A FAILED run under a concurrency key takes a slot again before its
    /// retry (`run` then holds it), or waits QUEUED for one; None when its
    /// workflow declares no concurrency. A key full under `cancel_new`
    /// refuses the retry.
    async fn readmit(
        &self,
        tx: &mut sqlx::PgConnection,
        run: &mut RunRow,
    ) -> Result<Option<crate::events::concurrency::Admitted>, CoordinatorError> {
        let Some(key) = run.concurrency_key.clone() else {
            return Ok(None);
        };
        let workflow = self
            .workflows
            .get_on(
                tx,
                &run.namespace,
                &run.workflow_name,
                Some(run.workflow_version),
            )
            .await?;
        let Some(concurrency) = workflow.compiled.concurrency() else {
            return Ok(None);
        };
        let quotas = self.quotas().of(&run.namespace);
        let admitted = crate::events::concurrency::admit(
            tx,
            &run.namespace,
            &run.workflow_name,
            key,
            concurrency,
            &quotas,
        )
        .await?;
        if let crate::events::concurrency::Outcome::CancelNew(_) = admitted.outcome {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run.id.to_string(),
                status: run.status.clone(),
                why: "its concurrency key is at its limit and its workflow says \
                      on_limit: cancel_new; retry it once a run of the key ended",
            });
        }
        let holds = !admitted.queued();
        composer_store::concurrency::readmit_run(tx, run.id, admitted.seq, holds).await?;
        run.concurrency_holds = holds;
        Ok(Some(admitted))
    }

    /// Delivers an event to a run or to the runs waiting on a correlation
    /// key; keeps it when no wait matches yet.
    pub async fn send_event(
        &self,
        namespace: &str,
        target: EventTarget,
        name: &str,
        payload: Json,
        request_id: Option<&str>,
        actor: &str,
    ) -> Result<SendEventResult, CoordinatorError> {
        let payload = self.accept_payload(namespace, "payload", payload).await?;
        // what a request id stands for: a repeat must name the same event
        // and target, or it would answer for a send it never made
        let sent_to = json!({"event": name, "target": target.describe()});
        if let Some(request_id) = request_id {
            let mut conn = self.store.pool().acquire().await?;
            if let Some(previous) =
                events::idempotent_result(&mut conn, namespace, "send_event", request_id).await?
            {
                let recorded = previous.get("sent_to");
                if recorded.is_some_and(|recorded| *recorded != sent_to) {
                    return Err(CoordinatorError::InvalidArgument(vec![FieldProblem {
                        field: "request_id".to_owned(),
                        description: "was used before for another event or target; \
                                      a request id names one send"
                            .to_owned(),
                    }]));
                }
                return Ok(result_from_json(&previous));
            }
        }
        let result = match target {
            EventTarget::Run(run_id) => {
                self.send_to_run(namespace, run_id, name, payload, actor)
                    .await?
            }
            EventTarget::Correlation(key) => {
                self.send_to_correlation(namespace, &key, name, payload, actor)
                    .await?
            }
        };
        if let Some(request_id) = request_id {
            let mut conn = self.store.pool().acquire().await?;
            let recorded = json!({
                "delivered": result.delivered.iter().map(Uuid::to_string).collect::<Vec<_>>(),
                "stored": result.stored,
                "sent_to": sent_to,
            });
            events::record_idempotent_result(
                &mut conn,
                namespace,
                "send_event",
                request_id,
                &recorded,
            )
            .await?;
        }
        Ok(result)
    }

    async fn send_to_run(
        &self,
        namespace: &str,
        run_id: Uuid,
        name: &str,
        payload: Json,
        actor: &str,
    ) -> Result<SendEventResult, CoordinatorError> {
        let (mut tx, run) = self.lock_existing(Some(namespace), run_id).await?;
        if is_final(&run.status) {
            return Err(CoordinatorError::WrongRunStatus {
                run_id: run_id.to_string(),
                status: run.status,
                why: "a run that ended takes no events",
            });
        }
        let Some(node) = events::take_wait(&mut tx, run_id, name, None).await? else {
            events::store_pending(&mut tx, namespace, Some(run_id), None, name, &payload, None)
                .await?;
            runs::append_history(
                &mut tx,
                run_id,
                namespace,
                &[composer_store::runs::HistoryWrite {
                    event_type: HistoryEventType::EventStored.as_str().to_owned(),
                    node_key: None,
                    attempt: None,
                    actor: actor.to_owned(),
                    details: json!({"name": name}),
                }],
            )
            .await?;
            tx.commit().await?;
            self.run_changed(run_id);
            return Ok(SendEventResult {
                delivered: Vec::new(),
                stored: true,
            });
        };
        let node = node
            .parse::<NodeKey>()
            .map_err(|_| CoordinatorError::Corrupt(format!("wait node key {node:?}")))?;
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        txn.push(
            Event::EventReceived {
                name: name.to_owned(),
                payload,
                node: Some(node),
            },
            actor,
        );
        txn.commit(tx).await?;
        Ok(SendEventResult {
            delivered: vec![run_id],
            stored: false,
        })
    }

    async fn send_to_correlation(
        &self,
        namespace: &str,
        key: &str,
        name: &str,
        payload: Json,
        actor: &str,
    ) -> Result<SendEventResult, CoordinatorError> {
        let mut result = SendEventResult::default();
        for run_id in events::runs_waiting_on(self.store.pool(), namespace, key, name).await? {
            let mut tx = self.store.begin().await?;
            let Some(run) = runs::lock_run(&mut tx, Some(namespace), run_id).await? else {
                continue;
            };
            let Some(node) = events::take_wait(&mut tx, run_id, name, Some(key)).await? else {
                continue;
            };
            let Ok(node) = node.parse::<NodeKey>() else {
                continue;
            };
            let mut txn = RunTxn::new(self, run, &mut tx).await?;
            txn.push(
                Event::EventReceived {
                    name: name.to_owned(),
                    payload: payload.clone(),
                    node: Some(node),
                },
                actor,
            );
            txn.commit(tx).await?;
            result.delivered.push(run_id);
        }
        if result.delivered.is_empty() {
            let mut tx = self.store.begin().await?;
            events::store_pending(
                &mut tx,
                namespace,
                None,
                Some(key),
                name,
                &payload,
                Some(self.config.correlation_retention_secs),
            )
            .await?;
            self.keep_blobs_of_stored_event(&mut tx, namespace, &payload)
                .await?;
            tx.commit().await?;
            result.stored = true;
        }
        Ok(result)
    }

    /// Applies the inbox of each run (and of the runs that causes), each in
    /// its own transaction, in a task of its own: the caller's answer does
    /// not wait for a cascade through child runs, and a caller that goes
    /// away does not cut one short. Failures are left for the recovery loop.
    pub(crate) async fn after_commit(&self, pending: Vec<Uuid>) {
        if pending.is_empty() {
            return;
        }
        let coordinator = self.clone();
        tokio::spawn(async move { coordinator.apply_inboxes(pending).await });
    }

    async fn apply_inboxes(&self, mut pending: Vec<Uuid>) {
        let mut rounds = 0;
        while let Some(run_id) = pending.pop() {
            rounds += 1;
            if rounds > 10_000 {
                tracing::warn!(%run_id, "inbox cascade too long; recovery continues it");
                return;
            }
            match self.apply_inbox(run_id).await {
                Ok(more) => pending.extend(more),
                Err(error) => {
                    tracing::warn!(%run_id, %error, "inbox not applied; recovery retries")
                }
            }
        }
    }

    /// Applies one run's inbox in one transaction; returns runs to visit next.
    pub(crate) async fn apply_inbox(&self, run_id: Uuid) -> Result<Vec<Uuid>, CoordinatorError> {
        let mut tx = self.store.begin().await?;
        let Some(run) = runs::lock_run(&mut tx, None, run_id).await? else {
            return Ok(Vec::new());
        };
        let messages = events::take_inbox(&mut tx, run_id).await?;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut txn = RunTxn::new(self, run, &mut tx).await?;
        for (event, actor) in messages {
            let event: Event = serde_json::from_value(event)?;
            txn.push(with_fresh_seed(event), &actor);
        }
        let applied = txn.finish(&mut tx).await?;
        tx.commit().await?;
        self.run_changed(run_id);
        self.publish(applied.outbox).await;
        Ok(applied.inbox_runs)
    }
}

fn with_fresh_seed(event: Event) -> Event {
    match event {
        Event::ChildRunFinished {
            node,
            attempt,
            status,
            output,
            error,
            ..
        } => Event::ChildRunFinished {
            node,
            attempt,
            status,
            output,
            error,
            seed: seed(),
        },
        other => other,
    }
}

/// True for the statuses a run ends in.
pub fn is_final(status: &str) -> bool {
    matches!(status, "COMPLETED" | "FAILED" | "CANCELLED")
}

fn result_from_json(value: &Json) -> SendEventResult {
    SendEventResult {
        delivered: value["delivered"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| id.as_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
        stored: value["stored"].as_bool().unwrap_or(false),
    }
}

/// `/a/0/b` → `.a[0].b`.
fn pointer_to_path(pointer: &str) -> String {
    pointer
        .split('/')
        .filter(|part| !part.is_empty())
        .map(|part| {
            if part.chars().all(|c| c.is_ascii_digit()) {
                format!("[{part}]")
            } else {
                format!(".{}", part.replace("~1", "/").replace("~0", "~"))
            }
        })
        .collect()
}

/// Fills in the outputs the engine assembles when an expression reads them
/// rather than stores (docs/language.md): a completed JOIN's, the map from each
/// completed incoming node to its output, and a completed MAP's, the list of
/// its elements' outputs. In topological order, so a JOIN after a JOIN or a
/// MAP sees its predecessors already assembled.
fn assemble_outputs(workflow: &composer_engine::CompiledWorkflow, nodes: &mut [runs::NodeRow]) {
    let index: std::collections::HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, row)| (row.key.clone(), i))
        .collect();
    let output_of = |nodes: &[runs::NodeRow], key: &str| {
        index
            .get(key)
            .map(|&i| &nodes[i])
            .filter(|row| row.status == "COMPLETED")
            .map(|row| row.state.get("output").cloned().unwrap_or(Json::Null))
    };
    for id in workflow.topological_order() {
        let Some(&at) = index.get(id) else { continue };
        if nodes[at].status != "COMPLETED" || nodes[at].state.get("output").is_some() {
            continue;
        }
        let assembled = match workflow.node(id).map(|n| n.node_type) {
            Some(composer_engine::NodeType::Join) => Json::Object(
                workflow
                    .predecessors(id)
                    .into_iter()
                    .filter_map(|from| Some((from.to_owned(), output_of(nodes, from)?)))
                    .collect(),
            ),
            Some(composer_engine::NodeType::Map) => {
                let total = nodes[at].state["map"]["total"].as_u64().unwrap_or(0);
                Json::Array(
                    (0..total)
                        .map(|i| output_of(nodes, &format!("{id}[{i}]")).unwrap_or(Json::Null))
                        .collect(),
                )
            }
            _ => continue,
        };
        if let Some(state) = nodes[at].state.as_object_mut() {
            state.insert("output".to_owned(), assembled);
        }
    }
}

/// Once a run has ended, nothing of it runs: a node still scheduled,
/// running or waiting in its rows was stopped by the run's end (the engine
/// cancels a run's tasks and timers as a whole, without rewriting each
/// node), and is shown CANCELLED, as the API says.
fn settle_unfinished(run_status: &str, nodes: &mut [runs::NodeRow]) {
    if !matches!(run_status, "COMPLETED" | "FAILED" | "CANCELLED") {
        return;
    }
    for row in nodes.iter_mut() {
        if matches!(
            row.status.as_str(),
            "PENDING" | "RETRY_SCHEDULED" | "RUNNING" | "WAITING"
        ) {
            row.status = "CANCELLED".to_owned();
        }
    }
}

//! One event, one transaction: with the run's row locked, load what the
//! event touches, `decide`, and persist the decision's state change and
//! actions (tasks and their outbox rows, timers, waits, history, run status,
//! hand-offs to other runs). The caller commits.

use std::collections::{BTreeMap, HashSet, VecDeque};

use chrono::{DateTime, TimeZone, Utc};
use composer_engine::{
    Action, ChildStatus, DecideError, ErrorInfo, Event, NodeKey, NodeState, RunRecord, RunState,
    RunStatus, SlotKey, TimerId, TimerKind, Timestamp, decide, history::HistoryEventType, prefetch,
};
use composer_store::{
    events, group_write,
    runs::{self, EventWrite, HistoryWrite, NewRun, NodeWrite, RunInsert, RunRow, RunUpdate},
    tasks::{self, TaskArm, TaskSlotArm},
    timers::{self, TimerWrite},
};
use serde_json::{Value as Json, json};
use sqlx::PgConnection;
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    Coordinator, error::CoordinatorError, payloads::OwnedBlobs, workflows::LoadedWorkflow,
};

/// Who caused an event, for the history (`system` for timers and recovery).
pub const SYSTEM: &str = "system";

/// The engine needs node state for at most this many rounds per event; more
/// means it keeps asking for keys it was given (a bug), not a big run.
/// Levels of parent runs a run may have: a child is started only below a
/// run with fewer (SUB_WORKFLOW and MAP of workflows).
pub const MAX_RUN_DEPTH: i32 = 16;
const MAX_LOAD_ROUNDS: usize = 64;

/// What applying events to a run did, for the caller to act on after commit.
#[derive(Debug, Default)]
pub struct Applied {
    /// Runs with new inbox messages (children to start or cancel, a parent
    /// to tell): process them after commit.
    pub inbox_runs: Vec<Uuid>,
    /// The outbox messages written, for the committing server to publish.
    pub outbox: Vec<composer_store::tasks::OutboxMessage>,
    /// The run's status after the events.
    pub status: String,
    /// The run the events were applied to.
    pub run_id: Uuid,
    /// Its output, once completed.
    pub output: Option<Json>,
    /// Its error, once failed or cancelled.
    pub error: Option<Json>,
    /// When the run was created; None when a run to insert was not (its
    /// idempotency key was taken, or a newer version was registered).
    pub created_at: Option<DateTime<Utc>>,
    /// The concurrency key a run inserted by this transaction was admitted
    /// under, if its workflow declares one.
    pub concurrency_key: Option<String>,
    /// Tasks the events armed (those handed to a waiting poll included).
    pub(crate) armed: usize,
    /// Tasks leased as they were armed, to the poll the group took for
    /// them (decision 0051); not in `outbox`.
    pub(crate) leased: Vec<composer_store::tasks::LeasedTask>,
    /// Timers written due at once to continue the work in a transaction of
    /// its own (a wide MAP's next slice): fired by the committing server
    /// right after the commit, by the timer loop if it dies first.
    pub(crate) continued: Vec<timers::DueTimer>,
    /// What the metrics count once the transaction committed.
    pub(crate) counted: Counted,
    /// The transaction's span (traces on only), the parent of its
    /// dispatch; it ends when this is dropped.
    pub(crate) span: Option<tracing::Span>,
}

/// An event transaction as the metrics see it.
#[derive(Debug, Default)]
pub(crate) struct Counted {
    namespace: String,
    workflow: String,
    events: usize,
    run_started: bool,
    run_ended: bool,
    took: std::time::Duration,
}

impl Counted {
    pub(crate) fn record(&self, status: &str) {
        if self.events == 0 {
            return;
        }
        crate::observe::metrics::event_transaction(self.took, self.events);
        if self.run_started {
            crate::observe::metrics::run_started(&self.namespace, &self.workflow);
        }
        if self.run_ended {
            crate::observe::metrics::run_ended(&self.namespace, &self.workflow, status);
        }
    }
}

/// Milliseconds since the epoch, the engine's clock.
pub fn timestamp(time: DateTime<Utc>) -> Timestamp {
    Timestamp(time.timestamp_millis())
}

fn to_datetime(ts: Timestamp) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ts.0)
        .single()
        .unwrap_or_else(Utc::now)
}

/// A fresh seed for retry jitter (the engine itself draws no randomness).
pub fn seed() -> u64 {
    Uuid::new_v4().as_u64_pair().0
}

/// The run record as stored: without the input, which lives once in
/// `runs.input` (rewriting a large input with every event would make each
/// event cost as much as the input, whatever it touches).
/// Nor is the input serialized to be dropped: a MAP's 10,000 items made
/// every event batch of its run copy them twice (B3).
/// Nor the run's id, workflow and version, which its row's columns hold:
/// about 90 bytes of every version of the row (decision 0061).
pub fn stored_record(record: &RunRecord) -> Result<Json, serde_json::Error> {
    let without_input = RunRecord {
        input: std::sync::Arc::default(),
        ..record.clone()
    };
    let mut value = serde_json::to_value(&without_input)?;
    if let Some(object) = value.as_object_mut() {
        for key in ["input", "run_id", "workflow", "version"] {
            object.remove(key);
        }
    }
    Ok(value)
}

/// The engine's run record of a stored record: the fields
/// [`stored_record`] leaves to the row's columns (its id, workflow and
/// version) taken from them; a record stored before it did keeps its own.
pub(crate) fn record_of_row(
    mut record: Json,
    run_id: Uuid,
    workflow: &str,
    version: i32,
) -> Result<RunRecord, serde_json::Error> {
    if let Some(object) = record.as_object_mut() {
        object
            .entry("run_id")
            .or_insert_with(|| Json::String(run_id.to_string()));
        object
            .entry("workflow")
            .or_insert_with(|| Json::String(workflow.to_owned()));
        object
            .entry("version")
            .or_insert_with(|| Json::from(version));
    }
    serde_json::from_value(record)
}

/// The engine's run record of a stored run, its record and input moved
/// out of the row (not copied: the row's are not read again).
fn record_from_row(run: &mut RunRow) -> Result<RunRecord, serde_json::Error> {
    let stored = std::mem::take(&mut run.record);
    let mut record = record_of_row(stored, run.id, &run.workflow_name, run.workflow_version)?;
    record.input = std::sync::Arc::new(std::mem::take(&mut run.input));
    Ok(record)
}

/// The stored text of an engine status.
pub fn run_status_text(status: RunStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "UNKNOWN".to_owned())
}

/// The status the engine keeps in a run's record (a paused run's row says
/// PAUSED; the record says what it is underneath).
pub(crate) fn engine_status(run: &RunRow) -> Result<String, CoordinatorError> {
    let status: composer_engine::RunStatus = serde_json::from_value(run.record["status"].clone())?;
    Ok(run_status_text(status))
}

/// A timer's row key: unique per run.
pub fn timer_key(timer: &TimerId) -> String {
    let kind = serde_json::to_value(timer.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let node = timer
        .node
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let attempt = timer.attempt.map(|a| a.to_string()).unwrap_or_default();
    format!("{kind}:{node}:{attempt}")
}

/// The text form of a correlation value (strings as they are, else JSON).
pub fn correlation_text(value: &Json) -> String {
    match value {
        Json::String(text) => text.clone(),
        other => other.to_string(),
    }
}

impl Coordinator {
    /// What follows a commit: tell watchers the run changed, publish the
    /// tasks it armed (the fast path of dispatch), and apply the inboxes of
    /// the runs it reached. Takes the outbox and inbox out of `applied`.
    pub(crate) async fn announce(&self, applied: &mut Applied) {
        applied.counted.record(&applied.status);
        // the next slice's transaction goes ahead while this one's tasks
        // are published
        self.continue_soon(std::mem::take(&mut applied.continued));
        self.run_changed(applied.run_id);
        let outbox = std::mem::take(&mut applied.outbox);
        match applied.span.take() {
            Some(armed_by) if !outbox.is_empty() => {
                let span = crate::observe::traces::dispatch(&armed_by, outbox.len());
                self.publish(outbox).instrument(span).await;
            }
            _ => self.publish(outbox).await,
        }
        self.after_commit(std::mem::take(&mut applied.inbox_runs))
            .await;
    }

    /// Fires the continuation timers a commit wrote, in a task of its own:
    /// a wide MAP's slices follow one another as fast as they commit. One
    /// that fails stays for the timer loop; one the timer loop took first
    /// is simply not there.
    fn continue_soon(&self, due: Vec<timers::DueTimer>) {
        if due.is_empty() {
            return;
        }
        let coordinator = self.clone();
        tokio::spawn(async move {
            if let Err(error) = coordinator.fire_continuations(&due).await {
                tracing::debug!(%error, "continuation left to the timer loop");
            }
        });
    }
}

/// Whether a timer continues its transaction's work rather than waits.
fn is_continuation(timer: &TimerWrite) -> bool {
    // the kind as the timer's JSON spells it, as `timer_key` reads it too
    serde_json::to_value(TimerKind::MapArm).is_ok_and(|kind| timer.timer.get("kind") == Some(&kind))
}

/// Applies events to one locked run.
pub(crate) struct RunTxn<'a> {
    coordinator: &'a Coordinator,
    run: RunRow,
    workflow: std::sync::Arc<LoadedWorkflow>,
    state: RunState,
    was_terminal: bool,
    /// The run was QUEUED, with this engine status underneath: it stays
    /// QUEUED while the events leave that status alone.
    queued_as: Option<RunStatus>,
    touched: BTreeMap<NodeKey, NodeState>,
    timers: BTreeMap<String, Option<TimerWrite>>,
    history: Vec<HistoryWrite>,
    /// The `task_leased` entry of the event being applied, by its index in
    /// `history`: the attempt's outcome entry takes its worker and it goes.
    lease_entry: Option<usize>,
    /// Events to apply, each with its actor and, for the end of a leased
    /// attempt, the worker that held the lease.
    queue: VecDeque<(Event, String, Option<String>)>,
    /// Tasks to arm, written with the rest at the end (one per node key).
    arms: PendingArms,
    /// A run inserted by this transaction: it has no node rows to load.
    fresh: bool,
    /// A run not written yet: the final statement inserts it (the value:
    /// only if its version is still the latest). No statement may run
    /// before that one.
    insert: Option<bool>,
    applied: Applied,
    /// The final write's values, between [`RunTxn::stage`] and the write.
    staged: Option<Staged>,
    /// When this transaction began, for its duration.
    began: std::time::Instant,
    /// Its span and that span's traceparent (the parent of the tasks it
    /// arms and the children it starts); none unless traces are on.
    span: tracing::Span,
    traceparent: Option<String>,
    /// Blobs the values entering the run refer to: the run refers to them
    /// in this transaction (decision 0047).
    blob_digests: Vec<String>,
}

/// A run's values for its final write, computed once its events applied.
struct Staged {
    status: String,
    /// The engine record as stored (without the input).
    record: Json,
    error: Option<Json>,
    ended: bool,
    held: bool,
    nodes: Vec<NodeWrite>,
    timers: Vec<TimerWrite>,
    cancelled_timers: Vec<String>,
}

/// A task attempt an event armed, not written yet.
struct PendingArm {
    new_id: Uuid,
    node_key: String,
    queue: String,
    task_name: String,
    attempt: i32,
    input: Json,
    heartbeat_timeout_ms: i64,
    attempt_timeout_ms: Option<i64>,
    rate_limit_key: Option<String>,
    /// The TASK node's id and its concurrency slot, if it has one.
    concurrency: Option<(String, SlotKey)>,
}

/// The task attempts a transaction armed, in the order armed, one per node
/// key. A MAP or FORK arms thousands in one event, so finding an earlier
/// attempt of a key is a set lookup, not a pass over the list.
#[derive(Default)]
struct PendingArms {
    list: Vec<PendingArm>,
    keys: HashSet<String>,
}

impl PendingArms {
    /// Adds `arm`; a later attempt of the same node in this transaction wins.
    fn push(&mut self, arm: PendingArm) {
        if !self.keys.insert(arm.node_key.clone()) {
            self.list.retain(|earlier| earlier.node_key != arm.node_key);
        }
        self.list.push(arm);
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

impl<'a> RunTxn<'a> {
    /// Starts applying events to `run`, whose row the caller has locked on
    /// `conn` (which also reads the workflow if the cache lacks it).
    pub(crate) async fn new(
        coordinator: &'a Coordinator,
        run: RunRow,
        conn: &mut PgConnection,
    ) -> Result<RunTxn<'a>, CoordinatorError> {
        let workflow = coordinator
            .workflows
            .get_on(
                conn,
                &run.namespace,
                &run.workflow_name,
                Some(run.workflow_version),
            )
            .await?;
        Self::with_workflow(coordinator, run, workflow, false)
    }

    /// Starts applying events to a run this transaction just inserted (so
    /// holds locked, and which has no node state yet).
    pub(crate) fn new_run(
        coordinator: &'a Coordinator,
        run: RunRow,
        workflow: std::sync::Arc<LoadedWorkflow>,
    ) -> Result<RunTxn<'a>, CoordinatorError> {
        Self::with_workflow(coordinator, run, workflow, true)
    }

    /// Starts applying events to a run not written yet, which the final
    /// write inserts (see [`start_writes_rows_only`]): a StartRun in one
    /// statement.
    pub(crate) fn new_unsaved_run(
        coordinator: &'a Coordinator,
        run: RunRow,
        workflow: std::sync::Arc<LoadedWorkflow>,
        only_if_latest: bool,
    ) -> Result<RunTxn<'a>, CoordinatorError> {
        let mut txn = Self::with_workflow(coordinator, run, workflow, true)?;
        txn.insert = Some(only_if_latest);
        Ok(txn)
    }

    /// Refuses a statement before the run row exists (the caller checked
    /// with [`start_writes_rows_only`] that none is needed).
    fn saved(&self) -> Result<(), CoordinatorError> {
        if self.insert.is_some() {
            return Err(CoordinatorError::Corrupt(
                "an unsaved run's event needed a statement before its insert".to_owned(),
            ));
        }
        Ok(())
    }

    fn with_workflow(
        coordinator: &'a Coordinator,
        mut run: RunRow,
        workflow: std::sync::Arc<LoadedWorkflow>,
        fresh: bool,
    ) -> Result<RunTxn<'a>, CoordinatorError> {
        let record = record_from_row(&mut run)?;
        let was_terminal = record.status.is_terminal();
        let queued_as =
            (run.status == composer_store::concurrency::QUEUED).then_some(record.status);
        let span = crate::observe::traces::run_events(run.traceparent.as_deref(), &run.id);
        let traceparent = crate::observe::traces::traceparent(&span);
        Ok(RunTxn {
            span,
            traceparent,
            coordinator,
            workflow,
            state: RunState {
                run: record,
                nodes: BTreeMap::new(),
                blobs: Default::default(),
            },
            was_terminal,
            queued_as,
            run,
            touched: BTreeMap::new(),
            timers: BTreeMap::new(),
            history: Vec::new(),
            lease_entry: None,
            queue: VecDeque::new(),
            began: std::time::Instant::now(),
            arms: PendingArms::default(),
            fresh,
            insert: None,
            applied: Applied::default(),
            staged: None,
            blob_digests: Vec::new(),
        })
    }

    /// The node keys `event` will need first, as stored keys (for a caller
    /// that loads them together with another statement, then [`preload`]s).
    ///
    /// [`preload`]: RunTxn::preload
    pub(crate) fn first_keys(&self, event: &Event) -> Vec<String> {
        prefetch(&self.workflow.compiled, &self.state, event)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// [`first_keys`] of the first queued event (none queued: none).
    ///
    /// [`first_keys`]: RunTxn::first_keys
    pub(crate) fn first_queued_keys(&self) -> Vec<String> {
        self.queue
            .front()
            .map(|(event, _, _)| self.first_keys(event))
            .unwrap_or_default()
    }

    /// Takes node states the caller loaded for `keys` (`rows`: the keys that
    /// have a row); the keys without one are known to be absent.
    pub(crate) fn preload(
        &mut self,
        keys: &[String],
        rows: Vec<(String, Json)>,
    ) -> Result<(), CoordinatorError> {
        let mut found: BTreeMap<String, Json> = rows.into_iter().collect();
        for text in keys {
            let key: NodeKey = text
                .parse()
                .map_err(|_| CoordinatorError::Corrupt(format!("node key {text:?}")))?;
            let state = match found.remove(text) {
                Some(json) => Some(serde_json::from_value::<NodeState>(json)?),
                None => None,
            };
            self.state.nodes.entry(key).or_insert(state);
        }
        Ok(())
    }

    /// The run's id.
    pub(crate) fn run_id(&self) -> Uuid {
        self.run.id
    }

    /// Queues an event.
    pub(crate) fn push(&mut self, event: Event, actor: &str) {
        self.queue.push_back((event, actor.to_owned(), None));
    }

    /// Records a history entry that no decision makes (e.g. who asked).
    pub(crate) fn note(&mut self, event_type: HistoryEventType, actor: &str, details: Json) {
        self.history.push(HistoryWrite {
            event_type: event_type.as_str().to_owned(),
            node_key: None,
            attempt: None,
            actor: actor.to_owned(),
            details,
        });
    }

    /// Queues an event that ends a leased attempt (a report, an expiry):
    /// its history starts with which worker held the lease.
    pub(crate) fn push_lease_end(&mut self, event: Event, actor: &str, worker_id: String) {
        self.queue
            .push_back((event, actor.to_owned(), Some(worker_id)));
    }

    /// Writes which worker held the lease that `event` ends, as its own
    /// `task_leased` entry; the attempt's outcome entry, if the event
    /// writes one, takes it over (`record_history`), so a completed attempt
    /// costs one history row, not two.
    fn note_lease(&mut self, event: &Event, worker_id: &str, actor: &str) {
        let (Event::TaskCompleted { node, attempt, .. }
        | Event::TaskFailed { node, attempt, .. }
        | Event::LeaseExpired { node, attempt, .. }) = event
        else {
            return;
        };
        self.lease_entry = Some(self.history.len());
        self.history.push(HistoryWrite {
            event_type: HistoryEventType::TaskLeased.as_str().to_owned(),
            node_key: Some(node.to_string()),
            attempt: i32::try_from(*attempt).ok(),
            actor: actor.to_owned(),
            details: json!({ "worker_id": worker_id }),
        });
    }

    /// Appends an entry the engine asked for. The outcome of a leased
    /// attempt (`node_completed`, `attempt_failed`, `lease_expired`) takes
    /// the attempt's `task_leased` entry into its details as `worker_id`.
    fn record_history(&mut self, mut entry: HistoryWrite) {
        let is_outcome = [
            HistoryEventType::NodeCompleted,
            HistoryEventType::AttemptFailed,
            HistoryEventType::LeaseExpired,
        ]
        .iter()
        .any(|t| t.as_str() == entry.event_type);
        if let Some(index) = self.lease_entry
            && is_outcome
            && let Some(lease) = self.history.get(index)
            && lease.node_key == entry.node_key
            && lease.attempt == entry.attempt
            && let Json::Object(details) = &mut entry.details
            && let Some(worker) = lease.details.get("worker_id")
        {
            details.insert("worker_id".to_owned(), worker.clone());
            self.history.remove(index);
            self.lease_entry = None;
        }
        self.history.push(entry);
    }

    /// Applies every queued event (and the ones they cause), then writes the
    /// result. The caller commits.
    pub(crate) async fn finish(
        mut self,
        conn: &mut PgConnection,
    ) -> Result<Applied, CoordinatorError> {
        self.stage(conn).await?;
        self.write_alone(conn).await
    }

    /// Writes a [`stage`](RunTxn::stage)d run in its own statement.
    pub(crate) async fn write_alone(
        self,
        conn: &mut PgConnection,
    ) -> Result<Applied, CoordinatorError> {
        self.coordinator
            .refer_runs_to_blobs(conn, &[self.blobs()])
            .await?;
        let arms = self.task_arms();
        let write = self.event_write(&arms)?;
        let insert = self.run_insert();
        let written = runs::write_event(conn, &write, insert.as_ref()).await?;
        drop(arms);
        self.conclude(conn, written).await
    }

    /// Writes several [`stage`](RunTxn::stage)d runs, each locked on
    /// `conn` and none twice, in as few statements as
    /// [`group_write::write_events`] can (one for most), and concludes each.
    pub(crate) async fn write_together(
        txns: Vec<RunTxn<'a>>,
        conn: &mut PgConnection,
    ) -> Result<Vec<Applied>, CoordinatorError> {
        if let Some(first) = txns.first() {
            let runs: Vec<_> = txns.iter().map(RunTxn::blobs).collect();
            first.coordinator.refer_runs_to_blobs(conn, &runs).await?;
        }
        let written = {
            let arms: Vec<_> = txns.iter().map(RunTxn::task_arms).collect();
            let writes = txns
                .iter()
                .zip(&arms)
                .map(|(txn, arms)| txn.event_write(arms))
                .collect::<Result<Vec<_>, _>>()?;
            group_write::write_events(conn, &writes).await?
        };
        let mut applied = Vec::with_capacity(txns.len());
        for (txn, written) in txns.into_iter().zip(written.per_write) {
            applied.push(txn.conclude(conn, written).await?);
        }
        Ok(applied)
    }

    /// Applies every queued event (and the ones they cause) and runs what
    /// must come before the final write; [`event_write`] is that write,
    /// alone or in a group's shared statement, and [`conclude`] follows it.
    ///
    /// [`event_write`]: RunTxn::event_write
    /// [`conclude`]: RunTxn::conclude
    pub(crate) async fn stage(&mut self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        while let Some((event, actor, lease_holder)) = self.queue.pop_front() {
            self.lease_entry = None;
            if let Some(worker_id) = lease_holder {
                self.note_lease(&event, &worker_id, &actor);
            }
            self.note_blobs(&event);
            self.apply_one(conn, &event, &actor).await?;
            self.applied.counted.events += 1;
            self.applied.counted.run_started |= matches!(event, Event::RunStarted);
        }
        self.stage_write(conn).await
    }

    /// The blobs the run is to refer to once staged: made so by its write
    /// (alone, or in one statement for a group's runs).
    pub(crate) fn blobs(&self) -> OwnedBlobs<'_> {
        OwnedBlobs {
            owner: self.run.id,
            namespace: &self.run.namespace,
            digests: &self.blob_digests,
        }
    }

    /// Notes the blobs the value `event` brings into the run refers to.
    fn note_blobs(&mut self, event: &Event) {
        let value = match event {
            Event::RunStarted => &*self.state.run.input,
            Event::TaskCompleted { output, .. } | Event::ChildRunFinished { output, .. } => output,
            Event::EventReceived { payload, .. } => payload,
            _ => return,
        };
        if !composer_engine::blob::holds_references(value) {
            return;
        }
        for digest in crate::payloads::referenced_digests(value) {
            if !self.blob_digests.contains(&digest) {
                self.blob_digests.push(digest);
            }
        }
    }

    /// A task's rendered input as its row holds it: offloaded when large.
    async fn task_input(&mut self, input: Json) -> Result<Json, CoordinatorError> {
        if !self.coordinator.offloads(&input) {
            return Ok(input);
        }
        let reference = self
            .coordinator
            .offload(&self.run.namespace, "input", &input)
            .await?;
        self.blob_digests
            .extend(crate::payloads::referenced_digests(&reference));
        Ok(reference)
    }

    /// Puts the values of the blobs `digests` in the state, for the
    /// expressions that read them.
    async fn load_blobs(&mut self, digests: Vec<String>) {
        for digest in digests {
            let value = self
                .coordinator
                .blob_value(&self.run.namespace, &digest)
                .await;
            self.state.blobs.insert(digest, value);
        }
    }

    /// What the final write returned, taken into the answer.
    pub(crate) async fn conclude(
        mut self,
        conn: &mut PgConnection,
        written: Option<runs::EventWritten>,
    ) -> Result<Applied, CoordinatorError> {
        self.take_written(conn, written).await?;
        self.applied.counted.namespace = self.run.namespace.clone();
        self.applied.counted.workflow = self.run.workflow_name.clone();
        self.applied.counted.took = self.began.elapsed();
        if !self.span.is_disabled() {
            self.applied.span = Some(self.span);
        }
        Ok(self.applied)
    }

    /// Applies every queued event, commits `tx`, then applies the inboxes
    /// of the other runs the events reached, each in its own transaction.
    /// Returns the run's status, output and error after the events.
    pub(crate) async fn commit(
        self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<Applied, CoordinatorError> {
        let coordinator = self.coordinator;
        let mut applied = self.finish(&mut tx).await?;
        tx.commit().await?;
        coordinator.announce(&mut applied).await;
        Ok(applied)
    }

    async fn load(
        &mut self,
        conn: &mut PgConnection,
        keys: Vec<NodeKey>,
    ) -> Result<(), CoordinatorError> {
        let wanted: Vec<String> = keys
            .iter()
            .filter(|k| !self.state.nodes.contains_key(*k))
            .map(ToString::to_string)
            .collect();
        let rows = if self.fresh {
            Vec::new()
        } else {
            runs::load_nodes(conn, self.run.id, &wanted).await?
        };
        let mut found: BTreeMap<String, Json> = rows.into_iter().collect();
        for key in keys {
            let state = match found.remove(&key.to_string()) {
                Some(json) => Some(serde_json::from_value::<NodeState>(json)?),
                None => None,
            };
            self.state.nodes.entry(key).or_insert(state);
        }
        Ok(())
    }

    async fn apply_one(
        &mut self,
        conn: &mut PgConnection,
        event: &Event,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let wf = std::sync::Arc::clone(&self.workflow);
        let first = prefetch(&wf.compiled, &self.state, event);
        self.load(conn, first).await?;
        let now = timestamp(Utc::now());
        let mut rounds = 0;
        let decision = loop {
            match decide(&wf.compiled, &self.state, event, now) {
                Ok(decision) => break decision,
                Err(DecideError::NeedNodes(keys)) if rounds < MAX_LOAD_ROUNDS => {
                    rounds += 1;
                    self.load(conn, keys).await?;
                }
                Err(DecideError::NeedBlobs(digests)) if rounds < MAX_LOAD_ROUNDS => {
                    rounds += 1;
                    self.load_blobs(digests).await;
                }
                Err(error) => return Err(CoordinatorError::Corrupt(error.to_string())),
            }
        };
        if let Event::EventReceived { name, payload, .. } = event
            && !decision.event_consumed()
        {
            self.saved()?;
            // the wait it was matched to is gone: keep it for a later one
            events::store_pending(
                conn,
                &self.run.namespace,
                Some(self.run.id),
                None,
                name,
                payload,
                None,
            )
            .await?;
        }
        self.state.apply(&decision.change);
        for (key, state) in &decision.change.nodes {
            self.touched.insert(key.clone(), state.clone());
        }
        for action in decision.actions {
            self.act(conn, action, actor).await?;
        }
        Ok(())
    }

    async fn act(
        &mut self,
        conn: &mut PgConnection,
        action: Action,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let run_id = self.run.id;
        match action {
            Action::CreateTask {
                node,
                attempt,
                queue,
                task_name,
                input,
                heartbeat_timeout_ms,
                timeout_ms,
                rate_limit_key,
                concurrency,
            } => {
                let input = self.task_input(input).await?;
                self.arms.push(PendingArm {
                    // time-ordered, as run ids are: a new task's key
                    // entry lands beside the last one, not on a random
                    // page of a large index (decision 0052)
                    new_id: Uuid::now_v7(),
                    node_key: node.to_string(),
                    queue,
                    task_name,
                    attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
                    input,
                    heartbeat_timeout_ms: i64::try_from(heartbeat_timeout_ms).unwrap_or(i64::MAX),
                    attempt_timeout_ms: timeout_ms.and_then(|t| i64::try_from(t).ok()),
                    rate_limit_key: rate_limit_key.map(crate::dispatch::rate_limit::bounded_key),
                    concurrency: concurrency.map(|slot| (node.node.clone(), slot)),
                });
            }
            Action::ScheduleTimer { timer, fire_at } => {
                let key = timer_key(&timer);
                let write = TimerWrite {
                    key: key.clone(),
                    timer: serde_json::to_value(&timer)?,
                    fire_at: to_datetime(fire_at),
                };
                self.timers.insert(key, Some(write));
            }
            Action::CancelTimer { timer } => {
                if timer.kind == TimerKind::EventTimeout
                    && let Some(node) = &timer.node
                {
                    self.saved()?;
                    events::delete_waits(conn, run_id, Some(&node.to_string())).await?;
                }
                self.timers.insert(timer_key(&timer), None);
            }
            Action::CancelTask { node } => {
                self.write_arms(conn).await?;
                tasks::cancel_node_tasks(conn, run_id, &node.to_string()).await?;
            }
            Action::CancelAllTasks => {
                self.write_arms(conn).await?;
                tasks::cancel_all_tasks(conn, run_id).await?;
            }
            Action::CancelAllTimers => {
                self.saved()?;
                timers::cancel_all_timers(conn, run_id).await?;
                events::delete_waits(conn, run_id, None).await?;
                self.timers.clear();
            }
            Action::AwaitEvent {
                node,
                name,
                correlation,
            } => {
                self.saved()?;
                let correlation = correlation.as_ref().map(correlation_text);
                let pending = events::take_pending(
                    conn,
                    &self.run.namespace,
                    run_id,
                    correlation.as_deref(),
                    &name,
                )
                .await?;
                match pending {
                    Some(payload) => self.queue.push_back((
                        Event::EventReceived {
                            name,
                            payload,
                            node: Some(node),
                        },
                        actor.to_owned(),
                        None,
                    )),
                    None => {
                        events::insert_wait(
                            conn,
                            run_id,
                            &node.to_string(),
                            &self.run.namespace,
                            &name,
                            correlation.as_deref(),
                        )
                        .await?
                    }
                }
            }
            Action::StartChildRun {
                node,
                attempt,
                workflow,
                version,
                input,
            } => {
                self.saved()?;
                self.start_child(conn, node, attempt, &workflow, version, input, actor)
                    .await?;
            }
            Action::CancelChildRun { node } => {
                self.saved()?;
                self.cancel_children(conn, Some(&node.to_string())).await?;
            }
            Action::CancelAllChildRuns => {
                self.saved()?;
                self.cancel_children(conn, None).await?;
            }
            Action::CompleteRun { .. } | Action::FailRun { .. } | Action::CancelRun { .. } => {
                // the status is in the state change; the run's end is
                // handled once, in stage_write
            }
            Action::AppendHistory {
                kind,
                node,
                attempt,
                detail,
            } => self.record_history(HistoryWrite {
                event_type: kind.as_str().to_owned(),
                node_key: node.map(|n| n.to_string()),
                attempt: attempt.and_then(|a| i32::try_from(a).ok()),
                actor: actor.to_owned(),
                details: detail,
            }),
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_child(
        &mut self,
        conn: &mut PgConnection,
        node: NodeKey,
        attempt: u32,
        workflow: &str,
        version: Option<u32>,
        input: Json,
        actor: &str,
    ) -> Result<(), CoordinatorError> {
        let version = version.and_then(|v| i32::try_from(v).ok());
        let child_workflow = match self
            .coordinator
            .workflows
            .get_on(conn, &self.run.namespace, workflow, version)
            .await
        {
            Ok(loaded) => loaded,
            Err(CoordinatorError::WorkflowNotFound { name, version }) => {
                let error = ErrorInfo::new(
                    "WORKFLOW_NOT_FOUND",
                    format!("workflow {name:?} {version} not found"),
                );
                self.child_not_started(node, attempt, error, actor);
                return Ok(());
            }
            Err(other) => return Err(other),
        };
        if let Some(error) = self.tree_refuses_a_child(conn).await? {
            self.child_not_started(node, attempt, error, actor);
            return Ok(());
        }
        let admitted = match crate::events::concurrency::run_key(&child_workflow, &input) {
            Ok(None) => None,
            Ok(Some((key, concurrency))) => {
                let quotas = self.coordinator.quotas().of(&self.run.namespace);
                match crate::events::concurrency::admit(
                    conn,
                    &self.run.namespace,
                    &child_workflow.row.name,
                    key,
                    concurrency,
                    &quotas,
                )
                .await
                {
                    Ok(admitted) => Some(admitted),
                    // the node fails and retries as its policy says
                    Err(CoordinatorError::QuotaExceeded(refusal)) => {
                        let error = ErrorInfo::new(
                            crate::limits::quotas::QUOTA_EXCEEDED,
                            refusal.to_string(),
                        );
                        self.child_not_started(node, attempt, error, actor);
                        return Ok(());
                    }
                    Err(other) => return Err(other),
                }
            }
            Err(CoordinatorError::InvalidArgument(problems)) => {
                let message = problems
                    .first()
                    .map(|p| p.description.clone())
                    .unwrap_or_default();
                let error = ErrorInfo::new("INVALID_INPUT", message);
                self.child_not_started(node, attempt, error, actor);
                return Ok(());
            }
            Err(other) => return Err(other),
        };
        let child_id = Uuid::now_v7();
        let record = RunState::new(
            child_id.to_string(),
            &child_workflow.row.name,
            u32::try_from(child_workflow.row.version).unwrap_or_default(),
            input.clone(),
        )
        .run;
        let node_key = node.to_string();
        let status = match &admitted {
            Some(a) if a.queued() => composer_store::concurrency::QUEUED.to_owned(),
            _ => run_status_text(RunStatus::Pending),
        };
        runs::insert_run(
            conn,
            &NewRun {
                id: child_id,
                namespace: &self.run.namespace,
                workflow_name: &child_workflow.row.name,
                workflow_version: child_workflow.row.version,
                status: &status,
                input: &input,
                labels: &json!({}),
                idempotency_key: None,
                parent_run_id: Some(self.run.id),
                parent_node: Some(&node_key),
                parent_attempt: i32::try_from(attempt).ok(),
                record: &stored_record(&record)?,
                // a child run's spans hang under the transaction that
                // started it: one trace for the whole tree
                traceparent: self.traceparent.as_deref(),
                // a child run dispatches at its parent's priority
                priority: self.run.priority,
                concurrency: admitted.as_ref().map(|a| a.admission()),
            },
            false,
        )
        .await?;
        if let Some(evicted) = admitted.as_ref().and_then(|a| a.evicted()) {
            self.applied.inbox_runs.push(evicted);
        }
        let first = admitted
            .as_ref()
            .map_or(Some(Event::RunStarted), |a| a.first_event());
        if let Some(first) = first {
            let first = serde_json::to_value(first)?;
            events::push_inbox(conn, child_id, &first, &format!("run:{}", self.run.id)).await?;
            self.applied.inbox_runs.push(child_id);
        }
        Ok(())
    }

    /// Why this run may not start another child run, if it may not:
    /// recursion through SUB_WORKFLOW and MAP stops at a depth and at a
    /// number of runs per root tree, as a failure of the node that asked.
    async fn tree_refuses_a_child(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Option<ErrorInfo>, CoordinatorError> {
        let (depth, root) = runs::ancestry(conn, self.run.id, MAX_RUN_DEPTH).await?;
        let Some(root) = root.filter(|_| depth < MAX_RUN_DEPTH) else {
            return Ok(Some(ErrorInfo::new(
                composer_engine::codes::SUB_WORKFLOW_TOO_DEEP,
                format!("a run may have at most {MAX_RUN_DEPTH} levels of parent runs"),
            )));
        };
        let max = self.coordinator.config.max_runs_per_tree;
        if !runs::count_run_in_tree(conn, root, max).await? {
            return Ok(Some(ErrorInfo::new(
                composer_engine::codes::RUN_TREE_TOO_LARGE,
                format!("the tree of run {root} already holds {max} runs (--max-runs-per-tree)"),
            )));
        }
        Ok(None)
    }

    /// A child run that could not start: the node hears it as a failed child.
    fn child_not_started(&mut self, node: NodeKey, attempt: u32, error: ErrorInfo, actor: &str) {
        let event = Event::ChildRunFinished {
            node,
            attempt,
            status: ChildStatus::Failed,
            output: Json::Null,
            error: Some(error),
            seed: seed(),
        };
        self.queue.push_back((event, actor.to_owned(), None));
    }

    async fn cancel_children(
        &mut self,
        conn: &mut PgConnection,
        node: Option<&str>,
    ) -> Result<(), CoordinatorError> {
        let children = runs::active_children(conn, self.run.id, node).await?;
        let cancel = serde_json::to_value(Event::CancelRequested {
            reason: "parent run cancelled".to_owned(),
        })?;
        for child in children {
            events::push_inbox(conn, child, &cancel, &format!("run:{}", self.run.id)).await?;
            self.applied.inbox_runs.push(child);
        }
        Ok(())
    }

    /// Arms the pending tasks now, each in its own statement (before a
    /// cancellation that must see them; rare).
    async fn write_arms(&mut self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        if self.arms.is_empty() {
            return Ok(());
        }
        self.saved()?;
        let held = self.held();
        for arm in std::mem::take(&mut self.arms).list {
            if let Some(message) = tasks::arm_task(conn, &self.task_arm(&arm), held).await? {
                self.applied.outbox.push(message);
                self.applied.armed += 1;
            }
        }
        Ok(())
    }

    fn task_arm<'t>(&'t self, arm: &'t PendingArm) -> TaskArm<'t> {
        TaskArm {
            new_id: arm.new_id,
            namespace: &self.run.namespace,
            run_id: self.run.id,
            node_key: &arm.node_key,
            workflow_name: &self.run.workflow_name,
            workflow_version: self.run.workflow_version,
            queue: &arm.queue,
            task_name: &arm.task_name,
            attempt: arm.attempt,
            input: &arm.input,
            heartbeat_timeout_ms: arm.heartbeat_timeout_ms,
            attempt_timeout_ms: arm.attempt_timeout_ms,
            traceparent: self.traceparent.as_deref(),
            rate_limit_key: arm.rate_limit_key.as_deref(),
            concurrency: arm.concurrency.as_ref().map(|(node, slot)| TaskSlotArm {
                node,
                key: &slot.key,
                max: i32::try_from(slot.max).unwrap_or(i32::MAX),
            }),
            lease_to: None,
        }
    }

    /// True while the run is paused and not ended: what it arms is held.
    fn held(&self) -> bool {
        self.run.status == composer_store::pause::PAUSED && !self.state.run.status.is_terminal()
    }

    /// The run's final values and the statements that precede its write:
    /// a run that ends arms what it still must (its end cancels those),
    /// tells its parent and gives back its slot.
    async fn stage_write(&mut self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        let nodes: Vec<NodeWrite> = std::mem::take(&mut self.touched)
            .into_iter()
            .map(|(key, state)| {
                Ok(NodeWrite {
                    key: key.to_string(),
                    status: state.status.as_str().to_owned(),
                    ended: !state.status.is_active()
                        && !matches!(state.status, composer_engine::NodeStatus::Pending),
                    state: serde_json::to_value(&state)?,
                })
            })
            .collect::<Result<_, serde_json::Error>>()?;

        let (deletes, writes): (Vec<_>, Vec<_>) = std::mem::take(&mut self.timers)
            .into_iter()
            .partition(|(_, w)| w.is_none());
        let cancelled_timers: Vec<String> = deletes.into_iter().map(|(k, _)| k).collect();
        let timers: Vec<TimerWrite> = writes.into_iter().filter_map(|(_, w)| w).collect();

        let record = &self.state.run;
        let held = self.held();
        if !held {
            let run_id = self.run.id;
            self.applied
                .continued
                .extend(
                    timers
                        .iter()
                        .filter(|t| is_continuation(t))
                        .map(|t| timers::DueTimer {
                            run_id,
                            key: t.key.clone(),
                        }),
                );
        }
        // a paused run shows PAUSED until it resumes or ends; the engine's
        // status stays in its record
        let status = if held {
            composer_store::pause::PAUSED.to_owned()
        } else if self.queued_as == Some(record.status) {
            composer_store::concurrency::QUEUED.to_owned()
        } else {
            run_status_text(record.status)
        };
        let ended = record.status.is_terminal() && !self.was_terminal;
        self.applied.counted.run_ended = ended;
        if ended {
            // the run's end cancels its live tasks, these included
            self.write_arms(conn).await?;
            // before the slot: telling the parent may wait for the parent's
            // lock, and the parent may be waiting for this slot row
            self.tell_parent(conn).await?;
            self.release_slot(conn).await?;
        }
        let record = &self.state.run;
        let error = record
            .error
            .as_ref()
            .map(serde_json::to_value)
            .transpose()?;
        self.staged = Some(Staged {
            record: stored_record(record)?,
            status,
            error,
            ended,
            held,
            nodes,
            timers,
            cancelled_timers,
        });
        Ok(())
    }

    /// The tasks to arm, in the order their slot rows are locked: every
    /// statement that arms several keyed tasks locks them in one order, so
    /// two such statements cannot deadlock.
    pub(crate) fn task_arms(&self) -> Vec<TaskArm<'_>> {
        let mut arms: Vec<TaskArm<'_>> = self
            .arms
            .list
            .iter()
            .map(|arm| self.task_arm(arm))
            .collect();
        arms.sort_by_key(|arm| arm.concurrency.map(|c| (c.node, c.key)));
        arms
    }

    /// Whether the tasks it arms may be leased as they are armed (decision
    /// 0051): this server sends their messages itself, and the run is not
    /// paused. Only once [`stage`](RunTxn::stage)d.
    pub(crate) fn hands_off_at_arm(&self) -> bool {
        self.coordinator.publisher.is_some() && self.staged.as_ref().is_some_and(|s| !s.held)
    }

    /// The run's dispatch priority, which its tasks take.
    pub(crate) fn priority(&self) -> i16 {
        self.run.priority
    }

    /// The final write, once [`stage`](RunTxn::stage)d; `arms` are
    /// [`task_arms`](RunTxn::task_arms).
    pub(crate) fn event_write<'s>(
        &'s self,
        arms: &'s [TaskArm<'s>],
    ) -> Result<EventWrite<'s>, CoordinatorError> {
        let staged = self.staged.as_ref().ok_or_else(|| {
            CoordinatorError::Corrupt("a run was written before it was staged".to_owned())
        })?;
        Ok(EventWrite {
            run_id: self.run.id,
            namespace: &self.run.namespace,
            run: RunUpdate {
                status: &staged.status,
                record: &staged.record,
                output: self.state.run.output.as_ref(),
                error: staged.error.as_ref(),
                ended: staged.ended,
            },
            nodes: &staged.nodes,
            history: &self.history,
            tasks: arms,
            timers: &staged.timers,
            cancelled_timers: &staged.cancelled_timers,
            held: staged.held,
            published_by_caller: self.coordinator.publisher.is_some(),
        })
    }

    /// The run's insert, for a run not written yet.
    pub(crate) fn run_insert(&self) -> Option<RunInsert<'_>> {
        self.insert.map(|only_if_latest| RunInsert {
            workflow_name: &self.run.workflow_name,
            workflow_version: self.run.workflow_version,
            input: &self.state.run.input,
            labels: &self.run.labels,
            idempotency_key: self.run.idempotency_key.as_deref(),
            only_if_latest,
            traceparent: self.run.traceparent.as_deref(),
            priority: self.run.priority,
        })
    }

    /// Takes what the final write returned (None: nothing was written).
    async fn take_written(
        &mut self,
        conn: &mut PgConnection,
        written: Option<runs::EventWritten>,
    ) -> Result<(), CoordinatorError> {
        self.arms = PendingArms::default();
        self.history.clear();
        let staged = self.staged.take().ok_or_else(|| {
            CoordinatorError::Corrupt("a run's write was taken before it was staged".to_owned())
        })?;
        let run_id = self.run.id;
        let Some(written) = written else {
            if self.insert.is_some() {
                // not inserted: the caller finds out why; nothing was written
                return Ok(());
            }
            return Err(CoordinatorError::RunNotFound(run_id.to_string()));
        };
        self.applied.created_at = Some(written.created_at);
        self.applied.armed += written.outbox.len() + written.leased.len();
        self.applied.outbox.extend(written.outbox);
        self.applied.leased.extend(written.leased);
        // tasks armed (outbox rows written) and no fast path to send them
        if !self.applied.outbox.is_empty() && self.coordinator.publisher.is_none() {
            tasks::notify_outbox(conn).await?;
        }
        self.applied.status = staged.status;
        self.applied.run_id = run_id;
        self.applied.output = self.state.run.output.clone();
        self.applied.error = staged.error;
        Ok(())
    }

    /// Every end of a run goes through here (from stage_write): a run holding a
    /// slot of its concurrency key gives it back, and the oldest QUEUED
    /// runs of the key that now fit take it, their start (or retry) put in
    /// their inbox in this same transaction.
    async fn release_slot(&mut self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        if !self.run.concurrency_holds {
            return Ok(());
        }
        let Some(key) = self.run.concurrency_key.clone() else {
            return Ok(());
        };
        self.saved()?;
        let slot = composer_store::concurrency::SlotKey {
            namespace: &self.run.namespace,
            workflow_name: &self.run.workflow_name,
            key: &key,
        };
        let handed = composer_store::concurrency::release_slot(conn, self.run.id, slot).await?;
        self.run.concurrency_holds = false;
        for next in handed {
            let event = crate::events::concurrency::resume_event(conn, &next).await?;
            let actor = format!("run:{}", self.run.id);
            events::push_inbox(conn, next.run_id, &serde_json::to_value(event)?, &actor).await?;
            self.applied.inbox_runs.push(next.run_id);
        }
        Ok(())
    }

    /// A child run just ended: put the news in its parent's inbox.
    async fn tell_parent(&mut self, conn: &mut PgConnection) -> Result<(), CoordinatorError> {
        let run_id = self.run.id;
        if self.run.parent_run_id.is_some() {
            self.saved()?;
        }
        let (Some(parent), Some(parent_node)) =
            (self.run.parent_run_id, self.run.parent_node.as_deref())
        else {
            return Ok(());
        };
        let node: NodeKey = parent_node
            .parse()
            .map_err(|_| CoordinatorError::Corrupt(format!("parent node key {parent_node:?}")))?;
        let record = &self.state.run;
        let status = match record.status {
            RunStatus::Completed => ChildStatus::Completed,
            RunStatus::Cancelled => ChildStatus::Cancelled,
            _ => ChildStatus::Failed,
        };
        let finished = Event::ChildRunFinished {
            node,
            attempt: self
                .run
                .parent_attempt
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or(1),
            status,
            output: record.output.clone().unwrap_or(Json::Null),
            error: record.error.clone(),
            seed: seed(),
        };
        events::push_inbox(
            conn,
            parent,
            &serde_json::to_value(&finished)?,
            &format!("run:{run_id}"),
        )
        .await?;
        self.applied.inbox_runs.push(parent);
        Ok(())
    }
}

/// True when applying `RunStarted` to a new run writes only rows of the
/// final write statement (node states, history, tasks, timers): then the
/// StartRun is that one statement. A first node that waits for an event or
/// starts a child run needs statements before it, and a transaction.
pub(crate) fn start_writes_rows_only(workflow: &LoadedWorkflow, record: &RunRecord) -> bool {
    let mut state = RunState {
        run: record.clone(),
        nodes: BTreeMap::new(),
        blobs: Default::default(),
    };
    let event = Event::RunStarted;
    for key in prefetch(&workflow.compiled, &state, &event) {
        state.nodes.insert(key, None);
    }
    let now = timestamp(Utc::now());
    for _ in 0..MAX_LOAD_ROUNDS {
        match decide(&workflow.compiled, &state, &event, now) {
            Ok(decision) => {
                let ends = decision.actions.iter().any(|action| {
                    matches!(action, Action::CompleteRun { .. } | Action::FailRun { .. })
                });
                let arms = decision
                    .actions
                    .iter()
                    .any(|action| matches!(action, Action::CreateTask { .. }));
                if ends && arms {
                    return false;
                }
                return decision.actions.iter().all(|action| {
                    matches!(
                        action,
                        Action::CreateTask { .. }
                            | Action::ScheduleTimer { .. }
                            | Action::AppendHistory { .. }
                            | Action::CompleteRun { .. }
                            | Action::FailRun { .. }
                    )
                });
            }
            Err(DecideError::NeedNodes(keys)) => {
                for key in keys {
                    state.nodes.entry(key).or_insert(None);
                }
            }
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod stored_record_tests {
    use super::*;

    #[test]
    fn a_stored_record_leaves_what_the_row_holds_and_reads_back_whole() {
        let id = Uuid::new_v4();
        let mut run = RunState::new(id.to_string(), "orders", 7, Json::Null).run;
        run.status = composer_engine::RunStatus::Running;
        run.active = 2;
        let stored = stored_record(&run).expect("stored");
        let keys: Vec<&String> = stored.as_object().expect("object").keys().collect();
        let absent = [
            "input",
            "run_id",
            "workflow",
            "version",
            "compensable",
            "failed",
        ];
        for key in absent {
            assert!(!keys.iter().any(|k| *k == key), "{key} in {stored}");
        }
        let read = record_of_row(stored, id, "orders", 7).expect("read");
        assert_eq!(read, run);
    }

    #[test]
    fn a_record_stored_whole_before_keeps_its_own_fields() {
        let mut run = RunState::new("old-id", "orders", 7, Json::Null).run;
        run.failed = vec!["a".parse::<NodeKey>().expect("key")];
        run.compensated = true;
        let mut whole = serde_json::to_value(&run).expect("whole");
        whole.as_object_mut().expect("object").remove("input");
        let read = record_of_row(whole, Uuid::new_v4(), "other", 9).expect("read");
        assert_eq!(read, run);
    }
}

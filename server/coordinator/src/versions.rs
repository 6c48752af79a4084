//! Runs replayed against other definitions (docs/versions.md): a run read
//! from the store (its row, node states and history), replayed by the
//! engine on the CPU pool, a namespace's share of it at a time.

use std::{collections::BTreeMap, sync::Arc};

use composer_engine::{
    CompiledWorkflow, NodeKey, NodeState,
    replay::{NodeMapping, RecordedEntry, RecordedRun, ReplayReport, replay},
};
use composer_store::runs::{self, HistoryRow, NodeRow, RunFilter, RunRow};
use futures::{StreamExt, stream};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{
    Coordinator, CoordinatorError, FieldProblem, limits::cpu_pool::Admission,
    workflows::LoadedWorkflow,
};

/// The most history entries a replay reads of one run: a longer history is
/// answered unreplayable rather than held in memory.
pub const MAX_REPLAYED_ENTRIES: usize = 100_000;

/// Runs replayed at once by one CheckWorkflowVersion call.
const CHECKS_AT_ONCE: usize = 4;

/// The definition a run is replayed against.
#[derive(Debug, Clone)]
pub enum NewDefinition {
    /// Text, checked as RegisterWorkflow checks it.
    Source(String),
    /// A registered version of the run's workflow.
    Version(i32),
}

/// Which runs of a workflow a check replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckScope {
    /// RUNNING, COMPENSATING and PAUSED runs.
    InFlight,
    /// COMPLETED runs.
    Completed,
}

/// Where a page of runs ends: the last run's creation time and id.
pub type RunCursor = (chrono::DateTime<chrono::Utc>, Uuid);

/// What CheckWorkflowVersion replays: the runs of `name` in `scope`
/// against `new`, with `mapping`'s renames.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub name: &'a str,
    pub new: &'a NewDefinition,
    pub mapping: &'a NodeMapping,
    pub scope: CheckScope,
}

/// A compiled target: a registered version or a checked text.
pub(crate) enum Target {
    Loaded(Arc<LoadedWorkflow>),
    Compiled(Arc<CompiledWorkflow>),
}

impl Target {
    fn compiled(&self) -> &CompiledWorkflow {
        match self {
            Target::Loaded(loaded) => &loaded.compiled,
            Target::Compiled(compiled) => compiled,
        }
    }
}

/// One run's verdict: the report, or why it could not be replayed.
#[derive(Debug, Clone)]
pub struct RunVerdict {
    pub run: RunRow,
    pub outcome: Result<ReplayReport, String>,
}

impl Coordinator {
    /// Replays one run of `namespace` against `new`.
    pub async fn replay_run(
        &self,
        namespace: &str,
        run_id: Uuid,
        new: &NewDefinition,
        mapping: &NodeMapping,
    ) -> Result<RunVerdict, CoordinatorError> {
        let run = runs::get_run(self.store().pool(), Some(namespace), run_id)
            .await?
            .ok_or_else(|| CoordinatorError::RunNotFound(run_id.to_string()))?;
        let target = Arc::new(self.target(namespace, &run.workflow_name, new).await?);
        self.replay_stored(run, target, mapping.clone()).await
    }

    /// Replays a run given whole (not read from the store) against `new`,
    /// `recorded_source` being the definition it ran on.
    pub async fn replay_recorded(
        &self,
        namespace: &str,
        recorded_source: &str,
        recorded: RecordedRun,
        new: &NewDefinition,
        mapping: &NodeMapping,
    ) -> Result<Result<ReplayReport, String>, CoordinatorError> {
        let old = match self
            .workflows()
            .validate(namespace, recorded_source)
            .await?
        {
            Ok(compiled) => compiled,
            Err(problems) => {
                return Ok(Err(format!(
                    "the run's own definition does not compile: {}",
                    problems
                        .first()
                        .map(|p| format!("{}: {}", p.field, p.description))
                        .unwrap_or_default()
                )));
            }
        };
        let target = Arc::new(self.target(namespace, old.name(), new).await?);
        let mapping = mapping.clone();
        let recorded = self.with_blob_values(namespace, recorded).await;
        let report = self
            .workflows()
            .cpu_pool()
            .run(namespace, Admission::RefuseWhenFull, move || {
                replay(&old, target.compiled(), &recorded, &mapping).map_err(|e| e.to_string())
            })
            .await?;
        Ok(report)
    }

    /// Replays one page of a workflow's runs (see [`Check`]), newest
    /// first, after `cursor`; returns their verdicts and the cursor of the
    /// next page (none after the last).
    pub async fn check_workflow_version(
        &self,
        namespace: &str,
        check: Check<'_>,
        cursor: Option<RunCursor>,
        limit: i64,
    ) -> Result<(Vec<RunVerdict>, Option<RunCursor>), CoordinatorError> {
        let Check {
            name,
            new,
            mapping,
            scope,
        } = check;
        let target = Arc::new(self.target(namespace, name, new).await?);
        let statuses = match scope {
            CheckScope::InFlight => vec!["RUNNING", "COMPENSATING", "PAUSED"],
            CheckScope::Completed => vec!["COMPLETED"],
        };
        let filter = RunFilter {
            workflow_name: Some(name.to_owned()),
            statuses: statuses.into_iter().map(str::to_owned).collect(),
            ..RunFilter::default()
        };
        let mut rows =
            runs::list_runs(self.store().pool(), namespace, &filter, cursor, limit + 1).await?;
        let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let next = more
            .then(|| rows.last().map(|r| (r.created_at, r.id)))
            .flatten();
        let verdicts: Vec<Result<RunVerdict, CoordinatorError>> = stream::iter(rows)
            .map(|run| self.replay_stored(run, Arc::clone(&target), mapping.clone()))
            .buffered(CHECKS_AT_ONCE)
            .collect()
            .await;
        let verdicts = verdicts.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok((verdicts, next))
    }

    /// The definition to replay against, for runs of `name`.
    async fn target(
        &self,
        namespace: &str,
        name: &str,
        new: &NewDefinition,
    ) -> Result<Target, CoordinatorError> {
        match new {
            NewDefinition::Version(version) => Ok(Target::Loaded(
                self.workflows()
                    .get(self.store(), namespace, name, Some(*version))
                    .await?,
            )),
            NewDefinition::Source(source) => {
                let compiled = self
                    .workflows()
                    .validate(namespace, source)
                    .await?
                    .map_err(CoordinatorError::InvalidDefinition)?;
                if compiled.name() != name {
                    return Err(CoordinatorError::InvalidArgument(vec![FieldProblem {
                        field: "source".into(),
                        description: format!(
                            "defines workflow {:?}; the runs are of {name:?}",
                            compiled.name()
                        ),
                    }]));
                }
                Ok(Target::Compiled(Arc::new(compiled)))
            }
        }
    }

    /// Reads `run`'s nodes and history and replays it on the CPU pool.
    async fn replay_stored(
        &self,
        run: RunRow,
        target: Arc<Target>,
        mapping: NodeMapping,
    ) -> Result<RunVerdict, CoordinatorError> {
        let namespace = run.namespace.clone();
        let old = self
            .workflows()
            .get(
                self.store(),
                &namespace,
                &run.workflow_name,
                Some(run.workflow_version),
            )
            .await?;
        let mut conn = self.store().pool().acquire().await?;
        let recorded = match recorded_run(&mut conn, &run).await? {
            Ok(recorded) => recorded,
            Err(reason) => {
                return Ok(RunVerdict {
                    run,
                    outcome: Err(reason),
                });
            }
        };
        drop(conn);
        let outcome = self
            .replay_on_pool(
                &namespace,
                Admission::RefuseWhenFull,
                old,
                target,
                recorded,
                mapping,
            )
            .await?;
        Ok(RunVerdict { run, outcome })
    }

    /// Replays `recorded` (a run of `old`) against `target` on the CPU pool.
    pub(crate) async fn replay_on_pool(
        &self,
        namespace: &str,
        admission: Admission,
        old: Arc<LoadedWorkflow>,
        target: Arc<Target>,
        recorded: RecordedRun,
        mapping: NodeMapping,
    ) -> Result<Result<ReplayReport, String>, CoordinatorError> {
        let recorded = self.with_blob_values(namespace, recorded).await;
        Ok(self
            .workflows()
            .cpu_pool()
            .run(namespace, admission, move || {
                replay(&old.compiled, target.compiled(), &recorded, &mapping)
                    .map_err(|e| e.to_string())
            })
            .await?)
    }
}

/// A stored run as the engine replays it, read through `conn` (under the
/// run's lock when a migration reads it); Err: why it cannot be replayed.
pub(crate) async fn recorded_run(
    conn: &mut PgConnection,
    run: &RunRow,
) -> Result<Result<RecordedRun, String>, CoordinatorError> {
    let nodes = runs::list_nodes(&mut *conn, run.id).await?;
    let Some(history) = whole_history(conn, run.id).await? else {
        return Ok(Err(format!(
            "its history has more than {MAX_REPLAYED_ENTRIES} entries"
        )));
    };
    Ok(recorded_from_store(run, &nodes, &history))
}

/// Every history entry of a run, or None past [`MAX_REPLAYED_ENTRIES`].
async fn whole_history(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<Vec<HistoryRow>>, CoordinatorError> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map_or(0, |row: &HistoryRow| row.seq);
        let page = runs::history_page(&mut *conn, run_id, after, 1000).await?;
        let last_page = page.len() < 1000;
        all.extend(page);
        if all.len() > MAX_REPLAYED_ENTRIES {
            return Ok(None);
        }
        if last_page {
            return Ok(Some(all));
        }
    }
}

/// The engine's view of a stored run.
pub fn recorded_from_store(
    run: &RunRow,
    nodes: &[NodeRow],
    history: &[HistoryRow],
) -> Result<RecordedRun, String> {
    let mut outputs = BTreeMap::new();
    for node in nodes {
        let key = node
            .key
            .parse::<NodeKey>()
            .map_err(|e| format!("node {:?}: {e}", node.key))?;
        let state: NodeState = serde_json::from_value(node.state.clone())
            .map_err(|e| format!("node {:?}: {e}", node.key))?;
        if let Some(output) = state.output {
            outputs.insert(key, output);
        }
    }
    let history = history
        .iter()
        .map(|row| {
            RecordedEntry::parse(
                row.seq,
                &row.event_type,
                row.node_key.as_deref(),
                row.attempt,
                row.details.clone(),
                row.created_at.timestamp_millis(),
            )
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RecordedRun {
        input: run.input.clone(),
        outputs,
        history,
        blobs: Default::default(),
    })
}

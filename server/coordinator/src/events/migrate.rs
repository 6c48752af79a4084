//! Moving runs in flight to another version of their workflow (MigrateRuns,
//! decision 0043). Each run moves in its own event transaction: locked,
//! replayed against the target by the engine, and moved only if the target
//! can continue it, so a run is never half moved and never moved while an
//! event of it is being applied.

use std::sync::Arc;

use composer_engine::{
    NodeKey, NodeState,
    history::HistoryEventType,
    replay::{NodeMapping, ReplayReport, Verdict},
};
use composer_store::{
    concurrency::QUEUED,
    migrate::{self, RunMove},
    runs::{self, HistoryWrite, NodeRow, RunRow},
};
use serde_json::{Value as Json, json};
use uuid::Uuid;

use crate::{
    Coordinator,
    error::CoordinatorError,
    events::{bulk_step::BulkStep, pause::FlowChange, runs::is_final},
    limits::cpu_pool::Admission,
    versions::{Target, recorded_run},
    workflows::LoadedWorkflow,
};

/// Where a migration moves runs: a registered version of their workflow,
/// with node ids renamed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The target version.
    pub target_version: i32,
    /// Node ids renamed, recorded id to the target's.
    pub mapping: NodeMapping,
}

impl Migration {
    /// As a bulk operation's `params`.
    pub fn to_params(&self) -> Json {
        json!({"target_version": self.target_version, "node_mapping": self.mapping_json()})
    }

    /// The node mapping as a JSON object, old id to new id.
    fn mapping_json(&self) -> Json {
        let mapping: serde_json::Map<String, Json> = self
            .mapping
            .pairs()
            .map(|(from, to)| (from.to_owned(), Json::from(to)))
            .collect();
        Json::Object(mapping)
    }

    /// From a bulk operation's `params`; None when they name no version.
    pub fn from_params(params: &Json) -> Option<Migration> {
        let target_version = i32::try_from(params.get("target_version")?.as_i64()?).ok()?;
        let pairs = params
            .get("node_mapping")
            .and_then(Json::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(from, to)| Some((from.clone(), to.as_str()?.to_owned())))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        Some(Migration {
            target_version,
            mapping: NodeMapping::from_pairs(pairs),
        })
    }
}

impl Coordinator {
    /// One run's move, as a bulk operation's step: Unchanged (skipped) when
    /// the run already is on the target; WrongRunStatus (skipped) when it
    /// is not RUNNING or PAUSED; RunNotMigrated (failed, with why) when the
    /// target cannot continue it or a renamed node has work in flight.
    pub(crate) async fn migrate_run_step(
        &self,
        namespace: &str,
        run_id: Uuid,
        migration: &Migration,
        actor: &str,
        step: &BulkStep<'_>,
    ) -> Result<FlowChange, CoordinatorError> {
        let (mut tx, run) = self.lock_existing(Some(namespace), run_id).await?;
        check_movable(&run)?;
        if run.workflow_version == migration.target_version {
            return Ok(FlowChange::Unchanged);
        }
        let refuse = |why: String| CoordinatorError::RunNotMigrated {
            run_id: run_id.to_string(),
            why,
        };
        let old = self.version_of(&run, run.workflow_version).await?;
        let target = self.version_of(&run, migration.target_version).await?;
        if let Some((from, to)) = migration
            .mapping
            .pairs()
            .find(|(_, to)| old.compiled.contains(to))
        {
            return Err(refuse(format!(
                "node_mapping renames {from} to {to}, a node its version {} already has",
                run.workflow_version
            )));
        }
        if !migration.mapping.is_empty() && migrate::has_inbox_events(&mut tx, run_id).await? {
            return Err(refuse(
                "events wait to be applied to it; move it once they are".to_owned(),
            ));
        }
        let recorded = recorded_run(&mut tx, &run).await?.map_err(&refuse)?;
        let nodes = runs::list_nodes(&mut *tx, run_id).await?;
        let report = self
            .replay_on_pool(
                namespace,
                Admission::Wait,
                Arc::clone(&old),
                Arc::new(Target::Loaded(Arc::clone(&target))),
                recorded,
                migration.mapping.clone(),
            )
            .await?
            .map_err(|reason| refuse(format!("its history cannot be replayed: {reason}")))?;
        check_verdict(&report).map_err(&refuse)?;
        let renamed_nodes = renamed_nodes(&nodes, &migration.mapping).map_err(&refuse)?;
        let record = moved_record(&run, migration)?;
        let renamed_ids: Vec<(String, String)> = migration
            .mapping
            .pairs()
            .map(|(from, to)| (from.to_owned(), to.to_owned()))
            .collect();
        migrate::move_run(
            &mut tx,
            &RunMove {
                run_id,
                to_version: migration.target_version,
                record: &record,
                renamed_nodes: &renamed_nodes,
                renamed_ids: &renamed_ids,
            },
        )
        .await?;
        let history = HistoryWrite {
            event_type: HistoryEventType::RunMigrated.as_str().to_owned(),
            node_key: None,
            attempt: None,
            actor: actor.to_owned(),
            details: json!({
                "from_version": run.workflow_version,
                "to_version": migration.target_version,
                "node_mapping": migration.mapping_json(),
                "verdict": report.verdict.as_str(),
                "operation_id": step.operation_id.to_string(),
            }),
        };
        runs::append_history(&mut tx, run_id, namespace, &[history]).await?;
        step.record(&mut tx).await?;
        tx.commit().await?;
        self.run_changed(run_id);
        Ok(FlowChange::Changed)
    }

    async fn version_of(
        &self,
        run: &RunRow,
        version: i32,
    ) -> Result<Arc<LoadedWorkflow>, CoordinatorError> {
        self.workflows()
            .get(
                self.store(),
                &run.namespace,
                &run.workflow_name,
                Some(version),
            )
            .await
    }
}

/// Only a run that is going on moves: one that ended has nothing left to
/// change, a compensating one runs its undo steps under the version that
/// recorded them, and a queued one starts under whatever version it names
/// when its turn comes (move it then).
fn check_movable(run: &RunRow) -> Result<(), CoordinatorError> {
    let why = if is_final(&run.status) {
        "a run that ended stays on its version"
    } else if run.status == "COMPENSATING" {
        "a compensating run finishes on its version"
    } else if run.status == QUEUED {
        "a queued run has started nothing to move; move it once it starts"
    } else {
        return Ok(());
    };
    Err(CoordinatorError::WrongRunStatus {
        run_id: run.id.to_string(),
        status: run.status.clone(),
        why,
    })
}

/// The target may continue the run when the replay found it identical or
/// compatible; else why not, in words.
fn check_verdict(report: &ReplayReport) -> Result<(), String> {
    match (report.verdict, &report.divergence) {
        (Verdict::Identical | Verdict::Compatible, _) => Ok(()),
        (Verdict::Incompatible, Some(divergence)) => Err(format!(
            "incompatible ({}): {}",
            divergence.rule.as_str(),
            divergence.message
        )),
        (Verdict::Incompatible, None) => Err("incompatible".to_owned()),
    }
}

/// The run's node rows that the mapping renames, under their new keys; Err
/// when one of them has work in flight (a task out, a timer or an event
/// awaited): a server may hold that work under its old name, so such a
/// node is renamed only once it has settled.
fn renamed_nodes(
    nodes: &[NodeRow],
    mapping: &NodeMapping,
) -> Result<Vec<(String, String, Json)>, String> {
    if mapping.is_empty() {
        return Ok(Vec::new());
    }
    let mut renamed = Vec::new();
    for row in nodes {
        let key: NodeKey = row
            .key
            .parse()
            .map_err(|e| format!("node {:?}: {e}", row.key))?;
        let new_key = mapping.key(&key);
        if new_key == key {
            continue;
        }
        let mut state: NodeState =
            serde_json::from_value(row.state.clone()).map_err(|e| format!("node {key}: {e}"))?;
        if state.status.is_active() {
            return Err(format!(
                "node {key} is {} and node_mapping renames it; a node with work in flight is \
                 renamed only once it settles",
                state.status.as_str()
            ));
        }
        if let Some(error) = &mut state.error
            && error.node.as_deref() == Some(row.key.as_str())
        {
            error.node = Some(new_key.to_string());
        }
        let state = serde_json::to_value(&state).map_err(|e| format!("node {key}: {e}"))?;
        renamed.push((row.key.clone(), new_key.to_string(), state));
    }
    Ok(renamed)
}

/// The run's record under the target: its version, its nodes renamed.
fn moved_record(run: &RunRow, migration: &Migration) -> Result<Json, CoordinatorError> {
    let stored = run.record.clone();
    let mut record = crate::events::apply::record_of_row(
        stored,
        run.id,
        &run.workflow_name,
        run.workflow_version,
    )?;
    record.version = u32::try_from(migration.target_version).unwrap_or_default();
    migration.mapping.rename_record(&mut record);
    Ok(crate::events::apply::stored_record(&record)?)
}

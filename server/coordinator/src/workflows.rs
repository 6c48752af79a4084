//! Registered workflows: validation, content-addressed versions, and a cache
//! of compiled definitions (one compile per version per server). Every
//! compile runs on the CPU pool (decision 0036), never on the threads that
//! serve requests.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use composer_engine::{CompiledWorkflow, ValidationErrors, parse_definition};
use composer_store::{
    Store,
    workflows::{self, NewWorkflow, WorkflowRow},
};
use sha2::{Digest, Sha256};

use crate::{
    error::{CoordinatorError, FieldProblem},
    limits::cpu_pool::{Admission, CpuPool},
};

/// A compiled version with its input schema, shared by every run of it.
pub struct LoadedWorkflow {
    /// The stored row.
    pub row: WorkflowRow,
    /// The compiled definition.
    pub compiled: CompiledWorkflow,
    /// The compiled `input_schema`, if any.
    pub input_schema: Option<jsonschema::Validator>,
    /// The input schema matches regular expressions (`pattern`,
    /// `patternProperties`, `format`), whose cost per string can reach
    /// the regex engine's backtrack limit: inputs are checked on the CPU
    /// pool.
    pub input_check_is_costly: bool,
    /// Tasks the last run started on this version armed at its start: what
    /// the next start reserves against its namespace's task quota.
    armed_at_start: std::sync::atomic::AtomicU64,
}

impl LoadedWorkflow {
    /// What a start of this version is expected to arm.
    pub fn armed_at_start(&self) -> u64 {
        self.armed_at_start
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes what a start of this version armed.
    pub fn started_arming(&self, tasks: usize) {
        let tasks = u64::try_from(tasks).unwrap_or(u64::MAX);
        self.armed_at_start
            .store(tasks, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Inputs larger than this (bytes of JSON) are checked against their
/// schema on the CPU pool whatever the schema; smaller ones against a
/// schema without regular expressions cost microseconds, less than the
/// hop to the pool (decision 0036).
pub const INLINE_INPUT_CHECK_BYTES: usize = 64 * 1024;

/// Whether `schema` names a keyword that runs a regular expression.
fn uses_regular_expressions(schema: &serde_json::Value) -> bool {
    match schema {
        serde_json::Value::Object(map) => map.iter().any(|(key, value)| {
            matches!(key.as_str(), "pattern" | "patternProperties" | "format")
                || uses_regular_expressions(value)
        }),
        serde_json::Value::Array(items) => items.iter().any(uses_regular_expressions),
        _ => false,
    }
}

type CacheKey = (String, String, i32);

/// Compiled versions by (namespace, name, version). Versions are immutable,
/// so entries never go stale; the map is cleared when it grows too large.
pub struct WorkflowCache {
    /// What a template of any workflow may render (`--max-payload-bytes`).
    max_rendered_bytes: usize,
    /// Where definitions are compiled.
    cpu: CpuPool,
    entries: Mutex<HashMap<CacheKey, Arc<LoadedWorkflow>>>,
    /// The latest version of each (namespace, name) as last read. A hint:
    /// StartRun checks it in the statement that inserts the run.
    latest: Mutex<HashMap<(String, String), i32>>,
}

const CACHE_LIMIT: usize = 4096;

fn problems(errors: ValidationErrors) -> Vec<FieldProblem> {
    errors
        .iter()
        .map(|e| FieldProblem {
            field: e.path.clone(),
            description: e.message.clone(),
        })
        .collect()
}

/// Parses and compiles a definition; every problem at once.
pub fn validate(source: &str) -> Result<CompiledWorkflow, Vec<FieldProblem>> {
    let definition = parse_definition(source).map_err(problems)?;
    let schema_problem = definition
        .input_schema
        .as_ref()
        .and_then(|schema| jsonschema::validator_for(schema).err())
        .map(|e| FieldProblem {
            field: "input_schema".to_owned(),
            description: format!("not a valid JSON Schema: {e}"),
        });
    let compiled = CompiledWorkflow::compile(definition).map_err(problems);
    match (compiled, schema_problem) {
        (Ok(compiled), None) => Ok(compiled),
        (Ok(_), Some(problem)) => Err(vec![problem]),
        (Err(mut all), problem) => {
            all.extend(problem);
            Err(all)
        }
    }
}

fn load(row: WorkflowRow, max_rendered_bytes: usize) -> Result<LoadedWorkflow, CoordinatorError> {
    let compiled = validate(&row.source)
        .map_err(|p| {
            CoordinatorError::Corrupt(format!(
                "stored workflow {} v{} no longer validates: {p:?}",
                row.name, row.version
            ))
        })?
        .with_max_rendered_bytes(max_rendered_bytes);
    let schema = compiled.definition().input_schema.as_ref();
    let input_check_is_costly = schema.is_some_and(uses_regular_expressions);
    let input_schema = schema
        .map(jsonschema::validator_for)
        .transpose()
        .map_err(|e| CoordinatorError::Corrupt(e.to_string()))?;
    Ok(LoadedWorkflow {
        row,
        compiled,
        input_schema,
        input_check_is_costly,
        armed_at_start: std::sync::atomic::AtomicU64::new(0),
    })
}

impl WorkflowCache {
    /// An empty cache whose workflows render at most `max_rendered_bytes`
    /// and compile on `cpu`.
    pub fn new(max_rendered_bytes: usize, cpu: CpuPool) -> Self {
        Self {
            max_rendered_bytes,
            cpu,
            entries: Mutex::default(),
            latest: Mutex::default(),
        }
    }

    /// Registers a definition: a new version only when the content changed.
    pub async fn register(
        &self,
        store: &Store,
        namespace: &str,
        source: &str,
    ) -> Result<(WorkflowRow, bool), CoordinatorError> {
        let compiled = self
            .validate(namespace, source)
            .await?
            .map_err(CoordinatorError::InvalidDefinition)?;
        let definition = compiled.definition();
        let canonical = definition.canonical_json();
        let content_hash = hex(&Sha256::digest(&canonical));
        let as_json: serde_json::Value = serde_json::from_slice(&canonical)?;
        let (row, created) = workflows::register_workflow(
            store.pool(),
            NewWorkflow {
                namespace,
                name: &definition.name,
                description: definition.description.as_deref().unwrap_or_default(),
                source,
                definition: &as_json,
                content_hash: &content_hash,
            },
        )
        .await?;
        Ok((row, created))
    }

    /// A compiled workflow version (the latest when `version` is None;
    /// "latest" is always read from the database), from the cache when it
    /// has it.
    pub async fn get(
        &self,
        store: &Store,
        namespace: &str,
        name: &str,
        version: Option<i32>,
    ) -> Result<Arc<LoadedWorkflow>, CoordinatorError> {
        if let Some(hit) = version.and_then(|v| self.cached(namespace, name, v)) {
            return Ok(hit);
        }
        let mut conn = store
            .pool()
            .acquire()
            .await
            .map_err(composer_store::StoreError::from)?;
        self.get_on(&mut conn, namespace, name, version).await
    }

    /// [`get`](WorkflowCache::get) on the caller's connection: for callers
    /// inside a transaction, which must not wait for a second connection.
    pub async fn get_on(
        &self,
        conn: &mut sqlx::PgConnection,
        namespace: &str,
        name: &str,
        version: Option<i32>,
    ) -> Result<Arc<LoadedWorkflow>, CoordinatorError> {
        if let Some(hit) = version.and_then(|v| self.cached(namespace, name, v)) {
            return Ok(hit);
        }
        let row = workflows::get_workflow(conn, namespace, name, version)
            .await?
            .ok_or_else(|| CoordinatorError::WorkflowNotFound {
                name: name.to_owned(),
                version: version.map_or("latest".to_owned(), |v| format!("version {v}")),
            })?;
        if let Some(hit) = self.cached(namespace, name, row.version) {
            return Ok(hit);
        }
        let key = (namespace.to_owned(), name.to_owned(), row.version);
        // a stored definition the server needs: it waits for the pool
        // rather than fail the run that needs it
        let max_rendered_bytes = self.max_rendered_bytes;
        let loaded = Arc::new(
            self.cpu
                .run(namespace, Admission::Wait, move || {
                    load(row, max_rendered_bytes)
                })
                .await??,
        );
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The latest version of a workflow, from the cache unless `refresh`
    /// (or never read). The answer may be stale: use it only where the
    /// write that follows checks it (StartRun does).
    pub async fn latest(
        &self,
        store: &Store,
        namespace: &str,
        name: &str,
        refresh: bool,
    ) -> Result<Arc<LoadedWorkflow>, CoordinatorError> {
        let key = (namespace.to_owned(), name.to_owned());
        let known = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        if !refresh
            && let Some(version) = known
            && let Some(hit) = self.cached(namespace, name, version)
        {
            return Ok(hit);
        }
        let loaded = self.get(store, namespace, name, None).await?;
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if latest.len() >= CACHE_LIMIT {
            latest.clear();
        }
        latest.insert(key, loaded.row.version);
        Ok(loaded)
    }

    /// [`validate`] on the CPU pool, as `namespace`'s request: refused
    /// when the namespace has as many checks waiting as it may.
    pub async fn validate(
        &self,
        namespace: &str,
        source: &str,
    ) -> Result<Result<CompiledWorkflow, Vec<FieldProblem>>, CoordinatorError> {
        let source = source.to_owned();
        Ok(self
            .cpu
            .run(namespace, Admission::RefuseWhenFull, move || {
                validate(&source)
            })
            .await?)
    }

    /// The CPU pool.
    pub fn cpu_pool(&self) -> &CpuPool {
        &self.cpu
    }

    fn cached(&self, namespace: &str, name: &str, version: i32) -> Option<Arc<LoadedWorkflow>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(&(namespace.to_owned(), name.to_owned(), version))
            .cloned()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl crate::Coordinator {
    /// One stored version (the latest when `version` is None).
    pub async fn workflow_version(
        &self,
        namespace: &str,
        name: &str,
        version: Option<i32>,
    ) -> Result<WorkflowRow, CoordinatorError> {
        let mut conn = self
            .store
            .pool()
            .acquire()
            .await
            .map_err(composer_store::StoreError::from)?;
        workflows::get_workflow(&mut conn, namespace, name, version)
            .await?
            .ok_or_else(|| CoordinatorError::WorkflowNotFound {
                name: name.to_owned(),
                version: version.map_or("latest".to_owned(), |v| format!("version {v}")),
            })
    }

    /// Every namespace with a registered workflow.
    pub async fn namespaces(&self) -> Result<Vec<String>, CoordinatorError> {
        Ok(workflows::namespaces(self.store.pool()).await?)
    }

    /// Workflow names after `after_name`, each with its latest version.
    pub async fn list_workflows(
        &self,
        namespace: &str,
        name_prefix: &str,
        after_name: &str,
        limit: i64,
    ) -> Result<Vec<WorkflowRow>, CoordinatorError> {
        Ok(
            workflows::list_workflows(self.store.pool(), namespace, name_prefix, after_name, limit)
                .await?,
        )
    }

    /// Versions of one workflow below `before_version`, newest first.
    pub async fn list_workflow_versions(
        &self,
        namespace: &str,
        name: &str,
        before_version: i32,
        limit: i64,
    ) -> Result<Vec<WorkflowRow>, CoordinatorError> {
        Ok(workflows::list_workflow_versions(
            self.store.pool(),
            namespace,
            name,
            before_version,
            limit,
        )
        .await?)
    }
}

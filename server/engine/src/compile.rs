//! Validation and the compiled, indexed form of a definition.

use std::collections::{HashMap, VecDeque};

use serde_json::Value as Json;

use crate::cel::{Env, NodeField, Program, Scope, Ty, Val};
use crate::definition::{
    Broken, Definition, EdgeOn, MAX_CONCURRENCY, MAX_NODES, Node, NodeConcurrency, NodeType,
    OnLimit, ValidationErrors, parse_structure,
};
use crate::duration::parse_duration;
use crate::names;
use crate::template::{self, Template};

/// Most edges one definition may have.
pub const MAX_EDGES: usize = 50_000;
/// Default lease length.
pub const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 30_000;
/// Default MAP concurrency.
pub const DEFAULT_MAP_CONCURRENCY: u32 = 100;
/// The most elements a MAP runs: each becomes a node row and a task when it
/// starts, and until then its input waits in a row shared by
/// [`crate::MAP_ARM_SLICE`] elements.
pub const MAX_MAP_ITEMS: usize = 100_000;
/// Queue of the engine's own HTTP worker.
pub const HTTP_QUEUE: &str = "_http";

/// Retry policy of a node, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_interval_ms: u64,
    pub backoff: f64,
    pub max_interval_ms: u64,
    pub jitter: bool,
    pub non_retryable: Vec<String>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval_ms: 1_000,
            backoff: 2.0,
            max_interval_ms: 300_000,
            jitter: false,
            non_retryable: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `failed + 1`, after attempt `failed` (1-based)
    /// failed: `min(initial * backoff^(failed-1), max)`; with jitter, a value
    /// in `[0, that]` drawn from `seed` (full jitter, deterministic).
    pub fn delay_ms(&self, failed: u32, seed: u64) -> u64 {
        let exp = i32::try_from(failed.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = self.initial_interval_ms as f64 * self.backoff.powi(exp);
        let capped = if raw.is_finite() {
            raw.min(self.max_interval_ms as f64)
        } else {
            self.max_interval_ms as f64
        };
        let delay = capped.max(0.0) as u64;
        if !self.jitter || delay == 0 {
            return delay;
        }
        splitmix64(seed ^ u64::from(failed).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % (delay + 1)
    }
}

/// A small, well-mixed deterministic hash (used for jitter from a seed).
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What a MAP runs per element.
#[derive(Debug, Clone)]
pub enum MapElement {
    Task {
        queue: String,
        task: String,
    },
    Workflow {
        workflow: String,
        version: Option<u32>,
    },
}

/// The type-specific part of a compiled node.
#[derive(Debug, Clone)]
pub enum Kind {
    Task {
        queue: String,
        task: String,
        /// The task's rate-limit key (a string; null: none).
        rate_limit_key: Option<Program>,
        /// The task's concurrency key and limit, if it has one.
        concurrency: Option<TaskSlot>,
    },
    Http {
        request: Template,
    },
    Code {
        language: String,
        code: String,
        /// Secrets the snippet receives, sorted; never rendered here.
        secrets: Vec<String>,
    },
    Switch,
    Fork,
    Join,
    Wait {
        duration_ms: Option<u64>,
        until: Option<Program>,
    },
    WaitForEvent {
        event: String,
        correlation: Option<Program>,
    },
    SubWorkflow {
        workflow: String,
        version: Option<u32>,
    },
    Map {
        items: Program,
        concurrency: u32,
        element: MapElement,
    },
}

/// A TASK node's compiled `concurrency`: at most `max` of its tasks hold a
/// slot per value of `key`.
#[derive(Debug, Clone)]
pub struct TaskSlot {
    /// A CEL string expression over what the node's input may read.
    pub key: Program,
    pub max: u32,
}

/// A compiled node.
#[derive(Debug, Clone)]
pub struct CNode {
    pub id: String,
    pub node_type: NodeType,
    pub kind: Kind,
    pub retry: RetryPolicy,
    pub timeout_ms: Option<u64>,
    pub heartbeat_timeout_ms: u64,
    pub compensate: Option<usize>,
    pub input: Option<Template>,
    /// Outgoing edges, in file order (SWITCH takes the first that holds).
    pub out_edges: Vec<usize>,
    /// Incoming edges, in file order.
    pub in_edges: Vec<usize>,
    /// Named by some `compensate`: no edges, runs only when compensating.
    pub is_compensation: bool,
    /// Nodes that this node's templates and expressions read (for prefetch).
    pub refs: Vec<usize>,
}

/// A compiled edge.
#[derive(Debug, Clone)]
pub struct CEdge {
    pub from: usize,
    pub to: usize,
    pub when: Option<Program>,
    pub on_error: bool,
    /// Nodes `when` reads.
    pub refs: Vec<usize>,
}

/// The most bytes a run's evaluated concurrency key may have.
pub const MAX_CONCURRENCY_KEY_BYTES: usize = 256;

/// A workflow's compiled `concurrency`.
#[derive(Debug, Clone)]
pub struct RunConcurrency {
    /// Reads only `input`; types as a string.
    pub key: Program,
    pub max: u32,
    pub on_limit: OnLimit,
}

/// Why a run's concurrency key could not be computed from its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConcurrencyKeyError {
    #[error("the concurrency key `{source_text}` failed: {message}")]
    Failed {
        source_text: String,
        message: String,
    },
    #[error("the concurrency key `{source_text}` is a {found}, not a string")]
    NotAString { source_text: String, found: String },
    #[error("the concurrency key is longer than {MAX_CONCURRENCY_KEY_BYTES} bytes")]
    TooLong,
}

/// An environment with nothing but the run's input in it.
struct InputOnly<'a>(&'a Json);

impl Env for InputOnly<'_> {
    fn input(&self) -> Val {
        Val::from_json(self.0)
    }
    fn input_json(&self) -> Option<&Json> {
        Some(self.0)
    }
    fn run(&self) -> Val {
        Val::Null
    }
    fn item(&self) -> Val {
        Val::Null
    }
    fn index(&self) -> Val {
        Val::Null
    }
    fn node(&self, _: &str, _: NodeField) -> Val {
        Val::Null
    }
}

impl RunConcurrency {
    /// The key of a run with `input`.
    pub fn key_of(&self, input: &Json) -> Result<String, ConcurrencyKeyError> {
        let source_text = self.key.source().to_owned();
        let value = self
            .key
            .eval(&InputOnly(input))
            .map_err(|e| ConcurrencyKeyError::Failed {
                source_text: source_text.clone(),
                message: e.to_string(),
            })?;
        let Val::Str(key) = value else {
            return Err(ConcurrencyKeyError::NotAString {
                source_text,
                found: value.ty().to_string(),
            });
        };
        if key.len() > MAX_CONCURRENCY_KEY_BYTES {
            return Err(ConcurrencyKeyError::TooLong);
        }
        Ok(key)
    }
}

/// Compiles a workflow's `concurrency`: a string expression over `input`
/// only (it is computed before the run exists), `max` in 1..=10,000.
fn compile_concurrency(def: &Definition, errors: &mut ValidationErrors) -> Option<RunConcurrency> {
    let spec = def.concurrency.as_ref()?;
    if !(1..=MAX_CONCURRENCY).contains(&spec.max) {
        errors.push(
            "concurrency.max",
            format!("must be between 1 and {MAX_CONCURRENCY}"),
        );
    }
    let no_nodes = |_: &str| false;
    let scope = Scope {
        node_ids: &no_nodes,
        map_element: false,
        input_schema: def.input_schema.as_ref(),
    };
    let key = match template::compile_expression(&spec.key, &scope) {
        Ok(key) => key,
        Err(e) => {
            errors.push("concurrency.key", e);
            return None;
        }
    };
    if !key.reads_only_input() {
        errors.push(
            "concurrency.key",
            "may read only `input`: the key is computed before the run starts",
        );
    }
    if !matches!(key.ty(), Ty::String | Ty::Dyn) {
        errors.push(
            "concurrency.key",
            format!("must be a string expression, not {}", key.ty()),
        );
    }
    Some(RunConcurrency {
        key,
        max: spec.max.clamp(1, MAX_CONCURRENCY),
        on_limit: spec.on_limit.unwrap_or_default(),
    })
}

/// A validated definition with its DAG index and compiled expressions.
/// Immutable and `Send + Sync`: cache one per (workflow, version) in an `Arc`.
#[derive(Debug, Clone)]
pub struct CompiledWorkflow {
    definition: Definition,
    pub(crate) nodes: Vec<CNode>,
    pub(crate) edges: Vec<CEdge>,
    index: HashMap<String, usize>,
    topo: Vec<usize>,
    pub(crate) start: usize,
    pub(crate) output: Option<Template>,
    pub(crate) output_refs: Vec<usize>,
    pub(crate) run_timeout_ms: Option<u64>,
    pub(crate) concurrency: Option<RunConcurrency>,
    /// The largest value a template may render (a task's input, the run's
    /// output), as JSON bytes; larger fails the node or the run.
    pub(crate) max_rendered_bytes: usize,
}

/// The default of [`CompiledWorkflow::with_max_rendered_bytes`]: the
/// server's default payload limit.
pub const DEFAULT_MAX_RENDERED_BYTES: usize = 2 * 1024 * 1024;

impl CompiledWorkflow {
    /// The same workflow with another limit on what a template renders
    /// (the server passes its `--max-payload-bytes`).
    pub fn with_max_rendered_bytes(mut self, bytes: usize) -> CompiledWorkflow {
        self.max_rendered_bytes = bytes;
        self
    }

    /// Validates `definition` and builds the index; every problem is reported.
    pub fn compile(definition: Definition) -> Result<CompiledWorkflow, ValidationErrors> {
        build(&definition, &Broken::default()).map(|parts| CompiledWorkflow {
            definition,
            ..parts
        })
    }

    /// Parses and compiles text (YAML or JSON).
    pub fn from_text(text: &str) -> Result<CompiledWorkflow, ValidationErrors> {
        let definition = parse_definition(text)?;
        CompiledWorkflow::compile(definition)
    }

    pub fn definition(&self) -> &Definition {
        &self.definition
    }

    pub fn name(&self) -> &str {
        &self.definition.name
    }

    /// The workflow's `concurrency`, if it declares one.
    pub fn concurrency(&self) -> Option<&RunConcurrency> {
        self.concurrency.as_ref()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn node_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The compiled node `id`.
    pub fn node(&self, id: &str) -> Option<&CNode> {
        self.node_index(id).map(|i| &self.nodes[i])
    }

    pub fn contains(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    /// Where a run starts: the first node of the file.
    pub fn start_node(&self) -> &str {
        &self.nodes[self.start].id
    }

    /// Successor ids in edge (file) order.
    pub fn successors(&self, id: &str) -> Vec<&str> {
        self.node(id).map_or_else(Vec::new, |n| {
            n.out_edges
                .iter()
                .map(|e| self.nodes[self.edges[*e].to].id.as_str())
                .collect()
        })
    }

    /// Predecessor ids in edge (file) order.
    pub fn predecessors(&self, id: &str) -> Vec<&str> {
        self.node(id).map_or_else(Vec::new, |n| {
            n.in_edges
                .iter()
                .map(|e| self.nodes[self.edges[*e].from].id.as_str())
                .collect()
        })
    }

    /// Node ids in a topological order (compensation nodes excluded).
    pub fn topological_order(&self) -> Vec<&str> {
        self.topo
            .iter()
            .map(|i| self.nodes[*i].id.as_str())
            .collect()
    }
}

// Cached in an `Arc` and shared across the coordinator's tasks.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<CompiledWorkflow>();
};

/// Why a node id is refused, if it is: the name rule for identifiers, and
/// `nodes`, which expressions use for the map of all nodes.
fn id_problem(id: &str) -> Option<String> {
    if id == "nodes" {
        return Some("'nodes' is reserved in expressions".to_owned());
    }
    names::check_identifier(id).err().map(|e| e.to_string())
}

/// A name as an error message may quote it: never more than a few dozen
/// characters of what the caller sent.
fn quoted(name: &str) -> String {
    const MAX: usize = 40;
    match name.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}...", &name[..end]),
        None => format!("{name:?}"),
    }
}

/// Checks the names a node refers to (queue, task, event, workflow).
fn check_node_names(node: &Node, path: &str, errors: &mut ValidationErrors) {
    let named = [
        ("queue", &node.queue),
        ("task", &node.task),
        ("event", &node.event),
        ("workflow", &node.workflow),
        ("language", &node.language),
    ];
    for (field, value) in named {
        if let Some(value) = value
            && let Err(problem) = names::check_name(value)
        {
            errors.push(
                format!("{path}.{field}"),
                format!("{} {problem}", quoted(value)),
            );
        }
    }
}

fn duration_field(
    value: &Option<String>,
    path: String,
    errors: &mut ValidationErrors,
) -> Option<u64> {
    let text = value.as_ref()?;
    match parse_duration(text) {
        Ok(ms) => Some(ms),
        Err(e) => {
            errors.push(path, e);
            None
        }
    }
}

fn refs_of(template: &Template, index: &HashMap<String, usize>, out: &mut Vec<usize>) {
    let mut r = Vec::new();
    template.node_refs(&mut r);
    add_refs(r, index, out);
}

fn add_refs(r: Vec<(String, NodeField)>, index: &HashMap<String, usize>, out: &mut Vec<usize>) {
    for (id, _) in r {
        if let Some(i) = index.get(&id)
            && !out.contains(i)
        {
            out.push(*i);
        }
    }
}

/// Which type-specific fields each node type takes.
fn check_fields(node: &Node, path: &str, errors: &mut ValidationErrors) {
    use NodeType::*;
    let t = node.node_type;
    let fields: [(&str, bool, &[NodeType]); 13] = [
        ("queue", node.queue.is_some(), &[Task, Map]),
        ("secrets", node.secrets.is_some(), &[Code]),
        ("task", node.task.is_some(), &[Task, Map]),
        ("http", node.http.is_some(), &[Http]),
        ("language", node.language.is_some(), &[Code]),
        ("code", node.code.is_some(), &[Code]),
        ("duration", node.duration.is_some(), &[Wait]),
        ("until", node.until.is_some(), &[Wait]),
        ("event", node.event.is_some(), &[WaitForEvent]),
        ("correlation", node.correlation.is_some(), &[WaitForEvent]),
        ("workflow", node.workflow.is_some(), &[SubWorkflow, Map]),
        ("version", node.version.is_some(), &[SubWorkflow, Map]),
        ("items", node.items.is_some(), &[Map]),
    ];
    for (name, present, allowed) in fields {
        if present && !allowed.contains(&t) {
            errors.push(
                format!("{path}.{name}"),
                format!("not allowed on a {t} node"),
            );
        }
    }
    match (&node.concurrency, t) {
        (None, _) | (Some(NodeConcurrency::Elements(_)), Map) => {}
        (Some(NodeConcurrency::Keyed(_)), Task) => {}
        (Some(NodeConcurrency::Elements(_)), Task) => errors.push(
            format!("{path}.concurrency"),
            "on a TASK node, concurrency is {key, max}",
        ),
        (Some(NodeConcurrency::Keyed(_)), Map) => errors.push(
            format!("{path}.concurrency"),
            "on a MAP node, concurrency is a number (elements in flight); \
             {key, max} is for TASK nodes",
        ),
        (Some(_), _) => errors.push(
            format!("{path}.concurrency"),
            format!("not allowed on a {t} node"),
        ),
    }
}

/// Parses YAML or JSON text into a [`Definition`], reporting every problem at
/// once. On success the definition is also known to compile.
pub fn parse_definition(text: &str) -> Result<Definition, ValidationErrors> {
    let (definition, mut errors, broken) = parse_structure(text);
    if let Some(def) = &definition
        && let Err(semantic) = build(def, &broken)
    {
        errors.0.extend(semantic.0);
    }
    match definition {
        Some(def) if errors.is_empty() => Ok(def),
        _ => Err(errors),
    }
}

/// Validates `def` (skipping what `broken` says did not parse) and builds
/// the compiled parts. The returned workflow's `definition` is empty: the
/// caller moves the definition in.
pub(crate) fn build(
    def: &Definition,
    broken: &Broken,
) -> Result<CompiledWorkflow, ValidationErrors> {
    let mut errors = ValidationErrors::default();
    if def.name.is_empty() {
        errors.push("name", "is required");
    } else if let Err(problem) = names::check_name(&def.name) {
        errors.push("name", format!("{} {problem}", quoted(&def.name)));
    }
    if def.nodes.len() > MAX_NODES {
        errors.push(
            "nodes",
            format!("too many nodes: {} (at most {MAX_NODES})", def.nodes.len()),
        );
        return Err(errors);
    }
    if def.edges.len() > MAX_EDGES {
        errors.push(
            "edges",
            format!("too many edges: {} (at most {MAX_EDGES})", def.edges.len()),
        );
        return Err(errors);
    }
    if def.nodes.is_empty() && broken.nodes.is_empty() {
        errors.push("nodes", "a workflow needs at least one node");
    }
    if let Some(schema) = &def.input_schema
        && !schema.is_object()
        && !schema.is_boolean()
    {
        errors.push("input_schema", "must be a JSON Schema object");
    }
    let run_timeout_ms = duration_field(&def.timeout, "timeout".into(), &mut errors);
    let concurrency = compile_concurrency(def, &mut errors);

    // Ids first: everything else refers to them.
    let mut index: HashMap<String, usize> = HashMap::with_capacity(def.nodes.len());
    let mut invalid_ids: Vec<&str> = Vec::new();
    for (i, node) in def.nodes.iter().enumerate() {
        if broken.nodes.contains(&i) {
            continue;
        }
        if let Some(problem) = id_problem(&node.id) {
            errors.push(
                format!("nodes[{i}].id"),
                format!("{} {problem}", quoted(&node.id)),
            );
            invalid_ids.push(&node.id);
            continue;
        }
        if let Some(first) = index.get(&node.id) {
            errors.push(
                format!("nodes[{i}].id"),
                format!("duplicate id '{}' (first at nodes[{first}])", node.id),
            );
            continue;
        }
        index.insert(node.id.clone(), i);
    }
    // Nodes that did not parse or have a bad id are still "known": an edge to
    // them is not a second problem.
    let known = |id: &str| {
        index.contains_key(id) || broken.ids.iter().any(|b| b == id) || invalid_ids.contains(&id)
    };

    // Compensation nodes.
    let mut is_compensation = vec![false; def.nodes.len()];
    for (i, node) in def.nodes.iter().enumerate() {
        let Some(target) = &node.compensate else {
            continue;
        };
        match index.get(target) {
            None if !known(target) => errors.push(
                format!("nodes[{i}].compensate"),
                format!("unknown node '{target}'"),
            ),
            None => {}
            Some(&t) if t == i => errors.push(
                format!("nodes[{i}].compensate"),
                "a node cannot compensate itself",
            ),
            Some(&t) => {
                is_compensation[t] = true;
                let tt = def.nodes[t].node_type;
                if !matches!(
                    tt,
                    NodeType::Task | NodeType::Http | NodeType::Code | NodeType::SubWorkflow
                ) {
                    errors.push(
                        format!("nodes[{i}].compensate"),
                        format!("'{target}' is a {tt} node; a compensation must be a TASK, HTTP, CODE or SUB_WORKFLOW node"),
                    );
                }
                if def.nodes[t].compensate.is_some() {
                    errors.push(
                        format!("nodes[{t}].compensate"),
                        "a compensation node cannot have a compensation of its own",
                    );
                }
            }
        }
    }

    // Per-node fields and expressions.
    let all_nodes = |id: &str| known(id);
    let plain = Scope {
        node_ids: &all_nodes,
        map_element: false,
        input_schema: def.input_schema.as_ref(),
    };
    let element = Scope {
        node_ids: &all_nodes,
        map_element: true,
        input_schema: def.input_schema.as_ref(),
    };
    let mut nodes: Vec<CNode> = Vec::with_capacity(def.nodes.len());
    let mut expr_errors = Vec::new();
    for (i, node) in def.nodes.iter().enumerate() {
        let path = format!("nodes[{i}]");
        let skip = broken.nodes.contains(&i);
        if !skip {
            check_fields(node, &path, &mut errors);
            check_node_names(node, &path, &mut errors);
            if node.workflow.as_deref() == Some(def.name.as_str()) {
                errors.push(
                    format!("{path}.workflow"),
                    "a workflow may not start itself (recursion without a bound)",
                );
            }
        }
        let retry = match &node.retry {
            None => RetryPolicy::default(),
            Some(spec) => {
                let mut policy = RetryPolicy::default();
                if let Some(n) = spec.max_attempts {
                    if n == 0 {
                        errors.push(format!("{path}.retry.max_attempts"), "must be at least 1");
                    }
                    policy.max_attempts = n.max(1);
                }
                if let Some(ms) = duration_field(
                    &spec.initial_interval,
                    format!("{path}.retry.initial_interval"),
                    &mut errors,
                ) {
                    policy.initial_interval_ms = ms;
                }
                if let Some(ms) = duration_field(
                    &spec.max_interval,
                    format!("{path}.retry.max_interval"),
                    &mut errors,
                ) {
                    policy.max_interval_ms = ms;
                }
                if let Some(b) = spec.backoff {
                    if !(b.is_finite() && (1.0..=100.0).contains(&b)) {
                        errors.push(
                            format!("{path}.retry.backoff"),
                            "must be between 1.0 and 100.0",
                        );
                    } else {
                        policy.backoff = b;
                    }
                }
                policy.jitter = spec.jitter.unwrap_or(false);
                policy.non_retryable = spec.non_retryable.clone().unwrap_or_default();
                policy
            }
        };
        let timeout_ms = duration_field(&node.timeout, format!("{path}.timeout"), &mut errors);
        let heartbeat_timeout_ms = duration_field(
            &node.heartbeat_timeout,
            format!("{path}.heartbeat_timeout"),
            &mut errors,
        )
        .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT_MS);
        if heartbeat_timeout_ms == 0 {
            errors.push(format!("{path}.heartbeat_timeout"), "must be longer than 0");
        }
        let is_map = node.node_type == NodeType::Map;
        let input = node.input.as_ref().map(|v| {
            template::compile(
                v,
                &format!("{path}.input"),
                if is_map { &element } else { &plain },
                &mut expr_errors,
            )
        });
        let mut expression = |src: &Option<String>, field: &str, want: &[Ty]| -> Option<Program> {
            let src = src.as_ref()?;
            match template::compile_expression(src, &plain) {
                Ok(p) => {
                    if !want.is_empty() && p.ty() != Ty::Dyn && !want.contains(&p.ty()) {
                        let names: Vec<String> = want.iter().map(|t| t.to_string()).collect();
                        expr_errors.push((
                            format!("{path}.{field}"),
                            format!(
                                "must be a {} expression, not {}",
                                names.join(" or "),
                                p.ty()
                            ),
                        ));
                    }
                    Some(p)
                }
                Err(e) => {
                    expr_errors.push((format!("{path}.{field}"), e));
                    None
                }
            }
        };
        let required = |present: bool, field: &str, errors: &mut ValidationErrors| {
            if !present && !skip {
                errors.push(
                    format!("{path}.{field}"),
                    format!("is required on a {} node", node.node_type),
                );
            }
        };
        if node.rate_limit_key.is_some() && node.node_type != NodeType::Task {
            errors.push(
                format!("{path}.rate_limit_key"),
                "only a TASK node may have a rate_limit_key",
            );
        }
        let kind = match node.node_type {
            NodeType::Task => {
                required(node.queue.is_some(), "queue", &mut errors);
                required(node.task.is_some(), "task", &mut errors);
                let concurrency = match &node.concurrency {
                    Some(NodeConcurrency::Keyed(spec)) => {
                        if !(1..=MAX_CONCURRENCY).contains(&spec.max) {
                            errors.push(
                                format!("{path}.concurrency.max"),
                                format!("must be between 1 and {MAX_CONCURRENCY}"),
                            );
                        }
                        expression(&Some(spec.key.clone()), "concurrency.key", &[Ty::String]).map(
                            |key| TaskSlot {
                                key,
                                max: spec.max.clamp(1, MAX_CONCURRENCY),
                            },
                        )
                    }
                    _ => None,
                };
                Kind::Task {
                    queue: node.queue.clone().unwrap_or_default(),
                    task: node.task.clone().unwrap_or_default(),
                    rate_limit_key: expression(
                        &node.rate_limit_key,
                        "rate_limit_key",
                        &[Ty::String],
                    ),
                    concurrency,
                }
            }
            NodeType::Http => {
                required(node.http.is_some(), "http", &mut errors);
                let mut request = Vec::new();
                if let Some(http) = &node.http {
                    const METHODS: [&str; 7] =
                        ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
                    if !METHODS.contains(&http.method.to_ascii_uppercase().as_str()) {
                        errors.push(
                            format!("{path}.http.method"),
                            format!(
                                "unknown method '{}' (one of {})",
                                http.method,
                                METHODS.join(", ")
                            ),
                        );
                    }
                    if http.url.trim().is_empty() {
                        errors.push(format!("{path}.http.url"), "must not be empty");
                    }
                    let timeout =
                        duration_field(&http.timeout, format!("{path}.http.timeout"), &mut errors);
                    // url, header values and body may hold `${secrets.NAME}`;
                    // the names go beside them for the executor
                    let mut secrets = Vec::new();
                    let mut bearing = |field: &str, value: serde_json::Value| {
                        let template = template::compile_secret_bearing(
                            &value,
                            &format!("{path}.http.{field}"),
                            &plain,
                            &mut expr_errors,
                            &mut secrets,
                        );
                        (field.to_owned(), template)
                    };
                    request.push(bearing("url", http.url.clone().into()));
                    request.push(bearing(
                        "headers",
                        http.headers
                            .clone()
                            .unwrap_or_else(|| serde_json::json!({})),
                    ));
                    request.push(bearing(
                        "body",
                        http.body.clone().unwrap_or(serde_json::Value::Null),
                    ));
                    request.push((
                        "method".to_owned(),
                        Template::Literal(http.method.to_ascii_uppercase().into()),
                    ));
                    request.push((
                        "timeout_ms".to_owned(),
                        Template::Literal(timeout.map_or(serde_json::Value::Null, Into::into)),
                    ));
                    if !secrets.is_empty() {
                        secrets.sort();
                        request.push(("secrets".to_owned(), Template::Literal(secrets.into())));
                    }
                }
                Kind::Http {
                    request: Template::Object(request),
                }
            }
            NodeType::Code => {
                required(node.code.is_some(), "code", &mut errors);
                required(node.language.is_some(), "language", &mut errors);
                if let Some(lang) = &node.language
                    && lang != "python"
                    && lang != "javascript"
                {
                    errors.push(
                        format!("{path}.language"),
                        format!("must be python or javascript, not '{lang}'"),
                    );
                }
                let mut secrets = node.secrets.clone().unwrap_or_default();
                for (i, name) in secrets.iter().enumerate() {
                    if let Err(problem) = crate::names::check_name(name) {
                        errors.push(format!("{path}.secrets[{i}]"), problem.to_string());
                    }
                }
                secrets.sort();
                secrets.dedup();
                Kind::Code {
                    language: node.language.clone().unwrap_or_default(),
                    code: node.code.clone().unwrap_or_default(),
                    secrets,
                }
            }
            NodeType::Switch => Kind::Switch,
            NodeType::Fork => Kind::Fork,
            NodeType::Join => Kind::Join,
            NodeType::Wait => {
                if node.duration.is_some() == node.until.is_some() && !skip {
                    errors.push(
                        path.clone(),
                        "a WAIT node needs exactly one of duration or until",
                    );
                }
                let duration_ms =
                    duration_field(&node.duration, format!("{path}.duration"), &mut errors);
                let until = expression(&node.until, "until", &[Ty::Timestamp, Ty::String, Ty::Int]);
                Kind::Wait { duration_ms, until }
            }
            NodeType::WaitForEvent => {
                required(node.event.is_some(), "event", &mut errors);
                let correlation = expression(&node.correlation, "correlation", &[]);
                Kind::WaitForEvent {
                    event: node.event.clone().unwrap_or_default(),
                    correlation,
                }
            }
            NodeType::SubWorkflow => {
                required(node.workflow.is_some(), "workflow", &mut errors);
                Kind::SubWorkflow {
                    workflow: node.workflow.clone().unwrap_or_default(),
                    version: node.version,
                }
            }
            NodeType::Map => {
                required(node.items.is_some(), "items", &mut errors);
                let items = expression(&node.items, "items", &[Ty::List]);
                let by_task = node.queue.is_some() || node.task.is_some();
                if by_task == node.workflow.is_some() && !skip {
                    errors.push(
                        path.clone(),
                        "a MAP node needs either queue and task, or workflow",
                    );
                } else if by_task {
                    required(node.queue.is_some(), "queue", &mut errors);
                    required(node.task.is_some(), "task", &mut errors);
                }
                let elements = node
                    .concurrency
                    .as_ref()
                    .and_then(NodeConcurrency::elements);
                if elements == Some(0) {
                    errors.push(format!("{path}.concurrency"), "must be at least 1");
                }
                let element = match &node.workflow {
                    Some(w) => MapElement::Workflow {
                        workflow: w.clone(),
                        version: node.version,
                    },
                    None => MapElement::Task {
                        queue: node.queue.clone().unwrap_or_default(),
                        task: node.task.clone().unwrap_or_default(),
                    },
                };
                let concurrency = elements.unwrap_or(DEFAULT_MAP_CONCURRENCY).max(1);
                match items {
                    Some(items) => Kind::Map {
                        items,
                        concurrency,
                        element,
                    },
                    None => Kind::Fork,
                }
            }
        };
        let mut refs = Vec::new();
        if let Some(t) = &input {
            refs_of(t, &index, &mut refs);
        }
        match &kind {
            Kind::Http { request } => refs_of(request, &index, &mut refs),
            Kind::Wait { until: Some(p), .. }
            | Kind::WaitForEvent {
                correlation: Some(p),
                ..
            }
            | Kind::Map { items: p, .. }
            | Kind::Task {
                rate_limit_key: Some(p),
                concurrency: None,
                ..
            } => add_refs(p.node_refs(), &index, &mut refs),
            Kind::Task {
                rate_limit_key,
                concurrency: Some(slot),
                ..
            } => {
                add_refs(slot.key.node_refs(), &index, &mut refs);
                if let Some(p) = rate_limit_key {
                    add_refs(p.node_refs(), &index, &mut refs);
                }
            }
            _ => {}
        }
        nodes.push(CNode {
            id: node.id.clone(),
            node_type: node.node_type,
            kind,
            retry,
            timeout_ms,
            heartbeat_timeout_ms,
            compensate: node.compensate.as_ref().and_then(|c| index.get(c).copied()),
            input,
            out_edges: Vec::new(),
            in_edges: Vec::new(),
            is_compensation: is_compensation[i],
            refs,
        });
    }

    // Edges.
    let mut edges = Vec::with_capacity(def.edges.len());
    let mut unresolved_edges = !broken.edges.is_empty();
    let mut seen_pairs: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, edge) in def.edges.iter().enumerate() {
        if broken.edges.contains(&i) {
            continue;
        }
        let path = format!("edges[{i}]");
        let mut end = |field: &str, id: &str| match index.get(id) {
            Some(&n) => Some(n),
            None => {
                if !known(id) {
                    errors.push(format!("{path}.{field}"), format!("unknown node '{id}'"));
                }
                None
            }
        };
        let from = end("from", &edge.from);
        let to = end("to", &edge.to);
        let when =
            edge.when
                .as_ref()
                .and_then(|src| match template::compile_expression(src, &plain) {
                    Ok(p) => {
                        if !matches!(p.ty(), Ty::Bool | Ty::Dyn) {
                            expr_errors.push((
                                format!("{path}.when"),
                                format!("must be a bool expression, not {}", p.ty()),
                            ));
                        }
                        Some(p)
                    }
                    Err(e) => {
                        expr_errors.push((format!("{path}.when"), e));
                        None
                    }
                });
        let (Some(from), Some(to)) = (from, to) else {
            unresolved_edges = true;
            continue;
        };
        for n in [from, to] {
            if is_compensation[n] {
                errors.push(
                    path.clone(),
                    format!("compensation node '{}' cannot have edges", def.nodes[n].id),
                );
            }
        }
        if let Some(first) = seen_pairs.insert((from, to), i) {
            errors.push(
                path.clone(),
                format!(
                    "duplicate edge {} -> {} (first at edges[{first}])",
                    edge.from, edge.to
                ),
            );
            continue;
        }
        let mut refs = Vec::new();
        if let Some(p) = &when {
            add_refs(p.node_refs(), &index, &mut refs);
        }
        if edge.on == Some(EdgeOn::Error)
            && matches!(
                def.nodes[from].node_type,
                NodeType::Switch | NodeType::Fork | NodeType::Join
            )
        {
            errors.push(
                format!("{path}.on"),
                format!(
                    "a {} node never fails, so it has no error edges",
                    def.nodes[from].node_type
                ),
            );
        }
        let e = edges.len();
        edges.push(CEdge {
            from,
            to,
            when,
            on_error: edge.on == Some(EdgeOn::Error),
            refs,
        });
        nodes[from].out_edges.push(e);
        nodes[to].in_edges.push(e);
    }
    for (path, message) in expr_errors {
        errors.push(path, message);
    }

    // Shape rules.
    for (i, node) in nodes.iter().enumerate() {
        if broken.nodes.contains(&i) || node.is_compensation {
            continue;
        }
        match node.node_type {
            NodeType::Join if node.in_edges.len() < 2 => errors.push(
                format!("nodes[{i}]"),
                format!(
                    "a JOIN needs at least two incoming edges (has {})",
                    node.in_edges.len()
                ),
            ),
            NodeType::Switch if node.out_edges.is_empty() => errors.push(
                format!("nodes[{i}]"),
                "a SWITCH needs at least one outgoing edge",
            ),
            _ => {}
        }
    }

    // Cycles (Kahn), then reachability from the start node.
    let n = nodes.len();
    let mut indegree: Vec<usize> = nodes.iter().map(|x| x.in_edges.len()).collect();
    let mut queue: VecDeque<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut topo = Vec::with_capacity(n);
    while let Some(v) = queue.pop_front() {
        topo.push(v);
        for &e in &nodes[v].out_edges {
            let t = edges[e].to;
            indegree[t] -= 1;
            if indegree[t] == 0 {
                queue.push_back(t);
            }
        }
    }
    let mut in_cycle = vec![false; n];
    if topo.len() < n {
        // Walk backwards from a node left over until a node repeats: that is a cycle.
        let mut reported = vec![false; n];
        // Nodes walked by an earlier search: walking into one finds nothing new,
        // which keeps the whole search linear.
        let mut walked = vec![false; n];
        for first in (0..n).filter(|&i| indegree[i] > 0) {
            if reported[first] || walked[first] {
                continue;
            }
            walked[first] = true;
            let mut path_nodes = vec![first];
            let mut pos: HashMap<usize, usize> = HashMap::from([(first, 0)]);
            let mut v = first;
            let cycle_start = loop {
                let Some(&e) = nodes[v]
                    .in_edges
                    .iter()
                    .find(|&&e| indegree[edges[e].from] > 0)
                else {
                    break None;
                };
                v = edges[e].from;
                if let Some(&p) = pos.get(&v) {
                    break Some(p);
                }
                if walked[v] {
                    break None;
                }
                walked[v] = true;
                pos.insert(v, path_nodes.len());
                path_nodes.push(v);
            };
            let Some(p) = cycle_start else { continue };
            let mut cycle: Vec<usize> = path_nodes[p..].to_vec();
            cycle.reverse();
            if cycle.iter().any(|&c| reported[c]) {
                continue;
            }
            for &c in &cycle {
                reported[c] = true;
                in_cycle[c] = true;
            }
            let min_pos = (0..cycle.len()).min_by_key(|&k| cycle[k]).unwrap_or(0);
            cycle.rotate_left(min_pos);
            let mut names: Vec<&str> = cycle.iter().map(|&c| nodes[c].id.as_str()).collect();
            names.push(names[0]);
            errors.push(
                format!("nodes[{}]", cycle[0]),
                format!("cycle: {}", names.join(" -> ")),
            );
        }
    }
    let start = 0usize;
    // With edges that did not resolve, reachability would only repeat them.
    if n > 0 && !broken.nodes.contains(&0) && !unresolved_edges {
        if nodes[0].is_compensation {
            errors.push(
                "nodes[0]",
                "the first node starts the run and cannot be a compensation node",
            );
        }
        let mut reachable = vec![false; n];
        let mut stack = vec![start];
        reachable[start] = true;
        while let Some(v) = stack.pop() {
            for &e in &nodes[v].out_edges {
                let t = edges[e].to;
                if !reachable[t] {
                    reachable[t] = true;
                    stack.push(t);
                }
            }
        }
        for (i, node) in nodes.iter().enumerate() {
            if !reachable[i]
                && !node.is_compensation
                && !in_cycle[i]
                && !broken.nodes.contains(&i)
                && index.get(&node.id) == Some(&i)
            {
                errors.push(
                    format!("nodes[{i}]"),
                    format!(
                        "unreachable: no path from the start node '{}'",
                        nodes[start].id
                    ),
                );
            }
        }
    }

    let mut output_refs = Vec::new();
    let output = def.output.as_ref().map(|v| {
        let mut out_errors = Vec::new();
        let t = template::compile(v, "output", &plain, &mut out_errors);
        for (p, m) in out_errors {
            errors.push(p, m);
        }
        refs_of(&t, &index, &mut output_refs);
        t
    });

    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(CompiledWorkflow {
        definition: Definition::default(),
        nodes,
        edges,
        index,
        topo,
        start,
        output,
        output_refs,
        run_timeout_ms,
        concurrency,
        max_rendered_bytes: DEFAULT_MAX_RENDERED_BYTES,
    })
}

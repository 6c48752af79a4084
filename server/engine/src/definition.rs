//! The typed model of a workflow definition and its parser.
//!
//! YAML and JSON are the same document. Parsing reports every structural
//! problem at once, each with its path (`nodes[3].retry.max_attempts`);
//! semantic checks (ids, edges, cycles, CEL) happen in
//! [`crate::CompiledWorkflow::compile`], which [`crate::parse_definition`] also runs
//! on whatever parsed, so one call reports every problem it can see.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// Largest definition text accepted, in bytes.
pub const MAX_DEFINITION_BYTES: usize = 4 * 1024 * 1024;
/// Most nodes one definition may have.
pub const MAX_NODES: usize = 10_000;

/// One problem in a definition: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationError {
    /// `nodes[3].retry.max_attempts`, `edges[2].when`, or empty for the whole document.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a definition.
#[derive(Debug, Clone, PartialEq, Eq, Default, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ValidationError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ValidationError> {
        self.0.iter()
    }
}

/// A workflow definition as written.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema for the run input; checked by StartRun, not here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Json>,
    /// Whole-run deadline, e.g. `72h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default)]
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub edges: Vec<Edge>,
    /// Template for the run output; default: `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Json>,
    /// At most `max` runs per value of a key computed from the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
}

/// The most runs of one key a workflow may allow at once.
pub const MAX_CONCURRENCY: u32 = 10_000;

/// A workflow's `concurrency`: at most `max` runs per value of `key` at a
/// time, in a namespace; `on_limit` says what a run beyond that does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// A CEL string expression over `input`.
    pub key: String,
    pub max: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_limit: Option<OnLimit>,
}

/// What a run that finds its key at `max` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    /// Waits (QUEUED) and starts when a run of its key ends, in arrival order.
    #[default]
    Queue,
    /// Is created CANCELLED at once.
    CancelNew,
    /// Cancels the oldest running run of its key and takes its place.
    CancelOldest,
}

impl OnLimit {
    pub fn as_str(self) -> &'static str {
        match self {
            OnLimit::Queue => "queue",
            OnLimit::CancelNew => "cancel_new",
            OnLimit::CancelOldest => "cancel_oldest",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeType {
    Task,
    Http,
    Code,
    Switch,
    Fork,
    Join,
    Wait,
    WaitForEvent,
    SubWorkflow,
    Map,
}

impl fmt::Display for NodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            NodeType::Task => "TASK",
            NodeType::Http => "HTTP",
            NodeType::Code => "CODE",
            NodeType::Switch => "SWITCH",
            NodeType::Fork => "FORK",
            NodeType::Join => "JOIN",
            NodeType::Wait => "WAIT",
            NodeType::WaitForEvent => "WAIT_FOR_EVENT",
            NodeType::SubWorkflow => "SUB_WORKFLOW",
            NodeType::Map => "MAP",
        };
        f.write_str(s)
    }
}

/// One node. Which fields apply depends on `type`; a field that does not
/// apply is a validation error, not silently ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub id: String,
    #[serde(rename = "type")]
    pub node_type: NodeType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// TASK, MAP: the worker queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// TASK, MAP: the task name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// HTTP: the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,
    /// CODE: `python` or `javascript`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// CODE: the snippet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// CODE: secrets the snippet receives in its input under `secrets`
    /// (docs/secrets.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<String>>,
    /// WAIT: how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// WAIT: a CEL timestamp to wait until.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// WAIT_FOR_EVENT: the event name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// WAIT_FOR_EVENT: a CEL correlation key, computed when the node starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation: Option<String>,
    /// SUB_WORKFLOW, MAP: the child workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// SUB_WORKFLOW, MAP: the child workflow version (default: latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// MAP: a CEL list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<String>,
    /// MAP: most elements in flight at once (default 100), a number.
    /// TASK: `{key, max}`, at most `max` tasks per key value at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<NodeConcurrency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Start to close of one attempt; for WAIT_FOR_EVENT, how long to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Lease length (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout: Option<String>,
    /// The node to run if the run fails or is cancelled after this one completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate: Option<String>,
    /// Template for the input (default: the run's input; for MAP, `item`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Json>,
    /// TASK: a CEL string naming the task's rate-limit key, computed when
    /// each attempt is armed; the queue's per-key limit applies per value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_key: Option<String>,
}

impl Node {
    /// A node of `node_type` with every optional field unset.
    pub fn new(id: impl Into<String>, node_type: NodeType) -> Node {
        Node {
            id: id.into(),
            node_type,
            description: None,
            queue: None,
            task: None,
            http: None,
            language: None,
            code: None,
            secrets: None,
            duration: None,
            until: None,
            event: None,
            correlation: None,
            workflow: None,
            version: None,
            items: None,
            concurrency: None,
            retry: None,
            timeout: None,
            heartbeat_timeout: None,
            compensate: None,
            input: None,
            rate_limit_key: None,
        }
    }
}

/// A node's `concurrency`: a number on a MAP node (elements in flight at
/// once), `{key, max}` on a TASK node (tasks per key value at once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum NodeConcurrency {
    /// MAP: most elements in flight at once.
    Elements(u32),
    /// TASK: at most `max` tasks per value of `key` at a time.
    Keyed(TaskConcurrency),
}

impl NodeConcurrency {
    /// The MAP element limit, if this is one.
    pub fn elements(&self) -> Option<u32> {
        match self {
            NodeConcurrency::Elements(n) => Some(*n),
            NodeConcurrency::Keyed(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for NodeConcurrency {
    // a mapping is the TASK form, anything else must be the MAP number; the
    // error is the one of the form the value looks like
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = Json::deserialize(d)?;
        if value.is_object() {
            return TaskConcurrency::deserialize(value)
                .map(NodeConcurrency::Keyed)
                .map_err(D::Error::custom);
        }
        u32::deserialize(value)
            .map(NodeConcurrency::Elements)
            .map_err(|e| D::Error::custom(format!("{e} (or {{key, max}} on a TASK node)")))
    }
}

/// A TASK node's `concurrency`: at most `max` of its tasks hold a slot per
/// value of `key` (a CEL string over what its `input` may read), per
/// namespace and workflow name, across all servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConcurrency {
    pub key: String,
    pub max: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    pub method: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Json>,
    /// The request timeout the HTTP worker applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_retryable: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeOn {
    /// Taken only when the source node failed after its last attempt.
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edge {
    pub from: String,
    pub to: String,
    /// A CEL condition; no `when` on a SWITCH edge makes it the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<EdgeOn>,
}

impl Definition {
    /// Stable bytes for hashing: JSON with object keys sorted at every level,
    /// no whitespace. Identical content gives identical bytes whatever the
    /// key order or format (YAML or JSON) it was written in.
    pub fn canonical_json(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).unwrap_or(Json::Null);
        serde_json::to_vec(&sorted(value)).unwrap_or_default()
    }
}

fn sorted(value: Json) -> Json {
    match value {
        Json::Object(map) => {
            let mut entries: Vec<(String, Json)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Json::Array(items) => Json::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn serde_message(e: &impl fmt::Display) -> String {
    let msg = e.to_string();
    // "unknown field `x`, expected one of ..." is long; the path says where.
    match msg.find(", expected one of") {
        Some(cut) if msg.starts_with("unknown field") => msg[..cut].to_owned(),
        _ => msg,
    }
}

fn join_path(prefix: &str, inner: &str) -> String {
    match (prefix.is_empty(), inner.is_empty() || inner == ".") {
        (_, true) => prefix.to_owned(),
        (true, false) => inner.to_owned(),
        (false, false) if inner.starts_with('[') => format!("{prefix}{inner}"),
        (false, false) => format!("{prefix}.{inner}"),
    }
}

fn typed<T: serde::de::DeserializeOwned>(
    value: &Json,
    path: &str,
    errors: &mut ValidationErrors,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let inner = e.path().to_string();
            errors.push(join_path(path, &inner), serde_message(e.inner()));
            None
        }
    }
}

/// The deepest nesting of `[` and `{` a definition may have.
pub const MAX_FLOW_NESTING: usize = 64;

/// Refuses deeply nested flow collections (`[[[[...`) in one linear pass,
/// before the YAML parser, which takes time quadratic in their depth
/// (60,000 levels: seconds of CPU from a 117 KiB request). It reads quotes
/// as YAML does (a quote opens a scalar only where a scalar starts; `''`
/// and `\"` escape), so brackets inside strings, which do not nest, neither
/// count nor cancel real ones; comments are skipped.
fn check_flow_nesting(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut chars = text.chars().peekable();
    // the last significant character (not blank, not in a comment), and
    // the character just before the current one
    let (mut last, mut before) = ('\n', '\n');
    while let Some(c) = chars.next() {
        let scalar_starts = (before.is_whitespace()
            && matches!(last, '\n' | ':' | '-' | '[' | '{' | ',' | '?'))
            || matches!(before, '[' | '{' | ',');
        match c {
            '\'' | '"' if scalar_starts => skip_quoted(c, &mut chars),
            '#' if before.is_whitespace() => {
                skip_comment(&mut chars);
                before = '\n';
                continue;
            }
            '[' | '{' => {
                depth += 1;
                if depth > MAX_FLOW_NESTING {
                    return Err(format!(
                        "not accepted: [ and {{ nest deeper than {MAX_FLOW_NESTING} levels"
                    ));
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if c == '\n' || !c.is_whitespace() {
            last = c;
        }
        before = c;
    }
    Ok(())
}

/// Skips a quoted scalar opened by `quote`, up to its closing quote.
fn skip_quoted(quote: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        if quote == '"' && c == '\\' {
            chars.next();
        } else if c == quote {
            if quote == '\'' && chars.peek() == Some(&'\'') {
                chars.next();
                continue;
            }
            return;
        }
    }
}

/// Skips to the end of the line (the newline is kept: it ends the line).
fn skip_comment(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.peek().is_some_and(|c| *c != '\n') {
        chars.next();
    }
}

/// What did not parse, so that semantic validation neither trips over the
/// placeholders left in its place nor reports edges to it as unknown.
#[derive(Debug, Default)]
pub(crate) struct Broken {
    pub nodes: Vec<usize>,
    pub edges: Vec<usize>,
    pub ids: Vec<String>,
}

/// Structure only: returns what parsed (nodes and edges that did not parse
/// are placeholders, listed in [`Broken`]) and the problems.
pub(crate) fn parse_structure(text: &str) -> (Option<Definition>, ValidationErrors, Broken) {
    let mut errors = ValidationErrors::default();
    if text.len() > MAX_DEFINITION_BYTES {
        errors.push(
            "",
            format!(
                "definition is larger than {MAX_DEFINITION_BYTES} bytes ({})",
                text.len()
            ),
        );
        return (None, errors, Broken::default());
    }
    if let Err(problem) = check_flow_nesting(text) {
        errors.push("", problem);
        return (None, errors, Broken::default());
    }
    let doc: Json = match serde_yaml_ng::from_str(text) {
        Ok(doc) => doc,
        Err(e) => {
            errors.push("", format!("not valid YAML or JSON: {e}"));
            return (None, errors, Broken::default());
        }
    };
    let Json::Object(top) = doc else {
        errors.push(
            "",
            "a definition must be a mapping with name, nodes and edges",
        );
        return (None, errors, Broken::default());
    };
    let mut def = Definition::default();
    let mut broken = Broken::default();
    for (key, value) in &top {
        match key.as_str() {
            "name" => {
                def.name = typed(value, "name", &mut errors).unwrap_or_default();
            }
            "description" => def.description = typed(value, "description", &mut errors),
            "input_schema" => def.input_schema = Some(value.clone()),
            "timeout" => def.timeout = typed(value, "timeout", &mut errors),
            "output" => def.output = Some(value.clone()),
            "concurrency" => def.concurrency = typed(value, "concurrency", &mut errors),
            "nodes" | "edges" => {
                let Json::Array(items) = value else {
                    if !value.is_null() {
                        errors.push(key.as_str(), "must be a list");
                    }
                    continue;
                };
                if key == "nodes" && items.len() > MAX_NODES {
                    errors.push(
                        "nodes",
                        format!("too many nodes: {} (at most {MAX_NODES})", items.len()),
                    );
                    return (None, errors, Broken::default());
                }
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{key}[{i}]");
                    if key == "nodes" {
                        match typed::<Node>(item, &path, &mut errors) {
                            Some(node) => def.nodes.push(node),
                            None => {
                                if let Some(id) = item.get("id").and_then(Json::as_str) {
                                    broken.ids.push(id.to_owned());
                                }
                                broken.nodes.push(i);
                                // Keep indexes aligned with the text: a placeholder
                                // that validation skips.
                                def.nodes.push(Node::new("", NodeType::Fork));
                            }
                        }
                    } else {
                        match typed::<Edge>(item, &path, &mut errors) {
                            Some(edge) => def.edges.push(edge),
                            None => {
                                broken.edges.push(i);
                                def.edges.push(Edge {
                                    from: String::new(),
                                    to: String::new(),
                                    when: None,
                                    on: None,
                                });
                            }
                        }
                    }
                }
            }
            other => errors.push(other, format!("unknown field `{other}`")),
        }
    }
    (Some(def), errors, broken)
}

#[cfg(test)]
mod nesting_tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_before_the_parser_sees_it() {
        let deep = format!(
            "name: d\ninput: {}{}",
            "[".repeat(60_000),
            "]".repeat(60_000)
        );
        assert!(check_flow_nesting(&deep).is_err());
        let fine = format!("name: d\ninput: {}{}", "[".repeat(64), "]".repeat(64));
        assert_eq!(check_flow_nesting(&fine), Ok(()));
    }

    #[test]
    fn brackets_in_strings_and_comments_neither_count_nor_cancel() {
        let quoted = format!(
            "a: '{}'\nb: \"{}\"\n# {}\n",
            "[".repeat(100),
            "{".repeat(100),
            "[".repeat(100)
        );
        assert_eq!(check_flow_nesting(&quoted), Ok(()));
        // closing brackets hidden in strings cannot cancel real nesting
        let level = "[ 'it''s ]]]]]]]]]]' , \"\\\" ]]]]]]]]]]\" ,";
        let evasive = format!("x: {}", level.repeat(100));
        assert!(check_flow_nesting(&evasive).is_err());
        // a quote inside a plain scalar opens nothing
        let plain = format!("x: [ a:'b {}", "[".repeat(100));
        assert!(check_flow_nesting(&plain).is_err());
        let apostrophe = format!("x: it's {}", "[".repeat(100));
        assert!(check_flow_nesting(&apostrophe).is_err());
    }
}

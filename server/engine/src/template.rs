//! `${...}` templating over JSON values.
//!
//! A string of the exact form `"${expr}"` becomes the value of `expr`, type
//! kept; a string with `${...}` pieces among other text is interpolation
//! (each piece rendered as text: strings as-is, other values as JSON);
//! everything else is literal.
//!
//! In an HTTP node's url, header values and body, a piece that is exactly
//! `${secrets.NAME}` is kept as that text for the executor to fill in at
//! execution time (the value is never rendered into a run); a string that
//! a rendered value brings there and that holds `${secrets.` is written
//! with `$${secrets.` instead, which the executor reads back as literal
//! text, so data never names a secret.

use serde_json::Value as Json;

use crate::cel::{self, Env, EvalError, NodeField, Program, Scope, Val};

/// A compiled template: the JSON shape with compiled expressions in it.
#[derive(Debug, Clone)]
pub enum Template {
    Literal(Json),
    /// `"${expr}"`: the value, type kept.
    Whole(Program),
    /// Text with `${...}` pieces.
    Interpolated(Vec<Piece>),
    List(Vec<Template>),
    Object(Vec<(String, Template)>),
    /// A part where `${secrets.NAME}` pieces may stand: rendered values
    /// in it are escaped (see the module's doc).
    SecretBearing(Box<Template>),
}

#[derive(Debug, Clone)]
pub enum Piece {
    Text(String),
    Expr(Program),
    /// `${secrets.NAME}`, kept as text.
    Secret(String),
}

/// What a secret reference is written as in a rendered input.
pub fn secret_reference(name: &str) -> String {
    format!("${{secrets.{name}}}")
}

/// How text that a rendered value brings into a secret-bearing part is
/// kept from naming a secret.
pub const ESCAPED_SECRET_PREFIX: &str = "$${secrets.";

/// The secret named by a piece's source, if it is exactly `secrets.NAME`.
fn secret_name(src: &str) -> Option<&str> {
    let name = src.trim().strip_prefix("secrets.")?;
    crate::names::check_name(name).ok().map(|()| name)
}

/// Splits a string into text and `${...}` pieces. The closing brace is found
/// with string literals and nested braces taken into account.
fn split(s: &str) -> Result<Vec<(bool, String)>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '$' && chars.get(i + 1) == Some(&'{') {
            let mut depth = 0usize;
            let mut quote: Option<char> = None;
            let mut j = i + 2;
            let mut end = None;
            while j < chars.len() {
                let c = chars[j];
                match quote {
                    Some(q) => {
                        if c == '\\' {
                            j += 1;
                        } else if c == q {
                            quote = None;
                        }
                    }
                    None => match c {
                        '"' | '\'' => quote = Some(c),
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            end = Some(j);
                            break;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    },
                }
                j += 1;
            }
            let Some(end) = end else {
                return Err("unterminated '${' in template".into());
            };
            if !text.is_empty() {
                out.push((false, std::mem::take(&mut text)));
            }
            out.push((true, chars[i + 2..end].iter().collect()));
            i = end + 1;
        } else {
            text.push(chars[i]);
            i += 1;
        }
    }
    if !text.is_empty() {
        out.push((false, text));
    }
    Ok(out)
}

/// Compiles `value`, reporting each bad expression at its path under `path`.
pub fn compile(
    value: &Json,
    path: &str,
    scope: &Scope<'_>,
    errors: &mut Vec<(String, String)>,
) -> Template {
    compile_in(value, path, scope, errors, None)
}

/// Compiles a part where `${secrets.NAME}` pieces may stand, adding each
/// name to `secrets`.
pub fn compile_secret_bearing(
    value: &Json,
    path: &str,
    scope: &Scope<'_>,
    errors: &mut Vec<(String, String)>,
    secrets: &mut Vec<String>,
) -> Template {
    Template::SecretBearing(Box::new(compile_in(
        value,
        path,
        scope,
        errors,
        Some(secrets),
    )))
}

fn compile_in(
    value: &Json,
    path: &str,
    scope: &Scope<'_>,
    errors: &mut Vec<(String, String)>,
    mut secrets: Option<&mut Vec<String>>,
) -> Template {
    match value {
        Json::String(s) if s.contains("${") => match split(s) {
            Err(e) => {
                errors.push((path.to_owned(), format!("syntax error: {e}")));
                Template::Literal(Json::Null)
            }
            Ok(parts) => {
                let compile_piece =
                    |src: &str, errors: &mut Vec<(String, String)>| match cel::compile(
                        src.trim(),
                        scope,
                    ) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            errors.push((path.to_owned(), e));
                            None
                        }
                    };
                let mut pieces = Vec::new();
                for (is_expr, part) in &parts {
                    if !is_expr {
                        pieces.push(Piece::Text(part.clone()));
                        continue;
                    }
                    if let (Some(names), Some(name)) = (secrets.as_deref_mut(), secret_name(part)) {
                        if !names.iter().any(|n| n == name) {
                            names.push(name.to_owned());
                        }
                        pieces.push(Piece::Secret(name.to_owned()));
                        continue;
                    }
                    if let Some(p) = compile_piece(part, errors) {
                        if parts.len() == 1 {
                            return Template::Whole(p);
                        }
                        pieces.push(Piece::Expr(p));
                    }
                }
                if parts.len() == 1 && pieces.is_empty() {
                    return Template::Literal(Json::Null);
                }
                Template::Interpolated(pieces)
            }
        },
        Json::Array(items) => Template::List(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let at = format!("{path}[{i}]");
                    compile_in(v, &at, scope, errors, secrets.as_deref_mut())
                })
                .collect(),
        ),
        Json::Object(map) => Template::Object(
            map.iter()
                .map(|(k, v)| {
                    let at = format!("{path}.{k}");
                    let t = compile_in(v, &at, scope, errors, secrets.as_deref_mut());
                    (k.clone(), t)
                })
                .collect(),
        ),
        other => Template::Literal(other.clone()),
    }
}

/// Compiles a field that holds one bare CEL expression; `"${expr}"` is
/// accepted too and means the same.
pub fn compile_expression(src: &str, scope: &Scope<'_>) -> Result<Program, String> {
    let trimmed = src.trim();
    let inner = trimmed
        .strip_prefix("${")
        .and_then(|s| s.strip_suffix('}'))
        .filter(|_| matches!(split(trimmed).as_deref(), Ok([(true, _)])))
        .unwrap_or(trimmed);
    cel::compile(inner, scope)
}

/// `value` with every `${secrets.` in its strings written `$${secrets.`.
fn escape_secret_refs(value: Json) -> Json {
    match value {
        Json::String(text) if text.contains("${secrets.") => {
            Json::String(text.replace("${secrets.", ESCAPED_SECRET_PREFIX))
        }
        Json::Array(items) => Json::Array(items.into_iter().map(escape_secret_refs).collect()),
        Json::Object(map) => Json::Object(
            map.into_iter()
                .map(|(k, v)| (k, escape_secret_refs(v)))
                .collect(),
        ),
        other => other,
    }
}

impl Template {
    pub fn render(&self, env: &dyn Env) -> Result<Json, EvalError> {
        self.render_in(env, false)
    }

    /// Renders; with `escape`, values that expressions bring in have their
    /// `${secrets.` escaped.
    fn render_in(&self, env: &dyn Env, escape: bool) -> Result<Json, EvalError> {
        let brought = |value: Json| {
            if escape {
                escape_secret_refs(value)
            } else {
                value
            }
        };
        Ok(match self {
            Template::Literal(v) => v.clone(),
            Template::Whole(p) => match p.whole().and_then(|whole| env.stored(whole)) {
                // passed along as stored: a reference stays one, unread
                Some(stored) => brought(stored),
                None => brought(p.eval(env)?.to_json()),
            },
            Template::Interpolated(pieces) => {
                let mut s = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => s.push_str(t),
                        Piece::Secret(name) => s.push_str(&secret_reference(name)),
                        Piece::Expr(p) => {
                            let text = match p.eval(env)? {
                                Val::Str(text) => text,
                                other => other.to_json().to_string(),
                            };
                            match brought(Json::String(text)) {
                                Json::String(text) => s.push_str(&text),
                                other => s.push_str(&other.to_string()),
                            }
                        }
                    }
                }
                Json::String(s)
            }
            Template::List(items) => Json::Array(
                items
                    .iter()
                    .map(|t| t.render_in(env, escape))
                    .collect::<Result<_, _>>()?,
            ),
            Template::Object(entries) => {
                let mut map = serde_json::Map::new();
                for (k, t) in entries {
                    map.insert(k.clone(), t.render_in(env, escape)?);
                }
                Json::Object(map)
            }
            Template::SecretBearing(inner) => inner.render_in(env, true)?,
        })
    }

    /// Every `nodes.<id>` the template reads.
    pub fn node_refs(&self, out: &mut Vec<(String, NodeField)>) {
        fn add(p: &Program, out: &mut Vec<(String, NodeField)>) {
            for r in p.node_refs() {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        match self {
            Template::Literal(_) => {}
            Template::Whole(p) => add(p, out),
            Template::Interpolated(pieces) => {
                for piece in pieces {
                    if let Piece::Expr(p) = piece {
                        add(p, out);
                    }
                }
            }
            Template::List(items) => items.iter().for_each(|t| t.node_refs(out)),
            Template::Object(entries) => entries.iter().for_each(|(_, t)| t.node_refs(out)),
            Template::SecretBearing(inner) => inner.node_refs(out),
        }
    }
}

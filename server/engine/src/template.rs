//! `${...}` templating over JSON values.
//!
//! A string of the exact form `"${expr}"` becomes the value of `expr`, type
//! kept; a string with `${...}` pieces among other text is interpolation
//! (each piece rendered as text: strings as-is, other values as JSON);
//! everything else is literal.

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
}

#[derive(Debug, Clone)]
pub enum Piece {
    Text(String),
    Expr(Program),
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
                if let [(true, src)] = parts.as_slice() {
                    return compile_piece(src, errors)
                        .map_or(Template::Literal(Json::Null), Template::Whole);
                }
                let mut pieces = Vec::new();
                for (is_expr, part) in parts {
                    if is_expr {
                        if let Some(p) = compile_piece(&part, errors) {
                            pieces.push(Piece::Expr(p));
                        }
                    } else {
                        pieces.push(Piece::Text(part));
                    }
                }
                Template::Interpolated(pieces)
            }
        },
        Json::Array(items) => Template::List(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| compile(v, &format!("{path}[{i}]"), scope, errors))
                .collect(),
        ),
        Json::Object(map) => Template::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), compile(v, &format!("{path}.{k}"), scope, errors)))
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

impl Template {
    pub fn render(&self, env: &dyn Env) -> Result<Json, EvalError> {
        Ok(match self {
            Template::Literal(v) => v.clone(),
            Template::Whole(p) => p.eval(env)?.to_json(),
            Template::Interpolated(pieces) => {
                let mut s = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => s.push_str(t),
                        Piece::Expr(p) => match p.eval(env)? {
                            Val::Str(text) => s.push_str(&text),
                            other => s.push_str(&other.to_json().to_string()),
                        },
                    }
                }
                Json::String(s)
            }
            Template::List(items) => Json::Array(
                items
                    .iter()
                    .map(|t| t.render(env))
                    .collect::<Result<_, _>>()?,
            ),
            Template::Object(entries) => {
                let mut map = serde_json::Map::new();
                for (k, t) in entries {
                    map.insert(k.clone(), t.render(env)?);
                }
                Json::Object(map)
            }
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
        }
    }
}

//! A CEL subset: lexer, parser, static scope/type checker and a cost-limited
//! evaluator.
//!
//! Supported: literals (int, double, string, bool, null, lists, maps with
//! string keys), `! - * / % + - < <= > >= == != in && || ?:`, field selection
//! and indexing, `has(a.b)`, the macros `all`, `exists`, `exists_one`, `map`,
//! `filter`, and the functions `size`, `contains`, `startsWith`, `endsWith`,
//! `lowerAscii`, `upperAscii`, `string`, `int`, `double`, `timestamp`,
//! `duration`. Timestamps and durations are milliseconds.
//!
//! Why our own and not the `cel` crate: workflows must be type- and
//! scope-checked at registration (`nodes.x` for an unknown node is an error
//! with a path), and every evaluation must stop at a cost limit. Both need
//! control over the AST that the interpreter crate does not give.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value as Json;

use crate::duration::{format_duration, format_timestamp, parse_duration, parse_timestamp};

/// Longest expression text accepted at registration.
pub const MAX_EXPRESSION_LEN: usize = 4096;
/// Deepest nesting of an expression accepted at registration.
pub const MAX_NESTING: usize = 32;
/// Evaluation steps one expression may take before it is stopped.
pub const EVAL_COST_LIMIT: u64 = 100_000;

/// A CEL value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    List(Vec<Val>),
    Map(BTreeMap<String, Val>),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
    /// Milliseconds.
    Duration(i64),
}

impl Val {
    pub fn from_json(json: &Json) -> Val {
        match json {
            Json::Null => Val::Null,
            Json::Bool(b) => Val::Bool(*b),
            Json::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => Val::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => Val::Str(s.clone()),
            Json::Array(items) => Val::List(items.iter().map(Val::from_json).collect()),
            Json::Object(map) => Val::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Val::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// JSON form: timestamps become RFC 3339 strings, durations `30s` strings,
    /// non-finite doubles `null`.
    pub fn to_json(&self) -> Json {
        match self {
            Val::Null => Json::Null,
            Val::Bool(b) => Json::Bool(*b),
            Val::Int(i) => Json::from(*i),
            Val::Double(d) => serde_json::Number::from_f64(*d).map_or(Json::Null, Json::Number),
            Val::Str(s) => Json::String(s.clone()),
            Val::List(items) => Json::Array(items.iter().map(Val::to_json).collect()),
            Val::Map(map) => {
                Json::Object(map.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
            Val::Timestamp(ms) => Json::String(format_timestamp(*ms)),
            Val::Duration(ms) => Json::String(format_duration(*ms)),
        }
    }

    pub fn ty(&self) -> Ty {
        match self {
            Val::Null => Ty::Null,
            Val::Bool(_) => Ty::Bool,
            Val::Int(_) => Ty::Int,
            Val::Double(_) => Ty::Double,
            Val::Str(_) => Ty::String,
            Val::List(_) => Ty::List,
            Val::Map(_) => Ty::Map,
            Val::Timestamp(_) => Ty::Timestamp,
            Val::Duration(_) => Ty::Duration,
        }
    }
}

/// Static types, `Dyn` where only evaluation can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Dyn,
    Null,
    Bool,
    Int,
    Double,
    String,
    List,
    Map,
    Timestamp,
    Duration,
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Ty::Dyn => "dyn",
            Ty::Null => "null",
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Timestamp => "timestamp",
            Ty::Duration => "duration",
        };
        f.write_str(name)
    }
}

/// Which part of `nodes.<id>` an expression reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeField {
    Output,
    Error,
    Status,
}

/// A variable root after resolution.
#[derive(Debug, Clone, PartialEq)]
enum Var {
    Input,
    Run,
    Item,
    Index,
    /// A comprehension variable, by depth (0 = outermost).
    Local(usize),
    Node(String, NodeField),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnOp {
    Not,
    Neg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    In,
    And,
    Or,
}

impl BinOp {
    fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::In => "in",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Macro {
    All,
    Exists,
    ExistsOne,
    Map,
    Filter,
}

/// The parsed, not yet resolved syntax tree.
#[derive(Debug, Clone)]
enum Ast {
    Lit(Val),
    Ident(String),
    Select(Box<Ast>, String),
    Index(Box<Ast>, Box<Ast>),
    Call {
        target: Option<Box<Ast>>,
        name: String,
        args: Vec<Ast>,
    },
    Unary(UnOp, Box<Ast>),
    Binary(BinOp, Box<Ast>, Box<Ast>),
    Cond(Box<Ast>, Box<Ast>, Box<Ast>),
    List(Vec<Ast>),
    Map(Vec<(Ast, Ast)>),
}

/// The resolved tree that is evaluated.
#[derive(Debug, Clone)]
enum Expr {
    Lit(Val),
    Var(Var),
    Select(Box<Expr>, String),
    Has(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
    Map(Vec<(Expr, Expr)>),
    Comprehension {
        kind: Macro,
        range: Box<Expr>,
        body: Box<Expr>,
    },
}

// ---------------------------------------------------------------- lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Double(f64),
    Str(String),
    Ident(String),
    Punct(&'static str),
}

const PUNCTS: [&str; 22] = [
    "&&", "||", "<=", ">=", "==", "!=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "?", "!", "-",
    "+", "*", "/", "%",
];

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let mut is_double = false;
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                is_double = true;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let save = i;
                i += 1;
                if i < chars.len() && (chars[i] == '+' || chars[i] == '-') {
                    i += 1;
                }
                if i < chars.len() && chars[i].is_ascii_digit() {
                    is_double = true;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                } else {
                    i = save;
                }
            }
            let text: String = chars[start..i].iter().collect();
            if is_double {
                toks.push(Tok::Double(
                    text.parse()
                        .map_err(|_| format!("invalid number '{text}'"))?,
                ));
            } else {
                toks.push(Tok::Int(
                    text.parse()
                        .map_err(|_| format!("integer '{text}' is out of range"))?,
                ));
            }
            if i < chars.len() && (chars[i] == 'u' || chars[i] == 'U') {
                i += 1; // unsigned suffix: treated as int
            }
            continue;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            toks.push(Tok::Ident(chars[start..i].iter().collect()));
            continue;
        }
        if c == '"' || c == '\'' {
            let quote = c;
            i += 1;
            let mut s = String::new();
            loop {
                let Some(&ch) = chars.get(i) else {
                    return Err("unterminated string literal".into());
                };
                i += 1;
                if ch == quote {
                    break;
                }
                if ch == '\\' {
                    let Some(&esc) = chars.get(i) else {
                        return Err("unterminated string literal".into());
                    };
                    i += 1;
                    match esc {
                        'n' => s.push('\n'),
                        'r' => s.push('\r'),
                        't' => s.push('\t'),
                        '\\' | '"' | '\'' => s.push(esc),
                        'u' => {
                            let hex: String = chars
                                .get(i..i + 4)
                                .map(|h| h.iter().collect())
                                .unwrap_or_default();
                            let code = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                            match code {
                                Some(ch) if hex.len() == 4 => {
                                    s.push(ch);
                                    i += 4;
                                }
                                _ => return Err("invalid \\u escape".into()),
                            }
                        }
                        other => return Err(format!("invalid escape '\\{other}'")),
                    }
                } else {
                    s.push(ch);
                }
            }
            toks.push(Tok::Str(s));
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
        match PUNCTS.iter().find(|p| rest.starts_with(**p)) {
            Some(p) => {
                toks.push(Tok::Punct(p));
                i += p.len();
            }
            None if c == '<' || c == '>' => {
                toks.push(Tok::Punct(if c == '<' { "<" } else { ">" }));
                i += 1;
            }
            None => return Err(format!("unexpected character '{c}'")),
        }
    }
    Ok(toks)
}

// ---------------------------------------------------------------- parser

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn eat(&mut self, p: &str) -> bool {
        if self.is_punct(p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Result<(), String> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(format!("expected '{p}' {}", self.found()))
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "but the expression ended".into(),
            Some(Tok::Int(i)) => format!("but found {i}"),
            Some(Tok::Double(d)) => format!("but found {d}"),
            Some(Tok::Str(s)) => format!("but found \"{s}\""),
            Some(Tok::Ident(s)) => format!("but found '{s}'"),
            Some(Tok::Punct(p)) => format!("but found '{p}'"),
        }
    }

    fn nest(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            Err(format!("expression nests deeper than {MAX_NESTING} levels"))
        } else {
            Ok(())
        }
    }

    fn expr(&mut self) -> Result<Ast, String> {
        self.nest()?;
        let cond = self.binary(0)?;
        let out = if self.eat("?") {
            let then = self.expr()?;
            self.expect(":")?;
            let otherwise = self.expr()?;
            Ast::Cond(Box::new(cond), Box::new(then), Box::new(otherwise))
        } else {
            cond
        };
        self.depth -= 1;
        Ok(out)
    }

    fn binop(&self, level: usize) -> Option<BinOp> {
        let op = match self.peek()? {
            Tok::Punct(p) => match (level, *p) {
                (0, "||") => BinOp::Or,
                (1, "&&") => BinOp::And,
                (2, "<") => BinOp::Lt,
                (2, "<=") => BinOp::Le,
                (2, ">") => BinOp::Gt,
                (2, ">=") => BinOp::Ge,
                (2, "==") => BinOp::Eq,
                (2, "!=") => BinOp::Ne,
                (3, "+") => BinOp::Add,
                (3, "-") => BinOp::Sub,
                (4, "*") => BinOp::Mul,
                (4, "/") => BinOp::Div,
                (4, "%") => BinOp::Rem,
                _ => return None,
            },
            Tok::Ident(name) if level == 2 && name == "in" => BinOp::In,
            _ => return None,
        };
        Some(op)
    }

    fn binary(&mut self, level: usize) -> Result<Ast, String> {
        if level == 5 {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        let mut chain = 0;
        while let Some(op) = self.binop(level) {
            self.pos += 1;
            chain += 1;
            if chain > 256 {
                return Err("expression has too many operators in a row".into());
            }
            let right = self.binary(level + 1)?;
            left = Ast::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Ast, String> {
        if self.eat("!") {
            self.nest()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Ast::Unary(UnOp::Not, Box::new(inner)));
        }
        if self.eat("-") {
            self.nest()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(match inner {
                Ast::Lit(Val::Int(i)) => Ast::Lit(Val::Int(-i)),
                Ast::Lit(Val::Double(d)) => Ast::Lit(Val::Double(-d)),
                other => Ast::Unary(UnOp::Neg, Box::new(other)),
            });
        }
        self.member()
    }

    fn member(&mut self) -> Result<Ast, String> {
        let mut e = self.primary()?;
        let mut chain = 0;
        loop {
            chain += 1;
            if chain > 256 {
                return Err("expression selects too many fields in a row".into());
            }
            if self.eat(".") {
                let name = match self.peek() {
                    Some(Tok::Ident(n)) => n.clone(),
                    _ => return Err(format!("expected a field name after '.' {}", self.found())),
                };
                self.pos += 1;
                if self.eat("(") {
                    let args = self.args(")")?;
                    e = Ast::Call {
                        target: Some(Box::new(e)),
                        name,
                        args,
                    };
                } else {
                    e = Ast::Select(Box::new(e), name);
                }
            } else if self.eat("[") {
                let index = self.expr()?;
                self.expect("]")?;
                e = Ast::Index(Box::new(e), Box::new(index));
            } else {
                return Ok(e);
            }
        }
    }

    fn args(&mut self, close: &str) -> Result<Vec<Ast>, String> {
        let mut args = Vec::new();
        if self.eat(close) {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat(close) {
                return Ok(args);
            }
            self.expect(",")?;
            if self.eat(close) {
                return Ok(args);
            }
        }
    }

    fn primary(&mut self) -> Result<Ast, String> {
        let Some(tok) = self.peek().cloned() else {
            return Err("expected an expression but the expression ended".into());
        };
        self.pos += 1;
        match tok {
            Tok::Int(i) => Ok(Ast::Lit(Val::Int(i))),
            Tok::Double(d) => Ok(Ast::Lit(Val::Double(d))),
            Tok::Str(s) => Ok(Ast::Lit(Val::Str(s))),
            Tok::Ident(name) => match name.as_str() {
                "true" => Ok(Ast::Lit(Val::Bool(true))),
                "false" => Ok(Ast::Lit(Val::Bool(false))),
                "null" => Ok(Ast::Lit(Val::Null)),
                _ if self.eat("(") => {
                    let args = self.args(")")?;
                    Ok(Ast::Call {
                        target: None,
                        name,
                        args,
                    })
                }
                _ => Ok(Ast::Ident(name)),
            },
            Tok::Punct("(") => {
                self.nest()?;
                let e = self.expr()?;
                self.expect(")")?;
                self.depth -= 1;
                Ok(e)
            }
            Tok::Punct("[") => {
                self.nest()?;
                let items = self.args("]")?;
                self.depth -= 1;
                Ok(Ast::List(items))
            }
            Tok::Punct("{") => {
                self.nest()?;
                let mut entries = Vec::new();
                if !self.eat("}") {
                    loop {
                        let key = self.expr()?;
                        self.expect(":")?;
                        let value = self.expr()?;
                        entries.push((key, value));
                        if self.eat("}") {
                            break;
                        }
                        self.expect(",")?;
                        if self.eat("}") {
                            break;
                        }
                    }
                }
                self.depth -= 1;
                Ok(Ast::Map(entries))
            }
            Tok::Punct(p) => Err(format!("unexpected '{p}'")),
        }
    }
}

// ---------------------------------------------------------------- checker

/// What an expression may refer to, given where it stands in a definition.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    /// Ids of every node of the definition.
    pub node_ids: &'a dyn Fn(&str) -> bool,
    /// `item` and `index` are in scope (inside a MAP element's input).
    pub map_element: bool,
    /// The workflow's `input_schema`, if any: `input.a.b` then has the type
    /// the schema declares for it.
    pub input_schema: Option<&'a Json>,
}

struct Checker<'s, 'a> {
    scope: &'s Scope<'a>,
    locals: Vec<String>,
}

/// The CEL type a JSON Schema declares (`type` as a single name); Dyn for
/// anything else (several types, no type, `$ref`).
fn schema_type(schema: &Json) -> Ty {
    match schema.get("type").and_then(Json::as_str) {
        Some("string") => Ty::String,
        Some("integer") => Ty::Int,
        Some("number") => Ty::Double,
        Some("boolean") => Ty::Bool,
        Some("array") => Ty::List,
        Some("object") => Ty::Map,
        Some("null") => Ty::Null,
        _ => Ty::Dyn,
    }
}

fn numeric(t: Ty) -> bool {
    matches!(t, Ty::Int | Ty::Double)
}

impl Checker<'_, '_> {
    fn resolve(&mut self, ast: Ast) -> Result<(Expr, Ty), String> {
        match ast {
            Ast::Lit(v) => {
                let ty = v.ty();
                Ok((Expr::Lit(v), ty))
            }
            Ast::Ident(name) => self.ident(&name),
            Ast::Select(base, field) => {
                if let Ast::Select(root, node) = base.as_ref()
                    && matches!(root.as_ref(), Ast::Ident(n) if n == "nodes")
                    && !self.locals.iter().any(|l| l == "nodes")
                {
                    return self.node_ref(node, &field);
                }
                if matches!(base.as_ref(), Ast::Ident(n) if n == "nodes")
                    && !self.locals.iter().any(|l| l == "nodes")
                {
                    return self.node_ref(&field, "");
                }
                if matches!(base.as_ref(), Ast::Ident(n) if n == "run")
                    && !self.locals.iter().any(|l| l == "run")
                {
                    let ty = match field.as_str() {
                        "id" | "workflow" => Ty::String,
                        "version" => Ty::Int,
                        "started_at" => Ty::Timestamp,
                        _ => {
                            return Err(format!(
                                "run has no field '{field}' (it has id, workflow, version, started_at)"
                            ));
                        }
                    };
                    return Ok((Expr::Select(Box::new(Expr::Var(Var::Run)), field), ty));
                }
                let declared = self.input_field_type(&base, &field)?;
                let (base, ty) = self.resolve(*base)?;
                if !matches!(ty, Ty::Dyn | Ty::Map | Ty::Null) {
                    return Err(format!("cannot select field '{field}' of a {ty}"));
                }
                Ok((Expr::Select(Box::new(base), field), declared))
            }
            Ast::Index(base, index) => {
                let (base, bt) = self.resolve(*base)?;
                let (index, it) = self.resolve(*index)?;
                match bt {
                    Ty::List if !matches!(it, Ty::Int | Ty::Dyn) => {
                        return Err(format!("a list index must be an int, not a {it}"));
                    }
                    Ty::Map if !matches!(it, Ty::String | Ty::Dyn) => {
                        return Err(format!("a map key must be a string, not a {it}"));
                    }
                    Ty::Dyn | Ty::List | Ty::Map => {}
                    other => return Err(format!("cannot index a {other}")),
                }
                Ok((Expr::Index(Box::new(base), Box::new(index)), Ty::Dyn))
            }
            Ast::Call { target, name, args } => self.call(target, name, args),
            Ast::Unary(op, inner) => {
                let (inner, ty) = self.resolve(*inner)?;
                let out = match (op, ty) {
                    (UnOp::Not, Ty::Bool | Ty::Dyn) => Ty::Bool,
                    (UnOp::Neg, Ty::Int | Ty::Double | Ty::Duration | Ty::Dyn) => ty,
                    (UnOp::Not, t) => {
                        return Err(format!("no matching overload for '!' applied to ({t})"));
                    }
                    (UnOp::Neg, t) => {
                        return Err(format!("no matching overload for '-' applied to ({t})"));
                    }
                };
                Ok((Expr::Unary(op, Box::new(inner)), out))
            }
            Ast::Binary(op, left, right) => {
                let (left, lt) = self.resolve(*left)?;
                let (right, rt) = self.resolve(*right)?;
                let ty = binary_type(op, lt, rt)?;
                if matches!(op, BinOp::Eq | BinOp::Ne) {
                    check_status_literal(&left, &right)?;
                    check_status_literal(&right, &left)?;
                }
                Ok((Expr::Binary(op, Box::new(left), Box::new(right)), ty))
            }
            Ast::Cond(cond, then, otherwise) => {
                let (cond, ct) = self.resolve(*cond)?;
                if !matches!(ct, Ty::Bool | Ty::Dyn) {
                    return Err(format!("the condition of '?:' must be a bool, not a {ct}"));
                }
                let (then, tt) = self.resolve(*then)?;
                let (otherwise, ot) = self.resolve(*otherwise)?;
                let ty = if tt == ot { tt } else { Ty::Dyn };
                Ok((
                    Expr::Cond(Box::new(cond), Box::new(then), Box::new(otherwise)),
                    ty,
                ))
            }
            Ast::List(items) => {
                let items = items
                    .into_iter()
                    .map(|i| self.resolve(i).map(|(e, _)| e))
                    .collect::<Result<_, _>>()?;
                Ok((Expr::List(items), Ty::List))
            }
            Ast::Map(entries) => {
                let mut out = Vec::with_capacity(entries.len());
                for (k, v) in entries {
                    let (k, kt) = self.resolve(k)?;
                    if !matches!(kt, Ty::String | Ty::Int | Ty::Bool | Ty::Dyn) {
                        return Err(format!("a map key must be a string, not a {kt}"));
                    }
                    let (v, _) = self.resolve(v)?;
                    out.push((k, v));
                }
                Ok((Expr::Map(out), Ty::Map))
            }
        }
    }

    /// The type `input_schema` declares for `base.field`, when `base` is
    /// `input` or a field path under it (Dyn when the schema says nothing).
    /// A field a closed object (`additionalProperties: false`) does not list
    /// is an error.
    fn input_field_type(&self, base: &Ast, field: &str) -> Result<Ty, String> {
        let Some(schema) = self.scope.input_schema else {
            return Ok(Ty::Dyn);
        };
        let Some(path) = self.input_path(base) else {
            return Ok(Ty::Dyn);
        };
        let mut at = schema;
        for step in &path {
            match at.get("properties").and_then(|p| p.get(*step)) {
                Some(next) => at = next,
                None => return Ok(Ty::Dyn),
            }
        }
        match at.get("properties").and_then(|p| p.get(field)) {
            Some(declared) => Ok(schema_type(declared)),
            None if at.get("additionalProperties") == Some(&Json::Bool(false)) => {
                let mut full: Vec<&str> = path.clone();
                full.push(field);
                Err(format!(
                    "input.{} is not in the input_schema (its object allows no other properties)",
                    full.join(".")
                ))
            }
            None => Ok(Ty::Dyn),
        }
    }

    /// `["a", "b"]` for `input.a.b`; None for anything not rooted at `input`.
    fn input_path<'x>(&self, ast: &'x Ast) -> Option<Vec<&'x str>> {
        match ast {
            Ast::Ident(name) if name == "input" && !self.locals.iter().any(|l| l == "input") => {
                Some(Vec::new())
            }
            Ast::Select(base, field) => {
                let mut path = self.input_path(base)?;
                path.push(field.as_str());
                Some(path)
            }
            _ => None,
        }
    }

    fn ident(&mut self, name: &str) -> Result<(Expr, Ty), String> {
        if let Some(depth) = self.locals.iter().rposition(|l| l == name) {
            return Ok((Expr::Var(Var::Local(depth)), Ty::Dyn));
        }
        match name {
            "input" => Ok((Expr::Var(Var::Input), Ty::Dyn)),
            "run" => Ok((Expr::Var(Var::Run), Ty::Map)),
            "item" | "index" if !self.scope.map_element => Err(format!(
                "'{name}' is only in scope in the input of a MAP node"
            )),
            "item" => Ok((Expr::Var(Var::Item), Ty::Dyn)),
            "index" => Ok((Expr::Var(Var::Index), Ty::Int)),
            "nodes" => {
                Err("'nodes' must be followed by .<id>.output, .<id>.error or .<id>.status".into())
            }
            // a template piece `${secrets.NAME}` never reaches CEL: the
            // HTTP node's url, headers and body keep it for the executor
            "secrets" => Err(SECRETS_ONLY_THERE.into()),
            _ => Err(format!(
                "undeclared reference to '{name}' (in scope: input, nodes, run{})",
                if self.scope.map_element {
                    ", item, index"
                } else {
                    ""
                }
            )),
        }
    }

    fn node_ref(&mut self, node: &str, field: &str) -> Result<(Expr, Ty), String> {
        if !(self.scope.node_ids)(node) {
            return Err(format!("unknown node '{node}' in nodes.{node}"));
        }
        let (field, ty) = match field {
            "output" => (NodeField::Output, Ty::Dyn),
            "error" => (NodeField::Error, Ty::Dyn),
            "status" => (NodeField::Status, Ty::String),
            _ => return Err(format!("nodes.{node} has only output, error and status")),
        };
        Ok((Expr::Var(Var::Node(node.to_owned(), field)), ty))
    }

    fn call(
        &mut self,
        target: Option<Box<Ast>>,
        name: String,
        args: Vec<Ast>,
    ) -> Result<(Expr, Ty), String> {
        let macro_kind = match name.as_str() {
            "all" => Some(Macro::All),
            "exists" => Some(Macro::Exists),
            "exists_one" => Some(Macro::ExistsOne),
            "map" => Some(Macro::Map),
            "filter" => Some(Macro::Filter),
            _ => None,
        };
        if let (Some(kind), Some(range)) = (macro_kind, &target) {
            let [Ast::Ident(var), body] = args.as_slice() else {
                return Err(format!(
                    "{name}() takes a variable name and an expression, e.g. list.{name}(x, x > 0)"
                ));
            };
            let (range, rt) = self.resolve(range.as_ref().clone())?;
            if !matches!(rt, Ty::List | Ty::Map | Ty::Dyn) {
                return Err(format!("{name}() needs a list or a map, not a {rt}"));
            }
            self.locals.push(var.clone());
            let body = self.resolve(body.clone());
            self.locals.pop();
            let (body, bt) = body?;
            if kind != Macro::Map && !matches!(bt, Ty::Bool | Ty::Dyn) {
                return Err(format!(
                    "the predicate of {name}() must be a bool, not a {bt}"
                ));
            }
            let ty = if matches!(kind, Macro::Map | Macro::Filter) {
                Ty::List
            } else {
                Ty::Bool
            };
            return Ok((
                Expr::Comprehension {
                    kind,
                    range: Box::new(range),
                    body: Box::new(body),
                },
                ty,
            ));
        }
        if name == "has" && target.is_none() {
            let [Ast::Select(base, field)] = args.as_slice() else {
                return Err("has() takes one field selection, e.g. has(input.x)".into());
            };
            if let Ast::Select(root, node) = base.as_ref()
                && matches!(root.as_ref(), Ast::Ident(n) if n == "nodes")
            {
                let (e, _) = self.node_ref(node, field)?;
                return Ok((Expr::Call("has_node".into(), vec![e]), Ty::Bool));
            }
            let (base, _) = self.resolve(base.as_ref().clone())?;
            return Ok((Expr::Has(Box::new(base), field.clone()), Ty::Bool));
        }
        let mut all = Vec::new();
        let mut types = Vec::new();
        if let Some(t) = target {
            let (e, ty) = self.resolve(*t)?;
            all.push(e);
            types.push(ty);
        }
        for a in args {
            let (e, ty) = self.resolve(a)?;
            all.push(e);
            types.push(ty);
        }
        let (arity, ret, first): (usize, Ty, &[Ty]) = match name.as_str() {
            "size" => (1, Ty::Int, &[Ty::String, Ty::List, Ty::Map]),
            "contains" | "startsWith" | "endsWith" => (2, Ty::Bool, &[Ty::String]),
            "lowerAscii" | "upperAscii" => (1, Ty::String, &[Ty::String]),
            "string" => (1, Ty::String, &[]),
            "int" => (
                1,
                Ty::Int,
                &[Ty::Int, Ty::Double, Ty::String, Ty::Timestamp, Ty::Duration],
            ),
            "double" => (1, Ty::Double, &[Ty::Int, Ty::Double, Ty::String]),
            "timestamp" => (1, Ty::Timestamp, &[Ty::String, Ty::Int, Ty::Timestamp]),
            "duration" => (1, Ty::Duration, &[Ty::String, Ty::Duration]),
            _ => return Err(format!("unknown function '{name}'")),
        };
        if all.len() != arity {
            return Err(format!(
                "{name}() takes {} argument(s), got {}",
                arity,
                all.len()
            ));
        }
        if let Some(t) = types.first()
            && !first.is_empty()
            && *t != Ty::Dyn
            && !first.contains(t)
        {
            return Err(format!(
                "no matching overload for {name}() applied to ({t})"
            ));
        }
        if arity == 2 && !matches!(types[1], Ty::String | Ty::Dyn) {
            return Err(format!(
                "no matching overload for {name}() applied to ({}, {})",
                types[0], types[1]
            ));
        }
        Ok((Expr::Call(name, all), ret))
    }
}

/// The values `nodes.<id>.status` takes.
pub const NODE_STATUSES: [&str; 7] = [
    "PENDING",
    "RUNNING",
    "WAITING",
    "RETRY_SCHEDULED",
    "COMPLETED",
    "FAILED",
    "SKIPPED",
];

/// `nodes.x.status == 'COMPLETD'` can never hold: a registration error.
fn check_status_literal(a: &Expr, b: &Expr) -> Result<(), String> {
    if let (Expr::Var(Var::Node(id, NodeField::Status)), Expr::Lit(Val::Str(s))) = (a, b)
        && !NODE_STATUSES.contains(&s.as_str())
    {
        return Err(format!(
            "nodes.{id}.status is never '{s}' (it is one of {})",
            NODE_STATUSES.join(", ")
        ));
    }
    Ok(())
}

fn binary_type(op: BinOp, l: Ty, r: Ty) -> Result<Ty, String> {
    use Ty::*;
    let mismatch = || {
        format!(
            "no matching overload for '{}' applied to ({l}, {r})",
            op.symbol()
        )
    };
    let dyn_either = l == Dyn || r == Dyn;
    Ok(match op {
        BinOp::And | BinOp::Or => {
            if !matches!(l, Bool | Dyn) || !matches!(r, Bool | Dyn) {
                return Err(mismatch());
            }
            Bool
        }
        BinOp::Eq | BinOp::Ne => {
            let comparable =
                dyn_either || l == r || (numeric(l) && numeric(r)) || l == Null || r == Null;
            if !comparable {
                return Err(mismatch());
            }
            Bool
        }
        BinOp::In => {
            if !matches!(r, List | Map | Dyn) {
                return Err(mismatch());
            }
            Bool
        }
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            if !(dyn_either || l == r || (numeric(l) && numeric(r)))
                || matches!(l, List | Map | Null)
            {
                return Err(mismatch());
            }
            Bool
        }
        BinOp::Add => match (l, r) {
            _ if dyn_either => Dyn,
            (Int, Int) => Int,
            (Double, Double) | (Int, Double) | (Double, Int) => Double,
            (String, String) => String,
            (List, List) => List,
            (Timestamp, Duration) | (Duration, Timestamp) => Timestamp,
            (Duration, Duration) => Duration,
            _ => return Err(mismatch()),
        },
        BinOp::Sub => match (l, r) {
            _ if dyn_either => Dyn,
            (Int, Int) => Int,
            (Double, Double) | (Int, Double) | (Double, Int) => Double,
            (Timestamp, Duration) => Timestamp,
            (Timestamp, Timestamp) | (Duration, Duration) => Duration,
            _ => return Err(mismatch()),
        },
        BinOp::Mul | BinOp::Div | BinOp::Rem => match (l, r) {
            _ if dyn_either => Dyn,
            (Int, Int) => Int,
            (Double, Double) | (Int, Double) | (Double, Int) if op != BinOp::Rem => Double,
            _ => return Err(mismatch()),
        },
    })
}

// ---------------------------------------------------------------- program

/// A compiled, checked expression.
#[derive(Debug, Clone)]
pub struct Program {
    expr: Expr,
    ty: Ty,
    source: String,
}

/// Compiles `src` in `scope`: parse, resolve, type-check. The message is
/// ready for a validation error.
/// Where `secrets.NAME` may be written, said wherever else it is.
pub const SECRETS_ONLY_THERE: &str = "secrets may be used only as `${secrets.NAME}` on its own \
     in an HTTP node's url, header values and body strings, or named in a CODE node's `secrets`; \
     never in expressions, conditions, outputs or a TASK's input (docs/secrets.md)";

pub fn compile(src: &str, scope: &Scope<'_>) -> Result<Program, String> {
    if src.len() > MAX_EXPRESSION_LEN {
        return Err(format!(
            "expression is longer than {MAX_EXPRESSION_LEN} characters ({})",
            src.len()
        ));
    }
    let toks = lex(src).map_err(|e| format!("syntax error: {e}"))?;
    let mut parser = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    let ast = parser.expr().map_err(|e| format!("syntax error: {e}"))?;
    if parser.pos != parser.toks.len() {
        return Err(format!(
            "syntax error: unexpected text after the expression {}",
            parser.found()
        ));
    }
    let mut checker = Checker {
        scope,
        locals: Vec::new(),
    };
    let (expr, ty) = checker.resolve(ast)?;
    Ok(Program {
        expr,
        ty,
        source: src.to_owned(),
    })
}

impl Program {
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The static type, `Dyn` when only evaluation can tell.
    pub fn ty(&self) -> Ty {
        self.ty
    }

    /// Every `nodes.<id>` this expression reads, with the field.
    pub fn node_refs(&self) -> Vec<(String, NodeField)> {
        let mut out = Vec::new();
        collect_refs(&self.expr, &mut out);
        out
    }

    /// True when the expression reads nothing but `input` (no `run`,
    /// `nodes`, `item` or `index`): it can be evaluated before a run exists.
    pub fn reads_only_input(&self) -> bool {
        only_input(&self.expr)
    }

    /// Evaluates with a cost limit: a runaway expression is an error.
    /// The value the expression is, when it only names one whole.
    pub fn whole(&self) -> Option<Whole<'_>> {
        match &self.expr {
            Expr::Var(Var::Input) => Some(Whole::Input),
            Expr::Var(Var::Node(id, NodeField::Output)) => Some(Whole::NodeOutput(id)),
            _ => None,
        }
    }

    pub fn eval(&self, env: &dyn Env) -> Result<Val, EvalError> {
        let mut ev = Evaluator {
            env,
            cost: 0,
            locals: Vec::new(),
        };
        ev.eval(&self.expr)
    }
}

fn collect_refs(e: &Expr, out: &mut Vec<(String, NodeField)>) {
    match e {
        Expr::Var(Var::Node(n, f)) => {
            if !out.iter().any(|(m, g)| m == n && g == f) {
                out.push((n.clone(), *f));
            }
        }
        Expr::Lit(_) | Expr::Var(_) => {}
        Expr::Select(b, _) | Expr::Has(b, _) | Expr::Unary(_, b) => collect_refs(b, out),
        Expr::Index(a, b) | Expr::Binary(_, a, b) => {
            collect_refs(a, out);
            collect_refs(b, out);
        }
        Expr::Comprehension { range, body, .. } => {
            collect_refs(range, out);
            collect_refs(body, out);
        }
        Expr::Cond(a, b, c) => {
            collect_refs(a, out);
            collect_refs(b, out);
            collect_refs(c, out);
        }
        Expr::Call(_, args) | Expr::List(args) => args.iter().for_each(|a| collect_refs(a, out)),
        Expr::Map(entries) => entries.iter().for_each(|(k, v)| {
            collect_refs(k, out);
            collect_refs(v, out);
        }),
    }
}

fn only_input(e: &Expr) -> bool {
    match e {
        Expr::Var(Var::Input | Var::Local(_)) | Expr::Lit(_) => true,
        Expr::Var(_) => false,
        Expr::Select(b, _) | Expr::Has(b, _) | Expr::Unary(_, b) => only_input(b),
        Expr::Index(a, b) | Expr::Binary(_, a, b) => only_input(a) && only_input(b),
        Expr::Comprehension { range, body, .. } => only_input(range) && only_input(body),
        Expr::Cond(a, b, c) => only_input(a) && only_input(b) && only_input(c),
        Expr::Call(_, args) | Expr::List(args) => args.iter().all(only_input),
        Expr::Map(entries) => entries.iter().all(|(k, v)| only_input(k) && only_input(v)),
    }
}

/// The variables an evaluation reads.
/// A value an expression names whole, which a template that only passes
/// it along may take as stored (references to blobs unread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whole<'p> {
    /// `input`.
    Input,
    /// `nodes.<id>.output`.
    NodeOutput(&'p str),
}

pub trait Env {
    fn input(&self) -> Val;
    /// The value `whole` names as stored, when it holds references to
    /// blobs (None: evaluate it as usual).
    fn stored(&self, _whole: Whole<'_>) -> Option<Json> {
        None
    }
    /// The run input as JSON, if the environment has it: `input.a.b` then
    /// converts only the selected value, not the whole input.
    fn input_json(&self) -> Option<&Json> {
        None
    }
    fn run(&self) -> Val;
    fn item(&self) -> Val;
    fn index(&self) -> Val;
    fn node(&self, id: &str, field: NodeField) -> Val;
}

/// Why an evaluation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("expression exceeded its evaluation cost limit of {EVAL_COST_LIMIT} steps")]
    CostLimit,
    #[error("{0}")]
    Runtime(String),
}

struct Evaluator<'e> {
    env: &'e dyn Env,
    cost: u64,
    locals: Vec<Val>,
}

fn rt<T>(msg: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError::Runtime(msg.into()))
}

fn type_name(v: &Val) -> Ty {
    v.ty()
}

fn val_eq(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Double(y)) | (Val::Double(y), Val::Int(x)) => (*x as f64) == *y,
        (Val::List(x), Val::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| val_eq(p, q))
        }
        (Val::Map(x), Val::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| val_eq(v, w)))
        }
        _ => a == b,
    }
}

fn compare(a: &Val, b: &Val) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::Double(y)) => (*x as f64).partial_cmp(y),
        (Val::Double(x), Val::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Val::Double(x), Val::Double(y)) => x.partial_cmp(y),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::Timestamp(x), Val::Timestamp(y)) | (Val::Duration(x), Val::Duration(y)) => {
            Some(x.cmp(y))
        }
        _ => None,
    }
}

fn map_key(v: &Val) -> Result<String, EvalError> {
    match v {
        Val::Str(s) => Ok(s.clone()),
        Val::Int(i) => Ok(i.to_string()),
        Val::Bool(b) => Ok(b.to_string()),
        other => rt(format!(
            "a map key must be a string, not a {}",
            type_name(other)
        )),
    }
}

fn size_of(v: &Val) -> u64 {
    match v {
        Val::Str(s) => s.len() as u64,
        Val::List(l) => l.len() as u64,
        Val::Map(m) => m.len() as u64,
        _ => 1,
    }
}

/// Roughly the bytes a value occupies, everything it holds included.
fn byte_size(v: &Val) -> u64 {
    match v {
        Val::Str(s) => 8 + s.len() as u64,
        Val::List(l) => 8 + l.iter().map(byte_size).sum::<u64>(),
        Val::Map(m) => {
            8 + m
                .iter()
                .map(|(k, v)| 8 + k.len() as u64 + byte_size(v))
                .sum::<u64>()
        }
        _ => 8,
    }
}

/// The variable a chain of field selections starts from.
fn select_root(e: &Expr) -> Option<&Var> {
    match e {
        Expr::Var(v) => Some(v),
        Expr::Select(base, _) => select_root(base),
        _ => None,
    }
}

impl Evaluator<'_> {
    /// `input.a.b...`: walks the input JSON and converts only the result.
    fn select_input(&mut self, base: &Expr, field: &str) -> Result<Val, EvalError> {
        let mut keys = vec![field];
        let mut e = base;
        while let Expr::Select(inner, f) = e {
            keys.push(f);
            e = inner;
        }
        let Some(mut json) = self.env.input_json() else {
            return rt("internal: no input");
        };
        for key in keys.iter().rev() {
            self.charge(1)?;
            json = match json {
                Json::Object(map) => match map.get(*key) {
                    Some(v) => v,
                    None => return rt(format!("no such key: '{key}'")),
                },
                Json::Null => return rt(format!("cannot select '{key}' of null")),
                Json::Bool(_) => return rt(format!("cannot select '{key}' of a bool")),
                Json::Number(_) => return rt(format!("cannot select '{key}' of a number")),
                Json::String(_) => return rt(format!("cannot select '{key}' of a string")),
                Json::Array(_) => return rt(format!("cannot select '{key}' of a list")),
            };
        }
        let v = Val::from_json(json);
        self.charge_read(&v)?;
        Ok(v)
    }

    /// Reading a value copies it: a step per 64 bytes of all it holds, so
    /// what an expression builds from its inputs is paid for by the byte.
    fn charge_read(&mut self, v: &Val) -> Result<(), EvalError> {
        self.charge(byte_size(v) / 64)
    }

    fn charge(&mut self, n: u64) -> Result<(), EvalError> {
        self.cost = self.cost.saturating_add(n);
        if self.cost > EVAL_COST_LIMIT {
            Err(EvalError::CostLimit)
        } else {
            Ok(())
        }
    }

    fn eval(&mut self, e: &Expr) -> Result<Val, EvalError> {
        self.charge(1)?;
        match e {
            Expr::Lit(v) => Ok(v.clone()),
            Expr::Var(var) => {
                let v = match var {
                    Var::Input => self.env.input(),
                    Var::Run => self.env.run(),
                    Var::Item => self.env.item(),
                    Var::Index => self.env.index(),
                    Var::Local(depth) => self.locals.get(*depth).cloned().unwrap_or(Val::Null),
                    Var::Node(id, field) => self.env.node(id, *field),
                };
                self.charge_read(&v)?;
                Ok(v)
            }
            Expr::Select(base, field)
                if matches!(select_root(base), Some(Var::Input))
                    && self.env.input_json().is_some() =>
            {
                self.select_input(base, field)
            }
            Expr::Select(base, field) => match self.eval(base)? {
                Val::Map(mut m) => match m.remove(field) {
                    Some(v) => Ok(v),
                    None => rt(format!("no such key: '{field}'")),
                },
                Val::Null => rt(format!("cannot select '{field}' of null")),
                other => rt(format!(
                    "cannot select '{field}' of a {}",
                    type_name(&other)
                )),
            },
            Expr::Has(base, field) => match self.eval(base)? {
                Val::Map(m) => Ok(Val::Bool(m.get(field).is_some_and(|v| *v != Val::Null))),
                _ => Ok(Val::Bool(false)),
            },
            Expr::Index(base, index) => {
                let base = self.eval(base)?;
                let index = self.eval(index)?;
                match (base, index) {
                    (Val::List(mut l), Val::Int(i)) => {
                        let len = l.len();
                        match usize::try_from(i).ok().filter(|i| *i < len) {
                            Some(i) => Ok(l.swap_remove(i)),
                            None => rt(format!("index {i} out of range (size {len})")),
                        }
                    }
                    (Val::List(mut l), Val::Double(d))
                        if d.fract() == 0.0 && d >= 0.0 && (d as usize) < l.len() =>
                    {
                        Ok(l.swap_remove(d as usize))
                    }
                    (Val::Map(mut m), key) => {
                        let k = map_key(&key)?;
                        match m.remove(&k) {
                            Some(v) => Ok(v),
                            None => rt(format!("no such key: '{k}'")),
                        }
                    }
                    (b, i) => rt(format!(
                        "cannot index a {} with a {}",
                        type_name(&b),
                        type_name(&i)
                    )),
                }
            }
            Expr::Unary(op, inner) => match (op, self.eval(inner)?) {
                (UnOp::Not, Val::Bool(b)) => Ok(Val::Bool(!b)),
                (UnOp::Neg, Val::Int(i)) => i
                    .checked_neg()
                    .map(Val::Int)
                    .ok_or(EvalError::Runtime("int overflow".into())),
                (UnOp::Neg, Val::Double(d)) => Ok(Val::Double(-d)),
                (UnOp::Neg, Val::Duration(d)) => Ok(Val::Duration(d.saturating_neg())),
                (_, v) => rt(format!(
                    "no matching overload for unary operator on a {}",
                    type_name(&v)
                )),
            },
            Expr::Binary(BinOp::And, l, r) => {
                // CEL's commutative logic: false && error = false.
                let left = self.eval(l);
                if matches!(left, Ok(Val::Bool(false))) {
                    return Ok(Val::Bool(false));
                }
                let right = self.eval(r);
                match (left, right) {
                    (_, Ok(Val::Bool(false))) => Ok(Val::Bool(false)),
                    (Ok(Val::Bool(true)), Ok(Val::Bool(true))) => Ok(Val::Bool(true)),
                    (Err(EvalError::CostLimit), _) | (_, Err(EvalError::CostLimit)) => {
                        Err(EvalError::CostLimit)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    _ => rt("no matching overload for '&&' on non-bool values"),
                }
            }
            Expr::Binary(BinOp::Or, l, r) => {
                let left = self.eval(l);
                if matches!(left, Ok(Val::Bool(true))) {
                    return Ok(Val::Bool(true));
                }
                let right = self.eval(r);
                match (left, right) {
                    (_, Ok(Val::Bool(true))) => Ok(Val::Bool(true)),
                    (Ok(Val::Bool(false)), Ok(Val::Bool(false))) => Ok(Val::Bool(false)),
                    (Err(EvalError::CostLimit), _) | (_, Err(EvalError::CostLimit)) => {
                        Err(EvalError::CostLimit)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    _ => rt("no matching overload for '||' on non-bool values"),
                }
            }
            Expr::Binary(op, l, r) => {
                let left = self.eval(l)?;
                let right = self.eval(r)?;
                self.binary(*op, left, right)
            }
            Expr::Cond(c, t, f) => match self.eval(c)? {
                Val::Bool(true) => self.eval(t),
                Val::Bool(false) => self.eval(f),
                other => rt(format!(
                    "the condition of '?:' must be a bool, not a {}",
                    type_name(&other)
                )),
            },
            Expr::List(items) => Ok(Val::List(
                items
                    .iter()
                    .map(|i| self.eval(i))
                    .collect::<Result<_, _>>()?,
            )),
            Expr::Map(entries) => {
                let mut m = BTreeMap::new();
                for (k, v) in entries {
                    let k = map_key(&self.eval(k)?)?;
                    let v = self.eval(v)?;
                    m.insert(k, v);
                }
                Ok(Val::Map(m))
            }
            Expr::Call(name, args) => {
                let args = args
                    .iter()
                    .map(|a| self.eval(a))
                    .collect::<Result<Vec<_>, _>>()?;
                self.call(name, args)
            }
            Expr::Comprehension { kind, range, body } => {
                let elems: Vec<Val> = match self.eval(range)? {
                    Val::List(l) => l,
                    Val::Map(m) => m.into_keys().map(Val::Str).collect(),
                    other => return rt(format!("cannot iterate over a {}", type_name(&other))),
                };
                let mut out = Vec::new();
                let mut count = 0usize;
                for elem in elems {
                    self.charge(1)?;
                    self.locals.push(elem.clone());
                    let r = self.eval(body);
                    self.locals.pop();
                    let r = r?;
                    match (kind, r) {
                        (Macro::Map, v) => out.push(v),
                        (Macro::Filter, Val::Bool(true)) => out.push(elem),
                        (Macro::All, Val::Bool(false)) => return Ok(Val::Bool(false)),
                        (Macro::Exists, Val::Bool(true)) => return Ok(Val::Bool(true)),
                        (Macro::ExistsOne, Val::Bool(true)) => count += 1,
                        (_, Val::Bool(_)) => {}
                        (_, v) => {
                            return rt(format!(
                                "a predicate returned a {}, not a bool",
                                type_name(&v)
                            ));
                        }
                    }
                }
                Ok(match kind {
                    Macro::Map | Macro::Filter => Val::List(out),
                    Macro::All => Val::Bool(true),
                    Macro::Exists => Val::Bool(false),
                    Macro::ExistsOne => Val::Bool(count == 1),
                })
            }
        }
    }

    fn binary(&mut self, op: BinOp, l: Val, r: Val) -> Result<Val, EvalError> {
        use Val::*;
        let overflow = || EvalError::Runtime("int overflow".into());
        let mismatch = |l: &Val, r: &Val| {
            EvalError::Runtime(format!(
                "no matching overload for '{}' applied to ({}, {})",
                op.symbol(),
                type_name(l),
                type_name(r)
            ))
        };
        Ok(match op {
            BinOp::Eq => Bool(val_eq(&l, &r)),
            BinOp::Ne => Bool(!val_eq(&l, &r)),
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let ord = compare(&l, &r).ok_or_else(|| mismatch(&l, &r))?;
                Bool(match op {
                    BinOp::Lt => ord.is_lt(),
                    BinOp::Le => ord.is_le(),
                    BinOp::Gt => ord.is_gt(),
                    _ => ord.is_ge(),
                })
            }
            BinOp::In => match &r {
                List(items) => {
                    self.charge(items.len() as u64)?;
                    Bool(items.iter().any(|i| val_eq(i, &l)))
                }
                Map(m) => Bool(m.contains_key(&map_key(&l)?)),
                _ => return Err(mismatch(&l, &r)),
            },
            BinOp::Add => match (l, r) {
                (Int(a), Int(b)) => Int(a.checked_add(b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a + b),
                (Int(a), Double(b)) => Double(a as f64 + b),
                (Double(a), Int(b)) => Double(a + b as f64),
                (Str(a), Str(b)) => {
                    self.charge((a.len() + b.len()) as u64 / 16)?;
                    Str(a + &b)
                }
                (List(mut a), List(b)) => {
                    self.charge((a.len() + b.len()) as u64)?;
                    a.extend(b);
                    List(a)
                }
                (Timestamp(a), Duration(b)) | (Duration(b), Timestamp(a)) => {
                    Timestamp(a.checked_add(b).ok_or_else(overflow)?)
                }
                (Duration(a), Duration(b)) => Duration(a.checked_add(b).ok_or_else(overflow)?),
                (l, r) => return Err(mismatch(&l, &r)),
            },
            BinOp::Sub => match (l, r) {
                (Int(a), Int(b)) => Int(a.checked_sub(b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a - b),
                (Int(a), Double(b)) => Double(a as f64 - b),
                (Double(a), Int(b)) => Double(a - b as f64),
                (Timestamp(a), Duration(b)) => Timestamp(a.checked_sub(b).ok_or_else(overflow)?),
                (Timestamp(a), Timestamp(b)) | (Duration(a), Duration(b)) => {
                    Duration(a.checked_sub(b).ok_or_else(overflow)?)
                }
                (l, r) => return Err(mismatch(&l, &r)),
            },
            BinOp::Mul => match (l, r) {
                (Int(a), Int(b)) => Int(a.checked_mul(b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a * b),
                (Int(a), Double(b)) => Double(a as f64 * b),
                (Double(a), Int(b)) => Double(a * b as f64),
                (l, r) => return Err(mismatch(&l, &r)),
            },
            BinOp::Div => match (l, r) {
                (Int(_), Int(0)) => return rt("division by zero"),
                (Int(a), Int(b)) => Int(a.checked_div(b).ok_or_else(overflow)?),
                (Double(a), Double(b)) => Double(a / b),
                (Int(a), Double(b)) => Double(a as f64 / b),
                (Double(a), Int(b)) => Double(a / b as f64),
                (l, r) => return Err(mismatch(&l, &r)),
            },
            BinOp::Rem => match (l, r) {
                (Int(_), Int(0)) => return rt("modulus by zero"),
                (Int(a), Int(b)) => Int(a.checked_rem(b).ok_or_else(overflow)?),
                (l, r) => return Err(mismatch(&l, &r)),
            },
            BinOp::And | BinOp::Or => return rt("internal: logical operator evaluated eagerly"),
        })
    }

    fn call(&mut self, name: &str, mut args: Vec<Val>) -> Result<Val, EvalError> {
        let first = if args.is_empty() {
            Val::Null
        } else {
            args.swap_remove(0)
        };
        let second = args.pop();
        let bad = |v: &Val| {
            EvalError::Runtime(format!(
                "no matching overload for {name}() applied to ({})",
                type_name(v)
            ))
        };
        Ok(match (name, first) {
            ("has_node", v) => Val::Bool(v != Val::Null),
            ("size", v @ (Val::Str(_) | Val::List(_) | Val::Map(_))) => match v {
                Val::Str(s) => Val::Int(s.chars().count() as i64),
                other => Val::Int(size_of(&other) as i64),
            },
            ("contains" | "startsWith" | "endsWith", Val::Str(s)) => {
                let Some(Val::Str(needle)) = second else {
                    return rt(format!("{name}() needs a string argument"));
                };
                self.charge(s.len() as u64 / 16)?;
                Val::Bool(match name {
                    "contains" => s.contains(&needle),
                    "startsWith" => s.starts_with(&needle),
                    _ => s.ends_with(&needle),
                })
            }
            ("lowerAscii", Val::Str(s)) => Val::Str(s.to_ascii_lowercase()),
            ("upperAscii", Val::Str(s)) => Val::Str(s.to_ascii_uppercase()),
            ("string", v) => Val::Str(match v {
                Val::Str(s) => s,
                Val::Null => "null".into(),
                Val::Bool(b) => b.to_string(),
                Val::Int(i) => i.to_string(),
                Val::Double(d) => d.to_string(),
                Val::Timestamp(t) => format_timestamp(t),
                Val::Duration(d) => format_duration(d),
                other @ (Val::List(_) | Val::Map(_)) => other.to_json().to_string(),
            }),
            ("int", Val::Int(i)) => Val::Int(i),
            ("int", Val::Double(d)) if d.is_finite() && d.abs() < 9.2e18 => {
                Val::Int(d.trunc() as i64)
            }
            ("int", Val::Str(s)) => Val::Int(
                s.trim()
                    .parse()
                    .map_err(|_| EvalError::Runtime(format!("cannot convert '{s}' to int")))?,
            ),
            ("int", Val::Timestamp(t)) => Val::Int(t / 1000),
            ("int", Val::Duration(d)) => Val::Int(d),
            ("double", Val::Int(i)) => Val::Double(i as f64),
            ("double", Val::Double(d)) => Val::Double(d),
            ("double", Val::Str(s)) => Val::Double(
                s.trim()
                    .parse()
                    .map_err(|_| EvalError::Runtime(format!("cannot convert '{s}' to double")))?,
            ),
            ("timestamp", Val::Str(s)) => {
                Val::Timestamp(parse_timestamp(&s).map_err(EvalError::Runtime)?)
            }
            ("timestamp", Val::Int(secs)) => {
                Val::Timestamp(secs.checked_mul(1000).ok_or_else(|| bad(&Val::Int(secs)))?)
            }
            ("timestamp", Val::Timestamp(t)) => Val::Timestamp(t),
            ("duration", Val::Str(s)) => {
                let negative = s.starts_with('-');
                let ms =
                    parse_duration(s.trim_start_matches('-')).map_err(EvalError::Runtime)? as i64;
                Val::Duration(if negative { -ms } else { ms })
            }
            ("duration", Val::Duration(d)) => Val::Duration(d),
            (_, v) => return Err(bad(&v)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestEnv;
    impl Env for TestEnv {
        fn input(&self) -> Val {
            Val::from_json(
                &serde_json::json!({"n": 3, "name": "ada", "items": [1, 2, 3], "big": 1.5}),
            )
        }
        fn run(&self) -> Val {
            Val::from_json(&serde_json::json!({"id": "r1", "workflow": "w", "version": 2}))
        }
        fn item(&self) -> Val {
            Val::Int(7)
        }
        fn index(&self) -> Val {
            Val::Int(0)
        }
        fn node(&self, id: &str, field: NodeField) -> Val {
            match (id, field) {
                ("a", NodeField::Output) => {
                    Val::from_json(&serde_json::json!({"ok": true, "n": 2}))
                }
                ("a", NodeField::Status) => Val::Str("COMPLETED".into()),
                _ => Val::Null,
            }
        }
    }

    fn known(id: &str) -> bool {
        id == "a" || id == "b"
    }

    fn run(src: &str) -> Result<Val, String> {
        let scope = Scope {
            node_ids: &known,
            map_element: true,
            input_schema: None,
        };
        let p = compile(src, &scope)?;
        p.eval(&TestEnv).map_err(|e| e.to_string())
    }

    #[test]
    fn expressions_evaluate_with_cel_semantics() {
        assert_eq!(run("input.n * 2 + 1"), Ok(Val::Int(7)));
        assert_eq!(run("input.name + '!'"), Ok(Val::Str("ada!".into())));
        assert_eq!(
            run("nodes.a.output.ok == true && nodes.a.status == 'COMPLETED'"),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            run("input.items.map(x, x * x)"),
            Ok(Val::List(vec![Val::Int(1), Val::Int(4), Val::Int(9)]))
        );
        assert_eq!(run("input.items.exists(x, x > 2)"), Ok(Val::Bool(true)));
        assert_eq!(
            run("size(input.items) == 3 ? 'three' : 'other'"),
            Ok(Val::Str("three".into()))
        );
        assert_eq!(
            run("has(input.n) && !has(input.missing)"),
            Ok(Val::Bool(true))
        );
        assert_eq!(run("2 in input.items"), Ok(Val::Bool(true)));
        assert_eq!(run("item + index"), Ok(Val::Int(7)));
        assert_eq!(run("input.big > 1"), Ok(Val::Bool(true)));
        assert_eq!(
            run("timestamp('2026-01-01T00:00:00Z') + duration('1h')"),
            Ok(Val::Timestamp(1_767_229_200_000))
        );
        assert_eq!(
            run("{'a': [1, {'b': 'c'}]}.a[1].b"),
            Ok(Val::Str("c".into()))
        );
        assert_eq!(run("false && (1 / 0 == 1)"), Ok(Val::Bool(false)));
        assert!(run("1 / 0").unwrap_err().contains("division by zero"));
        assert!(run("input.missing").unwrap_err().contains("no such key"));
    }

    #[test]
    fn compile_rejects_bad_scope_and_types() {
        assert!(
            run("foo.bar")
                .unwrap_err()
                .contains("undeclared reference to 'foo'")
        );
        assert!(
            run("nodes.zzz.output")
                .unwrap_err()
                .contains("unknown node 'zzz'")
        );
        assert!(
            run("nodes.a.result")
                .unwrap_err()
                .contains("only output, error and status")
        );
        assert!(
            run("1 + 'a'")
                .unwrap_err()
                .contains("no matching overload for '+' applied to (int, string)")
        );
        assert!(run("(1 == ").unwrap_err().starts_with("syntax error"));
        assert!(
            run("run.nope")
                .unwrap_err()
                .contains("run has no field 'nope'")
        );
        let scope = Scope {
            node_ids: &known,
            map_element: false,
            input_schema: None,
        };
        assert!(
            compile("item", &scope)
                .unwrap_err()
                .contains("only in scope in the input of a MAP")
        );
        let deep = format!("{}1{}", "(".repeat(40), ")".repeat(40));
        assert!(run(&deep).unwrap_err().contains("nests deeper than 32"));
        let long = "1 + ".repeat(1100) + "1";
        assert!(run(&long).unwrap_err().contains("longer than 4096"));
    }

    struct JsonEnv(Json);
    impl Env for JsonEnv {
        fn input(&self) -> Val {
            Val::from_json(&self.0)
        }
        fn input_json(&self) -> Option<&Json> {
            Some(&self.0)
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

    #[test]
    fn selecting_from_input_json_matches_the_full_conversion() {
        let env = JsonEnv(serde_json::json!({"a": {"b": [1, 2]}, "s": "x", "n": null}));
        let scope = Scope {
            node_ids: &known,
            map_element: false,
            input_schema: None,
        };
        let eval = |src: &str| {
            compile(src, &scope)
                .map_err(|e| e.to_string())
                .and_then(|p| p.eval(&env).map_err(|e| e.to_string()))
        };
        assert_eq!(eval("input.a.b[1]"), Ok(Val::Int(2)));
        assert_eq!(eval("size(input.a.b)"), Ok(Val::Int(2)));
        assert_eq!(
            eval("has(input.a.b) && !has(input.zz)"),
            Ok(Val::Bool(true))
        );
        assert_eq!(eval("input.zz"), Err("no such key: 'zz'".into()));
        assert_eq!(
            eval("input.s.t"),
            Err("cannot select 't' of a string".into())
        );
        assert_eq!(eval("input.n.t"), Err("cannot select 't' of null".into()));
    }

    #[test]
    fn copying_a_large_input_is_charged_by_its_bytes() {
        // the amplifier: 500 copies of a 1.9 MB input, cheap in steps
        let big = serde_json::json!({ "blob": "x".repeat(1_900_000) });
        let env = JsonEnv(big);
        let scope = Scope {
            node_ids: &known,
            map_element: false,
            input_schema: None,
        };
        let eval = |src: &str| compile(src, &scope).unwrap().eval(&env);
        let zeros = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        let amplifier = format!("{}.map(x, {}.map(y, input))", zeros(50), zeros(10));
        assert_eq!(eval(&amplifier), Err(EvalError::CostLimit));
        // a local holding the input costs the same to read
        assert_eq!(
            eval("[input].map(i, [i, i, i, i, i])"),
            Err(EvalError::CostLimit)
        );
        // reading it once or twice stays within the limit
        assert!(eval("input").is_ok());
        assert!(eval("[input, input]").is_ok());
    }

    #[test]
    fn runaway_expression_hits_the_cost_limit() {
        let src = "[1,2,3,4,5,6,7,8,9,10].map(a, [1,2,3,4,5,6,7,8,9,10].map(b, [1,2,3,4,5,6,7,8,9,10].map(c, [1,2,3,4,5,6,7,8,9,10].map(d, [1,2,3,4,5,6,7,8,9,10].map(e, a+b+c+d+e)))))";
        assert_eq!(run(src), Err(EvalError::CostLimit.to_string()));
    }
}

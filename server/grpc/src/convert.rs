//! JSON ↔ `google.protobuf.Value`, times, and page tokens.

use chrono::{DateTime, Utc};
use prost_types::{ListValue, Struct, Timestamp, Value, value::Kind};
use serde_json::{Map, Number, Value as Json};
use tonic::Status;

use crate::status::invalid_field;

/// Deepest nesting accepted in a payload (stack safety).
const MAX_DEPTH: usize = 128;

/// Why a payload cannot be stored as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unrepresentable {
    /// NaN or an infinity.
    NotANumber,
    /// Deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A NUL character in a string or key (Postgres cannot store it).
    Nul,
}

impl Unrepresentable {
    fn describe(self) -> String {
        match self {
            Unrepresentable::NotANumber => "holds NaN or an infinity, which JSON cannot".to_owned(),
            Unrepresentable::TooDeep => format!("is nested deeper than {MAX_DEPTH} levels"),
            Unrepresentable::Nul => "holds a NUL character in a string or key".to_owned(),
        }
    }
}

/// A protobuf Value as JSON; `field` names it in an error.
pub fn to_json(value: Option<Value>, field: &str) -> Result<Json, Status> {
    match value {
        None => Ok(Json::Null),
        Some(value) => value_to_json(value, 0).map_err(|why| invalid_field(field, why.describe())),
    }
}

fn value_to_json(value: Value, depth: usize) -> Result<Json, Unrepresentable> {
    if depth > MAX_DEPTH {
        return Err(Unrepresentable::TooDeep);
    }
    let Some(kind) = value.kind else {
        return Ok(Json::Null);
    };
    Ok(match kind {
        Kind::NullValue(_) => Json::Null,
        Kind::BoolValue(b) => Json::Bool(b),
        Kind::NumberValue(n) => number(n).ok_or(Unrepresentable::NotANumber)?,
        Kind::StringValue(s) => Json::String(without_nul(s)?),
        Kind::ListValue(list) => Json::Array(
            list.values
                .into_iter()
                .map(|v| value_to_json(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Kind::StructValue(object) => Json::Object(
            object
                .fields
                .into_iter()
                .map(|(k, v)| Ok((without_nul(k)?, value_to_json(v, depth + 1)?)))
                .collect::<Result<Map<_, _>, _>>()?,
        ),
    })
}

fn without_nul(text: String) -> Result<String, Unrepresentable> {
    if text.contains('\0') {
        return Err(Unrepresentable::Nul);
    }
    Ok(text)
}

/// Integral doubles become JSON integers, so `3` stays `3`, not `3.0`.
fn number(n: f64) -> Option<Json> {
    if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 {
        return Some(Json::Number(Number::from(n as i64)));
    }
    Number::from_f64(n).map(Json::Number)
}

/// JSON as a protobuf Value.
pub fn from_json(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(from_json).collect(),
        }),
        Json::Object(map) => Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// Optional JSON as an optional Value.
pub fn from_json_opt(json: Option<&Json>) -> Option<Value> {
    json.map(from_json)
}

/// A time as a protobuf Timestamp.
pub fn timestamp(time: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: time.timestamp(),
        nanos: i32::try_from(time.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf Timestamp as a time.
pub fn from_timestamp(ts: &Timestamp, field: &str) -> Result<DateTime<Utc>, Status> {
    let nanos =
        u32::try_from(ts.nanos).map_err(|_| invalid_field(field, "nanos must be 0..1e9"))?;
    DateTime::from_timestamp(ts.seconds, nanos).ok_or_else(|| invalid_field(field, "out of range"))
}

/// `page_size` with its default and ceiling.
pub fn page_size(requested: i32) -> Result<i64, Status> {
    match requested {
        0 => Ok(100),
        n if n < 0 => Err(invalid_field("page_size", "must not be negative")),
        n => Ok(i64::from(n.min(1000))),
    }
}

/// A `page_token` read back: None for the first page (empty), the key it
/// holds, or INVALID_ARGUMENT naming the field when `parse` does not
/// recognise it as one this server issued.
pub fn page_token<'t, T>(
    token: &'t str,
    parse: impl FnOnce(&'t str) -> Option<T>,
) -> Result<Option<T>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    parse(token)
        .map(Some)
        .ok_or_else(|| invalid_field("page_token", "not a token this server issued"))
}

/// A keyset page from rows fetched with one more than `limit`: the page,
/// and the next page's token (`token_of` its last row; empty when this is
/// the last page).
pub fn keyset_page<T>(
    mut rows: Vec<T>,
    limit: i64,
    token_of: impl FnOnce(&T) -> String,
) -> (Vec<T>, String) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = match (more, rows.last()) {
        (true, Some(last)) => token_of(last),
        _ => String::new(),
    };
    (rows, next)
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn an_empty_token_is_the_first_page_and_a_foreign_one_names_the_field() {
        assert_eq!(page_token("", |t| t.parse::<i64>().ok()).unwrap(), None);
        assert_eq!(
            page_token("42", |t| t.parse::<i64>().ok()).unwrap(),
            Some(42)
        );
        let refused = page_token("forty-two", |t| t.parse::<i64>().ok()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains("page_token"), "{refused:?}");
    }

    #[test]
    fn a_page_with_one_row_more_than_asked_has_a_next_token_from_its_last_row() {
        let (page, next) = keyset_page(vec![1, 2, 3], 2, |last| last.to_string());
        assert_eq!(page, [1, 2]);
        assert_eq!(next, "2");
    }

    #[test]
    fn the_last_page_has_no_next_token() {
        let (page, next) = keyset_page(vec![1, 2], 2, |last| last.to_string());
        assert_eq!(page, [1, 2]);
        assert_eq!(next, "");
        let (page, next) = keyset_page(Vec::<i32>::new(), 2, |last| last.to_string());
        assert!(page.is_empty());
        assert_eq!(next, "");
    }
}

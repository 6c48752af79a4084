//! How a run's history events are laid out in rows of `run_events`: the
//! events one write appends go into as few rows as fit (migration 0029),
//! each row's own columns being its first event and `more` the rest.
//! A row per event cost a heap tuple and a primary-key entry each, about a
//! fifth of a task's WAL in B1 (decision 0059).

use chrono::{DateTime, Utc};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::Value as Json;

/// A history entry to append.
#[derive(Debug, Clone)]
pub struct HistoryWrite {
    /// What happened.
    pub event_type: String,
    /// The node, if any.
    pub node_key: Option<String>,
    /// The attempt, if any.
    pub attempt: Option<i32>,
    /// Who caused it.
    pub actor: String,
    /// Details.
    pub details: Json,
}

/// A history entry as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRow {
    /// Position in the run's history, from 1.
    pub seq: i64,
    /// When.
    pub created_at: DateTime<Utc>,
    /// What happened.
    pub event_type: String,
    /// The node, if any.
    pub node_key: Option<String>,
    /// The attempt, if any.
    pub attempt: Option<i32>,
    /// Who caused it.
    pub actor: String,
    /// Details.
    pub details: Json,
}

/// At most this many events share a row, so a page of history starting
/// at `seq` reads back at most this many rows before it.
pub const EVENTS_PER_ROW: usize = 16;

/// A row takes no more events once its events' text passes this many
/// bytes: a row over about 2 KB is compressed by Postgres, at a cost in
/// CPU that the rows saved would not repay.
const ROW_BYTES: usize = 1_400;

/// The events of one row as written: the first event's offset in the
/// write (from 1), the first event, and the later ones as `more`.
pub(crate) struct RowWrite<'a> {
    pub ord: i64,
    pub first: &'a HistoryWrite,
    pub more: Option<sqlx::types::Json<Later<'a>>>,
}

/// The events of a row after its first, written as `more` straight from
/// the entries, without copying their details into a new value.
pub(crate) struct Later<'a>(pub &'a [HistoryWrite]);

impl Serialize for Later<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for e in self.0 {
            seq.serialize_element(&(&e.event_type, &e.node_key, e.attempt, &e.actor, &e.details))?;
        }
        seq.end()
    }
}

/// The rows `entries` are written in, in their order.
pub(crate) fn rows_of(entries: &[HistoryWrite]) -> Vec<RowWrite<'_>> {
    let mut rows = Vec::new();
    let mut start = 0;
    while start < entries.len() {
        let end = row_end(entries, start);
        let more = (end > start + 1).then(|| sqlx::types::Json(Later(&entries[start + 1..end])));
        rows.push(RowWrite {
            ord: i64::try_from(start + 1).unwrap_or(i64::MAX),
            first: &entries[start],
            more,
        });
        start = end;
    }
    rows
}

/// The rows of a write as the statement's parameters, one array per column.
#[derive(Default)]
pub(crate) struct HistoryColumns<'a> {
    pub ords: Vec<i64>,
    pub types: Vec<&'a str>,
    pub nodes: Vec<Option<&'a str>>,
    pub attempts: Vec<Option<i32>>,
    pub actors: Vec<&'a str>,
    pub details: Vec<&'a Json>,
    pub more: Vec<Option<sqlx::types::Json<Later<'a>>>>,
}

impl<'a> HistoryColumns<'a> {
    /// The columns of `entries`' rows.
    pub fn of(entries: &'a [HistoryWrite]) -> Self {
        let mut columns = Self::default();
        for row in rows_of(entries) {
            columns.push(row);
        }
        columns
    }

    /// Binds the columns in their order: offsets, types, nodes, attempts,
    /// actors, details, `more`.
    pub fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ords)
            .bind(&self.types)
            .bind(&self.nodes)
            .bind(&self.attempts)
            .bind(&self.actors)
            .bind(&self.details)
            .bind(&self.more)
    }

    /// Adds one row.
    pub fn push(&mut self, row: RowWrite<'a>) {
        self.ords.push(row.ord);
        self.types.push(&row.first.event_type);
        self.nodes.push(row.first.node_key.as_deref());
        self.attempts.push(row.first.attempt);
        self.actors.push(&row.first.actor);
        self.details.push(&row.first.details);
        self.more.push(row.more);
    }
}

/// Where the row starting at `start` ends (exclusive): after at least one
/// event, while the count and the text fit.
fn row_end(entries: &[HistoryWrite], start: usize) -> usize {
    let mut bytes = event_bytes(&entries[start], ROW_BYTES);
    let mut end = start + 1;
    while end < entries.len() && end - start < EVENTS_PER_ROW {
        bytes = bytes.saturating_add(event_bytes(&entries[end], ROW_BYTES - bytes.min(ROW_BYTES)));
        if bytes > ROW_BYTES {
            break;
        }
        end += 1;
    }
    end
}

/// About how many bytes an event takes as text, counted no further than
/// past `budget`.
fn event_bytes(event: &HistoryWrite, budget: usize) -> usize {
    let fixed = event.event_type.len()
        + event.node_key.as_ref().map_or(0, String::len)
        + event.actor.len()
        + 16;
    fixed.saturating_add(value_bytes(&event.details, budget.saturating_sub(fixed)))
}

/// About how many bytes `value` takes as JSON text (strings by their raw
/// length, every other scalar as 8), stopping once past `budget`. An
/// estimate is enough for a row's size; the exact count
/// (`composer_engine::json_text`) is in the engine, which the store does
/// not depend on.
fn value_bytes(value: &Json, budget: usize) -> usize {
    match value {
        Json::String(s) => s.len() + 2,
        Json::Array(items) => {
            let mut total = 2;
            for item in items {
                if total > budget {
                    break;
                }
                total += value_bytes(item, budget - total) + 1;
            }
            total
        }
        Json::Object(fields) => {
            let mut total = 2;
            for (key, item) in fields {
                if total > budget {
                    break;
                }
                total += key.len() + 4;
                total += value_bytes(item, budget.saturating_sub(total)) + 1;
            }
            total
        }
        _ => 8,
    }
}

/// A stored row's events: the row's own, then those in `more`, numbered on
/// from `seq`.
pub(crate) fn events_of(
    first: HistoryRow,
    more: Option<Json>,
) -> Result<Vec<HistoryRow>, RowError> {
    let (seq, created_at) = (first.seq, first.created_at);
    let later = match more {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items,
        Some(_) => return Err(RowError { seq }),
    };
    let mut events = Vec::with_capacity(later.len() + 1);
    events.push(first);
    for (offset, item) in (1_i64..).zip(later) {
        events.push(later_event(seq + offset, created_at, item).ok_or(RowError { seq })?);
    }
    Ok(events)
}

/// One element of `more`: `[event_type, node_key, attempt, actor, details]`.
fn later_event(seq: i64, created_at: DateTime<Utc>, item: Json) -> Option<HistoryRow> {
    let Json::Array(fields) = item else {
        return None;
    };
    let [event_type, node_key, attempt, actor, details]: [Json; 5] = fields.try_into().ok()?;
    Some(HistoryRow {
        seq,
        created_at,
        event_type: event_type.as_str()?.to_owned(),
        node_key: match node_key {
            Json::Null => None,
            Json::String(key) => Some(key),
            _ => return None,
        },
        attempt: match attempt {
            Json::Null => None,
            other => Some(i32::try_from(other.as_i64()?).ok()?),
        },
        actor: actor.as_str()?.to_owned(),
        details,
    })
}

/// A history row whose `more` is not in the shape this module writes.
#[derive(Debug, thiserror::Error)]
#[error("the history row at seq {seq} of its run holds events in an unknown shape")]
pub struct RowError {
    /// The row's first sequence number.
    pub seq: i64,
}

/// A written row's events as a read gives them back, the row dated
/// `created_at`.
#[cfg(test)]
fn read_back(row: &RowWrite<'_>, created_at: DateTime<Utc>) -> Result<Vec<HistoryRow>, RowError> {
    let first = HistoryRow {
        seq: row.ord,
        created_at,
        event_type: row.first.event_type.clone(),
        node_key: row.first.node_key.clone(),
        attempt: row.first.attempt,
        actor: row.first.actor.clone(),
        details: row.first.details.clone(),
    };
    let more = row
        .more
        .as_ref()
        .map(|more| serde_json::to_value(&more.0).expect("history serializes"));
    events_of(first, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, details: Json) -> HistoryWrite {
        HistoryWrite {
            event_type: kind.to_owned(),
            node_key: Some("a".to_owned()),
            attempt: Some(1),
            actor: "worker-1".to_owned(),
            details,
        }
    }

    fn stored(rows: &[RowWrite<'_>], created_at: DateTime<Utc>) -> Vec<HistoryRow> {
        rows.iter()
            .flat_map(|row| read_back(row, created_at).expect("rows_of writes a known shape"))
            .collect()
    }

    #[test]
    fn a_write_of_small_events_takes_one_row_per_sixteen() {
        let entries: Vec<_> = (0..40)
            .map(|i| event("task_scheduled", json!({"i": i})))
            .collect();
        let rows = rows_of(&entries);
        let sizes: Vec<usize> = rows
            .iter()
            .map(|r| 1 + r.more.as_ref().map_or(0, |more| more.0.0.len()))
            .collect();
        assert_eq!(sizes, [16, 16, 8]);
        assert_eq!(rows.iter().map(|r| r.ord).collect::<Vec<_>>(), [1, 17, 33]);
    }

    #[test]
    fn a_large_event_keeps_a_row_of_its_own() {
        let big = json!({"output": "x".repeat(5_000)});
        let entries = vec![
            event("task_completed", json!({})),
            event("task_completed", big.clone()),
            event("task_scheduled", json!({})),
        ];
        let rows = rows_of(&entries);
        assert_eq!(
            rows.len(),
            3,
            "neither the event before nor the one after joins it"
        );
        assert!(rows.iter().all(|row| row.more.is_none()));
        assert_eq!(rows[1].first.details, big);
    }

    #[test]
    fn every_event_reads_back_as_written_with_its_own_seq() {
        let entries = vec![
            event("task_completed", json!({"output": {"n": 1}})),
            HistoryWrite {
                node_key: None,
                attempt: None,
                ..event("run_completed", json!({"output": [1, "two", null]}))
            },
            event("task_scheduled", json!("plain")),
        ];
        let created_at = Utc::now();
        let read = stored(&rows_of(&entries), created_at);
        assert_eq!(read.len(), 3);
        for (seq, (read, written)) in (1_i64..).zip(read.iter().zip(&entries)) {
            assert_eq!(read.seq, seq);
            assert_eq!(read.event_type, written.event_type);
            assert_eq!(read.node_key, written.node_key);
            assert_eq!(read.attempt, written.attempt);
            assert_eq!(read.actor, written.actor);
            assert_eq!(read.details, written.details);
            assert_eq!(read.created_at, created_at);
        }
    }

    #[test]
    fn a_row_in_an_unknown_shape_is_an_error_not_a_panic() {
        let first = HistoryRow {
            seq: 7,
            created_at: Utc::now(),
            event_type: "x".into(),
            node_key: None,
            attempt: None,
            actor: "a".into(),
            details: json!({}),
        };
        for more in [
            json!({"a": 1}),
            json!([[1, 2]]),
            json!([["t", 5, 1, "a", {}]]),
        ] {
            let error = events_of(first.clone(), Some(more)).expect_err("unknown shape");
            assert_eq!(error.seq, 7);
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn details() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(Json::from),
            "[a-z\"\\\\é]{0,300}".prop_map(Json::String),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                prop::collection::btree_map("[a-z]{1,8}", inner, 0..6)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    fn event() -> impl Strategy<Value = HistoryWrite> {
        (
            "[a-z_]{1,20}",
            prop::option::of("[a-z\\[\\]0-9]{1,12}"),
            prop::option::of(any::<i32>()),
            "[a-z0-9-]{0,40}",
            details(),
        )
            .prop_map(
                |(event_type, node_key, attempt, actor, details)| HistoryWrite {
                    event_type,
                    node_key,
                    attempt,
                    actor,
                    details,
                },
            )
    }

    proptest! {
        /// Whatever a write appends reads back whole, in order, each event
        /// with its own number, from rows of at most EVENTS_PER_ROW events.
        #[test]
        fn rows_hold_every_event_in_order(entries in prop::collection::vec(event(), 0..60)) {
            let rows = rows_of(&entries);
            let mut next = 1;
            let mut read = Vec::new();
            for row in &rows {
                prop_assert_eq!(row.ord, next);
                let events = read_back(row, DateTime::<Utc>::UNIX_EPOCH).unwrap();
                prop_assert!(!events.is_empty() && events.len() <= EVENTS_PER_ROW);
                next += i64::try_from(events.len()).unwrap();
                read.extend(events);
            }
            prop_assert_eq!(read.len(), entries.len());
            for (seq, (r, w)) in (1_i64..).zip(read.iter().zip(&entries)) {
                prop_assert_eq!(r.seq, seq);
                prop_assert_eq!(&r.event_type, &w.event_type);
                prop_assert_eq!(&r.node_key, &w.node_key);
                prop_assert_eq!(r.attempt, w.attempt);
                prop_assert_eq!(&r.actor, &w.actor);
                prop_assert_eq!(&r.details, &w.details);
            }
        }
    }
}

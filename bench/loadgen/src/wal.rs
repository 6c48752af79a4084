//! Where a row's WAL bytes go: `pg_waldump`'s listing of the measured
//! window, by record type and by relation (each record's first block
//! reference, named through `pg_filenode_relation`).

use std::{collections::HashMap, path::Path};

use anyhow::{Context, Result, bail};
use sqlx::PgPool;

/// WAL of one window, per task.
#[derive(Debug, Clone, Default)]
pub struct WalBreakdown {
    /// By record type (`Heap/INSERT`, `Btree/INSERT_LEAF`, ...), largest
    /// first: records, record bytes and full-page-image bytes per task.
    pub by_record: Vec<RecordShare>,
    /// By relation (table or index; records without a block by resource
    /// manager, as `(Transaction)`), largest first: bytes per task, and
    /// the record types making them up, largest first.
    pub by_relation: Vec<RelationShare>,
    /// How the window's writing transactions were grouped.
    pub shapes: TransactionShapes,
}

/// The median size of each kind of writing transaction in a window, read
/// from which rows each transaction id wrote: what the group commit and
/// the lease batches made of the load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TransactionShapes {
    /// Runs inserted by a transaction that updates none (StartRun groups).
    pub starts: Median,
    /// Runs written by a transaction that updates one or more (event
    /// groups: each run's row is written once per event).
    pub events: Median,
    /// Task rows updated by a transaction that writes no run (lease
    /// batches).
    pub leases: Median,
    /// Where the armed tasks were leased: as they were armed (inserted
    /// LEASED), by an update in the transaction that armed them, or in a
    /// lease batch of its own; shares of the tasks armed.
    pub leases_at: LeasePlaces,
    /// The share of the runs inserted that were inserted by an event
    /// group (the group commit takes starts and reports together).
    pub starts_in_events: f64,
}

/// Shares of the armed tasks by where they were leased.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LeasePlaces {
    pub at_arm: f64,
    pub after_arm: f64,
    pub apart: f64,
}

/// A median over transactions, and how many there were.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Median {
    pub median: f64,
    pub transactions: usize,
}

/// One relation's share of the window.
#[derive(Debug, Clone)]
pub struct RelationShare {
    pub relation: String,
    pub bytes_per_task: f64,
    /// (record type, records per task, bytes per task), largest first.
    pub records: Vec<(String, f64, f64)>,
}

/// One record type's share of the window.
#[derive(Debug, Clone)]
pub struct RecordShare {
    pub record_type: String,
    pub records_per_task: f64,
    pub record_bytes_per_task: f64,
    pub fpi_bytes_per_task: f64,
}

/// The WAL between `start` and `end` (LSNs as Postgres prints them) of the
/// cluster in `data_dir`, divided by `tasks`; relations are named in
/// `db`'s database. One pass of pg_waldump: its listing gives each record's
/// type, place and lengths (the full-page images are its total less its
/// record length, as `--stats` counts them).
pub async fn breakdown(
    db: &PgPool,
    waldump: &Path,
    data_dir: &Path,
    (start, end): (&str, &str),
    tasks: f64,
) -> Result<WalBreakdown> {
    let listing = waldump_listing(waldump, &data_dir.join("pg_wal"), start, end).await?;
    let records: Vec<Record> = listing.lines().filter_map(parse_record).collect();
    // filenode -> relation; several filenodes of one name (a table
    // rewritten) make one relation
    let mut names: HashMap<&str, String> = HashMap::new();
    for record in &records {
        if !names.contains_key(record.place.as_str()) {
            let name = match record.place.parse::<i64>() {
                Ok(filenode) => relation_name(db, filenode).await,
                Err(_) => record.place.clone(),
            };
            names.insert(&record.place, name);
        }
    }
    // record type -> (records, record bytes, image bytes)
    let mut by_kind: HashMap<&str, (f64, f64, f64)> = HashMap::new();
    // relation -> record type -> (records, bytes)
    let mut by_name: HashMap<&str, HashMap<&str, (f64, f64)>> = HashMap::new();
    for record in &records {
        let kind = by_kind.entry(&record.kind).or_default();
        kind.0 += 1.0;
        kind.1 += record.record_bytes;
        kind.2 += record.total_bytes - record.record_bytes;
        let name = names[record.place.as_str()].as_str();
        let share = by_name
            .entry(name)
            .or_default()
            .entry(&record.kind)
            .or_default();
        share.0 += 1.0;
        share.1 += record.total_bytes;
    }
    let mut by_record: Vec<RecordShare> = by_kind
        .into_iter()
        .map(|(kind, (count, record, image))| RecordShare {
            record_type: kind.to_owned(),
            records_per_task: count / tasks,
            record_bytes_per_task: record / tasks,
            fpi_bytes_per_task: image / tasks,
        })
        .collect();
    by_record.sort_by(|a, b| {
        (b.record_bytes_per_task + b.fpi_bytes_per_task)
            .total_cmp(&(a.record_bytes_per_task + a.fpi_bytes_per_task))
    });
    let mut by_relation: Vec<RelationShare> = by_name
        .into_iter()
        .map(|(relation, kinds)| {
            let mut records: Vec<(String, f64, f64)> = kinds
                .into_iter()
                .map(|(kind, (count, bytes))| (kind.to_owned(), count / tasks, bytes / tasks))
                .collect();
            records.sort_by(|a, b| b.2.total_cmp(&a.2));
            RelationShare {
                relation: relation.to_owned(),
                bytes_per_task: records.iter().map(|r| r.2).sum(),
                records,
            }
        })
        .collect();
    by_relation.sort_by(|a, b| b.bytes_per_task.total_cmp(&a.bytes_per_task));
    let shapes = shapes(
        records
            .iter()
            .map(|r| (r.xid, names[r.place.as_str()].as_str(), r.kind.as_str())),
    );
    Ok(WalBreakdown {
        by_record,
        by_relation,
        shapes,
    })
}

/// Rows one transaction wrote.
#[derive(Default)]
struct Written {
    runs_inserted: u32,
    runs_updated: u32,
    tasks_inserted: u32,
    tasks_updated: u32,
}

/// The shapes of the transactions whose records are `(xid, relation,
/// record type)`. In an event group each run updated is one event, which
/// finished one task: the group's other task updates are leases of tasks
/// it armed.
fn shapes<'a>(records: impl Iterator<Item = (u64, &'a str, &'a str)>) -> TransactionShapes {
    let mut writes: HashMap<u64, Written> = HashMap::new();
    for (xid, relation, kind) in records {
        let inserted = kind.starts_with("Heap/INSERT");
        let updated = kind.starts_with("Heap/UPDATE") || kind.starts_with("Heap/HOT_UPDATE");
        if xid == 0 || !(inserted || updated) {
            continue;
        }
        let rows = writes.entry(xid).or_default();
        match (relation, inserted) {
            ("runs", true) => rows.runs_inserted += 1,
            ("runs", false) => rows.runs_updated += 1,
            ("tasks", true) => rows.tasks_inserted += 1,
            ("tasks", false) => rows.tasks_updated += 1,
            _ => {}
        }
    }
    let (mut starts, mut events, mut leases) = (Vec::new(), Vec::new(), Vec::new());
    // tasks armed; leased by an update where armed; leased apart
    let (mut armed, mut after_arm, mut apart) = (0.0, 0.0, 0.0);
    // runs inserted by event groups, by start groups
    let (mut started_in_events, mut started_apart) = (0.0, 0.0);
    for rows in writes.into_values() {
        let runs = f64::from(rows.runs_inserted + rows.runs_updated);
        if rows.runs_updated > 0 {
            events.push(runs);
            started_in_events += f64::from(rows.runs_inserted);
            armed += f64::from(rows.tasks_inserted);
            after_arm += f64::from(rows.tasks_updated.saturating_sub(rows.runs_updated));
        } else if rows.runs_inserted > 0 {
            starts.push(runs);
            started_apart += runs;
            armed += f64::from(rows.tasks_inserted);
            after_arm += f64::from(rows.tasks_updated);
        } else if rows.tasks_updated > 0 {
            leases.push(f64::from(rows.tasks_updated));
            apart += f64::from(rows.tasks_updated);
        }
    }
    let share = |part: f64, whole: f64| if whole > 0.0 { part / whole } else { 0.0 };
    TransactionShapes {
        starts: median(starts),
        events: median(events),
        leases: median(leases),
        leases_at: LeasePlaces {
            at_arm: share((armed - after_arm - apart).max(0.0), armed),
            after_arm: share(after_arm, armed),
            apart: share(apart, armed),
        },
        starts_in_events: share(started_in_events, started_in_events + started_apart),
    }
}

fn median(mut values: Vec<f64>) -> Median {
    values.sort_by(f64::total_cmp);
    let transactions = values.len();
    let median = match transactions {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    };
    Median {
        median,
        transactions,
    }
}

async fn waldump_listing(waldump: &Path, wal_dir: &Path, start: &str, end: &str) -> Result<String> {
    let out = tokio::process::Command::new(waldump)
        .arg("-p")
        .arg(wal_dir)
        .args(["-s", start, "-e", end])
        .output()
        .await
        .with_context(|| format!("run {}", waldump.display()))?;
    // a record cut by the end LSN makes pg_waldump complain on stderr and
    // exit 1 after printing everything before it
    if out.stdout.is_empty() {
        bail!(
            "pg_waldump printed nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One record of pg_waldump's listing.
#[derive(Debug, PartialEq)]
struct Record {
    /// The transaction that wrote it (0: none).
    xid: u64,
    /// Its first block's filenode, or `(rmgr)` for a record without one.
    place: String,
    /// `Heap/INSERT`, as `--stats=record` names it.
    kind: String,
    /// Its length without full-page images.
    record_bytes: f64,
    /// Its length, full-page images included.
    total_bytes: f64,
}

/// A record line of pg_waldump's listing.
fn parse_record(line: &str) -> Option<Record> {
    let rmgr = line.strip_prefix("rmgr: ")?.split_whitespace().next()?;
    let kind = line
        .split_once("desc: ")
        .and_then(|(_, desc)| desc.split_whitespace().next())
        .map_or_else(String::new, |word| word.trim_end_matches(':').to_owned());
    // `len (rec/tot):     79/  1211,`
    let (_, after) = line.split_once("len (rec/tot):")?;
    let (record, total) = after.split(',').next()?.split_once('/')?;
    let xid = line
        .split_once("tx:")?
        .1
        .split(',')
        .next()?
        .trim()
        .parse()
        .ok()?;
    let place = match line.split_once("blkref #0: rel ") {
        Some((_, rel)) => rel
            .split_whitespace()
            .next()?
            .rsplit('/')
            .next()?
            .to_owned(),
        None => format!("({rmgr})"),
    };
    Some(Record {
        xid,
        place,
        kind: format!("{rmgr}/{kind}"),
        record_bytes: record.trim().parse().ok()?,
        total_bytes: total.trim().parse().ok()?,
    })
}

/// The relation a filenode of `db`'s database belongs to, or the
/// filenode itself (another database's, or one dropped since).
async fn relation_name(db: &PgPool, filenode: i64) -> String {
    let name: Option<String> =
        sqlx::query_scalar("SELECT pg_filenode_relation(0, $1::bigint::oid)::regclass::text")
            .bind(filenode)
            .fetch_one(db)
            .await
            .ok()
            .flatten();
    name.unwrap_or_else(|| format!("filenode {filenode}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_placed_by_its_first_block_or_its_manager() {
        let heap = "rmgr: Heap        len (rec/tot):     79/  1211, tx:      1234, lsn: 0/016D2A48, prev 0/016D2A10, desc: INSERT off 3 flags 0x00, blkref #0: rel 1663/16384/16401 blk 5 FPW";
        assert_eq!(
            parse_record(heap),
            Some(Record {
                xid: 1234,
                place: "16401".to_owned(),
                kind: "Heap/INSERT".to_owned(),
                record_bytes: 79.0,
                total_bytes: 1211.0
            })
        );
        let commit = "rmgr: Transaction len (rec/tot):     34/    34, tx:      1234, lsn: 0/016D2B00, prev 0/016D2A48, desc: COMMIT 2026-12-06 23:00:00.000000 UTC";
        assert_eq!(
            parse_record(commit),
            Some(Record {
                xid: 1234,
                place: "(Transaction)".to_owned(),
                kind: "Transaction/COMMIT".to_owned(),
                record_bytes: 34.0,
                total_bytes: 34.0
            })
        );
        assert_eq!(parse_record("pg_waldump: error: error in WAL record"), None);
    }

    #[test]
    fn transactions_are_sized_by_the_runs_and_tasks_they_write() {
        let records = [
            // a start group of two runs, their tasks inserted leased
            (10, "runs", "Heap/INSERT"),
            (10, "runs", "Heap/INSERT+INIT"),
            (10, "tasks", "Heap/INSERT"),
            (10, "tasks", "Heap/INSERT"),
            // an event group of three runs, one started in it: two tasks
            // finished, three armed, one of them leased by an update
            (11, "runs", "Heap/LOCK"),
            (11, "runs", "Heap/HOT_UPDATE"),
            (11, "runs", "Heap/UPDATE"),
            (11, "runs", "Heap/INSERT"),
            (11, "tasks", "Heap/UPDATE"),
            (11, "tasks", "Heap/UPDATE"),
            (11, "tasks", "Heap/UPDATE"),
            (11, "tasks", "Heap/INSERT"),
            (11, "tasks", "Heap/INSERT"),
            (11, "tasks", "Heap/INSERT"),
            // lease batches of one and of three tasks
            (12, "tasks", "Heap/UPDATE"),
            (13, "tasks", "Heap/UPDATE"),
            (13, "tasks", "Heap/HOT_UPDATE"),
            (13, "tasks", "Heap/UPDATE+INIT"),
            // neither: an outbox row, and a record of no transaction
            (14, "outbox", "Heap/INSERT"),
            (0, "runs", "Heap/INSERT"),
        ];
        let shapes = shapes(records.into_iter());
        assert_eq!(
            shapes.starts,
            Median {
                median: 2.0,
                transactions: 1
            }
        );
        assert_eq!(
            shapes.events,
            Median {
                median: 3.0,
                transactions: 1
            }
        );
        assert_eq!(
            shapes.leases,
            Median {
                median: 2.0,
                transactions: 2
            }
        );
        // five armed: one leased by an update, four in batches, none as armed
        assert_eq!(
            shapes.leases_at,
            LeasePlaces {
                at_arm: 0.0,
                after_arm: 0.2,
                apart: 0.8
            }
        );
        assert_eq!(shapes.starts_in_events, 1.0 / 3.0);
    }
}

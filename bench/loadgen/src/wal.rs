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
    Ok(WalBreakdown {
        by_record,
        by_relation,
    })
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
                place: "(Transaction)".to_owned(),
                kind: "Transaction/COMMIT".to_owned(),
                record_bytes: 34.0,
                total_bytes: 34.0
            })
        );
        assert_eq!(parse_record("pg_waldump: error: error in WAL record"), None);
    }
}

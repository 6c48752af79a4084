//! Where a row's WAL bytes go: `pg_waldump` over the measured window, by
//! record type (its `--stats=record` table) and by relation (each record's
//! first block reference, named through `pg_filenode_relation`).

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
/// `db`'s database.
pub async fn breakdown(
    db: &PgPool,
    waldump: &Path,
    data_dir: &Path,
    (start, end): (&str, &str),
    tasks: f64,
) -> Result<WalBreakdown> {
    let wal_dir = data_dir.join("pg_wal");
    let stats = waldump_output(waldump, &wal_dir, start, end, &["--stats=record"]).await?;
    let mut by_record: Vec<RecordShare> = stats
        .lines()
        .filter_map(record_line)
        .map(|(record_type, n, record, fpi)| RecordShare {
            record_type,
            records_per_task: n / tasks,
            record_bytes_per_task: record / tasks,
            fpi_bytes_per_task: fpi / tasks,
        })
        .collect();
    by_record.sort_by(|a, b| {
        (b.record_bytes_per_task + b.fpi_bytes_per_task)
            .total_cmp(&(a.record_bytes_per_task + a.fpi_bytes_per_task))
    });
    let records = waldump_output(waldump, &wal_dir, start, end, &[]).await?;
    // (place, record type) -> (records, bytes)
    let mut by_place: HashMap<(String, String), (f64, f64)> = HashMap::new();
    for line in records.lines() {
        if let Some(record) = record_place(line) {
            let entry = by_place.entry((record.place, record.kind)).or_default();
            entry.0 += 1.0;
            entry.1 += record.bytes;
        }
    }
    let mut names: HashMap<String, String> = HashMap::new();
    // several filenodes of one name (a table rewritten) make one relation
    let mut merged: HashMap<String, HashMap<String, (f64, f64)>> = HashMap::new();
    for ((place, kind), (count, bytes)) in by_place {
        let name = match names.get(&place) {
            Some(name) => name.clone(),
            None => {
                let name = match place.parse::<i64>() {
                    Ok(filenode) => relation_name(db, filenode).await,
                    Err(_) => place.clone(),
                };
                names.insert(place, name.clone());
                name
            }
        };
        let entry = merged.entry(name).or_default().entry(kind).or_default();
        entry.0 += count;
        entry.1 += bytes;
    }
    let mut by_relation: Vec<RelationShare> = merged
        .into_iter()
        .map(|(relation, kinds)| {
            let mut records: Vec<(String, f64, f64)> = kinds
                .into_iter()
                .map(|(kind, (count, bytes))| (kind, count / tasks, bytes / tasks))
                .collect();
            records.sort_by(|a, b| b.2.total_cmp(&a.2));
            RelationShare {
                relation,
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

async fn waldump_output(
    waldump: &Path,
    wal_dir: &Path,
    start: &str,
    end: &str,
    extra: &[&str],
) -> Result<String> {
    let out = tokio::process::Command::new(waldump)
        .arg("-p")
        .arg(wal_dir)
        .args(["-s", start, "-e", end])
        .args(extra)
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

/// A row of `--stats=record`: its type, records, record bytes, FPI bytes.
fn record_line(line: &str) -> Option<(String, f64, f64, f64)> {
    // `Heap/INSERT   12 ( 1.00)   540 ( 2.00)   0 ( 0.00)   540 ( 2.00)`:
    // the parenthesised percentages dropped, five fields are left
    let mut plain = String::with_capacity(line.len());
    let mut depth = 0;
    for c in line.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let fields: Vec<&str> = plain.split_whitespace().collect();
    let [name, n, record, fpi, _combined] = fields.as_slice() else {
        return None;
    };
    if !name.contains('/') {
        return None;
    }
    Some((
        (*name).to_owned(),
        n.parse().ok()?,
        record.parse().ok()?,
        fpi.parse().ok()?,
    ))
}

/// One record of pg_waldump's listing.
#[derive(Debug, PartialEq)]
struct Record {
    /// Its first block's filenode, or `(rmgr)` for a record without one.
    place: String,
    /// `Heap/INSERT`, as `--stats=record` names it.
    kind: String,
    /// Its total length, full-page images included.
    bytes: f64,
}

/// A record line of pg_waldump's listing.
fn record_place(line: &str) -> Option<Record> {
    let rmgr = line.strip_prefix("rmgr: ")?.split_whitespace().next()?;
    let kind = line
        .split_once("desc: ")
        .and_then(|(_, desc)| desc.split_whitespace().next())
        .map_or_else(String::new, |word| word.trim_end_matches(':').to_owned());
    let (_, after) = line.split_once("len (rec/tot):")?;
    let total: f64 = after
        .split(',')
        .next()?
        .split('/')
        .nth(1)?
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
        place,
        kind: format!("{rmgr}/{kind}"),
        bytes: total,
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
    fn a_stats_row_gives_its_counts_and_a_header_none() {
        let row = "Heap/INSERT                                 1234 ( 12.34)               56789 ( 45.67)                 4096 (  1.00)                60885 ( 40.00)";
        assert_eq!(
            record_line(row),
            Some(("Heap/INSERT".to_owned(), 1234.0, 56789.0, 4096.0))
        );
        assert_eq!(record_line("Type    N    (%)   Record size   (%)"), None);
        assert_eq!(record_line("----    -    ---   -----------   ---"), None);
    }

    #[test]
    fn a_record_is_placed_by_its_first_block_or_its_manager() {
        let heap = "rmgr: Heap        len (rec/tot):     79/  1211, tx:      1234, lsn: 0/016D2A48, prev 0/016D2A10, desc: INSERT off 3 flags 0x00, blkref #0: rel 1663/16384/16401 blk 5 FPW";
        assert_eq!(
            record_place(heap),
            Some(Record {
                place: "16401".to_owned(),
                kind: "Heap/INSERT".to_owned(),
                bytes: 1211.0
            })
        );
        let commit = "rmgr: Transaction len (rec/tot):     34/    34, tx:      1234, lsn: 0/016D2B00, prev 0/016D2A48, desc: COMMIT 2026-12-06 23:00:00.000000 UTC";
        assert_eq!(
            record_place(commit),
            Some(Record {
                place: "(Transaction)".to_owned(),
                kind: "Transaction/COMMIT".to_owned(),
                bytes: 34.0
            })
        );
    }
}

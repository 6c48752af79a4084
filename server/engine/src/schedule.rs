//! Schedules as pure computation: when a schedule fires, which fires a
//! scheduler that was away must still start, and each fire's jitter.
//!
//! Nothing here reads a clock: every function takes `now` or the time to
//! start from, so the scheduler in the coordinator and the tests (with a
//! fixed clock) compute the same fire times. Cron expressions are parsed by
//! `croner`, time zones come from `chrono-tz` (decision 0016); the search
//! for the next fire is [`cron`]'s, bounded in steps (decision 0036).
//!
//! Daylight saving time follows `croner`'s documented rules:
//! - a fixed-time fire (`30 2 * * *`) whose local time falls in a spring
//!   forward gap fires at the first time after the gap (03:00 in
//!   Europe/Berlin), and once on that day;
//! - a wildcard or step expression (`0 * * * *`, `*/5 * * * *`) skips
//!   the times the gap removes;
//! - in the repeated hour of a fall back, every wall time matches once, at
//!   its first occurrence: `30 2 * * *` fires at 02:30 CEST and not at
//!   02:30 CET, and `0 * * * *` fires at 02:00 CEST and next at 03:00 CET.
//!   croner's `find_next_occurrence` answers so; its iterator would fire
//!   wildcard expressions in both copies, but that needs state carried
//!   from one fire to the next, and a schedule computes its next fire from
//!   the last fire time alone, so every server agrees.

pub mod cron;

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

pub use self::cron::{CronTable, MAX_SEARCH_STEPS, SEARCH_YEARS, Search};
use crate::compile::splitmix64;

/// The shortest interval of an interval schedule.
pub const MIN_INTERVAL_SECS: i64 = 1;
/// The longest interval of an interval schedule (a year and a day).
pub const MAX_INTERVAL_SECS: i64 = 366 * 24 * 3600;
/// The longest catch-up window.
pub const MAX_CATCH_UP_WINDOW_MS: i64 = 7 * 24 * 3600 * 1000;
/// The catch-up window of a schedule that names none.
pub const DEFAULT_CATCH_UP_WINDOW_MS: i64 = 60 * 1000;
/// The longest jitter (it must also stay below the gap between fires).
pub const MAX_JITTER_MS: i64 = 24 * 3600 * 1000;
/// Longest cron expression, in bytes.
pub const MAX_CRON_BYTES: usize = 256;
/// Fire times older than the catch-up window counted one by one in one
/// pass; past this many, the rest of the gap is counted only for interval
/// schedules (whose count is arithmetic), and a cron schedule's count
/// stops here for that gap.
pub const MAX_MISSED_STEPS: u64 = 10_000;

/// When a schedule fires, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScheduleSpec {
    /// A cron expression (5 fields, or 6 with seconds first) read in an
    /// IANA time zone.
    Cron {
        /// The expression.
        expression: String,
        /// The IANA time zone (`UTC` when the caller named none).
        time_zone: String,
    },
    /// Every `every_secs` seconds from `anchor` (the schedule's creation
    /// or last spec change, whole seconds), so every server computes the
    /// same fire times.
    Interval {
        /// The interval, in seconds.
        every_secs: i64,
        /// The first fire time; the others follow it by whole intervals.
        anchor: DateTime<Utc>,
    },
}

/// A problem with a spec, naming the request field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// `spec.cron`, `spec.time_zone` or `spec.interval`.
    pub field: &'static str,
    /// What is wrong.
    pub description: String,
}

fn problem(field: &'static str, description: impl Into<String>) -> SpecProblem {
    SpecProblem {
        field,
        description: description.into(),
    }
}

/// A checked spec that computes fire times.
#[derive(Debug, Clone)]
pub enum Timetable {
    /// A parsed cron expression in its zone.
    Cron {
        /// The expression, ready to search.
        cron: Box<CronTable>,
        /// The zone.
        zone: Tz,
    },
    /// A fixed interval.
    Interval {
        /// The interval.
        every: Duration,
        /// The first fire time.
        anchor: DateTime<Utc>,
    },
}

impl Timetable {
    /// Checks `spec`: a cron expression croner parses (seconds optional,
    /// no year field) that fires at least once more, a known IANA zone, an
    /// interval of 1 s to 366 days.
    pub fn new(spec: &ScheduleSpec) -> Result<Timetable, SpecProblem> {
        match spec {
            ScheduleSpec::Cron {
                expression,
                time_zone,
            } => {
                if expression.len() > MAX_CRON_BYTES {
                    return Err(problem(
                        "spec.cron",
                        format!(
                            "is {} bytes; at most {MAX_CRON_BYTES} are allowed",
                            expression.len()
                        ),
                    ));
                }
                let zone: Tz = time_zone.parse().map_err(|_| {
                    problem(
                        "spec.time_zone",
                        "is not an IANA time zone (like UTC or Europe/Berlin)",
                    )
                })?;
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .year(Year::Disallowed)
                    .build()
                    .parse(expression)
                    .map_err(|error| {
                        problem(
                            "spec.cron",
                            format!(
                                "{error} (5 fields: minute hour day-of-month month day-of-week, \
                                 or 6 with seconds first)"
                            ),
                        )
                    })?;
                Ok(Timetable::Cron {
                    cron: Box::new(CronTable::new(cron)),
                    zone,
                })
            }
            ScheduleSpec::Interval { every_secs, anchor } => {
                if !(MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(every_secs) {
                    return Err(problem(
                        "spec.interval",
                        format!(
                            "must be {MIN_INTERVAL_SECS} s to {MAX_INTERVAL_SECS} s (366 days), \
                             in whole seconds"
                        ),
                    ));
                }
                Ok(Timetable::Interval {
                    every: Duration::seconds(*every_secs),
                    anchor: *anchor,
                })
            }
        }
    }

    /// The first fire time strictly after `t`; None when there is none
    /// (a cron expression with no fire within [`SEARCH_YEARS`] of `t`,
    /// which therefore never fires again).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Timetable::Cron { cron, zone } => cron.next_after(*zone, t),
            Timetable::Interval { every, anchor } => {
                if t < *anchor {
                    return Some(*anchor);
                }
                let every_ms = every.num_milliseconds();
                let elapsed = (t - *anchor).num_milliseconds();
                let steps = elapsed / every_ms + 1;
                anchor.checked_add_signed(Duration::milliseconds(steps.checked_mul(every_ms)?))
            }
        }
    }

    /// The first fire time at or after `t`.
    pub fn next_at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_after(t - Duration::nanoseconds(1))
    }

    /// The next `n` fire times after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut times = Vec::with_capacity(n);
        let mut at = t;
        while times.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    times.push(next);
                    at = next;
                }
                None => break,
            }
        }
        times
    }

    /// The shortest gap between the next `samples` fires after `t` (None:
    /// fewer than two fires).
    pub fn shortest_gap(&self, t: DateTime<Utc>, samples: usize) -> Option<Duration> {
        match self {
            Timetable::Interval { every, .. } => Some(*every),
            Timetable::Cron { .. } => self
                .upcoming(t, samples)
                .windows(2)
                .map(|pair| pair[1] - pair[0])
                .min(),
        }
    }

    /// How many fire times lie in `[from, until)` when that is arithmetic
    /// (interval schedules); None for cron.
    fn count_between(&self, from: DateTime<Utc>, until: DateTime<Utc>) -> Option<u64> {
        match self {
            Timetable::Interval { every, .. } => {
                if until <= from {
                    return Some(0);
                }
                let span = (until - from).num_milliseconds();
                let every = every.num_milliseconds();
                // `from` is a fire time: it, and one per whole interval before `until`
                Some(u64::try_from((span - 1) / every + 1).unwrap_or(0))
            }
            Timetable::Cron { .. } => None,
        }
    }
}

/// What a scheduler does with a schedule that is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueFires {
    /// Fire times to start now, oldest first (each within the catch-up
    /// window).
    pub fire: Vec<DateTime<Utc>>,
    /// Fire times older than the catch-up window: not started, counted.
    pub missed: u64,
    /// The next fire time after these (None: the spec never fires again).
    pub next: Option<DateTime<Utc>>,
}

/// The fires due at `now` of a schedule whose next fire time is `next`:
/// those no older than `catch_up_window` start (at most `max_fires` of
/// them; the rest stay due for the next pass), older ones are missed. A
/// fire exactly `catch_up_window` old still starts.
pub fn due_fires(
    timetable: &Timetable,
    next: DateTime<Utc>,
    now: DateTime<Utc>,
    catch_up_window: Duration,
    max_fires: usize,
) -> DueFires {
    let oldest = now - catch_up_window;
    let mut due = DueFires {
        fire: Vec::new(),
        missed: 0,
        next: Some(next),
    };
    let mut steps = 0;
    while let Some(at) = due.next {
        if at > now || due.fire.len() >= max_fires {
            break;
        }
        if at < oldest {
            steps += 1;
            if steps > MAX_MISSED_STEPS {
                // a long gap: jump to the window, counting what lies between
                let resume = timetable.next_at_or_after(oldest);
                let until = resume.unwrap_or(oldest);
                due.missed += timetable.count_between(at, until).unwrap_or(0);
                due.next = resume;
                continue;
            }
            due.missed += 1;
        } else {
            due.fire.push(at);
        }
        due.next = timetable.next_after(at);
    }
    due
}

/// How long after its fire time a fire starts: a deterministic share of
/// `max_jitter_ms` drawn from the schedule and the fire time, so every
/// server computes the same delay for the same fire. 0 without jitter.
pub fn jitter_ms(
    namespace: &str,
    schedule_id: &str,
    fire: DateTime<Utc>,
    max_jitter_ms: i64,
) -> i64 {
    if max_jitter_ms <= 0 {
        return 0;
    }
    // FNV-1a over the names and the fire time, mixed by splitmix64
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let millis = fire.timestamp_millis().to_le_bytes();
    let bytes = namespace
        .bytes()
        .chain([0])
        .chain(schedule_id.bytes())
        .chain([0])
        .chain(millis);
    for byte in bytes {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let span = u64::try_from(max_jitter_ms).unwrap_or(0) + 1;
    i64::try_from(splitmix64(hash) % span).unwrap_or(0)
}

/// The idempotency key of a fire: `schedule:<id>:<fire time, RFC 3339 UTC>`,
/// so a fire starts one run however many servers try.
pub fn fire_key(schedule_id: &str, fire: DateTime<Utc>) -> String {
    format!("schedule:{schedule_id}:{}", fire_time_text(fire))
}

/// A fire time as its key and label write it (`2026-03-29T01:00:00Z`).
pub fn fire_time_text(fire: DateTime<Utc>) -> String {
    fire.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The label a scheduled run carries naming its schedule.
pub const SCHEDULE_LABEL: &str = "composer.schedule";
/// The label a scheduled run carries with its fire time.
pub const FIRE_TIME_LABEL: &str = "composer.fire_time";
/// Label keys a schedule's action may not set (the server's own).
pub const RESERVED_LABEL_PREFIX: &str = "composer.";

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("rfc 3339")
            .with_timezone(&Utc)
    }

    fn cron(expression: &str, zone: &str) -> Timetable {
        Timetable::new(&ScheduleSpec::Cron {
            expression: expression.to_owned(),
            time_zone: zone.to_owned(),
        })
        .expect("valid spec")
    }

    fn texts(times: &[DateTime<Utc>]) -> Vec<String> {
        times.iter().map(|t| fire_time_text(*t)).collect()
    }

    #[test]
    fn a_five_field_cron_fires_on_whole_minutes() {
        let table = cron("*/15 * * * *", "UTC");
        assert_eq!(
            texts(&table.upcoming(utc("2026-01-01T10:07:30Z"), 3)),
            [
                "2026-01-01T10:15:00Z",
                "2026-01-01T10:30:00Z",
                "2026-01-01T10:45:00Z"
            ]
        );
    }

    #[test]
    fn a_six_field_cron_has_seconds_first() {
        let table = cron("*/20 * * * * *", "UTC");
        assert_eq!(
            texts(&table.upcoming(utc("2026-01-01T10:00:00.500Z"), 3)),
            [
                "2026-01-01T10:00:20Z",
                "2026-01-01T10:00:40Z",
                "2026-01-01T10:01:00Z"
            ]
        );
    }

    #[test]
    fn next_after_is_strictly_after_even_on_a_fire_time() {
        let table = cron("* * * * * *", "UTC");
        assert_eq!(
            table.next_after(utc("2026-01-01T00:00:05Z")),
            Some(utc("2026-01-01T00:00:06Z"))
        );
        assert_eq!(
            table.next_at_or_after(utc("2026-01-01T00:00:05Z")),
            Some(utc("2026-01-01T00:00:05Z"))
        );
    }

    #[test]
    fn a_cron_reads_its_time_zone() {
        // 09:00 in New York in January is 14:00 UTC
        let table = cron("0 9 * * *", "America/New_York");
        assert_eq!(
            table.next_after(utc("2026-01-05T00:00:00Z")),
            Some(utc("2026-01-05T14:00:00Z"))
        );
    }

    #[test]
    fn bad_specs_name_their_field() {
        let bad = |spec: ScheduleSpec| Timetable::new(&spec).expect_err("refused").field;
        let cron = |e: &str, z: &str| ScheduleSpec::Cron {
            expression: e.to_owned(),
            time_zone: z.to_owned(),
        };
        assert_eq!(bad(cron("61 * * * *", "UTC")), "spec.cron");
        assert_eq!(bad(cron("* * * *", "UTC")), "spec.cron");
        assert_eq!(bad(cron("0 0 0 1 1 * 2030", "UTC")), "spec.cron");
        assert_eq!(bad(cron(&"1,".repeat(200), "UTC")), "spec.cron");
        assert_eq!(bad(cron("* * * * *", "Mars/Olympus")), "spec.time_zone");
        let interval = |every_secs| ScheduleSpec::Interval {
            every_secs,
            anchor: utc("2026-01-01T00:00:00Z"),
        };
        assert_eq!(bad(interval(0)), "spec.interval");
        assert_eq!(bad(interval(-5)), "spec.interval");
        assert_eq!(bad(interval(MAX_INTERVAL_SECS + 1)), "spec.interval");
        assert!(Timetable::new(&interval(1)).is_ok());
    }

    #[test]
    fn a_cron_that_never_matches_has_no_next_fire() {
        let table = cron("0 0 30 2 *", "UTC");
        assert_eq!(table.next_after(utc("2026-01-01T00:00:00Z")), None);
    }

    #[test]
    fn an_interval_fires_at_whole_intervals_from_its_anchor() {
        let table = Timetable::new(&ScheduleSpec::Interval {
            every_secs: 90,
            anchor: utc("2026-01-01T00:00:10Z"),
        })
        .expect("valid");
        assert_eq!(
            table.next_after(utc("2025-12-31T00:00:00Z")),
            Some(utc("2026-01-01T00:00:10Z"))
        );
        assert_eq!(
            texts(&table.upcoming(utc("2026-01-01T00:00:10Z"), 3)),
            [
                "2026-01-01T00:01:40Z",
                "2026-01-01T00:03:10Z",
                "2026-01-01T00:04:40Z"
            ]
        );
        assert_eq!(
            table.next_after(utc("2026-01-01T00:01:39.999Z")),
            Some(utc("2026-01-01T00:01:40Z"))
        );
    }

    // Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC)
    #[test]
    fn a_fixed_time_in_the_spring_forward_gap_fires_once_right_after_it() {
        let table = cron("30 2 * * *", "Europe/Berlin");
        let fires = table.upcoming(utc("2026-03-27T12:00:00Z"), 4);
        assert_eq!(
            texts(&fires),
            [
                "2026-03-28T01:30:00Z", // 02:30 CET
                "2026-03-29T01:00:00Z", // 03:00 CEST: 02:30 does not exist
                "2026-03-30T00:30:00Z", // 02:30 CEST
                "2026-03-31T00:30:00Z",
            ]
        );
    }

    // Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC)
    #[test]
    fn a_fixed_time_in_the_fall_back_repeat_fires_once_at_its_first_occurrence() {
        let table = cron("30 2 * * *", "Europe/Berlin");
        let fires = table.upcoming(utc("2026-10-24T12:00:00Z"), 3);
        assert_eq!(
            texts(&fires),
            [
                "2026-10-25T00:30:00Z", // 02:30 CEST, the first 02:30
                "2026-10-26T01:30:00Z", // the next day, 02:30 CET; not 01:30 UTC on the 25th
                "2026-10-27T01:30:00Z",
            ]
        );
    }

    #[test]
    fn an_hourly_wildcard_skips_the_missing_hour_and_fires_each_repeated_wall_time_once() {
        let table = cron("0 * * * *", "Europe/Berlin");
        let spring = table.upcoming(utc("2026-03-28T23:30:00Z"), 3);
        // 01:00 CET, then 03:00 CEST (no 02:00), then 04:00 CEST
        assert_eq!(
            texts(&spring),
            [
                "2026-03-29T00:00:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T02:00:00Z"
            ]
        );
        let autumn = table.upcoming(utc("2026-10-24T23:30:00Z"), 3);
        // 02:00 CEST, then 03:00 CET: 02:00 CET is the same wall time again
        assert_eq!(
            texts(&autumn),
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T02:00:00Z",
                "2026-10-25T03:00:00Z"
            ]
        );
    }

    #[test]
    fn from_inside_the_repeated_hour_the_next_fire_is_after_now() {
        // 02:30 CET (01:30 UTC), the second 02:30 of the day: 02:45 passed
        // as CEST already, so the next quarter is 03:00 CET
        let table = cron("*/15 * * * *", "Europe/Berlin");
        assert_eq!(
            table.next_after(utc("2026-10-25T01:30:00Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
        let every_second = cron("* * * * * *", "Europe/Berlin");
        assert_eq!(
            every_second.next_after(utc("2026-10-25T01:59:59Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
    }

    #[test]
    fn due_fires_start_within_the_window_and_count_older_ones_as_missed() {
        let table = cron("* * * * * *", "UTC");
        // down from :00 to :10, a 3 s window: :07 .. :10 start, :00 .. :06 missed
        let due = due_fires(
            &table,
            utc("2026-01-01T00:00:00Z"),
            utc("2026-01-01T00:00:10Z"),
            Duration::seconds(3),
            100,
        );
        assert_eq!(
            texts(&due.fire),
            [
                "2026-01-01T00:00:07Z",
                "2026-01-01T00:00:08Z",
                "2026-01-01T00:00:09Z",
                "2026-01-01T00:00:10Z"
            ]
        );
        assert_eq!(due.missed, 7);
        assert_eq!(due.next, Some(utc("2026-01-01T00:00:11Z")));
    }

    #[test]
    fn due_fires_take_at_most_max_fires_and_leave_the_rest_due() {
        let table = cron("* * * * * *", "UTC");
        let due = due_fires(
            &table,
            utc("2026-01-01T00:00:00Z"),
            utc("2026-01-01T00:00:59Z"),
            Duration::seconds(60),
            5,
        );
        assert_eq!(due.fire.len(), 5);
        assert_eq!(due.missed, 0);
        assert_eq!(due.next, Some(utc("2026-01-01T00:00:05Z")));
    }

    #[test]
    fn nothing_is_due_before_the_next_fire_time() {
        let table = cron("0 * * * *", "UTC");
        let due = due_fires(
            &table,
            utc("2026-01-01T01:00:00Z"),
            utc("2026-01-01T00:59:59Z"),
            Duration::seconds(60),
            100,
        );
        assert!(due.fire.is_empty());
        assert_eq!(due.missed, 0);
        assert_eq!(due.next, Some(utc("2026-01-01T01:00:00Z")));
    }

    #[test]
    fn a_long_gap_is_counted_without_stepping_through_it() {
        let anchor = utc("2026-01-01T00:00:00Z");
        let table = Timetable::new(&ScheduleSpec::Interval {
            every_secs: 1,
            anchor,
        })
        .expect("valid");
        // 30 days away at one fire a second, a one-minute window
        let now = anchor + Duration::days(30);
        let due = due_fires(&table, anchor, now, Duration::seconds(60), 1000);
        assert_eq!(due.fire.len(), 61);
        assert_eq!(due.missed, 30 * 24 * 3600 - 60);
        assert_eq!(due.next, Some(now + Duration::seconds(1)));
    }

    #[test]
    fn jitter_is_the_same_for_the_same_fire_and_within_its_bound() {
        let fire = utc("2026-01-01T00:00:00Z");
        let a = jitter_ms("ns", "nightly", fire, 30_000);
        assert_eq!(a, jitter_ms("ns", "nightly", fire, 30_000));
        assert_eq!(jitter_ms("ns", "nightly", fire, 0), 0);
        let mut distinct = std::collections::HashSet::new();
        for second in 0..200 {
            let delay = jitter_ms("ns", "nightly", fire + Duration::seconds(second), 1_000);
            assert!((0..=1_000).contains(&delay));
            distinct.insert(delay);
        }
        // spread, not constant
        assert!(distinct.len() > 100, "{} distinct delays", distinct.len());
        assert_ne!(
            (0..20)
                .map(|s| jitter_ms("ns", "a", fire + Duration::seconds(s), 1_000_000))
                .collect::<Vec<_>>(),
            (0..20)
                .map(|s| jitter_ms("ns", "b", fire + Duration::seconds(s), 1_000_000))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_fire_key_names_the_schedule_and_the_utc_fire_time() {
        assert_eq!(
            fire_key("nightly", utc("2026-03-29T03:00:00+02:00")),
            "schedule:nightly:2026-03-29T01:00:00Z"
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        const ZONES: [&str; 4] = [
            "UTC",
            "Europe/Berlin",
            "America/New_York",
            "Australia/Lord_Howe",
        ];
        const EXPRESSIONS: [&str; 7] = [
            "30 2 * * *",
            "0 * * * *",
            "*/7 * * * *",
            "15,45 1-3 * * *",
            "*/13 * * * * *",
            "0 30 2 * * SUN",
            "0 0 1 * *",
        ];

        proptest! {
            #[test]
            fn next_fires_strictly_increase(
                expression in 0..EXPRESSIONS.len(),
                zone in 0..ZONES.len(),
                // 2020 .. 2035, across many DST changes
                start in prop_oneof![
                    1_577_836_800i64..2_051_222_400i64,
                    // within a day of the 2026 changes in Berlin and New York
                    1_774_699_200i64..1_774_785_600i64,
                    1_792_843_200i64..1_792_929_600i64,
                    1_772_928_000i64..1_773_014_400i64,
                    1_793_491_200i64..1_793_577_600i64,
                ],
            ) {
                let table = cron(EXPRESSIONS[expression], ZONES[zone]);
                let start = DateTime::<Utc>::from_timestamp(start, 0).expect("in range");
                let fires = table.upcoming(start, 30);
                prop_assert_eq!(fires.len(), 30);
                prop_assert!(fires[0] > start);
                for pair in fires.windows(2) {
                    prop_assert!(pair[1] > pair[0], "{} then {}", pair[0], pair[1]);
                }
            }

            #[test]
            fn interval_fires_strictly_increase_by_the_interval(
                every_secs in 1i64..100_000,
                anchor in 1_577_836_800i64..2_051_222_400i64,
                offset in 0i64..10_000_000,
            ) {
                let anchor = DateTime::<Utc>::from_timestamp(anchor, 0).expect("in range");
                let table = Timetable::new(&ScheduleSpec::Interval { every_secs, anchor }).expect("valid");
                let fires = table.upcoming(anchor + Duration::seconds(offset), 5);
                for pair in fires.windows(2) {
                    prop_assert_eq!(pair[1] - pair[0], Duration::seconds(every_secs));
                }
                prop_assert!((fires[0] - anchor).num_seconds() % every_secs == 0);
            }
        }
    }
}

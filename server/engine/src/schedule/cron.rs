//! The next fire time of a cron expression, found field by field.
//!
//! croner parses the expression and answers whether a day matches (its
//! day-of-month and day-of-week rules, `L`, `W`, `#`); the search is ours.
//! croner's own search walks day by day until the year 5000 when no day
//! matches, which costs most of a second for `0 0 30 2 *`; this one jumps
//! to the next matching month, takes the first matching day of it from a
//! bit set, then the first matching hour, minute and second, so a search
//! costs a step per month visited.
//!
//! Which days of a month match depends only on the month, the weekday of
//! its first day and, for February, on the year being a leap year: a day
//! set is computed once per such month shape (at most 7 × 11 + 14) and
//! kept. The Gregorian calendar repeats every 400 years (146,097 days, a
//! whole number of weeks), so a search that finds no wall time within 400
//! years from its start proves the expression never fires; it stops
//! there, and after [`MAX_SEARCH_STEPS`] steps whatever happens.
//!
//! Time zones follow croner's documented rules (see the parent module): a
//! fixed-time expression whose wall time a spring-forward gap removes
//! fires at the first wall time after the gap, a wildcard one skips the
//! removed times, and in a fall-back repeat every wall time fires once, at
//! its first occurrence. The edges of a gap or a repeat are found by
//! probing the zone a quarter of an hour at a time, then by halving.

use std::sync::OnceLock;

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeZone,
    Timelike, Utc,
};
use chrono_tz::Tz;
use croner::{Cron, JobType, errors::CronError};

/// Years a search looks ahead: one Gregorian cycle, after which the
/// calendar repeats.
pub const SEARCH_YEARS: i32 = 400;

/// Steps one search may take: a month visited, a day whose times are all
/// past, a wall time tried in the zone, a probe of a gap or a repeat. A
/// search over the whole [`SEARCH_YEARS`] takes at most about 10,000
/// (two per month, twelve months a year); this bound only stops a search
/// that something unforeseen keeps going.
pub const MAX_SEARCH_STEPS: u32 = 16_384;

/// Month shapes: 12 months × 7 weekdays of the first day × leap or not.
const MONTH_SHAPES: usize = 12 * 7 * 2;

/// A probe into a gap or a repeat moves this far at a time (no zone's
/// change is shorter; the halving then finds the second).
const EDGE_PROBE_SECS: i64 = 15 * 60;

/// A zone change longer than this many probes (a day) is not searched
/// across.
const MAX_EDGE_PROBES: i64 = 24 * 3600 / EDGE_PROBE_SECS;

/// A cron expression ready to search: its fields as bit sets, and the
/// matching days of each month shape as they are needed.
#[derive(Debug, Clone)]
pub struct CronTable {
    cron: Cron,
    seconds: u64,
    minutes: u64,
    hours: u64,
    /// Bit `m` for month `m` (1 to 12).
    months: u64,
    /// A fixed-time expression (one second, one minute, one hour) fires
    /// after a gap that removes its wall time; others skip the removed
    /// times.
    fixed_time: bool,
    /// Bit `d` for each matching day `d` of a month shape.
    days: Box<[OnceLock<u32>; MONTH_SHAPES]>,
}

/// What a search found, and what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// The next fire time; None when there is none within the bound.
    pub next: Option<DateTime<Utc>>,
    /// Steps taken.
    pub steps: u32,
}

/// The steps left to one search.
struct Budget {
    steps: u32,
}

impl Budget {
    /// Takes a step; false when the search must stop.
    fn step(&mut self) -> bool {
        self.steps += 1;
        self.steps <= MAX_SEARCH_STEPS
    }
}

/// The values from `from` to `to` that `matches` accepts, as a bit set.
fn bits(from: u32, to: u32, matches: impl Fn(u32) -> Result<bool, CronError>) -> u64 {
    (from..=to)
        .filter(|&value| matches(value).unwrap_or(false))
        .fold(0, |set, value| set | (1 << value))
}

/// The smallest value in `set` at or above `from`.
fn first_at_or_after(set: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let above = set & (u64::MAX << from);
    (above != 0).then(|| above.trailing_zeros())
}

fn is_leap(year: i32) -> bool {
    NaiveDate::from_ymd_opt(year, 2, 29).is_some()
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn midnight(date: NaiveDate) -> NaiveDateTime {
    date.and_time(NaiveTime::MIN)
}

fn first_of_month(year: i32, month: u32) -> Option<NaiveDateTime> {
    NaiveDate::from_ymd_opt(year, month, 1).map(midnight)
}

fn first_of_next_month(year: i32, month: u32) -> Option<NaiveDateTime> {
    if month == 12 {
        first_of_month(year.checked_add(1)?, 1)
    } else {
        first_of_month(year, month + 1)
    }
}

impl CronTable {
    /// Prepares `cron` for searching.
    pub fn new(cron: Cron) -> CronTable {
        let pattern = &cron.pattern;
        CronTable {
            seconds: bits(0, 59, |s| pattern.second_match(s)),
            minutes: bits(0, 59, |m| pattern.minute_match(m)),
            hours: bits(0, 23, |h| pattern.hour_match(h)),
            months: bits(1, 12, |m| pattern.month_match(m)),
            fixed_time: cron.determine_job_type() == JobType::FixedTime,
            days: Box::new(std::array::from_fn(|_| OnceLock::new())),
            cron,
        }
    }

    /// The first fire time strictly after `t` in `zone`.
    pub fn next_after(&self, zone: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.search(zone, t).next
    }

    /// [`next_after`](CronTable::next_after), with the steps it took.
    pub fn search(&self, zone: Tz, t: DateTime<Utc>) -> Search {
        let mut budget = Budget { steps: 0 };
        let next = self.search_within(zone, t, &mut budget);
        Search {
            next,
            steps: budget.steps.min(MAX_SEARCH_STEPS),
        }
    }

    fn search_within(
        &self,
        zone: Tz,
        t: DateTime<Utc>,
        budget: &mut Budget,
    ) -> Option<DateTime<Utc>> {
        if self.seconds == 0 || self.minutes == 0 || self.hours == 0 || self.months == 0 {
            return None;
        }
        // whole seconds: from the second `t` is in, strictly after, is
        // strictly after `t` too
        let whole = DateTime::<Utc>::from_timestamp(t.timestamp(), 0)?;
        let mut from = zone
            .from_utc_datetime(&whole.naive_utc())
            .naive_local()
            .checked_add_signed(Duration::seconds(1))?;
        let last_year = from.year().checked_add(SEARCH_YEARS)?;
        loop {
            let wall = self.next_wall_time(from, last_year, budget)?;
            if !budget.step() {
                return None;
            }
            match zone.from_local_datetime(&wall) {
                LocalResult::Single(at) => {
                    let at = at.with_timezone(&Utc);
                    if at > t {
                        return Some(at);
                    }
                    from = wall.checked_add_signed(Duration::seconds(1))?;
                }
                LocalResult::Ambiguous(first, _) => {
                    let first = first.with_timezone(&Utc);
                    if first > t {
                        return Some(first);
                    }
                    // `t` is in the second copy of a repeated hour: every
                    // wall time left in it fired at its first occurrence
                    from = edge_after(zone, wall, budget, |r| {
                        !matches!(r, LocalResult::Ambiguous(..))
                    })?;
                }
                LocalResult::None => {
                    let after_gap =
                        edge_after(zone, wall, budget, |r| !matches!(r, LocalResult::None))?;
                    if self.fixed_time && self.day_matches(after_gap.date()) {
                        let at = zone.from_local_datetime(&after_gap).earliest()?;
                        return Some(at.with_timezone(&Utc));
                    }
                    from = after_gap;
                }
            }
        }
    }

    /// The first wall time at or after `from` that the expression names,
    /// in a year up to `last_year`.
    fn next_wall_time(
        &self,
        mut from: NaiveDateTime,
        last_year: i32,
        budget: &mut Budget,
    ) -> Option<NaiveDateTime> {
        loop {
            if !budget.step() || from.year() > last_year {
                return None;
            }
            let (year, month) = (from.year(), from.month());
            if self.months & (1 << month) == 0 {
                from = self.next_matching_month(year, month)?;
                continue;
            }
            let days = self.days_of(year, month) & (u32::MAX << from.day());
            if days == 0 {
                from = first_of_next_month(year, month)?;
                continue;
            }
            let date = NaiveDate::from_ymd_opt(year, month, days.trailing_zeros())?;
            let earliest = if date == from.date() {
                from.time()
            } else {
                NaiveTime::MIN
            };
            match self.first_time_at_or_after(earliest) {
                Some(time) => return Some(date.and_time(time)),
                None => from = midnight(date.succ_opt()?),
            }
        }
    }

    /// The first day of the next month (after `month` of `year`) the
    /// expression names.
    fn next_matching_month(&self, year: i32, month: u32) -> Option<NaiveDateTime> {
        match first_at_or_after(self.months, month + 1).filter(|&m| m <= 12) {
            Some(next) => first_of_month(year, next),
            None => first_of_month(year.checked_add(1)?, first_at_or_after(self.months, 1)?),
        }
    }

    /// The first time of day at or after `earliest` whose hour, minute
    /// and second the expression names.
    fn first_time_at_or_after(&self, earliest: NaiveTime) -> Option<NaiveTime> {
        let (h, m, s) = (earliest.hour(), earliest.minute(), earliest.second());
        let mut hour = first_at_or_after(self.hours, h)?;
        loop {
            let minute_from = if hour == h { m } else { 0 };
            let mut minute = first_at_or_after(self.minutes, minute_from);
            while let Some(this_minute) = minute {
                let second_from = if hour == h && this_minute == m { s } else { 0 };
                if let Some(second) = first_at_or_after(self.seconds, second_from) {
                    return NaiveTime::from_hms_opt(hour, this_minute, second);
                }
                minute = first_at_or_after(self.minutes, this_minute + 1);
            }
            hour = first_at_or_after(self.hours, hour + 1)?;
        }
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        self.months & (1 << date.month()) != 0
            && self.days_of(date.year(), date.month()) & (1 << date.day()) != 0
    }

    /// Bit `d` for each day `d` of `month` in `year` the expression names.
    fn days_of(&self, year: i32, month: u32) -> u32 {
        let Some(first) = NaiveDate::from_ymd_opt(year, month, 1) else {
            return 0;
        };
        // the day rules read the weekdays and the length of the month,
        // nothing else of the year
        let leap = usize::from(month == 2 && is_leap(year));
        let weekday = first.weekday().num_days_from_sunday() as usize;
        let shape = ((month as usize - 1) * 7 + weekday) * 2 + leap;
        *self.days[shape].get_or_init(|| {
            (1..=days_in_month(year, month))
                .filter(|&day| {
                    self.cron
                        .pattern
                        .day_match(year, month, day)
                        .unwrap_or(false)
                })
                .fold(0, |set, day| set | (1 << day))
        })
    }
}

/// The first wall time after `inside` (a wall time of a gap or a repeat of
/// `zone`) that `outside` accepts: probed a quarter of an hour at a time,
/// then halved down to the second.
fn edge_after(
    zone: Tz,
    inside: NaiveDateTime,
    budget: &mut Budget,
    outside: impl Fn(LocalResult<DateTime<Tz>>) -> bool,
) -> Option<NaiveDateTime> {
    let is_outside = |wall: NaiveDateTime| outside(zone.from_local_datetime(&wall));
    let mut low = inside;
    let mut high = None;
    for _ in 0..MAX_EDGE_PROBES {
        if !budget.step() {
            return None;
        }
        let probe = low.checked_add_signed(Duration::seconds(EDGE_PROBE_SECS))?;
        if is_outside(probe) {
            high = Some(probe);
            break;
        }
        low = probe;
    }
    let mut high = high?;
    // `low` is inside, `high` outside: halve to the first second outside
    while (high - low).num_seconds() > 1 {
        if !budget.step() {
            return None;
        }
        let middle = low + Duration::seconds((high - low).num_seconds() / 2);
        if is_outside(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    Some(high)
}

#[cfg(test)]
mod tests {
    use croner::parser::{CronParser, Seconds, Year};

    use super::*;

    fn parse(expression: &str) -> Cron {
        CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expression)
            .expect("valid expression")
    }

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("rfc 3339")
            .with_timezone(&Utc)
    }

    fn search(expression: &str, zone: &str, from: &str) -> Search {
        let zone: Tz = zone.parse().expect("zone");
        CronTable::new(parse(expression)).search(zone, utc(from))
    }

    #[test]
    fn a_spec_that_fires_only_on_february_29_is_found_across_a_century_without_one() {
        // 2100 is not a leap year: from March 2096 the next February 29 is 2104's
        let found = search("0 0 29 2 *", "UTC", "2096-03-01T00:00:00Z");
        assert_eq!(found.next, Some(utc("2104-02-29T00:00:00Z")));
        assert!(found.steps < 100, "{} steps", found.steps);
        // February 29 on a Monday: 2072, then 40 years to 2112
        let found = search("0 0 29 2 +MON", "UTC", "2072-03-01T00:00:00Z");
        assert_eq!(found.next, Some(utc("2112-02-29T00:00:00Z")));
        assert!(found.steps < 1_000, "{} steps", found.steps);
        // the fifth Monday of a February, in Berlin's winter time
        let found = search("0 9 * 2 MON#5", "Europe/Berlin", "2026-01-01T00:00:00Z");
        assert_eq!(found.next, Some(utc("2044-02-29T08:00:00Z")));
    }

    #[test]
    fn a_spec_that_never_fires_is_refused_within_the_step_bound() {
        for (expression, zone) in [
            ("0 0 30 2 *", "UTC"),
            ("*/1 */1 */1 31 2,4,6,9,11 *", "UTC"),
            ("* * 31 4,6,9,11 *", "America/New_York"),
            ("0 0 30,31 2 *", "Europe/Berlin"),
            ("0 0 31 2 +MON", "Australia/Lord_Howe"),
        ] {
            let started = std::time::Instant::now();
            let found = search(expression, zone, "2026-06-15T12:00:00Z");
            let took = started.elapsed();
            println!("{expression:?} in {zone}: {} steps, {took:?}", found.steps);
            assert_eq!(found.next, None, "{expression:?}");
            assert!(
                found.steps < MAX_SEARCH_STEPS,
                "{expression:?}: {} steps, the bound is {MAX_SEARCH_STEPS}",
                found.steps
            );
        }
    }

    #[test]
    fn an_everyday_spec_takes_a_few_steps() {
        for expression in ["* * * * * *", "*/5 * * * *", "0 9 * * MON-FRI", "0 0 1 * *"] {
            let found = search(expression, "Europe/Berlin", "2026-06-15T12:00:00Z");
            assert!(found.next.is_some(), "{expression:?}");
            assert!(found.steps <= 8, "{expression:?}: {} steps", found.steps);
        }
    }

    #[test]
    fn a_wildcard_in_a_spring_forward_gap_resumes_at_its_end() {
        // Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC)
        let found = search("* * * * * *", "Europe/Berlin", "2026-03-29T00:59:59Z");
        assert_eq!(found.next, Some(utc("2026-03-29T01:00:00Z")));
        // 02:00 .. 02:50 do not exist on the 29th: the next day's 02:00 CEST
        let found = search("*/10 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z");
        assert_eq!(found.next, Some(utc("2026-03-30T00:00:00Z")));
        assert!(found.steps < 100, "{} steps", found.steps);
    }

    #[test]
    fn every_second_of_a_repeated_hour_fires_once() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC)
        let zone: Tz = "Europe/Berlin".parse().expect("zone");
        let table = CronTable::new(parse("* * * * * *"));
        // from the last second of the first copy, the next is 03:00 CET
        let found = table.search(zone, utc("2026-10-25T00:59:59Z"));
        assert_eq!(found.next, Some(utc("2026-10-25T02:00:00Z")));
        // from inside the second copy, too, in a few steps
        let found = table.search(zone, utc("2026-10-25T01:20:00Z"));
        assert_eq!(found.next, Some(utc("2026-10-25T02:00:00Z")));
        assert!(found.steps < 100, "{} steps", found.steps);
    }

    /// croner's own search, as the scheduler used it before: the answer to
    /// match wherever croner finds one quickly.
    fn croner_next_after(cron: &Cron, zone: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let whole = DateTime::<Utc>::from_timestamp(t.timestamp(), 0)?;
        let mut from = zone.from_utc_datetime(&whole.naive_utc());
        for _ in 0..3_700 {
            let next = cron.find_next_occurrence(&from, false).ok()?;
            if next.with_timezone(&Utc) > t {
                return Some(next.with_timezone(&Utc));
            }
            from = next;
        }
        None
    }

    /// Whether croner's answer is the end of a gap in local time (clocks
    /// going forward) that no time of the expression falls in, and not a
    /// time of the expression either. croner answers that for a day whose
    /// midnight is skipped (America/Santiago on 2034-09-03: `30 2 * * *`
    /// from the day before gave 00:00 → 01:00, not 02:30): the oracle is
    /// wrong there, not the search.
    fn croner_answers_an_empty_gap(cron: &Cron, zone: Tz, answer: Option<DateTime<Utc>>) -> bool {
        use chrono::Offset;
        let Some(at) = answer else {
            return false;
        };
        if cron
            .is_time_matching(&at.with_timezone(&zone))
            .unwrap_or(true)
        {
            return false;
        }
        let before = zone
            .offset_from_utc_datetime(&(at - Duration::seconds(1)).naive_utc())
            .fix();
        let after = zone.offset_from_utc_datetime(&at.naive_utc()).fix();
        let gap = i64::from(after.local_minus_utc() - before.local_minus_utc());
        if gap <= 0 {
            return false;
        }
        let gap_start = at.naive_utc() + Duration::seconds(i64::from(before.local_minus_utc()));
        !(0..gap).any(|s| {
            before
                .from_local_datetime(&(gap_start + Duration::seconds(s)))
                .single()
                .is_none_or(|t| cron.is_time_matching(&t).unwrap_or(true))
        })
    }

    #[test]
    fn croner_answers_a_skipped_midnight_that_no_time_of_the_expression_falls_in() {
        // America/Santiago, 2034-09-03: 00:00 (-04) becomes 01:00 (-03) at 04:00 UTC
        let zone: Tz = "America/Santiago".parse().expect("zone");
        let start = utc("2034-09-02T06:30:00Z");
        let two_thirty = parse("30 2 * * *");
        let oracle = croner_next_after(&two_thirty, zone, start);
        assert_eq!(oracle, Some(utc("2034-09-03T04:00:00Z")), "croner's answer");
        assert!(croner_answers_an_empty_gap(&two_thirty, zone, oracle));
        let found = CronTable::new(two_thirty).next_after(zone, start);
        assert_eq!(found, Some(utc("2034-09-03T05:30:00Z")), "02:30 -03");
        // an expression with a time in the gap keeps the strict comparison
        let half_past_midnight = parse("30 0 * * *");
        assert!(!croner_answers_an_empty_gap(
            &half_past_midnight,
            zone,
            Some(utc("2034-09-03T04:00:00Z"))
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        const ZONES: [&str; 6] = [
            "UTC",
            "Europe/Berlin",
            "America/New_York",
            "Australia/Lord_Howe",
            "America/Santiago",
            "Asia/Kolkata",
        ];
        const EXPRESSIONS: [&str; 18] = [
            "30 2 * * *",
            "0 * * * *",
            "*/7 * * * *",
            "15,45 1-3 * * *",
            "*/13 * * * * *",
            "0 30 2 * * SUN",
            "0 0 1 * *",
            "0 0 29 2 *",
            "0 0 L * *",
            "0 12 15W * *",
            "0 12 * * MON#2",
            "0 0 * * 5L",
            "0 9 13 * +FRI",
            "0 9 13 * FRI",
            "59 59 23 31 12 *",
            "0 0 * 2,8 MON",
            "30 0 * * *",
            "0 0,30 0-3 * 3,10 *",
        ];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn the_search_answers_what_croner_answers(
                expression in 0..EXPRESSIONS.len(),
                zone in 0..ZONES.len(),
                // 2020 .. 2035, and days around the 2026 changes of the zones
                start in prop_oneof![
                    1_577_836_800i64..2_051_222_400i64,
                    1_774_699_200i64..1_774_785_600i64,
                    1_792_843_200i64..1_792_929_600i64,
                    1_772_928_000i64..1_773_014_400i64,
                    1_793_491_200i64..1_793_577_600i64,
                    1_775_268_000i64..1_775_440_800i64,
                    1_788_141_600i64..1_788_314_400i64,
                    1_775_959_200i64..1_776_132_000i64,
                ],
                millis in 0i64..1000,
            ) {
                let cron = parse(EXPRESSIONS[expression]);
                let zone: Tz = ZONES[zone].parse().expect("zone");
                let start = DateTime::<Utc>::from_timestamp(start, 0).expect("in range")
                    + Duration::milliseconds(millis);
                let table = CronTable::new(cron.clone());
                let (found, oracle) = (table.next_after(zone, start), croner_next_after(&cron, zone, start));
                if found != oracle && croner_answers_an_empty_gap(&cron, zone, oracle) {
                    // the oracle is wrong: the answer must still be a time of the expression
                    prop_assert!(
                        found.is_some_and(|t| t > start
                            && cron.is_time_matching(&t.with_timezone(&zone)).unwrap_or(false)),
                        "{} in {} from {}: {:?}", EXPRESSIONS[expression], zone, start, found
                    );
                    return Ok(());
                }
                prop_assert_eq!(
                    found,
                    oracle,
                    "{} in {} from {}", EXPRESSIONS[expression], zone, start
                );
            }
        }
    }
}

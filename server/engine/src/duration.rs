//! Durations (`500ms`, `30s`, `5m`, `72h`, `1d`, or sums such as `1h30m`) and
//! RFC 3339 timestamps, both as milliseconds. Pure arithmetic: no clock.

/// The longest duration, and so the furthest timer: 3,660 days (about ten
/// years). Past it a duration is refused, so a timer never overflows the
/// clock's arithmetic and fires at once.
pub const MAX_DURATION_MS: u64 = 3_660 * 86_400_000;

/// Parses a duration such as `500ms`, `30s`, `5m`, `72h`, `1d` or `1h30m`
/// into milliseconds, at most [`MAX_DURATION_MS`].
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "invalid duration '{text}': expected a number and a unit (ms, s, m, h, d), e.g. 30s"
        )
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(bad());
    }
    let bytes = s.as_bytes();
    let mut total: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(bad());
        }
        let number: u64 = s[start..i].parse().map_err(|_| bad())?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let factor: u64 = match &s[unit_start..i] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        let part = number.checked_mul(factor).ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    if total > MAX_DURATION_MS {
        return Err(format!(
            "duration '{text}' is longer than the maximum of 3660d (about ten years)"
        ));
    }
    Ok(total)
}

/// Formats milliseconds as the shortest exact duration text (`1500ms`, `30s`, `2h`).
pub fn format_duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    for (unit, factor) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms.is_multiple_of(factor) {
            return format!("{sign}{}{unit}", ms / factor);
        }
    }
    format!("{sign}{ms}ms")
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, fractional seconds and
/// offsets allowed) into milliseconds since the Unix epoch.
pub fn parse_timestamp(text: &str) -> Result<i64, String> {
    let bad =
        || format!("invalid timestamp '{text}': expected RFC 3339, e.g. 2026-01-02T03:04:05Z");
    let b = text.as_bytes();
    if b.len() < 20 || !text.is_ascii() {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &text[range];
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse::<i64>().map_err(|_| bad())
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(bad());
        }
        let digits = &text[start..i.min(start + 3)];
        millis = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_minutes = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let minutes = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *sign == b'+' { minutes } else { -minutes }
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Ok(seconds * 1_000 + millis)
}

/// Formats milliseconds since the epoch as RFC 3339 in UTC.
pub fn format_timestamp(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rest = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000,
    );
    if milli == 0 {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_every_unit_and_sums() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("30s"), Ok(30_000));
        assert_eq!(parse_duration("5m"), Ok(300_000));
        assert_eq!(parse_duration("72h"), Ok(259_200_000));
        assert_eq!(parse_duration("1d"), Ok(86_400_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000));
        for bad in ["", "30", "s", "3x", "-1s", "1.5s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(format_duration(5_400_000), "90m");
        assert_eq!(format_duration(1_500), "1500ms");
    }

    #[test]
    fn timestamps_round_trip() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_timestamp("2026-01-02T03:04:05.250Z"),
            Ok(1_767_323_045_250)
        );
        assert_eq!(
            parse_timestamp("2026-01-02T05:04:05+02:00"),
            Ok(1_767_323_045_000)
        );
        assert_eq!(
            format_timestamp(1_767_323_045_250),
            "2026-01-02T03:04:05.250Z"
        );
        assert_eq!(format_timestamp(-1_000), "1969-12-31T23:59:59Z");
        assert!(parse_timestamp("2026-13-02T03:04:05Z").is_err());
        assert!(parse_timestamp("yesterday").is_err());
    }
}

//! Calendar arithmetic for the two places providers hand us wall-clock times: `Retry-After` HTTP-dates and
//! OpenAI's `created` unix timestamps. Written here rather than pulling a date crate for a few dozen lines.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (era-based, exact for any i64-safe year).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (i64::from(month) + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn month_number(name: &str) -> Option<u32> {
    MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(name))
        .map(|i| i as u32 + 1)
}

fn parse_clock(text: &str) -> Option<i64> {
    let mut parts = text.split(':');
    let hour: i64 = parse_digits(parts.next()?, 2)?;
    let minute: i64 = parse_digits(parts.next()?, 2)?;
    // 60 admits a leap second.
    let second: i64 = parse_digits(parts.next()?, 2)?;
    if parts.next().is_some() || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(hour * 3600 + minute * 60 + second)
}

/// Parses 1..=`max_len` ASCII digits (no sign, no spaces).
fn parse_digits(text: &str, max_len: usize) -> Option<i64> {
    if text.is_empty() || text.len() > max_len || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn unix_seconds(year: i64, month: u32, day: u32, seconds_of_day: i64) -> Option<i64> {
    if !(1..=9999).contains(&year) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + seconds_of_day)
}

fn is_weekday_token(token: &str) -> bool {
    (3..=9).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_alphabetic())
}

fn is_gmt(token: &str) -> bool {
    token.eq_ignore_ascii_case("GMT") || token.eq_ignore_ascii_case("UTC")
}

/// Parses the three HTTP-date forms recipients must accept (RFC 9110 §5.6.7) into unix seconds:
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT` and
/// asctime `Sun Nov  6 08:49:37 1994`. `now_year` resolves RFC 850's two-digit years.
fn parse_http_date(text: &str, now_year: i64) -> Option<i64> {
    let normalized = text.replace(',', " ");
    let tokens: Vec<&str> = normalized.split_whitespace().collect();
    match tokens.as_slice() {
        [weekday, day, month, year, clock, zone] if is_weekday_token(weekday) && is_gmt(zone) => {
            let year = parse_digits(year, 4)?;
            unix_seconds(
                year,
                month_number(month)?,
                parse_digits(day, 2)? as u32,
                parse_clock(clock)?,
            )
        }
        [weekday, date, clock, zone] if is_weekday_token(weekday) && is_gmt(zone) => {
            let mut parts = date.split('-');
            let day = parse_digits(parts.next()?, 2)? as u32;
            let month = month_number(parts.next()?)?;
            let short_year = parse_digits(parts.next()?, 2)?;
            if parts.next().is_some() {
                return None;
            }
            // A two-digit year more than 50 years ahead means the most recent past year with those digits.
            let century = now_year - now_year.rem_euclid(100);
            let mut year = century + short_year;
            if year > now_year + 50 {
                year -= 100;
            }
            unix_seconds(year, month, day, parse_clock(clock)?)
        }
        [weekday, month, day, clock, year] if is_weekday_token(weekday) => {
            let year = parse_digits(year, 4)?;
            unix_seconds(
                year,
                month_number(month)?,
                parse_digits(day, 2)? as u32,
                parse_clock(clock)?,
            )
        }
        _ => None,
    }
}

fn signed_unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Reads a `Retry-After` value: delta-seconds (a fractional value is tolerated, as some gateways send one) or
/// an HTTP-date, which becomes the time left until then from `now` (zero when already past).
/// Returns None for anything unparseable, so a garbled header simply means "no hint".
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // An absurdly long number saturates; the retry policy clamps it to its deadline anyway.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let now_secs = signed_unix_seconds(now);
    let now_year = civil_from_days(now_secs.div_euclid(86_400)).0;
    let target = parse_http_date(value, now_year)?;
    let wait_secs = target.saturating_sub(now_secs);
    Some(Duration::from_secs(u64::try_from(wait_secs).unwrap_or(0)))
}

/// Reads OpenAI's non-standard `retry-after-ms` header (milliseconds, possibly fractional).
pub(crate) fn parse_retry_after_ms(value: &str) -> Option<Duration> {
    let millis: f64 = value.trim().parse().ok()?;
    Duration::try_from_secs_f64(millis / 1000.0).ok()
}

/// Formats unix seconds as RFC 3339 UTC (`2023-11-14T22:13:20Z`); None outside years 0..=9999.
pub(crate) fn format_rfc3339(unix_secs: i64) -> Option<String> {
    let days = unix_secs.div_euclid(86_400);
    let seconds_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    if !(0..=9999).contains(&year) {
        return None;
    }
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds_of_day / 3600,
        seconds_of_day % 3600 / 60,
        seconds_of_day % 60
    ))
}

/// Formats unix seconds as an IMF-fixdate, so tests can build `Retry-After` dates relative to now.
#[cfg(test)]
pub(crate) fn format_imf_fixdate(unix_secs: i64) -> String {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let days = unix_secs.div_euclid(86_400);
    let seconds_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{}, {day:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
        seconds_of_day / 3600,
        seconds_of_day % 3600 / 60,
        seconds_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix_secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(unix_secs)
    }

    // 1994-11-06T08:49:37Z, the RFC's example instant.
    const RFC_EXAMPLE: i64 = 784_111_777;

    #[test]
    fn civil_round_trip_over_four_centuries() {
        let start = days_from_civil(1900, 1, 1);
        for days in (start..start + 146_097 + 400).step_by(7) {
            let (y, m, d) = civil_from_days(days);
            assert!(d >= 1 && d <= days_in_month(y, m), "{y}-{m}-{d}");
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn three_http_date_forms_agree() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT", 2025),
            Some(RFC_EXAMPLE)
        );
        assert_eq!(
            parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", 2025),
            Some(RFC_EXAMPLE)
        );
        assert_eq!(
            parse_http_date("Sun Nov  6 08:49:37 1994", 2025),
            Some(RFC_EXAMPLE)
        );
    }

    #[test]
    fn rfc850_two_digit_year_picks_the_nearest_plausible_century() {
        let in_2030 = parse_http_date("Tuesday, 01-Jan-30 00:00:00 GMT", 2025).unwrap();
        assert_eq!(format_rfc3339(in_2030).unwrap(), "2030-01-01T00:00:00Z");
        let in_1990 = parse_http_date("Monday, 01-Jan-90 00:00:00 GMT", 2025).unwrap();
        assert_eq!(format_rfc3339(in_1990).unwrap(), "1990-01-01T00:00:00Z");
    }

    #[test]
    fn rejects_malformed_dates() {
        for bad in [
            "",
            "tomorrow",
            "Sun, 31 Feb 2024 00:00:00 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 19945 08:49:37 GMT",
            "Sun, -6 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_http_date(bad, 2025), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = at(RFC_EXAMPLE as u64);
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("NaN", now), None);
    }

    #[test]
    fn retry_after_ms() {
        assert_eq!(
            parse_retry_after_ms("1500"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after_ms("20.5"),
            Some(Duration::from_micros(20_500))
        );
        assert_eq!(parse_retry_after_ms("-1"), None);
        assert_eq!(parse_retry_after_ms("x"), None);
    }

    #[test]
    fn imf_fixdate_formatting_round_trips() {
        assert_eq!(
            format_imf_fixdate(RFC_EXAMPLE),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        let now = 1_700_000_000;
        assert_eq!(parse_http_date(&format_imf_fixdate(now), 2023), Some(now));
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(format_rfc3339(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_rfc3339(1_700_000_000).unwrap(),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(format_rfc3339(i64::MAX / 2), None);
    }
}

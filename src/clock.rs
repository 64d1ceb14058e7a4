//! The process's wall clock, as the stored forms use it: RFC 3339 UTC text for records
//! (checkpoints, threads, events, cassettes, the data store) and milliseconds since the epoch
//! for lease expiry.
//!
//! A leaf: it depends on nothing in the crate, so any layer may take the time from it without
//! depending on the layer that happens to store it.

/// Milliseconds since the Unix epoch, the clock of lease expiry.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// The current time, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// `ms` milliseconds since the epoch as RFC 3339 UTC text, the form records store (so two
/// times compare as their texts do).
pub fn at_ms(ms: i64) -> String {
    rfc3339(ms.div_euclid(1000), ms.rem_euclid(1000) as u32)
}

/// `secs` since the epoch plus `millis`, as `YYYY-MM-DDTHH:MM:SS.mmmZ`. Written digit by digit:
/// every checkpoint and event takes a timestamp, and `format!` costs several times more.
fn rfc3339(secs: i64, millis: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    let mut out = *b"0000-00-00T00:00:00.000Z";
    // Years outside 0..=9999 are not RFC 3339; the clock of a running process never gives one.
    let fields = [
        (0, 4, y),
        (5, 2, i64::from(m)),
        (8, 2, i64::from(day)),
        (11, 2, rem / 3600),
        (14, 2, (rem % 3600) / 60),
        (17, 2, rem % 60),
        (20, 3, i64::from(millis)),
    ];
    for (at, width, mut n) in fields {
        for digit in out[at..at + width].iter_mut().rev() {
            *digit = b'0' + n.rem_euclid(10) as u8;
            n /= 10;
        }
    }
    out.iter().map(|&b| char::from(b)).collect()
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn rfc3339_text() {
        assert_eq!(super::rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        // 2026-11-22T13:05:09.042Z
        assert_eq!(
            super::rfc3339(20_779 * 86_400 + 13 * 3600 + 5 * 60 + 9, 42),
            "2026-11-22T13:05:09.042Z"
        );
        assert_eq!(
            super::rfc3339(11_016 * 86_400 + 86_399, 999),
            "2000-02-29T23:59:59.999Z"
        );
    }

    #[test]
    fn now_is_rfc3339_utc_with_milliseconds() {
        let t = super::now();
        let b = t.as_bytes();
        assert_eq!(b.len(), 24, "{t}");
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16], b[19], b[23]),
            (b'-', b'-', b'T', b':', b':', b'.', b'Z'),
            "{t}"
        );
    }
}

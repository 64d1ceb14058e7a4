//! Schedules: a cron expression and the time zone it is read in, and the tick that follows a
//! moment. One parser for every place a schedule is written — a workflow's `serve.schedules`
//! (checked here, at validate time) and the server's crons (`POST /runs/crons`, `runner cron
//! add`) — so a schedule the compiler accepts is the one the server runs.
//!
//! The expression is the standard five fields (minute, hour, day of month, month, day of
//! week), as LangGraph's API takes them, read by `croner` with Vixie cron's rules: ranges,
//! steps, lists, month and weekday names, `L`, `W` and `#`, the `@hourly`-style aliases, and
//! a day-of-month and a day-of-week field both restricted matching either (as croniter, which
//! LangGraph uses, does). A seconds or a year field is refused: schedules tick by the minute.
//! The time zone is an IANA name (`Europe/Paris`), compiled in by `chrono-tz`, so a schedule
//! reads the same on every host; none is UTC. Across a daylight-saving change a wall-clock
//! time that does not exist runs at the first instant after the gap, and one that occurs twice
//! runs once.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// A checked schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    /// None: UTC.
    zone: Option<Tz>,
}

/// Why a schedule cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "`{expr}` is not a cron schedule: {reason}; a schedule is five fields, minute hour day-of-month month day-of-week (e.g. `0 9 * * 1` for Mondays at 09:00, `*/5 * * * *` for every five minutes)"
    )]
    Expression { expr: String, reason: String },
    #[error("`{0}` is not an IANA time zone (e.g. `Europe/Paris`, `America/New_York`, `UTC`)")]
    TimeZone(String),
}

impl Schedule {
    /// `expr` read in `timezone` (none: UTC).
    pub fn parse(expr: &str, timezone: Option<&str>) -> Result<Schedule, ScheduleError> {
        let zone = match timezone {
            None => None,
            Some(name) => Some(
                name.parse::<Tz>()
                    .map_err(|_| ScheduleError::TimeZone(name.to_string()))?,
            ),
        };
        let bad = |reason: String| ScheduleError::Expression {
            expr: expr.to_string(),
            reason,
        };
        let trimmed = expr.trim();
        // croner reads a sixth field as seconds first; croniter, as seconds last. Neither is
        // accepted, so a schedule never means two things.
        if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
            return Err(bad(format!(
                "it has {} fields, not 5",
                trimmed.split_whitespace().count()
            )));
        }
        let cron = parser()
            .parse(trimmed)
            .map_err(|e| bad(field_at_fault(trimmed).unwrap_or_else(|| e.to_string())))?;
        let schedule = Schedule { cron, zone };
        // A pattern that can never match (`0 0 31 2 *`) is refused now, not found at its
        // first tick.
        if schedule.next_after(0).is_none() {
            return Err(bad("it never matches a date".into()));
        }
        Ok(schedule)
    }

    /// The first tick strictly after `ms` (milliseconds since the epoch), in the same unit;
    /// none when the schedule has no tick left.
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        let at = DateTime::<Utc>::from_timestamp_millis(ms)?;
        match self.zone {
            None => next(&self.cron, &at),
            Some(zone) => next(&self.cron, &zone.from_utc_datetime(&at.naive_utc())),
        }
    }
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
}

/// Which of a five-field pattern's fields is wrong, said for a person: each field is tried
/// alone, the others `*`.
fn field_at_fault(expr: &str) -> Option<String> {
    const FIELDS: [(&str, &str); 5] = [
        ("minute", "0-59"),
        ("hour", "0-23"),
        ("day-of-month", "1-31, L or W"),
        ("month", "1-12 or JAN-DEC"),
        ("day-of-week", "0-7 or SUN-SAT, # or L"),
    ];
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if fields.len() != 5 {
        return None;
    }
    (0..5).find_map(|i| {
        let alone: Vec<&str> = (0..5).map(|j| if i == j { fields[i] } else { "*" }).collect();
        parser().parse(&alone.join(" ")).is_err().then(|| {
            let (name, range) = FIELDS[i];
            format!("its {name} field `{}` is not valid ({range})", fields[i])
        })
    })
}

fn next<Z: TimeZone>(cron: &Cron, at: &DateTime<Z>) -> Option<i64>
where
    DateTime<Z>: croner::CronDateTime,
{
    cron.find_next_occurrence(at, false).ok().map(|t| t.timestamp_millis())
}

/// `text` as milliseconds since the epoch: an RFC 3339 time (`2030-01-01T09:00:00Z`,
/// `2030-01-01T10:00:00+01:00`), or, without an offset, a UTC one as Python's `isoformat()`
/// writes a naive time.
pub fn parse_time(text: &str) -> Option<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text.trim()) {
        return Some(t.timestamp_millis());
    }
    chrono::NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// Checks the workflow's `serve.schedules`; a defect is reported at its field and leaves the
/// schedule out.
pub(super) fn schedules(b: &mut super::nodes::Build) -> Vec<super::plan::PlanSchedule> {
    use crate::diag::Code;
    use crate::spec::load::push_pointer;
    let Some(serve) = &b.wf.serve else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, spec) in serve.schedules.iter().enumerate() {
        let at = format!("/serve/schedules/{i}");
        let mut ok = true;
        if let Some(zone) = &spec.timezone
            && zone.parse::<Tz>().is_err()
        {
            ok = false;
            b.diags.push(
                b.src
                    .diag(
                        Code::BadSchedule,
                        &push_pointer(&at, "timezone"),
                        ScheduleError::TimeZone(zone.clone()).to_string(),
                    )
                    .help("time zones are named as in the IANA database; leave `timezone` out for UTC"),
            );
        }
        if let Err(ScheduleError::Expression { reason, .. }) = Schedule::parse(&spec.cron, None) {
            ok = false;
            b.diags.push(
                b.src
                    .diag(
                        Code::BadSchedule,
                        &push_pointer(&at, "cron"),
                        format!("`{}` is not a cron schedule: {reason}", spec.cron),
                    )
                    .help(
                        "five fields: minute hour day-of-month month day-of-week, e.g. `0 9 * * 1` (Mondays at 09:00) or `*/15 * * * *`",
                    ),
            );
        }
        let until = match &spec.until {
            None => None,
            Some(text) => match parse_time(text) {
                Some(ms) => Some(ms),
                None => {
                    ok = false;
                    b.diags.push(
                        b.src
                            .diag(
                                Code::BadSchedule,
                                &push_pointer(&at, "until"),
                                format!("`{text}` is not a time"),
                            )
                            .help("an RFC 3339 time, e.g. `2031-01-01T00:00:00Z`"),
                    );
                    None
                }
            },
        };
        if let Some(input) = &spec.input
            && !input.is_object()
        {
            ok = false;
            b.diags.push(
                b.src
                    .diag(
                        Code::BadSchedule,
                        &push_pointer(&at, "input"),
                        "a run's input is a mapping",
                    )
                    .help("give the input's fields, e.g. `input: {query: weekly digest}`"),
            );
        }
        let known = &b.wf.config;
        for name in spec.config.keys() {
            if !known.contains_key(name) {
                ok = false;
                let hint = crate::diag::did_you_mean(name, known.keys().map(String::as_str))
                    .map(|k| format!("did you mean `{k}`?"))
                    .unwrap_or_else(|| "a schedule sets values of the workflow's own `config`".into());
                b.diags.push(
                    b.src
                        .diag(
                            Code::BadSchedule,
                            &push_pointer(&push_pointer(&at, "config"), name),
                            format!("`{name}` is not a key of the workflow's `config`"),
                        )
                        .help(hint),
                );
            }
        }
        if let Some(url) = &spec.webhook
            && !is_web_url(url)
        {
            ok = false;
            b.diags.push(
                b.src
                    .diag(
                        Code::BadSchedule,
                        &push_pointer(&at, "webhook"),
                        format!("`{url}` is not an http or https URL"),
                    )
                    .help("e.g. `https://hooks.example.com/digest`"),
            );
        }
        if !ok {
            continue;
        }
        out.push(super::plan::PlanSchedule {
            cron: spec.cron.trim().to_string(),
            timezone: spec.timezone.clone(),
            input: spec.input.clone(),
            config: spec.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            context: spec.context.clone(),
            metadata: spec.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            thread: spec.thread.clone(),
            until,
            webhook: spec.webhook.clone(),
        });
    }
    out
}

/// Whether `text` is an absolute http or https URL with a host: what a webhook may be.
pub fn is_web_url(text: &str) -> bool {
    url::Url::parse(text)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        parse_time(text).unwrap()
    }

    fn next(expr: &str, zone: Option<&str>, after: &str) -> String {
        let s = Schedule::parse(expr, zone).unwrap();
        let at = DateTime::<Utc>::from_timestamp_millis(s.next_after(ms(after)).unwrap()).unwrap();
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    #[test]
    fn the_next_tick_is_strictly_after() {
        assert_eq!(
            next("*/5 * * * *", None, "2030-01-01T10:00:00Z"),
            "2030-01-01T10:05:00.000Z"
        );
        assert_eq!(
            next("*/5 * * * *", None, "2030-01-01T10:02:30.5Z"),
            "2030-01-01T10:05:00.000Z"
        );
        // Mondays at 09:00: 2030-01-01 is a Tuesday.
        assert_eq!(
            next("0 9 * * 1", None, "2030-01-01T10:00:00Z"),
            "2030-01-07T09:00:00.000Z"
        );
        assert_eq!(
            next("0 9 * * MON", None, "2030-01-01T10:00:00Z"),
            "2030-01-07T09:00:00.000Z"
        );
        assert_eq!(next("@daily", None, "2030-01-01T10:00:00Z"), "2030-01-02T00:00:00.000Z");
    }

    #[test]
    fn a_time_zone_moves_the_tick_and_follows_daylight_saving() {
        // 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer.
        assert_eq!(
            next("0 9 * * *", Some("Europe/Paris"), "2030-01-01T10:00:00Z"),
            "2030-01-02T08:00:00.000Z"
        );
        assert_eq!(
            next("0 9 * * *", Some("Europe/Paris"), "2030-07-01T10:00:00Z"),
            "2030-07-02T07:00:00.000Z"
        );
        // 02:30 does not exist in Paris on 2030-03-31 (02:00 → 03:00): the run is at the
        // first instant after the gap, 03:00 CEST = 01:00 UTC.
        assert_eq!(
            next("30 2 * * *", Some("Europe/Paris"), "2030-03-30T12:00:00Z"),
            "2030-03-31T01:00:00.000Z"
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_match_either_as_vixie_cron() {
        // The 13th, or any Friday: 2030-01-04 is a Friday, before the 13th.
        assert_eq!(
            next("0 0 13 * 5", None, "2030-01-01T00:00:00Z"),
            "2030-01-04T00:00:00.000Z"
        );
    }

    #[test]
    fn bad_schedules_say_why() {
        for (expr, zone, says) in [
            ("* * * *", None, "it has 4 fields, not 5"),
            ("0 * * * * *", None, "it has 6 fields, not 5"),
            ("61 * * * *", None, "its minute field `61` is not valid (0-59)"),
            ("0 9 * 13 *", None, "its month field `13` is not valid"),
            ("0 0 31 2 *", None, "it never matches a date"),
            ("every day", None, "it has 2 fields"),
            ("0 9 * * *", Some("Mars/Olympus"), "is not an IANA time zone"),
        ] {
            let e = Schedule::parse(expr, zone).unwrap_err().to_string();
            assert!(e.contains(says), "{expr}: {e}");
        }
    }

    #[test]
    fn times_are_read_with_or_without_an_offset() {
        assert_eq!(ms("2030-01-01T10:00:00+01:00"), ms("2030-01-01T09:00:00Z"));
        assert_eq!(ms("2030-01-01T09:00:00"), ms("2030-01-01T09:00:00Z"));
        assert_eq!(ms("2030-01-01T09:00:00.250000+00:00"), ms("2030-01-01T09:00:00Z") + 250);
        assert_eq!(parse_time("tomorrow"), None);
    }
}

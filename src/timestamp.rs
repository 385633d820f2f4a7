//! Times for people. idem stores and serves milliseconds since the Unix epoch; DTM's API
//! and the operator's tables show them as RFC 3339 in UTC instead.

use crate::core::Millis;

/// Milliseconds since the epoch as RFC 3339 in UTC, as Go renders a `time.Time`. A time
/// past the years 0000–9999 (only a clock set very wrong gives one) is shown as its number.
pub fn rfc3339(ms: Millis) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000);
    match at {
        Ok(at) if (0..=9_999).contains(&at.year()) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            at.year(),
            u8::from(at.month()),
            at.day(),
            at.hour(),
            at.minute(),
            at.second(),
            at.millisecond()
        ),
        _ => format!("{ms} ms since the epoch"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_like_go() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_796_006_802_500), "2026-11-30T02:46:42.500Z");
        // Before the epoch too (a clock set wrong shows as such, not as garbage).
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
        // Past what a date can show: the number, never a panic or a wrapped date.
        assert_eq!(
            rfc3339(i64::MAX),
            format!("{} ms since the epoch", i64::MAX)
        );
        assert_eq!(
            rfc3339(i64::MIN),
            format!("{} ms since the epoch", i64::MIN)
        );
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }
}

//! How long the client waits before it repeats a request.
//!
//! Exponential backoff with jitter: each wait is drawn between half the backoff and the
//! whole of it, so a thousand clients refused at the same moment come back spread over that
//! span instead of together. A `Retry-After` the coordinator sent (with `429` and `503`) is a
//! floor: the client never comes back sooner than it was asked to. A `Retry-After` longer
//! than the policy's `max_delay` ends the retries: the caller gets the refusal and decides,
//! rather than the client sleeping for longer than it was configured to.

use std::time::Duration;

/// The wait before the next try, or `None` to stop retrying. `backoff` is the policy's
/// current (doubling) delay, `jitter` a number in `[0, 1)`.
pub(crate) fn next_wait(
    backoff: Duration,
    retry_after: Option<Duration>,
    max_delay: Duration,
    jitter: f64,
) -> Option<Duration> {
    let jittered = backoff.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
    match retry_after {
        Some(asked) if asked > max_delay => None,
        Some(asked) => Some(jittered.max(asked)),
        None => Some(jittered),
    }
}

/// `Retry-After` in delta-seconds (what idem sends). An HTTP date, which idem never sends, is
/// not honoured: the backoff applies.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(2);

    #[test]
    fn the_wait_is_drawn_between_half_the_backoff_and_all_of_it() {
        let backoff = Duration::from_millis(400);
        assert_eq!(
            next_wait(backoff, None, MAX, 0.0),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            next_wait(backoff, None, MAX, 0.5),
            Some(Duration::from_millis(300))
        );
        let top = next_wait(backoff, None, MAX, 0.999_999).unwrap();
        assert!(
            top <= backoff && top > Duration::from_millis(399),
            "{top:?}"
        );
    }

    #[test]
    fn clients_refused_together_come_back_spread_out() {
        let backoff = Duration::from_millis(800);
        let waits: std::collections::BTreeSet<Duration> = (0..1_000)
            .map(|_| next_wait(backoff, None, MAX, rand::random::<f64>()).unwrap())
            .collect();
        // A thousand draws over a 400 ms span: far from one instant.
        assert!(waits.len() > 900, "{} distinct waits", waits.len());
        let (low, high) = (waits.first().unwrap(), waits.last().unwrap());
        assert!(*low >= Duration::from_millis(400) && *high <= backoff);
        assert!(
            *high - *low > Duration::from_millis(300),
            "{low:?}..{high:?}"
        );
    }

    #[test]
    fn retry_after_is_a_floor_and_too_long_a_one_ends_the_retries() {
        let backoff = Duration::from_millis(100);
        let asked = Some(Duration::from_secs(1));
        assert_eq!(
            next_wait(backoff, asked, MAX, 0.7),
            Some(Duration::from_secs(1))
        );
        let long_backoff = Duration::from_millis(1_800);
        let wait = next_wait(long_backoff, asked, MAX, 0.9).unwrap();
        assert!(
            wait > Duration::from_secs(1),
            "the larger of the two: {wait:?}"
        );
        assert_eq!(
            next_wait(backoff, Some(Duration::from_secs(30)), MAX, 0.1),
            None
        );
    }

    #[test]
    fn only_delta_seconds_are_read() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2026 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}

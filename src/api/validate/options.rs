//! The numeric transaction options and the list's page size: one table of bounds that
//! both front doors read. The native door names an option as `TxOptions` does, in
//! milliseconds; the DTM door maps its own fields (in seconds) onto the same rows. So one
//! bound judges both doors, and a value out of range is `400 invalid_options` on either,
//! never clamped. Inside that range the server's operator may set a tighter bound on the
//! options that make idem call more (attempts per call, the retry interval): a request
//! past it is `400 option_limit`, whichever door it came through, and cannot raise it.
//! `branch_headers`, the one option that is not a number, has the same name in both
//! doors and is checked by [`check_headers`]. Listed in `docs/api.md`, "Limits".

use std::collections::BTreeMap;

use serde_json::Number;

use super::check_headers;
use crate::api::error::ApiError;
use crate::core::{DEFAULT_MAX_IN_PROGRESS_MS, Protocol, TxOptions};

/// The unit an option is given in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Seconds,
    Count,
}

impl Unit {
    /// How many of idem's units (milliseconds, or one) one of these is, and how a message
    /// names it.
    fn scale(self) -> (u64, &'static str) {
        match self {
            Unit::Millis => (1, " ms"),
            Unit::Seconds => (1_000, " seconds"),
            Unit::Count => (1, ""),
        }
    }
}

/// One numeric option: its bounds in idem's unit, its built-in default, and what each
/// front door calls it.
#[derive(Debug)]
pub struct OptionBound {
    /// Its field in `TxOptions` and in the native API's `options`.
    pub name: &'static str,
    /// The DTM door's field for it and that field's unit; `None`: DTM has no such field.
    pub dtm: Option<(&'static str, Unit)>,
    /// The unit of `name`, `min`, `max` and `default`: milliseconds or a count.
    pub unit: Unit,
    pub min: u64,
    pub max: u64,
    /// `TxOptions::default()`'s value, which the server's flags (`--request-timeout-ms`,
    /// ...) may replace; `None`: unset (no global timeout; TCC and msg get the server's
    /// `--prepared-timeout-ms`).
    pub default: Option<u64>,
    /// The operator's tighter bound inside `min..=max`, if it has one.
    pub limit: Option<ServerLimit>,
    get: fn(&TxOptions) -> Option<u64>,
    set: fn(&mut TxOptions, u64),
}

/// A bound the server's operator sets on an option (see [`OptionLimits`]), in idem's unit.
#[derive(Debug)]
pub struct ServerLimit {
    /// True: the least a request may ask for; false: the most.
    pub is_minimum: bool,
    /// The `idem serve` flag that sets it.
    pub flag: &'static str,
    pub of: fn(&OptionLimits) -> u64,
}

/// The server's bounds on the options that make idem call more: what a request may ask
/// within the table's range, and no more (`400 option_limit`). Attempts per call times
/// the calls of a round is what one request can make idem send, and the retry interval
/// how fast; the call budget (`--max-calls-per-transaction`, the engine's) bounds the
/// total whatever the options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionLimits {
    /// `max_attempts` (DTM's `retry_limit`), at most (`--max-attempts-limit`).
    pub max_attempts: u32,
    /// `retry_interval_ms` (DTM's `retry_interval`), at least (`--min-retry-interval-ms`).
    pub min_retry_interval_ms: u64,
}

/// `--max-attempts-limit`'s default: eight times the default `max_attempts`, with the
/// retry interval doubling to its cap, hours of retrying.
pub const DEFAULT_MAX_ATTEMPTS_LIMIT: u32 = 100;
/// `--min-retry-interval-ms`'s default: one branch is called at most about a hundred
/// times a second (two hundred with the jitter, which spreads a delay over its upper
/// half), in progress or not, until its backoff or the budget stops it.
pub const DEFAULT_MIN_RETRY_INTERVAL_MS: u64 = 10;

impl Default for OptionLimits {
    fn default() -> OptionLimits {
        OptionLimits {
            max_attempts: DEFAULT_MAX_ATTEMPTS_LIMIT,
            min_retry_interval_ms: DEFAULT_MIN_RETRY_INTERVAL_MS,
        }
    }
}

impl OptionLimits {
    /// No bound but the table's.
    pub const OPEN: OptionLimits = OptionLimits {
        max_attempts: 10_000,
        min_retry_interval_ms: 1,
    };
}

const DAY_MS: u64 = 86_400_000;

/// A call longer than 10 minutes holds a connection and a call slot for that long; such a
/// participant should answer 425 (in progress) and be asked again.
pub static REQUEST_TIMEOUT: OptionBound = OptionBound {
    name: "request_timeout_ms",
    dtm: Some(("request_timeout", Unit::Seconds)),
    unit: Unit::Millis,
    min: 1,
    max: 600_000,
    default: Some(5_000),
    limit: None,
    get: |o| Some(o.request_timeout_ms),
    set: |o, v| o.request_timeout_ms = v,
};

pub static RETRY_INTERVAL: OptionBound = OptionBound {
    name: "retry_interval_ms",
    dtm: Some(("retry_interval", Unit::Seconds)),
    unit: Unit::Millis,
    min: 1,
    max: 3_600_000,
    default: Some(1_000),
    limit: Some(ServerLimit {
        is_minimum: true,
        flag: "--min-retry-interval-ms",
        of: |l| l.min_retry_interval_ms,
    }),
    get: |o| Some(o.retry_interval_ms),
    set: |o, v| o.retry_interval_ms = v,
};

pub static MAX_RETRY_INTERVAL: OptionBound = OptionBound {
    name: "max_retry_interval_ms",
    dtm: None,
    unit: Unit::Millis,
    min: 1,
    max: DAY_MS,
    default: Some(60_000),
    limit: None,
    get: |o| Some(o.max_retry_interval_ms),
    set: |o, v| o.max_retry_interval_ms = v,
};

/// Every failed attempt is a row of the transaction's history, shown with it.
pub static MAX_ATTEMPTS: OptionBound = OptionBound {
    name: "max_attempts",
    dtm: Some(("retry_limit", Unit::Count)),
    unit: Unit::Count,
    min: 1,
    max: 10_000,
    default: Some(12),
    limit: Some(ServerLimit {
        is_minimum: false,
        flag: "--max-attempts-limit",
        of: |l| u64::from(l.max_attempts),
    }),
    get: |o| Some(u64::from(o.max_attempts)),
    set: |o, v| o.max_attempts = u32::try_from(v).expect("bounded by MAX_ATTEMPTS.max"),
};

pub static MAX_IN_PROGRESS: OptionBound = OptionBound {
    name: "max_in_progress_ms",
    dtm: None,
    unit: Unit::Millis,
    min: 1,
    max: 30 * DAY_MS,
    default: Some(DEFAULT_MAX_IN_PROGRESS_MS),
    limit: None,
    get: |o| Some(o.max_in_progress_ms),
    set: |o, v| o.max_in_progress_ms = v,
};

/// The global timeout. DTM's seconds are multiplied with the overflow checked, so a huge
/// `timeout_to_fail` is refused, never wrapped.
pub static TIMEOUT: OptionBound = OptionBound {
    name: "timeout_ms",
    dtm: Some(("timeout_to_fail", Unit::Seconds)),
    unit: Unit::Millis,
    min: 1,
    max: 30 * DAY_MS,
    default: None,
    limit: None,
    get: |o| o.timeout_ms,
    set: |o, v| o.timeout_ms = Some(v),
};

/// Every numeric option; a request's values are checked in this order, so both doors
/// report the same one first.
pub static OPTIONS: [&OptionBound; 6] = [
    &REQUEST_TIMEOUT,
    &RETRY_INTERVAL,
    &MAX_RETRY_INTERVAL,
    &MAX_ATTEMPTS,
    &MAX_IN_PROGRESS,
    &TIMEOUT,
];

impl OptionBound {
    /// Its value in `options`.
    pub fn of(&self, options: &TxOptions) -> Option<u64> {
        (self.get)(options)
    }

    fn position(&self) -> usize {
        OPTIONS
            .iter()
            .position(|o| std::ptr::eq(*o, self))
            .expect("every bound is in OPTIONS")
    }
}

/// One numeric option as a request gave it, under the door's name and in its unit. Kept
/// as any JSON number, so that one beyond what a u64 holds (or a fraction, or a negative)
/// is refused with the same code and message as one beyond the bound.
#[derive(Clone, Debug)]
pub struct Given {
    option: &'static OptionBound,
    field: &'static str,
    unit: Unit,
    value: Number,
}

impl Given {
    /// As the native door names it, in idem's unit.
    pub fn native(option: &'static OptionBound, value: Number) -> Given {
        Given {
            option,
            field: option.name,
            unit: option.unit,
            value,
        }
    }

    /// As the DTM door names it, in the DTM field's unit. The DTM door asks only for the
    /// rows that have a DTM field.
    pub fn dtm(option: &'static OptionBound, value: Number) -> Given {
        let (field, unit) = option.dtm.expect("an option the DTM door has");
        Given {
            option,
            field,
            unit,
            value,
        }
    }

    /// In idem's unit, if an integer within the option's bounds and the server's limit.
    fn resolve(&self, limits: &OptionLimits) -> Result<u64, ApiError> {
        let (factor, unit) = self.unit.scale();
        let (min, max) = (self.option.min, self.option.max);
        let value = self
            .value
            .as_u64()
            .and_then(|v| v.checked_mul(factor))
            .filter(|v| (min..=max).contains(v))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_options",
                    format!(
                        "{} must be an integer from {} to {}{unit} (got {})",
                        self.field,
                        min.div_ceil(factor),
                        max / factor,
                        self.value
                    ),
                )
            })?;
        let Some(limit) = &self.option.limit else {
            return Ok(value);
        };
        let bound = (limit.of)(limits);
        let (past, most_or_least, shown) = if limit.is_minimum {
            (value < bound, "least", bound.div_ceil(factor))
        } else {
            (value > bound, "most", bound / factor)
        };
        if !past {
            return Ok(value);
        }
        Err(ApiError::bad_request(
            OPTION_LIMIT,
            format!(
                "{} is {}{unit}; this server allows at {most_or_least} {shown}{unit} \
                 (idem serve {})",
                self.field, self.value, limit.flag
            ),
        ))
    }
}

/// What a request changes in the server's default options, in whichever door's names
/// and units. Only what the request gave is checked: an operator's default is not the
/// client's mistake.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub given: Vec<Given>,
    pub branch_headers: BTreeMap<String, String>,
}

/// The code of a request refused for passing a server's [`OptionLimits`].
pub const OPTION_LIMIT: &str = "option_limit";

impl Overrides {
    /// The values in idem's units, if every one is in range, within the server's
    /// `limits`, and the headers are valid.
    pub fn check(mut self, limits: &OptionLimits) -> Result<Stated, ApiError> {
        self.given.sort_by_key(|g| g.option.position());
        let mut numbers = Vec::with_capacity(self.given.len());
        for given in &self.given {
            numbers.push((given.option, given.resolve(limits)?));
        }
        check_headers(&self.branch_headers)?;
        Ok(Stated {
            numbers,
            branch_headers: self.branch_headers,
            ..Stated::default()
        })
    }
}

/// The options a create request states, checked and in idem's units, apart from the ones
/// it leaves to a default. Laid over the server's defaults they are the options of the
/// transaction it creates; laid over a stored transaction's options they are what that
/// transaction's request was if this one repeats it (see `api::identity`), whatever the
/// server's defaults are today.
#[derive(Clone, Debug, Default)]
pub struct Stated {
    /// The numeric options given, in table order.
    numbers: Vec<(&'static OptionBound, u64)>,
    /// Headers given; they add to (or replace by name) the ones under them.
    branch_headers: BTreeMap<String, String>,
    /// These three have no server default: a request always says them (its door, and
    /// false and none when it gives no `concurrent` and `orders`).
    pub protocol: Protocol,
    pub concurrent: bool,
    pub orders: BTreeMap<usize, Vec<usize>>,
}

impl Stated {
    /// `base` with what the request states laid over it.
    pub fn onto(&self, base: &TxOptions) -> TxOptions {
        let mut options = base.clone();
        for (option, value) in &self.numbers {
            (option.set)(&mut options, *value);
        }
        options.branch_headers.extend(
            self.branch_headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        options.protocol = self.protocol;
        options.concurrent = self.concurrent;
        options.orders.clone_from(&self.orders);
        options
    }
}

// ---- the list's page size ---------------------------------------------------------------

/// Transactions per page of the list, through either door (`limit`): a page is one query
/// and one answer, so a larger one is refused (`invalid_query`), like an option out of range,
/// rather than cut.
pub const MAX_LIST_LIMIT: u32 = 1_000;
/// The native door's page when `limit` is not given.
pub const DEFAULT_LIST_LIMIT: u32 = 50;
/// The DTM door's page when `limit` is not given: DTM's own default.
pub const DTM_DEFAULT_LIST_LIMIT: u32 = 100;

/// The page size a list request asked for (`default` if none), if within
/// 1..=[`MAX_LIST_LIMIT`].
pub fn list_limit(field: &str, given: Option<u32>, default: u32) -> Result<u32, ApiError> {
    let limit = given.unwrap_or(default);
    if (1..=MAX_LIST_LIMIT).contains(&limit) {
        return Ok(limit);
    }
    Err(ApiError::bad_request(
        "invalid_query",
        format!("{field} must be 1..={MAX_LIST_LIMIT} (got {limit})"),
    ))
}

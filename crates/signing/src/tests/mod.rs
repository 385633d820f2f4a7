//! The scheme's unit tests: v1 as before, v2 with its known answers, keys and keyrings.

use std::time::{Duration, UNIX_EPOCH};

use super::*;

mod keyring;
mod v1;
mod v2;

const T: u64 = 1_764_600_000;
const PATH: &str = "/inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try";
const BODY: &[u8] = br#"{"sku":"apple","quantity":2}"#;
const SECRET: &str = "0123456789abcdef0123";

fn keys(text: &str) -> Keys {
    Keys::parse(text).unwrap()
}

fn at(seconds: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

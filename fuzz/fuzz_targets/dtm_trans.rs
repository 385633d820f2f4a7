//! Any bytes as DTM's `TransGlobal` body (`/api/dtmsvr/submit`, `prepare`, `abort`): the
//! check answers Ok or a 4xx with a code, and never panics.
#![no_main]

use axum::body::Bytes;
use idem::api::validate::Limits;
use idem_types::TxOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = Ok(Bytes::copy_from_slice(data));
    if let Err(e) = idem::api::dtm::parse_trans(body, None, &TxOptions::default(), &Limits::default()) {
        let e = e.api_error();
        assert!(e.status.is_client_error(), "{} {}", e.status, e.code);
        assert!(!e.code.is_empty());
    }
});

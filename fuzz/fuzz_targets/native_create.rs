//! Any bytes as a `POST /api/v1/transactions` body: the check answers Ok or a 4xx with a
//! code, and never panics.
#![no_main]

use axum::body::Bytes;
use idem::api::validate::Limits;
use idem_types::TxOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = Ok(Bytes::copy_from_slice(data));
    if let Err(e) =
        idem::api::native::check_create(body, None, &TxOptions::default(), &Limits::default(), 0)
    {
        assert!(e.status.is_client_error(), "{} {}", e.status, e.code);
        assert!(!e.code.is_empty());
    }
});

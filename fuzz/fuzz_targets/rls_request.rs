//! Arbitrary bytes as a protobuf `RateLimitRequest` (the message Envoy sends to
//! `ShouldRateLimit`, decoded by prost, as the HTTP surface's requests are), then through
//! the service's decision (`RateLimiter::should_rate_limit`) on the memory store with the
//! rules of config/example.yaml and fuzz_targets/common/rules.yaml.
//!
//! The same bytes are read by the server's own reader (`service::wire`), which must agree
//! with prost: the same request, or a refusal exactly when prost refuses them.
//!
//! Invariants (see `common::check_answer`): no panic; a request outside the bounds is
//! refused with INVALID_ARGUMENT naming the field, and one within them only for its hits;
//! an answer has one status per descriptor and codes OK/OVER_LIMIT only; OVER_LIMIT names
//! an over descriptor, and a non-quota over descriptor makes the request OVER_LIMIT;
//! shadow, replaced and unlimited descriptors are OK; a refused request that cannot debit
//! is refused again at the same instant; the memory store never answers UNAVAILABLE.

#![no_main]

mod common;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use shardgate::service::wire::{Keep, RequestView};

fuzz_target!(|data: &[u8]| {
    let _ = common::world();
    let decoded = RateLimitRequest::decode(data);
    let ours = RequestView::decode(data, Keep::ALL);
    let Ok(req) = &decoded else {
        assert!(
            ours.is_err(),
            "prost refuses what the reader reads: {ours:?}"
        );
        return;
    };
    assert_eq!(
        ours.as_ref().ok(),
        Some(&RequestView::from(req)),
        "the reader disagrees with prost"
    );
    common::run_request(req);
});

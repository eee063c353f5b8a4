//! The Rate Limit Quota Service's policy (`envoy.service.rate_limit_quota.v3`): Envoy's
//! `rate_limit_quota` filter reports, per bucket, what it allowed and denied; shardgate
//! answers each bucket with an assignment Envoy enforces itself until it expires. A
//! bucket id stands for a descriptor of the filter's domain in the loaded rules (its
//! entries sorted by key, or as the domain's `rlqs:` section says: `config/rlqs.rs`;
//! `stream.rs`); its rule's kind becomes allow-all, deny-all or a token
//! bucket (`assign.rs`) whose rate is this Envoy's share of the limit (`share.rs`), from
//! the demand every stream on this server reports (`demand.rs`).
//!
//! It owns no socket (`server/rlqs.rs` carries the stream). On the memory store it
//! touches no store: the limit is divided among the Envoys connected to this server. On
//! a store a fleet shares, each server draws its Envoys' tokens from the rule's bucket
//! through the engine (`fleet.rs`, the bank's arithmetic in `grant.rs`) and divides what
//! it drew.

pub mod assign;
pub mod board;
pub mod demand;
pub mod fleet;
pub mod grant;
pub mod share;
pub mod stream;

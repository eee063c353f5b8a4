//! Strict validation: turns one parsed YAML document into a [`DocumentModel`], reporting
//! every problem (docs/configuration.md, "Validation") with its position instead of
//! stopping at the first. Reading a mapping's keys and scalars is `fields.rs`'s, a
//! node's `rate_limit` `rate_limit.rs`'s, the `rlqs:` section
//! `rlqs.rs`'s, the check across rules sharing a bucket
//! `shared_bucket.rs`'s; `walk.rs` walks the tree.
//!
//! It checks the schema (known keys, types, ranges) and the rules that span nodes
//! (duplicate composite keys, cascade parents, template keys, limit names shared by one
//! bucket). It must not build the matcher or touch files.

mod fields;
mod rate_limit;
mod rlqs;
mod shared_bucket;
mod validator;
mod walk;

pub(crate) use shared_bucket::SharedBuckets;
pub(crate) use walk::document;

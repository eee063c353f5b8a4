//! The commit script's arguments: each write of a slow pass as `lua/commit.lua` reads it
//! (JSON, every number a decimal string), its bounds computed here in `i128`. Pure:
//! nothing here talks to Redis.

use serde::Serialize;

use super::args::{need, turn};
use super::codec::{fields_of, push_limit};
use crate::store::key::{key_attribute_bytes, MAX_ITEM_BYTES};
use crate::store::{LimitWrite, Write};

/// One write of the commit script (`lua/commit.lua`), every number a string.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum ScriptWrite {
    Create {
        create: Vec<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ttl: Option<String>,
    },
    Update {
        update: ScriptUpdate,
    },
    Debit {
        debit: Vec<[String; 5]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ttl: Option<String>,
    },
}

#[derive(Serialize)]
pub(super) struct ScriptUpdate {
    /// The bytes of the item's key attributes, and the most an item may have: the script
    /// measures the item it leaves (`lib.lua`, `item_bytes`).
    kb: String,
    mx: String,
    erf: String,
    rf: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sc: Option<[String; 2]>,
    limits: Vec<ScriptLimit>,
}

#[derive(Serialize)]
pub(super) struct ScriptLimit {
    n: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    add: Option<ScriptAdd>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rtc: Option<String>,
}

/// An additive change: the balance must lie in `lo..=hi` (the write's floor and cap, and
/// room for the delta inside `i64`).
#[derive(Serialize)]
pub(super) struct ScriptAdd {
    lo: String,
    hi: String,
    tk: String,
    tc: String,
    turn: String,
    up: bool,
}

/// `w` as the commit script reads it.
pub(super) fn script_write(w: &Write) -> ScriptWrite {
    match w {
        Write::Create { item, .. } => ScriptWrite::Create {
            create: fields_of(item),
            ttl: item.ttl.map(|t| t.to_string()),
        },
        Write::Update {
            key,
            expected_refilled_at: expected_rf,
            refilled_at: rf,
            ttl,
            shard_count,
            limits,
        } => ScriptWrite::Update {
            update: ScriptUpdate {
                kb: key_attribute_bytes(key).to_string(),
                mx: MAX_ITEM_BYTES.to_string(),
                erf: expected_rf.to_string(),
                rf: rf.to_string(),
                ttl: ttl.map(|t| t.to_string()),
                sc: shard_count.map(|c| [c.read.to_string(), c.new.to_string()]),
                limits: limits.iter().map(script_limit).collect(),
            },
        },
        Write::Debit { debits, ttl, .. } => ScriptWrite::Debit {
            debit: debits
                .iter()
                .map(|d| {
                    [
                        d.limit.to_string(),
                        need(d).to_string(),
                        d.amount.to_string(),
                        (-i128::from(d.amount)).to_string(),
                        turn(d.amount).0.to_string(),
                    ]
                })
                .collect(),
            ttl: ttl.map(|t| t.to_string()),
        },
    }
}

fn script_limit(lw: &LimitWrite) -> ScriptLimit {
    match lw {
        LimitWrite::Add {
            limit,
            balance_delta: tk_delta,
            taken_delta: tc_delta,
            floor,
            cap,
            ..
        } => {
            let delta = i128::from(*tk_delta);
            // The sum stays in i64, and within the write's own bounds.
            let mut lo = i128::from(i64::MIN) - delta.min(0);
            let mut hi = i128::from(i64::MAX) - delta.max(0);
            if let Some(f) = floor {
                lo = lo.max(i128::from(*f));
            }
            if let Some(c) = cap {
                hi = hi.min(i128::from(*c));
            }
            let (turn, up) = turn(*tc_delta);
            ScriptLimit {
                n: limit.to_string(),
                add: Some(ScriptAdd {
                    lo: lo.to_string(),
                    hi: hi.to_string(),
                    tk: tk_delta.to_string(),
                    tc: tc_delta.to_string(),
                    turn: turn.to_string(),
                    up,
                }),
                set: None,
                rtc: None,
            }
        }
        LimitWrite::Set {
            limit,
            state,
            read_tc,
            ..
        } => {
            let mut set = Vec::with_capacity(10);
            push_limit(&mut set, limit, state);
            ScriptLimit {
                n: limit.to_string(),
                add: None,
                set: Some(set),
                rtc: read_tc.map(|t| t.to_string()),
            }
        }
    }
}

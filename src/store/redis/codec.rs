//! The Redis item format and the scripts' arguments: keys, hash fields, images decoded
//! from `HGETALL`, and each call's arguments as the scripts in `lua/` read them. Pure:
//! nothing here talks to Redis.
//!
//! An item is one hash: `rf`, `sc` (shard count), `ttl` (epoch seconds; absent: never
//! expires) and five fields per limit, `b:{limit}:tk|cp|ra|rp|tc`, every value a decimal
//! integer — the same integers the other stores hold. The key is
//! `{}{namespace}/BUCKET#{entity}#{resource}#{shard}`: the leading empty hash tag makes
//! Redis Cluster hash the whole key, so a brace in a request value can never choose the
//! slot, and the shards of one bucket land on slots of their own (spread over the
//! masters, which is what sharding a hot bucket is for).
//!
//! Bounds the scripts check are computed here in `i128`, where no sum overflows, and sent
//! as decimal strings that the scripts compare exactly (Lua's numbers are doubles).

use serde::Serialize;

use crate::store::key::{key_attribute_bytes, MAX_ITEM_BYTES};
use crate::store::{
    BucketItem, BucketKey, Credit, CreditGuard, Debit, DebitMode, LimitState, LimitWrite, Limits,
    Write, MILLI, MIN_BALANCE, WCU_LIMIT,
};

/// The prefix that makes Cluster hash the whole key (see the module comment).
const WHOLE_KEY_TAG: &str = "{}";

/// The Redis key of `key` under `namespace`.
pub(super) fn redis_key(namespace: &str, key: &BucketKey) -> String {
    let mut out = String::with_capacity(
        WHOLE_KEY_TAG.len() + namespace.len() + key.entity.len() + key.resource.len() + 16,
    );
    out.push_str(WHOLE_KEY_TAG);
    out.push_str(namespace);
    out.push_str("/BUCKET#");
    out.push_str(&key.entity);
    out.push('#');
    out.push_str(&key.resource);
    out.push('#');
    out.push_str(&key.shard.to_string());
    out
}

/// The Cluster slot of a Redis key: CRC16 (XMODEM) of the whole key, as Redis computes it
/// for a key whose first `{` is followed at once by `}` — every key of this store.
pub(super) fn slot(redis_key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(redis_key.as_bytes()) % 16_384
}

/// Why an image could not be decoded.
pub(super) type DecodeError = String;

/// The item an `HGETALL` returned as a flat field/value list (`None`: no item).
pub(super) fn decode<S: AsRef<str>>(flat: &[S]) -> Result<Option<BucketItem>, DecodeError> {
    if !flat.len().is_multiple_of(2) {
        return Err(format!("{} values, not field/value pairs", flat.len()));
    }
    decode_strings(flat.iter().map(AsRef::as_ref)).and_then(crate::store::checked_stored)
}

/// The item a script's image names: its field and value strings joined by single spaces
/// (`lua/lib.lua`, `image`; empty: no item).
pub(super) fn decode_joined(joined: &str) -> Result<Option<BucketItem>, DecodeError> {
    if joined.is_empty() {
        return Ok(None);
    }
    decode_strings(joined.split(' ')).and_then(crate::store::checked_stored)
}

/// The item of a field/value sequence (none: no item).
fn decode_strings<'a>(
    mut flat: impl Iterator<Item = &'a str>,
) -> Result<Option<BucketItem>, DecodeError> {
    let mut found = false;
    let (mut rf, mut sc, mut ttl) = (None, None, None);
    // Each limit's five fields as they are found (any value is valid, i64::MIN too: a
    // consumed counter saturates there).
    let mut fields: Vec<(&str, [Option<i64>; 5])> = Vec::new();
    while let Some(field) = flat.next() {
        found = true;
        let value = flat
            .next()
            .ok_or_else(|| format!("field '{field}' has no value: not field/value pairs"))?;
        let int = |v: &str| -> Result<i64, DecodeError> {
            v.parse()
                .map_err(|_| format!("field '{field}' is not an integer"))
        };
        match field {
            "rf" => rf = Some(int(value)?),
            "sc" => {
                sc = Some(
                    value
                        .parse::<u32>()
                        .map_err(|_| "field 'sc' is not a shard count".to_string())?,
                )
            }
            "ttl" => ttl = Some(int(value)?),
            _ => {
                let Some((name, part)) = field
                    .strip_prefix("b:")
                    .and_then(|rest| rest.rsplit_once(':'))
                else {
                    return Err(format!("unknown field '{field}'"));
                };
                let slot = match part {
                    "tk" => 0,
                    "cp" => 1,
                    "ra" => 2,
                    "rp" => 3,
                    "tc" => 4,
                    _ => return Err(format!("unknown field '{field}'")),
                };
                let v = int(value)?;
                match fields.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, parts)) => parts[slot] = Some(v),
                    None => {
                        let mut parts = [None; 5];
                        parts[slot] = Some(v);
                        fields.push((name, parts));
                    }
                }
            }
        }
    }
    if !found {
        return Ok(None);
    }
    let mut limits = Limits::new();
    for (name, parts) in fields {
        let [Some(tk), Some(cp), Some(ra), Some(rp), Some(tc)] = parts else {
            return Err(format!("limit '{name}' lacks a field"));
        };
        limits.insert(
            name,
            LimitState {
                balance: tk,
                capacity: cp,
                refill_amount: ra,
                refill_period_ms: rp,
                taken: tc,
            },
        );
    }
    Ok(Some(BucketItem {
        refilled_at: rf.ok_or("no field 'rf'")?,
        shard_count: sc.ok_or("no field 'sc'")?,
        ttl,
        limits,
    }))
}

/// The hash fields of a new item, flat (`rf`, `sc`, then five per limit).
pub(super) fn fields_of(item: &BucketItem) -> Vec<String> {
    let mut out = Vec::with_capacity(4 + 10 * item.limits.len());
    out.extend(["rf".into(), item.refilled_at.to_string()]);
    out.extend(["sc".into(), item.shard_count.to_string()]);
    for (name, st) in item.limits.iter() {
        push_limit(&mut out, name, st);
    }
    out
}

/// A limit's five fields: each suffix (`b:{name}:{suffix}`) and its value.
fn limit_parts(st: &LimitState) -> [(&'static str, i64); 5] {
    [
        ("tk", st.balance),
        ("cp", st.capacity),
        ("ra", st.refill_amount),
        ("rp", st.refill_period_ms),
        ("tc", st.taken),
    ]
}

fn push_limit(out: &mut Vec<String>, name: &str, st: &LimitState) {
    for (part, v) in limit_parts(st) {
        out.push(format!("b:{name}:{part}"));
        out.push(v.to_string());
    }
}

/// The least balance that covers `d` (`tk − amount ≥ floor`, as `tk ≥ floor + amount`).
fn need(d: &Debit) -> i128 {
    let floor = if d.gated { 0 } else { i128::from(MIN_BALANCE) };
    floor + i128::from(d.amount)
}

/// The value past which adding `delta` leaves `i64` (upward for `delta ≥ 0`).
fn turn(delta: i64) -> (i128, bool) {
    if delta >= 0 {
        (i128::from(i64::MAX) - i128::from(delta), true)
    } else {
        (i128::from(i64::MIN) - i128::from(delta), false)
    }
}

/// The item a debit creates from `seed` where there is none: `seed` with `debits` applied
/// (no `wcu` token taken: a create takes none), when the debit's conditions under `mode`
/// hold on it — the very conditions `lua/debit.lua` checks on a stored item (expiry,
/// shard count, a `wcu` token, each limit present with its parameters and covering its
/// amount). `None`: they do not, and nothing is to be created. Checked here, where the
/// seed is, so that the script only writes what it is sent.
pub(super) fn created(seed: &BucketItem, debits: &[Debit], mode: DebitMode) -> Option<BucketItem> {
    let fast = match mode {
        DebitMode::Fast { now_s, shard_count } => {
            let wcu = seed.limit(WCU_LIMIT).map_or(0, |w| w.balance);
            if seed.ttl.is_some_and(|t| t <= now_s)
                || seed.shard_count != shard_count
                || wcu < MILLI
            {
                return None;
            }
            true
        }
        DebitMode::RetryOnly => false,
    };
    let mut item = seed.clone();
    for d in debits {
        let st = item.limits.get_mut(&d.limit)?;
        let params_differ = d.params.is_some_and(|p| st.params() != p);
        if i128::from(st.balance) < need(d) || (fast && params_differ) {
            return None;
        }
        st.balance -= d.amount;
        st.taken = st.taken.saturating_add(d.amount);
    }
    Some(item)
}

/// An integer as the scripts read it: canonical decimal text.
fn text(v: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(v).to_owned()
}

/// The debit script's arguments (`lua/debit.lua`): the mode's, the item to create where
/// there is none (`created`: its fields as one string, [`seed_arg`], and its `ttl`, the
/// debit already applied), then eight per debit.
pub(super) fn debit_args(
    debits: &[Debit],
    mode: DebitMode,
    created: Option<&BucketItem>,
) -> Vec<String> {
    let mut args = Vec::with_capacity(4 + 8 * debits.len());
    match mode {
        DebitMode::Fast { now_s, shard_count } => {
            args.push(text(now_s));
            args.push(text(shard_count));
        }
        DebitMode::RetryOnly => {
            args.push(String::new());
            args.push(String::new());
        }
    }
    args.push(created.and_then(seed_arg).unwrap_or_default());
    args.push(created.and_then(|s| s.ttl).map_or_else(String::new, text));
    for d in debits {
        args.push(d.limit.to_string());
        args.push(text(need(d)));
        args.push(text(d.amount));
        args.push(text(-i128::from(d.amount)));
        args.push(text(turn(d.amount).0));
        match d.params {
            Some(p) => args.extend([
                text(p.capacity),
                text(p.refill_amount),
                text(p.refill_period_ms),
            ]),
            None => args.extend([String::new(), String::new(), String::new()]),
        }
    }
    args
}

/// An item's hash fields as the debit script takes a seed: field and value strings
/// joined by single spaces. `None` when a limit's name holds a space (the rules never
/// make one; the contract does not forbid it): such a seed is not sent, and a missing
/// item is refused as missing, to be created by the caller's commit instead.
pub(super) fn seed_arg(item: &BucketItem) -> Option<String> {
    if item.limits.iter().any(|(name, _)| name.contains(' ')) {
        return None;
    }
    // What `fields_of(item).join(" ")` is, written into one string: a seed goes with
    // every debit that may create, and building it field by field was about 5% of a
    // server's time on distinct buckets.
    let mut digits = itoa::Buffer::new();
    let mut out = String::with_capacity(24 + 80 * item.limits.len());
    out.push_str("rf ");
    out.push_str(digits.format(item.refilled_at));
    out.push_str(" sc ");
    out.push_str(digits.format(item.shard_count));
    for (name, st) in item.limits.iter() {
        for (part, v) in limit_parts(st) {
            for piece in [" b:", name, ":", part, " ", digits.format(v)] {
                out.push_str(piece);
            }
        }
    }
    Some(out)
}

/// The item a debit the script applied left: `before` (the image the script answered,
/// as it found it) with the script's own writes — each debit's amount off its balance
/// and onto its `tc` (saturating), and on the fast path one `wcu` token the same way.
/// Computed here rather than read back in the script, which costs Redis a second
/// `HGETALL`; the script checked every bound, so a limit missing or a balance leaving
/// `i64` means the image is not what the script saw.
pub(super) fn debited(
    before: BucketItem,
    debits: &[Debit],
    mode: DebitMode,
) -> Result<BucketItem, DecodeError> {
    let mut item = before;
    let wcu = matches!(mode, DebitMode::Fast { .. }).then(|| Debit {
        limit: WCU_LIMIT.into(),
        amount: MILLI,
        gated: true,
        params: None,
    });
    for d in debits.iter().chain(wcu.as_ref()) {
        let st = item
            .limits
            .get_mut(&d.limit)
            .ok_or_else(|| format!("the debited limit '{}' is missing", d.limit))?;
        st.balance = st
            .balance
            .checked_sub(d.amount)
            .ok_or_else(|| format!("limit '{}' balance leaves i64", d.limit))?;
        st.taken = st.taken.saturating_add(d.amount);
    }
    Ok(item)
}

/// The credit script's arguments (`lua/credit.lua`).
pub(super) fn credit_args(guard: CreditGuard, credits: &[Credit]) -> Vec<String> {
    let mut args = Vec::with_capacity(2 + 8 * credits.len());
    match guard {
        CreditGuard::Unrefilled(stamp) => {
            args.push(stamp.refilled_at.to_string());
            args.push(stamp.shard_count.to_string());
        }
        CreditGuard::SameCount(count) => {
            args.push(String::new());
            args.push(count.to_string());
        }
    }
    for c in credits {
        args.push(c.limit.to_string());
        // tk + amount ≤ ceiling.
        args.push((i128::from(c.ceiling) - i128::from(c.amount)).to_string());
        args.push(c.amount.to_string());
        args.push((-i128::from(c.amount)).to_string());
        args.push(turn(c.amount.saturating_neg()).0.to_string());
        args.extend([
            c.params.capacity.to_string(),
            c.params.refill_amount.to_string(),
            c.params.refill_period_ms.to_string(),
        ]);
    }
    args
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LimitParams, MILLI, WCU_LIMIT};

    #[test]
    fn the_scripts_name_the_reserved_limit_and_its_unit_as_the_contract_does() {
        // lua/lib.lua's `debit` spells both out.
        assert_eq!(WCU_LIMIT, "wcu");
        assert_eq!(MILLI, 1_000);
        let lib = include_str!("lua/lib.lua");
        let debit = &lib[lib.find("local function debit(").unwrap()..];
        assert!(debit.contains("'b:wcu:tk'") && debit.contains("'1000'"));
    }

    #[test]
    fn keys_hash_whole_so_a_brace_in_a_value_cannot_pick_the_slot() {
        let a = redis_key("ns", &BucketKey::new("{x}a", "r", 0));
        let b = redis_key("ns", &BucketKey::new("{x}b", "r", 0));
        assert!(a.starts_with("{}ns/BUCKET#"));
        // With `{x}` hashed alone both would share a slot; hashed whole they differ
        // (checked for these two values, which do).
        assert_ne!(slot(&a), slot(&b));
        // Redis's own example: the slot of "123456789" is 0x31C3 % 16384.
        assert_eq!(slot("123456789"), 0x31C3);
    }

    #[test]
    fn an_item_round_trips_through_its_fields() {
        let item = BucketItem {
            refilled_at: 1_700_000_000_123,
            shard_count: 4,
            ttl: None,
            limits: [
                (
                    "rpm",
                    LimitState::new(LimitParams::new(10, 10, 60_000), -(1 << 62), 7),
                ),
                ("a:b", LimitState::new(LimitParams::new(1, 1, 1), 0, 0)),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(decode(&fields_of(&item)), Ok(Some(item.clone())));
        // A consumed counter saturated at i64::MIN is a value like any other.
        let mut saturated = item;
        saturated.limits.get_mut("rpm").unwrap().taken = i64::MIN;
        assert_eq!(decode(&fields_of(&saturated)), Ok(Some(saturated.clone())));
        assert_eq!(decode::<String>(&[]), Ok(None));
        // As the debit scripts answer it: one string, joined by spaces.
        let joined = fields_of(&saturated).join(" ");
        assert_eq!(decode_joined(&joined), Ok(Some(saturated)));
        assert_eq!(decode_joined(""), Ok(None));
        assert!(decode_joined("rf 1 sc").unwrap_err().contains("pairs"));
    }

    #[test]
    fn a_corrupt_image_names_what_is_wrong() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(decode(&s(&["rf", "x", "sc", "1"]))
            .unwrap_err()
            .contains("'rf'"));
        assert!(decode(&s(&["rf", "1"])).unwrap_err().contains("'sc'"));
        assert!(decode(&s(&["rf", "1", "sc", "1", "b:l:tk", "5"]))
            .unwrap_err()
            .contains("lacks"));
        assert!(decode(&s(&["rf", "1", "sc", "1", "zz", "5"]))
            .unwrap_err()
            .contains("'zz'"));
    }

    #[test]
    fn a_created_item_is_the_seed_debited_when_the_debit_fits_it() {
        let params = crate::store::LimitParams::new(10, 10, 60_000);
        let wcu = crate::store::LimitParams::new(1_000, 1_000, 1_000);
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(params, 10_000, 0));
        limits.insert(WCU_LIMIT, LimitState::new(wcu, 1_000_000, 0));
        let seed = BucketItem {
            refilled_at: 5_000,
            shard_count: 1,
            ttl: Some(100),
            limits,
        };
        let debit = |amount| Debit {
            limit: "rpm".into(),
            amount,
            gated: true,
            params: Some(params),
        };
        let fast = |now_s, shard_count| DebitMode::Fast { now_s, shard_count };
        let made = created(&seed, &[debit(3_000)], fast(5, 1)).unwrap();
        assert_eq!(made.limits["rpm"], LimitState::new(params, 7_000, 3_000));
        assert_eq!(
            made.limits[WCU_LIMIT], seed.limits[WCU_LIMIT],
            "no wcu token"
        );
        assert_eq!(created(&seed, &[debit(11_000)], fast(5, 1)), None, "short");
        assert_eq!(
            created(&seed, &[debit(1_000)], fast(100, 1)),
            None,
            "expired"
        );
        assert_eq!(
            created(&seed, &[debit(1_000)], fast(5, 2)),
            None,
            "another count"
        );
    }

    #[test]
    fn an_applied_debit_is_the_image_found_with_the_scripts_writes() {
        let params = LimitParams::new(10, 10, 60_000);
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(params, 10_000, i64::MAX - 500));
        limits.insert(
            WCU_LIMIT,
            LimitState::new(LimitParams::new(5, 5, 1_000), 5_000, 0),
        );
        let before = BucketItem {
            refilled_at: 5_000,
            shard_count: 1,
            ttl: Some(100),
            limits,
        };
        let debit = |limit: &str, amount| Debit {
            limit: limit.into(),
            amount,
            gated: true,
            params: None,
        };
        let fast = DebitMode::Fast {
            now_s: 5,
            shard_count: 1,
        };
        // Twice the same limit adds up, as the script's writes do; `tc` saturates.
        let after = debited(
            before.clone(),
            &[debit("rpm", 3_000), debit("rpm", 1_000)],
            fast,
        )
        .unwrap();
        assert_eq!(after.limits["rpm"].balance, 6_000);
        assert_eq!(after.limits["rpm"].taken, i64::MAX);
        assert_eq!(after.limits[WCU_LIMIT].balance, 4_000, "one wcu token");
        assert_eq!(after.limits[WCU_LIMIT].taken, MILLI);
        let retry = debited(before.clone(), &[debit("rpm", 1)], DebitMode::RetryOnly).unwrap();
        assert_eq!(
            retry.limits[WCU_LIMIT], before.limits[WCU_LIMIT],
            "no token"
        );
        assert!(debited(before.clone(), &[debit("other", 1)], fast)
            .unwrap_err()
            .contains("'other'"));
        assert!(debited(before, &[debit("rpm", i64::MIN)], fast)
            .unwrap_err()
            .contains("leaves i64"));
    }

    #[test]
    fn a_seed_travels_as_one_string_unless_a_name_holds_a_space() {
        let params = LimitParams::new(1, 1, 1);
        let item = |name: &str| {
            let mut limits = Limits::new();
            limits.insert(name, LimitState::new(params, 1_000, 0));
            BucketItem {
                refilled_at: 7,
                shard_count: 2,
                ttl: None,
                limits,
            }
        };
        assert_eq!(
            seed_arg(&item("rpm")).unwrap(),
            "rf 7 sc 2 b:rpm:tk 1000 b:rpm:cp 1000 b:rpm:ra 1000 b:rpm:rp 1 b:rpm:tc 0"
        );
        assert_eq!(seed_arg(&item("a b")), None);
        let mut wide = item("rpm");
        wide.limits
            .insert("x.y-z", LimitState::new(params, i64::MIN, i64::MAX));
        assert_eq!(seed_arg(&wide), Some(fields_of(&wide).join(" ")));
        let created = item("a b");
        let args = debit_args(&[], DebitMode::RetryOnly, Some(&created));
        assert_eq!(
            args[2], "",
            "not sent: a missing item is refused as missing"
        );
    }

    #[test]
    fn bounds_are_exact_past_i64() {
        let d = Debit {
            limit: "l".into(),
            amount: i64::MAX,
            gated: false,
            params: None,
        };
        let args = debit_args(&[d], DebitMode::RetryOnly, None);
        assert_eq!(
            args[5],
            (i128::from(MIN_BALANCE) + i128::from(i64::MAX)).to_string()
        );
        assert_eq!(args[8], "0", "adding i64::MAX saturates past tc = 0");
    }
}

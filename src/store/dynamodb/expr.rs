//! DynamoDB expressions for the contract's conditional writes: `ADD` deltas, `SET`s and
//! the condition of each, with positional attribute aliases (`#t0`, `:a0`, …) so that
//! limit names may hold `.` and `-`. Text only: nothing here calls DynamoDB.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::store::{
    CountChange, Credit, CreditGuard, Debit, DebitMode, LimitWrite, Write, MILLI, MIN_BALANCE,
    WCU_LIMIT,
};

pub(super) fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(super) fn attr(limit: &str, field: &str) -> String {
    format!("b_{limit}_{field}")
}

/// Expression attribute names by alias.
type Names = HashMap<String, String>;

/// Expression attribute values by alias.
type Values = HashMap<String, AttributeValue>;

/// Expression attribute names and values under construction, with positional aliases.
#[derive(Default)]
pub(super) struct Expr {
    names: Names,
    values: Values,
}

impl Expr {
    pub(super) fn name(&mut self, alias: String, attribute: String) -> String {
        self.names.insert(alias.clone(), attribute);
        alias
    }

    pub(super) fn value(&mut self, alias: String, v: AttributeValue) -> String {
        self.values.insert(alias.clone(), v);
        alias
    }

    /// The names and values, moved out for the request (each `None` when empty, which
    /// DynamoDB requires).
    pub(super) fn into_parts(self) -> (Option<Names>, Option<Values>) {
        (
            (!self.names.is_empty()).then_some(self.names),
            (!self.values.is_empty()).then_some(self.values),
        )
    }
}

/// The `ADD` (and, for a retry-only debit with a `ttl`, `SET`) and condition of a debit,
/// with positional aliases.
pub(super) fn debit_expression(
    debits: &[Debit],
    mode: DebitMode,
    ttl: Option<i64>,
) -> (String, String, Expr) {
    use std::fmt::Write;
    // Written into two strings as it goes: this runs on every fast-path debit.
    let mut e = Expr::default();
    let mut add = String::with_capacity(32 * (debits.len() + 1));
    let mut cond = String::with_capacity(96 * (debits.len() + 1));
    add.push_str("ADD ");
    cond.push_str("attribute_exists(PK)");
    for (i, d) in debits.iter().enumerate() {
        let t = e.name(format!("#t{i}"), attr(&d.limit, "tk"));
        let c = e.name(format!("#c{i}"), attr(&d.limit, "tc"));
        let neg = e.value(format!(":n{i}"), n(-d.amount));
        let pos = e.value(format!(":a{i}"), n(d.amount));
        if i > 0 {
            add.push_str(", ");
        }
        let _ = write!(add, "{t} {neg}, {c} {pos}");
        if d.gated {
            let _ = write!(cond, " AND {t} >= {pos}");
        } else {
            let floor = e.value(format!(":f{i}"), n(MIN_BALANCE.saturating_add(d.amount)));
            let _ = write!(cond, " AND {t} >= {floor}");
        }
        if let (DebitMode::Fast { .. }, Some(p)) = (mode, d.params) {
            for (field, v) in [
                ("cp", p.capacity),
                ("ra", p.refill_amount),
                ("rp", p.refill_period_ms),
            ] {
                let name = e.name(format!("#{field}{i}"), attr(&d.limit, field));
                let val = e.value(format!(":{field}{i}"), n(v));
                let _ = write!(cond, " AND {name} = {val}");
            }
        }
    }
    if let DebitMode::Fast { now_s, shard_count } = mode {
        let sc = e.name("#sc".into(), "shard_count".into());
        let scv = e.value(":sc".into(), n(i64::from(shard_count)));
        let _ = write!(cond, " AND {sc} = {scv}");
        let wt = e.name("#wt".into(), attr(WCU_LIMIT, "tk"));
        let wc = e.name("#wc".into(), attr(WCU_LIMIT, "tc"));
        let wneg = e.value(":wneg".into(), n(-MILLI));
        let wpos = e.value(":wpos".into(), n(MILLI));
        if !debits.is_empty() {
            add.push_str(", ");
        }
        let _ = write!(add, "{wt} {wneg}, {wc} {wpos}");
        let _ = write!(cond, " AND {wt} >= {wpos}");
        let ttl = e.name("#ttl".into(), "ttl".into());
        let now = e.value(":now".into(), n(now_s));
        let _ = write!(cond, " AND (attribute_not_exists({ttl}) OR {ttl} > {now})");
    }
    if let Some(t) = ttl {
        let name = e.name("#ttl".into(), "ttl".into());
        let v = e.value(":ttl".into(), n(t));
        let _ = write!(add, " SET {name} = {v}");
    }
    (add, cond, e)
}

/// The clauses of an update expression and its condition, gathered while the names and
/// values are bound.
#[derive(Default)]
struct Clauses {
    set: Vec<String>,
    add: Vec<String>,
    remove: Vec<String>,
    cond: Vec<String>,
}

impl Clauses {
    /// The update expression and the condition, as DynamoDB takes them.
    fn into_expressions(self) -> (String, String) {
        let mut update = format!("SET {}", self.set.join(", "));
        if !self.add.is_empty() {
            update.push_str(&format!(" ADD {}", self.add.join(", ")));
        }
        if !self.remove.is_empty() {
            update.push_str(&format!(" REMOVE {}", self.remove.join(", ")));
        }
        (update, self.cond.join(" AND "))
    }
}

/// The update and condition of a slow-path write under the `rf` lock.
pub(super) fn update_expression(
    expected_rf: i64,
    rf: i64,
    ttl: Option<i64>,
    shard_count: Option<CountChange>,
    limits: &[LimitWrite],
) -> (String, String, Expr) {
    let mut e = Expr::default();
    let rf_name = e.name("#rf".into(), "rf".into());
    let rf_val = e.value(":rf".into(), n(rf));
    let erf = e.value(":erf".into(), n(expected_rf));
    let ttl_name = e.name("#ttl".into(), "ttl".into());
    let mut x = Clauses {
        set: vec![format!("{rf_name} = {rf_val}")],
        cond: vec![format!("{rf_name} = {erf}")],
        ..Clauses::default()
    };
    match ttl {
        Some(t) => {
            let v = e.value(":ttl".into(), n(t));
            x.set.push(format!("{ttl_name} = {v}"));
            // The stored expiry is never moved earlier; a missing `ttl` (the item never
            // expires) fails the comparison too.
            x.cond.push(format!("{ttl_name} <= {v}"));
        }
        None => x.remove.push(ttl_name),
    }
    if let Some(change) = shard_count {
        let sc = e.name("#sc".into(), "shard_count".into());
        let read = e.value(":scr".into(), n(i64::from(change.read)));
        let new = e.value(":scn".into(), n(i64::from(change.new)));
        x.set.push(format!("{sc} = {new}"));
        x.cond.push(format!("{sc} = {read}"));
        // When the count was raised: the write's `rf` (see `BucketItem::count_raised_at`).
        let sa = e.name("#sa".into(), "sa".into());
        x.set.push(format!("{sa} = {rf_val}"));
    }
    for (i, w) in limits.iter().enumerate() {
        limit_clauses(&mut e, &mut x, i, w);
    }
    let (update, cond) = x.into_expressions();
    (update, cond, e)
}

/// The clauses of the `i`th limit's write: an additive delta with its floor and bound,
/// or the limit set whole on condition that it is as read.
fn limit_clauses(e: &mut Expr, x: &mut Clauses, i: usize, w: &LimitWrite) {
    match w {
        LimitWrite::Add {
            limit,
            balance_delta: tk_delta,
            taken_delta: tc_delta,
            floor,
            cap,
            ..
        } => {
            let t = e.name(format!("#t{i}"), attr(limit, "tk"));
            let c = e.name(format!("#c{i}"), attr(limit, "tc"));
            let dv = e.value(format!(":d{i}"), n(*tk_delta));
            let cv = e.value(format!(":u{i}"), n(*tc_delta));
            x.add.push(format!("{t} {dv}, {c} {cv}"));
            x.cond.push(format!("attribute_exists({t})"));
            if let Some(f) = floor {
                let fv = e.value(format!(":f{i}"), n(*f));
                x.cond.push(format!("{t} >= {fv}"));
            }
            if let Some(cp) = cap {
                let kv = e.value(format!(":k{i}"), n(*cp));
                x.cond.push(format!("{t} <= {kv}"));
            }
        }
        LimitWrite::Set {
            limit,
            state,
            read_tc,
            ..
        } => {
            // As read: `tc` unmoved by a concurrent debit, or the limit still absent.
            let c = e.name(format!("#c{i}"), attr(limit, "tc"));
            match read_tc {
                Some(tc) => {
                    let v = e.value(format!(":r{i}"), n(*tc));
                    x.cond.push(format!("{c} = {v}"));
                }
                None => x.cond.push(format!("attribute_not_exists({c})")),
            }
            for (field, v) in [
                ("tk", state.balance),
                ("cp", state.capacity),
                ("ra", state.refill_amount),
                ("rp", state.refill_period_ms),
                ("tc", state.taken),
            ] {
                let name = e.name(format!("#{field}{i}"), attr(limit, field));
                let val = e.value(format!(":{field}{i}"), n(v));
                x.set.push(format!("{name} = {val}"));
            }
        }
    }
}

/// The update and condition expressions of a slow-path update or a retry-only debit
/// (`None` for a create, which is a conditional put).
pub(super) fn update_of(w: &Write) -> Option<(String, String, Expr)> {
    match w {
        Write::Create { .. } => None,
        Write::Update {
            expected_refilled_at: expected_rf,
            refilled_at: rf,
            ttl,
            shard_count,
            limits,
            ..
        } => Some(update_expression(
            *expected_rf,
            *rf,
            *ttl,
            *shard_count,
            limits,
        )),
        Write::Debit { debits, ttl, .. } => {
            Some(debit_expression(debits, DebitMode::RetryOnly, *ttl))
        }
    }
}

/// The `ADD` and condition of a credit: the item meeting `guard` (for a refund, not
/// refilled nor doubled since the debit: `rf` and count as it showed; for a lease's
/// return, the count), each limit's balance at or under its ceiling after it and its
/// parameters those the tokens were taken under.
pub(super) fn credit_expression(guard: CreditGuard, credits: &[Credit]) -> (String, String, Expr) {
    let mut e = Expr::default();
    let mut add = Vec::new();
    let mut cond = Vec::new();
    let count = match guard {
        CreditGuard::Unrefilled(stamp) => {
            let rf = e.name("#rf".into(), "rf".into());
            let erf = e.value(":erf".into(), n(stamp.refilled_at));
            cond.push(format!("{rf} = {erf}"));
            stamp.shard_count
        }
        CreditGuard::SameCount(count) => count,
    };
    let sc = e.name("#sc".into(), "shard_count".into());
    let esc = e.value(":esc".into(), n(i64::from(count)));
    cond.push(format!("{sc} = {esc}"));
    for (i, c) in credits.iter().enumerate() {
        let t = e.name(format!("#t{i}"), attr(&c.limit, "tk"));
        let tc = e.name(format!("#c{i}"), attr(&c.limit, "tc"));
        let a = e.value(format!(":a{i}"), n(c.amount));
        let na = e.value(format!(":n{i}"), n(-c.amount));
        let lim = e.value(format!(":l{i}"), n(c.ceiling.saturating_sub(c.amount)));
        add.push(format!("{t} {a}, {tc} {na}"));
        cond.push(format!("{t} <= {lim}"));
        for (field, v) in [
            ("cp", c.params.capacity),
            ("ra", c.params.refill_amount),
            ("rp", c.params.refill_period_ms),
        ] {
            let name = e.name(format!("#{field}{i}"), attr(&c.limit, field));
            let val = e.value(format!(":{field}{i}"), n(v));
            cond.push(format!("{name} = {val}"));
        }
    }
    (format!("ADD {}", add.join(", ")), cond.join(" AND "), e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitParams;
    #[test]
    fn fast_debit_expression_uses_positional_aliases() {
        let debits = [Debit {
            limit: "rpm.v2-x_y".into(),
            amount: 1_000,
            gated: true,
            params: Some(LimitParams::new(10, 10, 60_000)),
        }];
        let fast = DebitMode::Fast {
            now_s: 5,
            shard_count: 2,
        };
        let (u, c, e) = debit_expression(&debits, fast, None);
        assert_eq!(u, "ADD #t0 :n0, #c0 :a0, #wt :wneg, #wc :wpos");
        assert!(
            !u.contains("rpm") && !c.contains("rpm"),
            "names only through aliases"
        );
        assert_eq!(e.names["#t0"], "b_rpm.v2-x_y_tk");
        assert!(c.starts_with("attribute_exists(PK) AND #t0 >= :a0 AND #cp0 = :cp0"));
        assert!(c.ends_with(
            "#sc = :sc AND #wt >= :wpos AND (attribute_not_exists(#ttl) OR #ttl > :now)"
        ));
    }
}

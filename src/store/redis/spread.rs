//! A commit whose items lie on several Redis Cluster slots: no script can write them
//! atomically (each slot may live on another master), so the commit is made slot by
//! slot, and undone as far as it went when a later slot refuses.
//!
//! How, and why it admits no more than one atomic commit would:
//!
//! 1. The writes are grouped by slot, in the order the engine gave them, and each group is
//!    one commit script: atomic on its node, all its conditions checked before it writes.
//! 2. When a group is refused (or fails), each write of the groups already applied is
//!    undone: put back exactly as it was (a created item deleted) when nothing touched the
//!    item since — it still holds exactly what the write left — and the write did not
//!    raise the shard count (a count once seen on shard 0 must never go down: a server
//!    that saw it may already have created a shard sized for it). Otherwise its request's
//!    claim is given back — the write's `claimed` millitokens (a created item's `tc`, a
//!    retry's debits) — as a credit under [`CreditGuard::Unrefilled`], stamped with the
//!    item as the write left it: exactly the refund of a voided fast-path debit. The
//!    refused group's items are reported as the conflict, as on the other stores.
//!
//! An exact undo is the same as no write. For the rest: each applied group on its own is a write some slow pass could make alone: a refill
//! from the item's `rf` to now (tokens that accrued, whoever takes them), a clamp or a
//! shard-count raise (which only lower shares), a limit seeded or rewritten, plus the
//! request's claim. The claim is the only part the failed request must not keep, and the
//! credit gives it back under the conditions that keep any credit safe: only onto an
//! item neither refilled nor doubled since (a refill since may already have restored
//! the tokens through its clamp at the ceiling, and a credit on top would mint them),
//! never above the shard's share, only under the parameters the tokens were taken with.
//! A credit that cannot land loses those tokens until the next refill: the bucket admits
//! less, never more. Between the apply and the give-back other requests see less than
//! they would have — an under-admission bounded by one request's claim, for one round
//! trip. So every interleaving admits at most what the buckets' capacity plus refill
//! allows; the engine's bound tests run on a Cluster to show it.
//!
//! A group whose call fails as the store's fault (an answer lost past the resend, a
//! timeout) may have applied: it is sent once more with the same operation id, which
//! answers what the first run did (or applies it now), and what it applied is given back
//! with the groups before it. When that fails too, its claim stays taken: an
//! under-admission, as on DynamoDB when a transaction's answer is lost.

use crate::store::{
    BucketItem, BucketStore, CommitOutcome, Credit, CreditGuard, LimitWrite, Name, Stamp,
    StoreError, Write, WCU_LIMIT,
};

use super::codec::{op_id, slot};
use super::scripts::UNDO;
use super::store::{Applied, RedisStore, Written};

impl RedisStore {
    /// `writes` (whose Redis keys are `keys`) slot by slot; see the module comment.
    pub(super) async fn commit_spread(
        &self,
        writes: &[Write],
        keys: &[String],
    ) -> Result<CommitOutcome, StoreError> {
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let s = slot(k);
            match groups.iter_mut().find(|(g, _)| *g == s) {
                Some((_, members)) => members.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        let mut applied: Vec<(usize, Written)> = Vec::new();
        for (_, members) in &groups {
            let group: Vec<Write> = members.iter().map(|&i| writes[i].clone()).collect();
            let group_keys: Vec<String> = members.iter().map(|&i| keys[i].clone()).collect();
            let op = op_id();
            match self.commit_together(&group, &group_keys, true, &op).await {
                Ok(Applied::Committed(images)) => {
                    applied.extend(members.iter().copied().zip(images));
                }
                Ok(Applied::Refused(failed)) => {
                    self.give_back(writes, &applied).await;
                    let failed = failed
                        .into_iter()
                        .map(|(j, image)| (members[j], image))
                        .collect();
                    return Ok(CommitOutcome::Conflict(failed));
                }
                Err(e) => {
                    // It may have applied before failing (an answer lost past the
                    // resend, a timeout): sent once more with the same operation id, it
                    // answers what it did (or applies now), and is given back with the
                    // rest. Not a store's refusal of this request, which wrote nothing.
                    if e.is_fault() {
                        if let Ok(Applied::Committed(images)) =
                            self.commit_together(&group, &group_keys, true, &op).await
                        {
                            applied.extend(members.iter().copied().zip(images));
                        }
                    }
                    self.give_back(writes, &applied).await;
                    return Err(e);
                }
            }
        }
        Ok(CommitOutcome::Committed)
    }

    /// Undoes each applied write, last first: exactly when its item is untouched, else by
    /// giving back what it claimed (best effort: a credit that cannot land only lowers
    /// the bucket).
    async fn give_back(&self, writes: &[Write], applied: &[(usize, Written)]) {
        for (i, written) in applied.iter().rev() {
            let w = &writes[*i];
            let raised = matches!(
                w,
                Write::Update {
                    shard_count: Some(_),
                    ..
                }
            );
            if !raised {
                match self.undo(w, written).await {
                    Ok(true) => continue,
                    Ok(false) => {}
                    // Not counted yet: the give-back below may still land.
                    Err(e) => tracing::debug!(error = %e, "a spread commit's write was not undone"),
                }
            }
            let credits = claimed_credits(w, &written.image);
            if credits.is_empty() {
                continue;
            }
            let guard = CreditGuard::Unrefilled(Stamp::of(&written.image));
            if let Err(e) = self.credit(w.key(), guard, &credits).await {
                crate::store::counters::spread_undo_failed();
                tracing::debug!(error = %e, "a spread commit's claim was not given back");
            }
        }
    }

    /// Puts `w`'s item back as it was, if it still holds exactly what `w` left (never
    /// when how it was is not known: the commit's answer came from a second run).
    async fn undo(&self, w: &Write, written: &Written) -> Result<bool, StoreError> {
        let Some(before) = &written.before else {
            return Ok(false);
        };
        let key = super::codec::redis_key(self.namespace(), w.key());
        let undo = serde_json::json!({ "post": written.after, "pre": before });
        let mut call = UNDO.call(&[&key]);
        call.arg(undo.to_string()).arg(op_id());
        let out = self.run_once(&key, &UNDO, &call).await?;
        Ok(matches!(out, redis::Value::Int(1)))
    }
}

/// What `w` took for its request, by limit (see [`LimitWrite::Add`]'s `claimed`).
fn claimed(w: &Write) -> Vec<(Name, i64)> {
    let all: Vec<(Name, i64)> = match w {
        // A created item's `tc` is what its request took from the full share.
        Write::Create { item, .. } => item
            .limits
            .iter()
            .filter(|(name, _)| *name != WCU_LIMIT)
            .map(|(name, st)| (Name::new(name), st.taken))
            .collect(),
        Write::Update { limits, .. } => limits
            .iter()
            .map(|lw| match lw {
                LimitWrite::Add { limit, claimed, .. } | LimitWrite::Set { limit, claimed, .. } => {
                    (limit.clone(), *claimed)
                }
            })
            .collect(),
        Write::Debit { debits, .. } => debits.iter().map(|d| (d.limit.clone(), d.amount)).collect(),
    };
    all.into_iter().filter(|(_, amount)| *amount > 0).collect()
}

/// The credits that give back `w`'s claim on the item it left as `image`.
fn claimed_credits(w: &Write, image: &BucketItem) -> Vec<Credit> {
    claimed(w)
        .into_iter()
        .filter_map(|(limit, amount)| {
            let params = image.limit(&limit)?.params();
            Some(Credit {
                ceiling: params.share(image.shard_count).ceiling,
                limit,
                amount,
                params,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BucketKey, Debit, LimitParams, LimitState};

    #[test]
    fn the_claim_is_what_the_request_took_never_the_refill_or_wcu() {
        let params = LimitParams::new(10, 10, 1_000);
        let item = BucketItem {
            refilled_at: 5,
            shard_count: 2,
            count_raised_at: 0,
            ttl: None,
            limits: [
                ("rps", LimitState::new(params, 3_000, 2_000)),
                (WCU_LIMIT, LimitState::new(params, 1_000, 0)),
            ]
            .into_iter()
            .collect(),
        };
        let key = BucketKey::new("e", "r", 1);
        let create = Write::Create {
            key: key.clone(),
            item: item.clone(),
        };
        let credits = claimed_credits(&create, &item);
        assert_eq!(credits.len(), 1);
        assert_eq!((credits[0].amount, credits[0].ceiling), (2_000, 5_000));

        let update = Write::Update {
            key: key.clone(),
            expected_refilled_at: 1,
            refilled_at: 5,
            ttl: None,
            shard_count: None,
            limits: vec![
                LimitWrite::Add {
                    limit: "rps".into(),
                    balance_delta: 4_000,
                    taken_delta: 1_000,
                    floor: None,
                    cap: Some(0),
                    claimed: 1_000,
                },
                LimitWrite::Add {
                    limit: WCU_LIMIT.into(),
                    balance_delta: 500,
                    taken_delta: 0,
                    floor: None,
                    cap: Some(0),
                    claimed: 0,
                },
            ],
        };
        let credits = claimed_credits(&update, &item);
        assert_eq!(credits.len(), 1);
        assert_eq!(credits[0].amount, 1_000, "the refill stays");

        let retry = Write::Debit {
            key,
            debits: vec![Debit {
                limit: "rps".into(),
                amount: 1_000,
                gated: true,
                params: None,
            }],
            ttl: None,
        };
        assert_eq!(claimed_credits(&retry, &item)[0].amount, 1_000);
    }
}

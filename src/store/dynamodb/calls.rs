//! What the DynamoDB store does: its construction, and the contract's calls as
//! conditional UpdateItem, PutItem, BatchGetItem and TransactWriteItems, their conflicts
//! retried, their failures classified.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, Put, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;

use super::client::connection;
use super::ledger::CallLedger;

use super::codec::Item;
use super::expr::{credit_expression, debit_expression, update_of, Expr};
use super::failure::{cause, describe, TRANSACTION_THROTTLING};
use super::ledger::{capacity, capacity_all};

use super::super::detached::caller_gone;
use super::super::key::{check_commit, check_item, check_key, check_once};
use super::super::seed::seed_after_debit;
use super::super::DEFAULT_STORE_TIMEOUT;
use super::super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write, MAX_COMMIT_ITEMS,
};
use super::seeded::debit_or_create_expression;

use super::store::{DynamoOptions, DynamoStore};

/// Backoff caps (full jitter) of the retries of a write refused by [`CONFLICT`](super::store::CONFLICT); small,
/// and none past the call's deadline. Then it is [`StoreError::Contention`].
const CONFLICT_BACKOFF_CAPS_MS: [u64; 3] = [2, 4, 8];

impl DynamoStore {
    /// Connects with the standard AWS chain (see [`client`]).
    pub async fn connect(options: &DynamoOptions) -> DynamoStore {
        let (client, credentials) = connection(options).await;
        let mut store = DynamoStore::new(client, &options.table, &options.namespace)
            .with_timeout(options.timeout);
        store.credentials = credentials;
        store
    }

    /// A store on `table` with keys under `namespace`, its calls bounded by
    /// [`DEFAULT_STORE_TIMEOUT`] (the client's own timeouts are its builder's).
    pub fn new(client: Client, table: &str, namespace: &str) -> DynamoStore {
        DynamoStore {
            client,
            table: table.to_string(),
            namespace: namespace.to_string(),
            timeout: DEFAULT_STORE_TIMEOUT,
            credentials: None,
            ledger: CallLedger::default(),
        }
    }

    /// Bounds this store's own retry loops (unprocessed keys) by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> DynamoStore {
        self.timeout = timeout;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The calls made so far.
    pub fn ledger(&self) -> &CallLedger {
        &self.ledger
    }

    /// The prefix of every key this store writes.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Runs `attempt` (one single-item write) until no transaction holds its item:
    /// retried after jittered waits within [`CONFLICT_BACKOFF_CAPS_MS`], none starting
    /// or running past the call's deadline (the first try's start plus the store
    /// timeout: the SDK's own timeout bounds one try, not this loop), and none once the
    /// caller has gone (nobody reads the answer, and each try loads an item already
    /// busy). Then the item is contended.
    async fn until_no_conflict<T, F>(
        &self,
        key: &BucketKey,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<Option<T>, StoreError>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        if let Some(done) = attempt().await? {
            return Ok(done);
        }
        for cap in CONFLICT_BACKOFF_CAPS_MS {
            let wait = jitter(cap);
            if caller_gone() || tokio::time::Instant::now() + wait >= deadline {
                break;
            }
            tokio::time::sleep(wait).await;
            match tokio::time::timeout_at(deadline, attempt()).await {
                Ok(result) => {
                    if let Some(done) = result? {
                        return Ok(done);
                    }
                }
                // Cut off at the deadline: still the transactions' doing, not the store's.
                Err(_) => break,
            }
        }
        Err(StoreError::Contention { key: self.pk(key) })
    }

    /// One conditional `UpdateItem` built by `expression` (again for each retry after a
    /// [`CONFLICT`]); `Ok(Err(old image))` when the condition failed.
    async fn update(
        &self,
        key: &BucketKey,
        expression: impl Fn() -> (String, String, Expr),
    ) -> Result<Result<BucketItem, Option<BucketItem>>, StoreError> {
        self.until_no_conflict(key, || {
            let (u, c, e) = expression();
            self.update_once(key, u, c, e)
        })
        .await
    }

    /// One `UpdateItem` attempt; `None` when a transaction held the item.
    async fn update_once(
        &self,
        key: &BucketKey,
        update: String,
        condition: String,
        e: Expr,
    ) -> Result<Option<Result<BucketItem, Option<BucketItem>>>, StoreError> {
        let (names, values) = e.into_parts();
        let result = Box::pin(
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.key_of(key)))
                .update_expression(update)
                .condition_expression(condition)
                .set_expression_attribute_names(names)
                .set_expression_attribute_values(values)
                .return_values(ReturnValue::AllNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send(),
        )
        .await;
        match result {
            Ok(out) => {
                self.ledger
                    .record("UpdateItem", "ok", capacity(out.consumed_capacity()));
                let image = self
                    .decode_opt(key, out.attributes())?
                    .ok_or_else(|| self.unavailable(key, "UpdateItem returned no item".into()))?;
                Ok(Some(Ok(image)))
            }
            Err(err) => {
                let condition_failed = match err.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(ccf)) => Some(ccf.item()),
                    _ => None,
                };
                Ok(self
                    .refused("UpdateItem", key, &err, condition_failed)?
                    .map(Err))
            }
        }
    }

    /// A conditional `PutItem` of a new item; `Ok(Some(current))` when it exists already.
    async fn put_new(
        &self,
        key: &BucketKey,
        item: &BucketItem,
    ) -> Result<Option<Option<BucketItem>>, StoreError> {
        self.until_no_conflict(key, || self.put_once(key, item))
            .await
    }

    /// One `PutItem` attempt; `None` when a transaction held the item.
    async fn put_once(
        &self,
        key: &BucketKey,
        item: &BucketItem,
    ) -> Result<Option<Option<Option<BucketItem>>>, StoreError> {
        let result = Box::pin(
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(self.encode(key, item)))
                .condition_expression("attribute_not_exists(PK)")
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send(),
        )
        .await;
        match result {
            Ok(out) => {
                self.ledger
                    .record("PutItem", "ok", capacity(out.consumed_capacity()));
                Ok(Some(None))
            }
            Err(err) => {
                let condition_failed = match err.as_service_error() {
                    Some(PutItemError::ConditionalCheckFailedException(ccf)) => Some(ccf.item()),
                    _ => None,
                };
                Ok(self
                    .refused("PutItem", key, &err, condition_failed)?
                    .map(Some))
            }
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "the builder is given every required field; updates and debits have an expression"
    )]
    fn transact_item(&self, w: &Write) -> TransactWriteItem {
        let old = ReturnValuesOnConditionCheckFailure::AllOld;
        match w {
            Write::Create { key, item } => TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&self.table)
                        .set_item(Some(self.encode(key, item)))
                        .condition_expression("attribute_not_exists(PK)")
                        .return_values_on_condition_check_failure(old)
                        .build()
                        .expect("table, item and condition are set"),
                )
                .build(),
            Write::Update { key, .. } | Write::Debit { key, .. } => {
                let (u, c, e) = update_of(w).expect("updates and debits have an expression");
                self.transact_update(key, u, c, e)
            }
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "the builder is given every required field"
    )]
    fn transact_update(&self, key: &BucketKey, u: String, c: String, e: Expr) -> TransactWriteItem {
        let (names, values) = e.into_parts();
        TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name(&self.table)
                    .set_key(Some(self.key_of(key)))
                    .update_expression(u)
                    .condition_expression(c)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .expect("table, key and expressions are set"),
            )
            .build()
    }

    #[expect(clippy::expect_used, reason = "updates and debits have an expression")]
    async fn commit_one(&self, w: &Write) -> Result<CommitOutcome, StoreError> {
        let refused = |image: Option<BucketItem>| CommitOutcome::Conflict(vec![(0, image)]);
        Ok(match w {
            Write::Create { key, item } => match self.put_new(key, item).await? {
                None => CommitOutcome::Committed,
                Some(image) => refused(image),
            },
            Write::Update { key, .. } | Write::Debit { key, .. } => {
                let expression = || update_of(w).expect("updates and debits have an expression");
                match self.update(key, expression).await? {
                    Ok(_) => CommitOutcome::Committed,
                    Err(image) => refused(image),
                }
            }
        })
    }
}

impl BucketStore for DynamoStore {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        check_key(key)?;
        check_once(key, debits, |d| &d.limit)?;
        Ok(
            match self
                .update(key, || debit_expression(debits, mode, None))
                .await?
            {
                Ok(image) => DebitOutcome::Applied(image),
                Err(image) => DebitOutcome::Refused(image),
            },
        )
    }

    /// One `UpdateItem` for a bucket's first request too (`seeded.rs`): a missing item is
    /// created from the seed, debited. Where the seed does not fit the debit, or one
    /// expression cannot serve (see `seeded.rs`), the plain debit: a missing item is
    /// refused as missing and created by the caller's commit.
    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        check_key(key)?;
        check_once(key, debits, |d| &d.limit)?;
        let item = seed();
        let one_write =
            check_item(key, &item).is_ok() && seed_after_debit(&item, debits, mode).is_some();
        let expression = || {
            one_write
                .then(|| debit_or_create_expression(key, debits, mode, &item))
                .flatten()
                .unwrap_or_else(|| debit_expression(debits, mode, None))
        };
        Ok(match self.update(key, expression).await? {
            Ok(image) => DebitOutcome::Applied(image),
            Err(image) => DebitOutcome::Refused(image),
        })
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        let first = keys
            .first()
            .cloned()
            .unwrap_or_else(|| BucketKey::new("", "", 0));
        for k in keys {
            check_key(k)?;
        }
        let mut by_pk: HashMap<String, Item> = HashMap::new();
        let mut wanted: Vec<Item> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            if seen.insert(self.pk(k)) {
                wanted.push(self.key_of(k));
            }
        }
        // Unprocessed keys (throttling) are asked for again with backoff, but never past
        // the call's deadline (the SDK's own timeout covers one call, not this loop) nor
        // once the caller has gone.
        let deadline = tokio::time::Instant::now() + self.timeout;
        for chunk in wanted.chunks(MAX_COMMIT_ITEMS) {
            let mut pending: Vec<Item> = chunk.to_vec();
            let mut delay = Duration::from_millis(10);
            for attempt in 0..4 {
                if pending.is_empty() {
                    break;
                }
                if attempt > 0 {
                    if caller_gone() || tokio::time::Instant::now() + delay >= deadline {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                let ka = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| self.unavailable(&first, e.to_string()))?;
                let out = Box::pin(
                    self.client
                        .batch_get_item()
                        .request_items(&self.table, ka)
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send(),
                )
                .await;
                let out = match out {
                    Ok(o) => o,
                    Err(err) => return Err(self.failed("BatchGetItem", &first, &err)),
                };
                self.ledger
                    .record("BatchGetItem", "ok", capacity_all(out.consumed_capacity()));
                if let Some(items) = out.responses().and_then(|r| r.get(&self.table)) {
                    for it in items {
                        if let Some(AttributeValue::S(pk)) = it.get("PK") {
                            by_pk.insert(pk.clone(), it.clone());
                        }
                    }
                }
                if let Some(un) = out.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                    pending = un.keys().to_vec();
                }
            }
            // Keys DynamoDB kept leaving unprocessed: their partitions are throttled.
            if let Some(left) = pending.first() {
                let throttled = keys
                    .iter()
                    .find(|k| left.get("PK") == Some(&AttributeValue::S(self.pk(k))))
                    .unwrap_or(&first);
                return Err(StoreError::Throttled {
                    key: throttled.clone(),
                });
            }
        }
        keys.iter()
            .map(|k| self.decode_opt(k, by_pk.get(&self.pk(k))))
            .collect()
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let first = check_commit(writes, |k| self.pk(k))?;
        if let [only] = writes {
            return self.commit_one(only).await;
        }
        let items: Vec<TransactWriteItem> = writes.iter().map(|w| self.transact_item(w)).collect();
        let result = Box::pin(
            self.client
                .transact_write_items()
                .set_transact_items(Some(items))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send(),
        )
        .await;
        match result {
            Ok(out) => {
                self.ledger.record(
                    "TransactWriteItems",
                    "ok",
                    capacity_all(out.consumed_capacity()),
                );
                Ok(CommitOutcome::Committed)
            }
            Err(err) => {
                let reasons = match err.as_service_error() {
                    Some(TransactWriteItemsError::TransactionCanceledException(t)) => {
                        Some(t.cancellation_reasons().to_vec())
                    }
                    _ => None,
                };
                let Some(reasons) = reasons else {
                    return Err(self.failed("TransactWriteItems", first.key(), &err));
                };
                self.ledger.record("TransactWriteItems", "cancelled", 0.0);
                let mut failed = Vec::new();
                let mut unknown = Vec::new();
                // One reason per write, in order; a reason past the writes is ignored.
                for (i, (r, w)) in reasons.iter().zip(writes).enumerate() {
                    match r.code() {
                        Some("ConditionalCheckFailed") => {
                            failed.push((i, self.decode_opt(w.key(), r.item())?));
                        }
                        Some("None") | None => {}
                        // This request's item (too large, a bad expression): its error.
                        Some(code @ ("ValidationError" | "ItemCollectionSizeLimitExceeded")) => {
                            return Err(self.refused_in_transaction(w.key(), code, r));
                        }
                        // That item's partition is throttled: its bucket's contention.
                        Some(code) if TRANSACTION_THROTTLING.contains(&code) => {
                            return Err(StoreError::Throttled {
                                key: w.key().clone(),
                            });
                        }
                        // A conflicting concurrent transaction: treat as a lost race and
                        // let the caller retry against the item as it is now.
                        Some(_) => unknown.push((i, w.key().clone())),
                    }
                }
                if !unknown.is_empty() {
                    let (places, keys): (Vec<usize>, Vec<BucketKey>) = unknown.into_iter().unzip();
                    let images = self.read(&keys).await?;
                    failed.extend(places.into_iter().zip(images));
                    failed.sort_by_key(|f| f.0);
                }
                if failed.is_empty() {
                    return Err(self.unavailable_from(first.key(), describe(&err), cause(&err)));
                }
                Ok(CommitOutcome::Conflict(failed))
            }
        }
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        check_key(key)?;
        check_once(key, credits, |c| &c.limit)?;
        let mut todo: Vec<Credit> = credits.to_vec();
        for _ in 0..2 {
            if todo.is_empty() {
                break;
            }
            match self.update(key, || credit_expression(guard, &todo)).await? {
                Ok(_) => return Ok(todo),
                Err(None) => return Ok(Vec::new()),
                Err(Some(image)) if !guard.admits(image.refilled_at, image.shard_count) => {
                    return Ok(Vec::new())
                }
                Err(Some(image)) => {
                    // Keep only the credits that still fit under their ceiling.
                    todo.retain(|c| {
                        image
                            .limit(&c.limit)
                            .is_some_and(|st| st.balance.saturating_add(c.amount) <= c.ceiling)
                    });
                }
            }
        }
        Ok(Vec::new())
    }
}

/// A random wait up to `cap_ms` (full jitter) before a retry.
fn jitter(cap_ms: u64) -> Duration {
    Duration::from_micros(rand::random_range(0..=cap_ms * 1_000))
}

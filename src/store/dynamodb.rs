//! The DynamoDB store: bucket items in one table, shared by a fleet of servers.
//!
//! Each contract primitive is one DynamoDB call with the condition the contract names:
//! the fast path is one `UpdateItem` (`ADD` deltas, `ReturnValuesOnConditionCheckFailure
//! = ALL_OLD`), a read is one `BatchGetItem`, a commit is one `PutItem`/`UpdateItem` or one
//! `TransactWriteItems`. Expression attribute names are positional (`#t0`, `#c0`, …) so
//! limit names may contain `.` and `-`. Every call is counted by operation and outcome,
//! with the capacity DynamoDB reports, in a [`CallLedger`]. The SDK's call futures are
//! boxed: each is several KB, and inline they made every future above them (the engine's,
//! the request's) about 30 KB, copied and allocated on every decision.
//!
//! Table: `PK` (S) + `SK` (S), on-demand, TTL on `ttl`. Bucket item:
//! `PK = {namespace}/BUCKET#{entity}#{resource}#{shard}`, `SK = #STATE`, attributes `rf`,
//! `shard_count`, `ttl`, `entity_id`, `resource`, and per limit `b_{limit}_{tk,cp,ra,rp,tc}`.
//! This module decides nothing about limits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use aws_credential_types::provider::{self, ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConsumedCapacity, KeySchemaElement, KeyType,
    KeysAndAttributes, Put, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
    TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::key::{check_item, check_key};
use super::DEFAULT_STORE_TIMEOUT;
use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, CountChange, Credit, Debit, DebitMode,
    DebitOutcome, LimitState, LimitWrite, Limits, Stamp, StoreError, Write, MAX_COMMIT_ITEMS,
    MIN_BALANCE, WCU_LIMIT,
};
use crate::engine::bucket::MILLI;
use crate::text::elide;

type Item = HashMap<String, AttributeValue>;

/// Where the table is and how to reach it.
#[derive(Debug, Clone)]
pub struct DynamoOptions {
    pub table: String,
    /// Prefix of every key, so several deployments can share a table.
    pub namespace: String,
    /// Endpoint override, for DynamoDB Local only; real AWS uses the standard resolution.
    pub endpoint: Option<String>,
    /// Region; else the standard AWS chain (environment, profile, instance metadata).
    pub region: Option<String>,
    /// Deadline of one store call, retries included (the SDK retries with jittered
    /// backoff inside it).
    pub timeout: Duration,
}

/// Builds a DynamoDB client from the standard AWS configuration chain. Its calls are
/// bounded by `options.timeout`; its credentials are resolved by [`DetachedCredentials`].
pub async fn client(options: &DynamoOptions) -> Client {
    connection(options).await.0
}

/// A client (see [`client`]) and the credentials provider it uses, if the chain found one.
async fn connection(options: &DynamoOptions) -> (Client, Option<SharedCredentialsProvider>) {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &options.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let shared = loader.load().await;
    let mut builder = aws_sdk_dynamodb::config::Builder::from(&shared)
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .operation_timeout(options.timeout)
                .operation_attempt_timeout(options.timeout)
                .connect_timeout(options.timeout.max(Duration::from_millis(100)))
                .build(),
        )
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff((options.timeout / 4).max(Duration::from_millis(1))),
        );
    let credentials = shared
        .credentials_provider()
        .map(|p| SharedCredentialsProvider::new(DetachedCredentials::new(p)));
    if let Some(provider) = &credentials {
        builder = builder.credentials_provider(provider.clone());
    }
    if shared.region().is_none() && options.endpoint.is_some() {
        // DynamoDB Local ignores the region, but the SDK needs one to sign requests.
        builder = builder.region(aws_config::Region::new("us-east-1"));
    }
    (Client::from_conf(builder.build()), credentials)
}

/// A fetch of credentials, shared by every caller waiting for it; its error as text (the
/// SDK's error is not `Clone`).
type CredentialsFetch = Shared<BoxFuture<'static, Result<Credentials, String>>>;

/// Credentials resolved in a task of their own, shared by concurrent callers.
///
/// The SDK resolves credentials inside the call that needs them (its identity cache
/// loads them in the caller's future), so a call that gives up mid-fetch — an IMDS or
/// STS round trip on a cold start or a refresh — cancels the fetch, and the next call
/// starts it over; with every call bounded by a deadline shorter than the fetch, none
/// would ever get credentials. Here a fetch runs to its end whatever its callers do, and
/// the next caller finds its result.
#[derive(Debug)]
pub struct DetachedCredentials {
    inner: SharedCredentialsProvider,
    /// The fetch in flight or last finished.
    fetch: std::sync::Mutex<Option<CredentialsFetch>>,
}

/// A finished fetch is handed to a later caller only while its credentials have this
/// much left before they expire (the SDK asks again ten seconds before expiry).
const CREDENTIALS_REUSE_MARGIN: Duration = Duration::from_secs(60);

impl DetachedCredentials {
    pub fn new(inner: SharedCredentialsProvider) -> DetachedCredentials {
        DetachedCredentials {
            inner,
            fetch: std::sync::Mutex::new(None),
        }
    }

    /// The fetch to wait for: the one in flight, or a finished one whose credentials are
    /// still good (its caller gave up before receiving them), else a new one.
    fn current(&self) -> CredentialsFetch {
        let mut fetch = self.fetch.lock().unwrap_or_else(|e| e.into_inner());
        let reusable = fetch.as_ref().is_some_and(|f| match f.peek() {
            None => true,
            Some(Ok(c)) => c.expiry().is_none_or(|at| {
                at.duration_since(std::time::SystemTime::now())
                    .is_ok_and(|left| left > CREDENTIALS_REUSE_MARGIN)
            }),
            Some(Err(_)) => false,
        });
        if !reusable {
            let inner = self.inner.clone();
            let task = tokio::spawn(async move {
                inner
                    .provide_credentials()
                    .await
                    .map_err(|e| DisplayErrorContext(e).to_string())
            });
            let shared: BoxFuture<'static, Result<Credentials, String>> = Box::pin(async move {
                task.await
                    .unwrap_or_else(|e| Err(format!("credentials fetch ended: {e}")))
            });
            *fetch = Some(shared.shared());
        }
        fetch.clone().expect("set above")
    }
}

impl ProvideCredentials for DetachedCredentials {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let fetch = self.current();
        provider::future::ProvideCredentials::new(async move {
            fetch
                .await
                .map_err(provider::error::CredentialsError::provider_error)
        })
    }
}

/// What `table create` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCreated {
    Created,
    AlreadyExisted,
}

/// Creates the bucket table (on-demand billing, TTL on `ttl`) if it does not exist, and
/// makes sure TTL is enabled either way. Idempotent.
pub async fn create_table(client: &Client, table: &str) -> Result<TableCreated, StoreError> {
    let err = |e: String| StoreError::Unavailable {
        key: table.to_string(),
        reason: e,
    };
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .expect("name and type are set")
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .expect("name and type are set")
    };
    let created = match client
        .create_table()
        .table_name(table)
        .attribute_definitions(attr("PK"))
        .attribute_definitions(attr("SK"))
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
    {
        Ok(_) => TableCreated::Created,
        Err(e) if e.code() == Some("ResourceInUseException") => TableCreated::AlreadyExisted,
        Err(e) => return Err(err(describe(&e))),
    };
    // Wait until the table is active before touching its TTL.
    for _ in 0..60 {
        let d = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| err(describe(&e)))?;
        let active = d
            .table()
            .and_then(|t| t.table_status())
            .is_some_and(|s| s.as_str() == "ACTIVE");
        if active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ttl = TimeToLiveSpecification::builder()
        .attribute_name("ttl")
        .enabled(true)
        .build()
        .expect("name and flag are set");
    match client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(ttl)
        .send()
        .await
    {
        Ok(_) => {}
        // Already enabled on this attribute.
        Err(e) if e.code() == Some("ValidationException") => {}
        Err(e) => return Err(err(describe(&e))),
    }
    Ok(created)
}

fn describe<E: ProvideErrorMetadata + std::fmt::Debug, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> String {
    match e {
        SdkError::ServiceError(s) => {
            let inner = s.err();
            format!(
                "{}: {}",
                inner.code().unwrap_or("ServiceError"),
                inner.message().unwrap_or("no message")
            )
        }
        SdkError::TimeoutError(_) => "timed out".to_string(),
        SdkError::DispatchFailure(d) => format!("dispatch failure: {d:?}"),
        other => format!("{other:?}"),
    }
}

/// DynamoDB error codes that refuse one request (its key, item or expression), not the
/// store: they never count towards the circuit breaker.
const REQUEST_ERRORS: [&str; 3] = [
    "ValidationException",
    "ItemCollectionSizeLimitExceededException",
    "SerializationException",
];

/// A single-item write DynamoDB refused because a transaction holds the item.
const CONFLICT: &str = "TransactionConflictException";

/// Backoff caps (full jitter) of the retries of a write refused by [`CONFLICT`]; small,
/// since the store call's deadline bounds the whole call. Then it is [`StoreError::Contention`].
const CONFLICT_BACKOFF_CAPS_MS: [u64; 3] = [2, 4, 8];

/// Most bytes of a DynamoDB error text carried into a [`StoreError`].
const REASON_BYTES: usize = 256;

/// One DynamoDB call's operation and outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKind {
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// Totals of one kind of call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallTotals {
    pub calls: u64,
    /// Capacity units DynamoDB reported (`ReturnConsumedCapacity = TOTAL`).
    pub capacity: f64,
}

/// Every DynamoDB call this store made, by operation and outcome; optionally the
/// sequence of the most recent calls (tests compare call sequences).
#[derive(Debug, Default)]
pub struct CallLedger {
    totals: Mutex<BTreeMap<CallKind, CallTotals>>,
    sequence: Mutex<Option<VecDeque<CallKind>>>,
}

const SEQUENCE_CAP: usize = 100_000;

impl CallLedger {
    fn record(&self, operation: &'static str, outcome: &'static str, capacity: f64) {
        let kind = CallKind { operation, outcome };
        {
            let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            let e = t.entry(kind.clone()).or_default();
            e.calls += 1;
            e.capacity += capacity;
        }
        let mut s = self.sequence.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seq) = s.as_mut() {
            if seq.len() == SEQUENCE_CAP {
                seq.pop_front();
            }
            seq.push_back(kind);
        }
    }

    /// Totals per (operation, outcome).
    pub fn totals(&self) -> BTreeMap<CallKind, CallTotals> {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Calls of one operation, any outcome.
    pub fn calls_of(&self, operation: &str) -> u64 {
        self.totals()
            .iter()
            .filter(|(k, _)| k.operation == operation)
            .map(|(_, t)| t.calls)
            .sum()
    }

    /// Every call counted so far.
    pub fn total_calls(&self) -> u64 {
        self.totals().values().map(|t| t.calls).sum()
    }

    /// Starts (or restarts) recording the call sequence.
    pub fn record_sequence(&self) {
        *self.sequence.lock().unwrap_or_else(|e| e.into_inner()) = Some(VecDeque::new());
    }

    /// The calls recorded since `record_sequence`, as `Operation` or `Operation✗` (refused).
    pub fn sequence(&self) -> Vec<String> {
        self.sequence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| {
                s.iter()
                    .map(|k| match k.outcome {
                        "ok" => k.operation.to_string(),
                        _ => format!("{}✗", k.operation),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Clears totals and the sequence.
    pub fn reset(&self) {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if let Some(s) = self
            .sequence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            s.clear();
        }
    }
}

fn capacity(c: Option<&ConsumedCapacity>) -> f64 {
    c.and_then(|c| c.capacity_units()).unwrap_or(0.0)
}

fn capacity_all(c: &[ConsumedCapacity]) -> f64 {
    c.iter().filter_map(|c| c.capacity_units()).sum()
}

/// Bucket items in a DynamoDB table.
#[derive(Debug)]
pub struct DynamoStore {
    client: Client,
    table: String,
    namespace: String,
    /// The deadline of one contract call (the SDK's operation timeout, and the bound of
    /// this store's own retry loops).
    timeout: Duration,
    /// What the client resolves credentials with (resolved ahead by [`Self::warm_up`]).
    credentials: Option<SharedCredentialsProvider>,
    ledger: CallLedger,
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn attr(limit: &str, field: &str) -> String {
    format!("b_{limit}_{field}")
}

/// Expression attribute names by alias.
type Names = HashMap<String, String>;

/// Expression attribute values by alias.
type Values = HashMap<String, AttributeValue>;

/// Expression attribute names and values under construction, with positional aliases.
#[derive(Default)]
struct Expr {
    names: Names,
    values: Values,
}

impl Expr {
    fn name(&mut self, alias: String, attribute: String) -> String {
        self.names.insert(alias.clone(), attribute);
        alias
    }

    fn value(&mut self, alias: String, v: AttributeValue) -> String {
        self.values.insert(alias.clone(), v);
        alias
    }

    /// The names and values, moved out for the request (each `None` when empty, which
    /// DynamoDB requires).
    fn into_parts(self) -> (Option<Names>, Option<Values>) {
        (
            (!self.names.is_empty()).then_some(self.names),
            (!self.values.is_empty()).then_some(self.values),
        )
    }
}

/// The `ADD` (and, for a retry-only debit with a `ttl`, `SET`) and condition of a debit,
/// with positional aliases.
fn debit_expression(debits: &[Debit], mode: DebitMode, ttl: Option<i64>) -> (String, String, Expr) {
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
            for (field, v) in [("cp", p.cp), ("ra", p.ra), ("rp", p.rp)] {
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

/// The update and condition of a slow-path write under the `rf` lock.
fn update_expression(
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
    let mut set = vec![format!("{rf_name} = {rf_val}")];
    let mut add = Vec::new();
    let mut remove = Vec::new();
    match ttl {
        Some(t) => {
            let v = e.value(":ttl".into(), n(t));
            set.push(format!("{ttl_name} = {v}"));
        }
        None => remove.push(ttl_name),
    }
    let mut cond = vec![format!("{rf_name} = {erf}")];
    if let Some(change) = shard_count {
        let sc = e.name("#sc".into(), "shard_count".into());
        let read = e.value(":scr".into(), n(i64::from(change.read)));
        let new = e.value(":scn".into(), n(i64::from(change.new)));
        set.push(format!("{sc} = {new}"));
        cond.push(format!("{sc} = {read}"));
    }
    for (i, w) in limits.iter().enumerate() {
        match w {
            LimitWrite::Add {
                limit,
                tk_delta,
                tc_delta,
                floor,
                cap,
            } => {
                let t = e.name(format!("#t{i}"), attr(limit, "tk"));
                let c = e.name(format!("#c{i}"), attr(limit, "tc"));
                let dv = e.value(format!(":d{i}"), n(*tk_delta));
                let cv = e.value(format!(":u{i}"), n(*tc_delta));
                add.push(format!("{t} {dv}, {c} {cv}"));
                cond.push(format!("attribute_exists({t})"));
                if let Some(f) = floor {
                    let fv = e.value(format!(":f{i}"), n(*f));
                    cond.push(format!("{t} >= {fv}"));
                }
                if let Some(cp) = cap {
                    let kv = e.value(format!(":k{i}"), n(*cp));
                    cond.push(format!("{t} <= {kv}"));
                }
            }
            LimitWrite::Set {
                limit,
                state,
                read_tc,
            } => {
                // As read: `tc` unmoved by a concurrent debit, or the limit still absent.
                let c = e.name(format!("#c{i}"), attr(limit, "tc"));
                match read_tc {
                    Some(tc) => {
                        let v = e.value(format!(":r{i}"), n(*tc));
                        cond.push(format!("{c} = {v}"));
                    }
                    None => cond.push(format!("attribute_not_exists({c})")),
                }
                for (field, v) in [
                    ("tk", state.tk),
                    ("cp", state.cp),
                    ("ra", state.ra),
                    ("rp", state.rp),
                    ("tc", state.tc),
                ] {
                    let name = e.name(format!("#{field}{i}"), attr(limit, field));
                    let val = e.value(format!(":{field}{i}"), n(v));
                    set.push(format!("{name} = {val}"));
                }
            }
        }
    }
    let mut update = format!("SET {}", set.join(", "));
    if !add.is_empty() {
        update.push_str(&format!(" ADD {}", add.join(", ")));
    }
    if !remove.is_empty() {
        update.push_str(&format!(" REMOVE {}", remove.join(", ")));
    }
    (update, cond.join(" AND "), e)
}

/// The update and condition expressions of a slow-path update or a retry-only debit
/// (`None` for a create, which is a conditional put).
fn update_of(w: &Write) -> Option<(String, String, Expr)> {
    match w {
        Write::Create { .. } => None,
        Write::Update {
            expected_rf,
            rf,
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

/// An item's number attribute; the error is the reason it is corrupt.
fn parse_n(attr: &str, v: &AttributeValue) -> Result<i64, String> {
    match v {
        AttributeValue::N(text) => text
            .parse::<i64>()
            .map_err(|_| format!("'{attr}' is not an integer in range: {text}")),
        other => Err(format!("'{attr}' is not a number: {other:?}")),
    }
}

/// Decodes a bucket item. A limit is recognised when its `tk` and `cp` exist. The error
/// is the reason the item is corrupt; the caller names the key (only then: formatting it
/// on every decode showed in profiles).
fn decode(item: &Item) -> Result<BucketItem, String> {
    let rf = item
        .get("rf")
        .map(|v| parse_n("rf", v))
        .transpose()?
        .ok_or_else(|| "no 'rf'".to_string())?;
    let shard_count = match item.get("shard_count") {
        Some(v) => u32::try_from(parse_n("shard_count", v)?)
            .map_err(|_| "'shard_count' out of range".to_string())?
            .max(1),
        None => 1,
    };
    let ttl = item.get("ttl").map(|v| parse_n("ttl", v)).transpose()?;
    let mut fields: BTreeMap<&str, [Option<i64>; 5]> = BTreeMap::new();
    for (name, v) in item {
        let Some(rest) = name.strip_prefix("b_") else {
            continue;
        };
        let Some((limit, field)) = rest.rsplit_once('_') else {
            continue;
        };
        let slot = match field {
            "tk" => 0,
            "cp" => 1,
            "ra" => 2,
            "rp" => 3,
            "tc" => 4,
            _ => continue,
        };
        fields.entry(limit).or_default()[slot] = Some(parse_n(name, v)?);
    }
    let mut limits = Limits::new();
    for (limit, [tk, cp, ra, rp, tc]) in fields {
        let (Some(tk), Some(cp)) = (tk, cp) else {
            continue;
        };
        let rp = rp.unwrap_or(0);
        if rp <= 0 {
            return Err(format!("limit '{limit}' has refill period {rp}"));
        }
        limits.insert(
            limit,
            LimitState {
                tk,
                cp,
                ra: ra.unwrap_or(0),
                rp,
                tc: tc.unwrap_or(0),
            },
        );
    }
    Ok(BucketItem {
        rf,
        shard_count,
        ttl,
        limits,
    })
}

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

    /// Gets the store ready to answer within its deadline: resolves credentials, then
    /// makes a first call and opens `connections` connections (one concurrent call each),
    /// every step under `patience` instead of the store timeout, so that a cold process
    /// (credentials through IMDS or IRSA, a first TLS handshake) or a cold store (a JVM
    /// just started) is ready before it serves. Succeeds once the first call is answered.
    pub async fn warm_up(&self, connections: usize, patience: Duration) -> Result<(), StoreError> {
        let probe = BucketKey::new("%health", "%health", 0);
        if let Some(provider) = &self.credentials {
            match tokio::time::timeout(patience, provider.provide_credentials()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let reason = format!("no credentials: {}", DisplayErrorContext(e));
                    return Err(self.unavailable(&probe, reason));
                }
                Err(_) => {
                    let reason = format!("no credentials within {patience:?}");
                    return Err(self.unavailable(&probe, reason));
                }
            }
        }
        let first = self.patient_read(&probe, patience).await;
        first?;
        let more = (1..connections).map(|_| self.patient_read(&probe, patience));
        for r in futures::future::join_all(more).await {
            if let Err(e) = r {
                tracing::debug!(error = %e, "a warm-up connection failed");
            }
        }
        Ok(())
    }

    /// One strongly consistent read of `key` under `patience` (not the store timeout).
    async fn patient_read(&self, key: &BucketKey, patience: Duration) -> Result<(), StoreError> {
        let ka = KeysAndAttributes::builder()
            .set_keys(Some(vec![self.key_of(key)]))
            .consistent_read(true)
            .build()
            .map_err(|e| self.unavailable(key, e.to_string()))?;
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .operation_timeout(patience)
            .operation_attempt_timeout(patience)
            .connect_timeout(patience)
            .build();
        let out = Box::pin(
            self.client
                .batch_get_item()
                .request_items(&self.table, ka)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .customize()
                .config_override(aws_sdk_dynamodb::config::Builder::new().timeout_config(timeouts))
                .send(),
        )
        .await;
        match out {
            Ok(o) => {
                self.ledger
                    .record("BatchGetItem", "ok", capacity_all(o.consumed_capacity()));
                Ok(())
            }
            Err(err) => {
                self.ledger.record("BatchGetItem", "error", 0.0);
                Err(self.failure(key, &err))
            }
        }
    }

    /// The calls made so far.
    pub fn ledger(&self) -> &CallLedger {
        &self.ledger
    }

    /// The prefix of every key this store writes.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The partition key of a bucket shard.
    pub fn pk(&self, key: &BucketKey) -> String {
        format!(
            "{}/BUCKET#{}#{}#{}",
            self.namespace, key.entity, key.resource, key.shard
        )
    }

    fn key_of(&self, key: &BucketKey) -> Item {
        HashMap::from([
            ("PK".to_string(), s(self.pk(key))),
            ("SK".to_string(), s("#STATE")),
        ])
    }

    fn unavailable(&self, key: &BucketKey, reason: String) -> StoreError {
        StoreError::Unavailable {
            key: self.pk(key),
            reason: elide(&reason, REASON_BYTES).into_owned(),
        }
    }

    /// What a failed SDK call means: this request's error ([`REQUEST_ERRORS`]) or the
    /// store's (everything else: timeouts, 5xx, throttling, connections, credentials).
    fn failure<E, R>(&self, key: &BucketKey, err: &SdkError<E, R>) -> StoreError
    where
        E: ProvideErrorMetadata + std::fmt::Debug,
        R: std::fmt::Debug,
    {
        let reason = elide(&describe(err), REASON_BYTES).into_owned();
        match err.code() {
            Some(code) if REQUEST_ERRORS.contains(&code) => StoreError::Invalid {
                key: self.pk(key),
                reason,
            },
            _ => StoreError::Unavailable {
                key: self.pk(key),
                reason,
            },
        }
    }

    fn decode_opt(
        &self,
        key: &BucketKey,
        item: Option<&Item>,
    ) -> Result<Option<BucketItem>, StoreError> {
        item.filter(|i| !i.is_empty())
            .map(|i| {
                decode(i).map_err(|reason| StoreError::Corrupt {
                    key: self.pk(key),
                    reason,
                })
            })
            .transpose()
    }

    fn encode(&self, key: &BucketKey, item: &BucketItem) -> Item {
        let mut out = self.key_of(key);
        out.insert("entity_id".into(), s(key.entity.clone()));
        out.insert("resource".into(), s(key.resource.clone()));
        out.insert("rf".into(), n(item.rf));
        out.insert("shard_count".into(), n(i64::from(item.shard_count)));
        if let Some(t) = item.ttl {
            out.insert("ttl".into(), n(t));
        }
        for (limit, st) in item.limits.iter() {
            for (field, v) in [
                ("tk", st.tk),
                ("cp", st.cp),
                ("ra", st.ra),
                ("rp", st.rp),
                ("tc", st.tc),
            ] {
                out.insert(attr(limit, field), n(v));
            }
        }
        out
    }

    /// One conditional `UpdateItem` built by `expression` (again for each retry after a
    /// [`CONFLICT`]); `Ok(Err(old image))` when the condition failed.
    async fn update(
        &self,
        key: &BucketKey,
        expression: impl Fn() -> (String, String, Expr),
    ) -> Result<Result<BucketItem, Option<BucketItem>>, StoreError> {
        for cap in CONFLICT_BACKOFF_CAPS_MS {
            let (u, c, e) = expression();
            match self.update_once(key, u, c, e).await? {
                Some(done) => return Ok(done),
                None => backoff(cap).await,
            }
        }
        let (u, c, e) = expression();
        self.update_once(key, u, c, e)
            .await?
            .ok_or_else(|| StoreError::Contention { key: self.pk(key) })
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
                if let Some(UpdateItemError::ConditionalCheckFailedException(ccf)) =
                    err.as_service_error()
                {
                    self.ledger.record("UpdateItem", "condition_failed", 1.0);
                    return Ok(Some(Err(self.decode_opt(key, ccf.item())?)));
                }
                if err.code() == Some(CONFLICT) {
                    self.ledger.record("UpdateItem", "conflict", 0.0);
                    return Ok(None);
                }
                self.ledger.record("UpdateItem", "error", 0.0);
                Err(self.failure(key, &err))
            }
        }
    }

    /// A conditional `PutItem` of a new item; `Ok(Some(current))` when it exists already.
    async fn put_new(
        &self,
        key: &BucketKey,
        item: &BucketItem,
    ) -> Result<Option<Option<BucketItem>>, StoreError> {
        for cap in CONFLICT_BACKOFF_CAPS_MS {
            match self.put_once(key, item).await? {
                Some(done) => return Ok(done),
                None => backoff(cap).await,
            }
        }
        self.put_once(key, item)
            .await?
            .ok_or_else(|| StoreError::Contention { key: self.pk(key) })
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
                if let Some(PutItemError::ConditionalCheckFailedException(ccf)) =
                    err.as_service_error()
                {
                    self.ledger.record("PutItem", "condition_failed", 1.0);
                    return Ok(Some(Some(self.decode_opt(key, ccf.item())?)));
                }
                if err.code() == Some(CONFLICT) {
                    self.ledger.record("PutItem", "conflict", 0.0);
                    return Ok(None);
                }
                self.ledger.record("PutItem", "error", 0.0);
                Err(self.failure(key, &err))
            }
        }
    }

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
        // the call's deadline: the SDK's own timeout covers one call, not this loop.
        let deadline = tokio::time::Instant::now() + self.timeout;
        for chunk in wanted.chunks(MAX_COMMIT_ITEMS) {
            let mut pending: Vec<Item> = chunk.to_vec();
            let mut delay = Duration::from_millis(10);
            for attempt in 0..4 {
                if pending.is_empty() {
                    break;
                }
                if attempt > 0 {
                    if tokio::time::Instant::now() + delay >= deadline {
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
                    Err(err) => {
                        self.ledger.record("BatchGetItem", "error", 0.0);
                        return Err(self.failure(&first, &err));
                    }
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
            if !pending.is_empty() {
                return Err(self.unavailable(
                    &first,
                    "BatchGetItem left keys unprocessed (throttled) until the deadline".into(),
                ));
            }
        }
        keys.iter()
            .map(|k| self.decode_opt(k, by_pk.get(&self.pk(k))))
            .collect()
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        if writes.is_empty() || writes.len() > MAX_COMMIT_ITEMS {
            return Err(StoreError::Invalid {
                key: writes.first().map(|w| self.pk(w.key())).unwrap_or_default(),
                reason: format!(
                    "a commit carries 1..={MAX_COMMIT_ITEMS} items, not {}",
                    writes.len()
                ),
            });
        }
        for w in writes {
            check_key(w.key())?;
            if let Write::Create { key, item } = w {
                check_item(key, item)?;
            }
        }
        if writes.len() == 1 {
            return self.commit_one(&writes[0]).await;
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
                    self.ledger.record("TransactWriteItems", "error", 0.0);
                    return Err(self.failure(writes[0].key(), &err));
                };
                self.ledger.record("TransactWriteItems", "cancelled", 0.0);
                let mut failed = Vec::new();
                let mut unknown = Vec::new();
                for (i, r) in reasons.iter().enumerate().take(writes.len()) {
                    match r.code() {
                        Some("ConditionalCheckFailed") => {
                            failed.push((i, self.decode_opt(writes[i].key(), r.item())?));
                        }
                        Some("None") | None => {}
                        // This request's item (too large, a bad expression): its error.
                        Some(code @ ("ValidationError" | "ItemCollectionSizeLimitExceeded")) => {
                            return Err(StoreError::Invalid {
                                key: self.pk(writes[i].key()),
                                reason: format!(
                                    "{code}: {}",
                                    elide(r.message().unwrap_or("no message"), REASON_BYTES)
                                ),
                            });
                        }
                        // The store's capacity: an outage.
                        Some(code @ ("ProvisionedThroughputExceeded" | "ThrottlingError")) => {
                            return Err(self.unavailable(writes[i].key(), code.to_string()));
                        }
                        // A conflicting concurrent transaction: treat as a lost race and
                        // let the caller retry against the item as it is now.
                        Some(_) => unknown.push(i),
                    }
                }
                if !unknown.is_empty() {
                    let keys: Vec<BucketKey> =
                        unknown.iter().map(|&i| writes[i].key().clone()).collect();
                    let images = self.read(&keys).await?;
                    failed.extend(unknown.into_iter().zip(images));
                    failed.sort_by_key(|f| f.0);
                }
                if failed.is_empty() {
                    return Err(self.unavailable(writes[0].key(), describe(&err)));
                }
                Ok(CommitOutcome::Conflict(failed))
            }
        }
    }

    async fn credit(
        &self,
        key: &BucketKey,
        stamp: Stamp,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        check_key(key)?;
        let mut todo: Vec<Credit> = credits.to_vec();
        for _ in 0..2 {
            if todo.is_empty() {
                break;
            }
            match self.update(key, || credit_expression(stamp, &todo)).await? {
                Ok(_) => return Ok(todo),
                Err(None) => return Ok(Vec::new()),
                Err(Some(image)) if Stamp::of(&image) != stamp => return Ok(Vec::new()),
                Err(Some(image)) => {
                    // Keep only the credits that still fit under their ceiling.
                    todo.retain(|c| {
                        image
                            .limit(&c.limit)
                            .is_some_and(|st| st.tk.saturating_add(c.amount) <= c.ceiling)
                    });
                }
            }
        }
        Ok(Vec::new())
    }
}

/// Waits a random time below `cap_ms` (full jitter) before a retry.
async fn backoff(cap_ms: u64) {
    let ms = rand::random_range(0..=cap_ms * 1_000);
    tokio::time::sleep(Duration::from_micros(ms)).await;
}

/// The `ADD` and condition of a refund: the item not refilled nor doubled since the debit
/// (`rf` and count as it showed), each limit's balance at or under its ceiling after it.
fn credit_expression(stamp: Stamp, credits: &[Credit]) -> (String, String, Expr) {
    let mut e = Expr::default();
    let mut add = Vec::new();
    let rf = e.name("#rf".into(), "rf".into());
    let erf = e.value(":erf".into(), n(stamp.rf));
    let sc = e.name("#sc".into(), "shard_count".into());
    let esc = e.value(":esc".into(), n(i64::from(stamp.shard_count)));
    let mut cond = vec![format!("{rf} = {erf}"), format!("{sc} = {esc}")];
    for (i, c) in credits.iter().enumerate() {
        let t = e.name(format!("#t{i}"), attr(&c.limit, "tk"));
        let tc = e.name(format!("#c{i}"), attr(&c.limit, "tc"));
        let a = e.value(format!(":a{i}"), n(c.amount));
        let na = e.value(format!(":n{i}"), n(-c.amount));
        let lim = e.value(format!(":l{i}"), n(c.ceiling.saturating_sub(c.amount)));
        add.push(format!("{t} {a}, {tc} {na}"));
        cond.push(format!("{t} <= {lim}"));
    }
    (format!("ADD {}", add.join(", ")), cond.join(" AND "), e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LimitParams;

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

    #[test]
    fn decode_splits_limit_names_on_the_last_underscore() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), n(7));
        for (f, v) in [("tk", 1), ("cp", 2), ("ra", 3), ("rp", 4), ("tc", 5)] {
            item.insert(format!("b_my_limit_{f}"), n(v));
        }
        let it = decode(&item).unwrap();
        assert_eq!(
            *it.limits.get("my_limit").unwrap(),
            LimitState {
                tk: 1,
                cp: 2,
                ra: 3,
                rp: 4,
                tc: 5
            }
        );
        assert_eq!(it.shard_count, 1);
    }

    #[test]
    fn decode_rejects_corrupt_numbers() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), AttributeValue::N("1.5".into()));
        assert_eq!(
            decode(&item).unwrap_err(),
            "'rf' is not an integer in range: 1.5"
        );
        item.insert("rf".into(), n(1));
        item.insert("b_x_tk".into(), n(1));
        item.insert("b_x_cp".into(), n(1));
        item.insert("b_x_rp".into(), n(0));
        assert_eq!(decode(&item).unwrap_err(), "limit 'x' has refill period 0");
    }
}

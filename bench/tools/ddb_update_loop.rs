//! The store's own ceiling for `bench/run dynamodb`: a bare loop of conditional
//! `UpdateItem`s shaped like shardgate's DynamoDB fast path, with no rate limiter around
//! it.
//!
//! Each call is what one admitted decision costs shardgate in steady state: `ADD` of a
//! limit's balance and consumed counter plus the reserved `wcu` limit's, under the
//! condition that the item exists, the balance covers the amount, the limit's parameters
//! are the configured ones, `wcu` has a token and the item has not expired, with
//! `ReturnValues = ALL_NEW`, `ReturnValuesOnConditionCheckFailure = ALL_OLD` and
//! `ReturnConsumedCapacity = TOTAL`. Items have shardgate's bucket-item attributes (same
//! key layout, one limit + `wcu`), so they are the same size.
//!
//! The client is configured as shardgate's (`src/store/dynamodb/client.rs`, `client()`):
//! the standard AWS chain, an endpoint override, an operation and attempt deadline
//! (`--timeout-ms`), standard retries (3 attempts, 1 ms initial backoff, at most a quarter
//! of the deadline), on tokio's default multi-thread runtime. It leaves out shardgate's
//! detached credential fetches: DynamoDB Local's static keys are never fetched.
//!
//! `--concurrency` tasks each loop until `--duration` or `--max-ops` in all. Every call
//! picks one of `--items` items uniformly at random, as shardgate draws a shard of a
//! bucket: `bench/run` passes the shard count shardgate's hot bucket reached, so both
//! write the same number of items. With `--items 1` every task writes one item, the
//! pattern of an unsharded hot bucket.
//!
//!     AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1 \
//!     ddb_update_loop --endpoint http://127.0.0.1:8000 --table shardgate \
//!                     --concurrency 64 --duration 10 [--items 1] [--timeout-ms 1000]
//!
//! Prints one JSON object: ops/s, p50/p99/p99.9/max/mean latency of successful calls (µs,
//! from per-task HDR histograms, `latency.rs`), outcomes and the write capacity DynamoDB
//! reported per successful call.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "latency.rs"]
mod latency;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use aws_sdk_dynamodb::Client;
use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use hdrhistogram::Histogram;

const MAX_OPS_CAP: u64 = 10_000_000;
const MAX_DURATION_CAP: Duration = Duration::from_secs(600);
/// Millitokens per token, as shardgate stores balances.
const MILLI: i64 = 1_000;
/// A balance no run of this loop can use up.
const BIG: i64 = 1_000_000_000_000_000;

/// A bare loop of shardgate's fast-path conditional UpdateItem, against DynamoDB Local.
#[derive(Parser)]
#[command(name = "ddb_update_loop")]
struct Args {
    /// DynamoDB Local's URL, e.g. http://127.0.0.1:8000 (DynamoDB Local only).
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    endpoint: String,
    /// The table, made by `shardgate table create`.
    #[arg(long, default_value = "shardgate")]
    table: String,
    /// Tasks calling at once (at least 1).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seconds to loop for (fractions allowed; at most 600).
    #[arg(long, default_value = "10", value_parser = seconds)]
    duration: Duration,
    /// Items the calls spread over, as a bucket's shards (1 to 32).
    #[arg(long, default_value_t = 1)]
    items: usize,
    /// Calls to make at most, all tasks together (at most 10,000,000).
    #[arg(long, default_value_t = 2_000_000)]
    max_ops: u64,
    /// Each call's deadline, in milliseconds (fractions allowed), as `--store-timeout`.
    #[arg(long = "timeout-ms", default_value = "1000", value_parser = millis)]
    timeout: Duration,
    /// The items' key prefix, as shardgate's `--namespace`.
    #[arg(long, default_value = "bench-ceiling")]
    namespace: String,
}

impl Args {
    /// The flags brought within the tool's bounds: the caps hold whatever was asked.
    fn bounded(mut self) -> Args {
        self.concurrency = self.concurrency.max(1);
        self.items = self.items.clamp(1, 32);
        self.duration = self.duration.min(MAX_DURATION_CAP);
        self.max_ops = self.max_ops.min(MAX_OPS_CAP);
        self
    }
}

/// A non-negative number of seconds, fractions allowed.
fn seconds(text: &str) -> Result<Duration, String> {
    let s: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    Duration::try_from_secs_f64(s).map_err(|e| format!("{text}: {e}"))
}

/// A non-negative number of milliseconds, fractions allowed.
fn millis(text: &str) -> Result<Duration, String> {
    let ms: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    Duration::try_from_secs_f64(ms / 1e3).map_err(|e| format!("{text}: {e}"))
}

/// One limit's parameters as shardgate stores them on a bucket item (its `LimitParams`,
/// `src/store/item.rs`): capacity and refill amount in millitokens, refill period in ms.
/// The update's condition compares them, as shardgate's does.
#[derive(Clone, Copy)]
struct LimitParams {
    cp: i64,
    ra: i64,
    rp: i64,
}

async fn client(a: &Args) -> Client {
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).endpoint_url(&a.endpoint);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        // DynamoDB Local takes any key; never go looking for instance credentials.
        loader = loader.credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "local",
            "local",
            None,
            None,
            "ddb_update_loop",
        ));
    }
    let shared = loader.load().await;
    let mut builder = aws_sdk_dynamodb::config::Builder::from(&shared)
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .operation_timeout(a.timeout)
                .operation_attempt_timeout(a.timeout)
                .connect_timeout(a.timeout.max(Duration::from_millis(100)))
                .build(),
        )
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff((a.timeout / 4).max(Duration::from_millis(1))),
        );
    if shared.region().is_none() {
        builder = builder.region(aws_config::Region::new("us-east-1"));
    }
    Client::from_conf(builder.build())
}

fn num(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn text(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

fn pk(a: &Args, item: usize) -> String {
    format!("{}/BUCKET#tenant=ceiling#bench#{item}", a.namespace)
}

fn key(a: &Args, item: usize) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("PK".to_string(), text(&pk(a, item))),
        ("SK".to_string(), text("#STATE")),
    ])
}

/// Writes (or overwrites) the items with shardgate's bucket-item attributes.
async fn put_items(c: &Client, a: &Args, now_s: i64, params: LimitParams) -> Result<(), String> {
    for i in 0..a.items {
        let mut item = key(a, i);
        item.insert("entity_id".into(), text("tenant=ceiling"));
        item.insert("resource".into(), text("bench"));
        item.insert("rf".into(), num(now_s * 1_000));
        item.insert("shard_count".into(), num(a.items as i64));
        item.insert("ttl".into(), num(now_s + 86_400));
        for limit in ["tenant_rps", "wcu"] {
            let LimitParams { cp, ra, rp } = params;
            for (field, v) in [("tk", BIG), ("cp", cp), ("ra", ra), ("rp", rp), ("tc", 0)] {
                item.insert(format!("b_{limit}_{field}"), num(v));
            }
        }
        c.put_item()
            .table_name(&a.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "PutItem: {}",
                    aws_sdk_dynamodb::error::DisplayErrorContext(e)
                )
            })?;
    }
    Ok(())
}

/// What one task saw (and, merged, the whole run).
struct Tally {
    /// Latencies of the successful calls.
    latency_us: Histogram<u64>,
    ok: u64,
    condition_failed: u64,
    errors: u64,
    capacity: f64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_us: latency::histogram(),
            ok: 0,
            condition_failed: 0,
            errors: 0,
            capacity: 0.0,
            first_error: None,
        }
    }

    fn merge(&mut self, t: Tally) -> Result<(), String> {
        self.latency_us
            .add(&t.latency_us)
            .map_err(|e| format!("merging latencies: {e:?}"))?;
        self.ok += t.ok;
        self.condition_failed += t.condition_failed;
        self.errors += t.errors;
        self.capacity += t.capacity;
        if self.first_error.is_none() {
            self.first_error = t.first_error;
        }
        Ok(())
    }
}

async fn worker(
    c: Client,
    a: Arc<Args>,
    params: LimitParams,
    now_s: i64,
    deadline: Instant,
    issued: Arc<AtomicU64>,
    seed: u64,
) -> Tally {
    let LimitParams { cp, ra, rp } = params;
    let mut t = Tally::new();
    let mut rng = seed | 1;
    let names = HashMap::from([
        ("#t0".to_string(), "b_tenant_rps_tk".to_string()),
        ("#c0".to_string(), "b_tenant_rps_tc".to_string()),
        ("#cp0".to_string(), "b_tenant_rps_cp".to_string()),
        ("#ra0".to_string(), "b_tenant_rps_ra".to_string()),
        ("#rp0".to_string(), "b_tenant_rps_rp".to_string()),
        ("#wt".to_string(), "b_wcu_tk".to_string()),
        ("#wc".to_string(), "b_wcu_tc".to_string()),
        ("#ttl".to_string(), "ttl".to_string()),
    ]);
    let values = HashMap::from([
        (":n0".to_string(), num(-MILLI)),
        (":a0".to_string(), num(MILLI)),
        (":cp0".to_string(), num(cp)),
        (":ra0".to_string(), num(ra)),
        (":rp0".to_string(), num(rp)),
        (":wneg".to_string(), num(-MILLI)),
        (":wpos".to_string(), num(MILLI)),
        (":now".to_string(), num(now_s)),
    ]);
    while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < a.max_ops {
        // xorshift: a uniform item, as shardgate draws a shard.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let item = (rng % a.items as u64) as usize;
        let started = Instant::now();
        let result = c
            .update_item()
            .table_name(&a.table)
            .set_key(Some(key(&a, item)))
            .update_expression("ADD #t0 :n0, #c0 :a0, #wt :wneg, #wc :wpos")
            .condition_expression(
                "attribute_exists(PK) AND #t0 >= :a0 AND #cp0 = :cp0 AND #ra0 = :ra0 \
                 AND #rp0 = :rp0 AND #wt >= :wpos AND (attribute_not_exists(#ttl) OR #ttl > :now)",
            )
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values.clone()))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        let us = started.elapsed().as_micros() as u64;
        match result {
            Ok(out) => {
                t.ok += 1;
                latency::record(&mut t.latency_us, us);
                t.capacity += out
                    .consumed_capacity()
                    .and_then(|c| c.capacity_units())
                    .unwrap_or(0.0);
            }
            Err(e) => {
                if let Some(UpdateItemError::ConditionalCheckFailedException(_)) =
                    e.as_service_error()
                {
                    t.condition_failed += 1;
                } else {
                    t.errors += 1;
                }
                if t.first_error.is_none() {
                    t.first_error =
                        Some(aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string());
                }
            }
        }
    }
    t
}

async fn run(a: Args) -> Result<serde_json::Value, String> {
    let c = client(&a).await;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // 100,000,000 per second in millitokens, as shardgate stores a rule's parameters.
    let params = LimitParams {
        cp: 100_000_000 * MILLI,
        ra: 100_000_000 * MILLI,
        rp: 1_000,
    };
    put_items(&c, &a, now_s, params).await?;
    let a = Arc::new(a);
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + a.duration;
    let mut tasks = Vec::new();
    for i in 0..a.concurrency {
        tasks.push(tokio::spawn(worker(
            c.clone(),
            a.clone(),
            params,
            now_s,
            deadline,
            issued.clone(),
            0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1),
        )));
    }
    let mut all = Tally::new();
    for task in tasks {
        all.merge(task.await.map_err(|e| format!("a worker failed: {e}"))?)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "tool": "ddb_update_loop",
        "concurrency": a.concurrency,
        "items": a.items,
        "duration_s": a.duration.as_secs_f64(),
        "elapsed_s": elapsed,
        "ok": all.ok,
        "condition_failed": all.condition_failed,
        "errors": all.errors,
        "first_error": all.first_error,
        "ops_per_s": all.ok as f64 / elapsed,
        "write_units_per_op": if all.ok > 0 { all.capacity / all.ok as f64 } else { 0.0 },
        "latency_us": latency::summary(&all.latency_us),
    }))
}

fn main() -> ExitCode {
    // Bad flags: clap prints why and the usage, and exits with status 2.
    let args = Args::parse().bounded();
    // The same runtime as `shardgate serve`: tokio's default multi-thread runtime.
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ddb_update_loop: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ddb_update_loop: {e}");
            ExitCode::FAILURE
        }
    }
}

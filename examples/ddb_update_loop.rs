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
//! The client is configured as shardgate's (`src/store/dynamodb.rs`, `client()`): the
//! standard AWS chain, an endpoint override, an operation and attempt deadline
//! (`--timeout-ms`), standard retries (3 attempts, 1 ms initial backoff, at most a quarter
//! of the deadline), on tokio's default multi-thread runtime.
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
//! Prints one JSON object: ops/s, p50/p99/p99.9 latency (µs), outcomes and the write
//! capacity DynamoDB reported per successful call.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/latency.rs"]
mod latency;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use aws_sdk_dynamodb::Client;

const MAX_OPS_CAP: u64 = 10_000_000;
const MAX_DURATION_CAP: Duration = Duration::from_secs(600);
/// Millitokens per token, as shardgate stores balances.
const MILLI: i64 = 1_000;
/// A balance no run of this loop can use up.
const BIG: i64 = 1_000_000_000_000_000;

struct Args {
    endpoint: String,
    table: String,
    concurrency: usize,
    duration: Duration,
    items: usize,
    max_ops: u64,
    timeout: Duration,
    namespace: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        endpoint: String::new(),
        table: "shardgate".into(),
        concurrency: 1,
        duration: Duration::from_secs(10),
        items: 1,
        max_ops: 2_000_000,
        timeout: Duration::from_secs(1),
        namespace: "bench-ceiling".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|e| format!("{v}: {e}"));
        match flag.as_str() {
            "--endpoint" => a.endpoint = value()?,
            "--table" => a.table = value()?,
            "--concurrency" => a.concurrency = num(value()?)? as usize,
            "--duration" => a.duration = Duration::from_secs_f64(num(value()?)?),
            "--items" => a.items = num(value()?)? as usize,
            "--max-ops" => a.max_ops = num(value()?)? as u64,
            "--timeout-ms" => a.timeout = Duration::from_secs_f64(num(value()?)? / 1e3),
            "--namespace" => a.namespace = value()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.endpoint.is_empty() {
        return Err("--endpoint is required (DynamoDB Local only)".into());
    }
    a.concurrency = a.concurrency.max(1);
    a.items = a.items.clamp(1, 32);
    a.duration = a.duration.min(MAX_DURATION_CAP);
    a.max_ops = a.max_ops.min(MAX_OPS_CAP);
    Ok(a)
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
async fn put_items(
    c: &Client,
    a: &Args,
    now_s: i64,
    params: (i64, i64, i64),
) -> Result<(), String> {
    for i in 0..a.items {
        let mut item = key(a, i);
        item.insert("entity_id".into(), text("tenant=ceiling"));
        item.insert("resource".into(), text("bench"));
        item.insert("rf".into(), num(now_s * 1_000));
        item.insert("shard_count".into(), num(a.items as i64));
        item.insert("ttl".into(), num(now_s + 86_400));
        for (limit, (cp, ra, rp)) in [("tenant_rps", params), ("wcu", params)] {
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

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    ok: u64,
    condition_failed: u64,
    errors: u64,
    capacity: f64,
    first_error: Option<String>,
}

async fn worker(
    c: Client,
    a: Arc<Args>,
    params: (i64, i64, i64),
    now_s: i64,
    deadline: Instant,
    issued: Arc<AtomicU64>,
    seed: u64,
) -> Tally {
    let (cp, ra, rp) = params;
    let mut t = Tally::default();
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
                t.latencies_us.push(us);
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
    let params = (100_000_000 * MILLI, 100_000_000 * MILLI, 1_000);
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
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.map_err(|e| format!("a worker failed: {e}"))?;
        all.latencies_us.extend(t.latencies_us);
        all.ok += t.ok;
        all.condition_failed += t.condition_failed;
        all.errors += t.errors;
        all.capacity += t.capacity;
        if all.first_error.is_none() {
            all.first_error = t.first_error;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.latencies_us.sort_unstable();
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
        "latency_us": latency::percentiles(&all.latencies_us),
    }))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ddb_update_loop: {e}");
            return ExitCode::FAILURE;
        }
    };
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

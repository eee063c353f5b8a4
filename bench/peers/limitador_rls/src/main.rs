//! limitador behind Envoy's ShouldRateLimit, for `bench/run redis` (see Cargo.toml).
//!
//!     limitador_rls --addr 127.0.0.1:9081 --redis redis://127.0.0.1:6379 \
//!                   --storage redis|redis_cached --limit KEY:MAX:SECONDS [--limit ...]
//!
//! Each `--limit` is one limitador `Limit` in the `bench` namespace, counted per value of
//! the first descriptor's `KEY` entry (`descriptors[0].KEY`), applying when that entry is
//! present (`KEY=VALUE`: when it holds that value) — what a limitador-server limits file
//! with `conditions: ["'KEY' in descriptors[0]"]` and `variables: ["descriptors[0].KEY"]`
//! says.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use limitador::limit::{Context, Expression, Limit, Predicate};
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
use limitador::storage::AsyncCounterStorage;
use limitador::AsyncRateLimiter;
use tonic::{Request, Response, Status};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long)]
    redis: String,
    /// `redis` or `redis_cached`.
    #[arg(long, default_value = "redis")]
    storage: String,
    /// KEY[=VALUE]:MAX:SECONDS.
    #[arg(long, required = true)]
    limit: Vec<String>,
}

struct Rls {
    limiter: Arc<AsyncRateLimiter>,
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        let descriptors: Vec<HashMap<String, String>> = req
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect()
            })
            .collect();
        let mut ctx = Context::default();
        ctx.list_binding("descriptors".to_string(), descriptors);
        let hits = u64::from(req.hits_addend.max(1));
        let result = self
            .limiter
            .check_rate_limited_and_update(&req.domain.as_str().into(), &ctx, hits)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let code = if result.limited {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        }))
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let storage: Box<dyn AsyncCounterStorage> = match args.storage.as_str() {
        "redis" => Box::new(AsyncRedisStorage::new(&args.redis).await.expect("redis")),
        "redis_cached" => Box::new(
            CachedRedisStorageBuilder::new(&args.redis)
                .build()
                .await
                .expect("redis"),
        ),
        other => panic!("--storage {other}: redis or redis_cached"),
    };
    let limiter = AsyncRateLimiter::new_with_storage(storage);
    for spec in &args.limit {
        let parts: Vec<&str> = spec.split(':').collect();
        let [key, max, seconds] = parts[..] else {
            panic!("--limit {spec}: KEY:MAX:SECONDS");
        };
        let condition = match key.split_once('=') {
            Some((key, value)) => format!("'{key}' in descriptors[0] && descriptors[0].{key} == '{value}'"),
            None => format!("'{key}' in descriptors[0]"),
        };
        let key = key.split('=').next().unwrap_or(key);
        limiter.add_limit(Limit::new(
            "bench",
            max.parse().expect("MAX"),
            seconds.parse().expect("SECONDS"),
            [Predicate::parse(condition).expect("predicate")],
            [Expression::parse(format!("descriptors[0].{key}")).expect("variable")],
        ));
    }
    eprintln!("limitador_rls on {} ({})", args.addr, args.storage);
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Rls {
            limiter: Arc::new(limiter),
        }))
        .serve(args.addr)
        .await
        .expect("serve");
}

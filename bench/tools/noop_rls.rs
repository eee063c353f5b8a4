//! A no-op rate-limit service: the ceiling the load benchmarks (`bench/run`) compare
//! shardgate with.
//!
//! It is a plain tonic rate-limit server, as shardgate's gRPC port was built until
//! 2026-12-02 — tonic's default server builder (same HTTP/2 settings), the same kind of
//! response-mapping layer, health and reflection beside the rate-limit service in tonic's
//! router, tonic's generated service and prost codec, shardgate's log subscriber (text to
//! stderr, `RUST_LOG` filter, default `info`), tokio's default multi-thread runtime, the
//! same allocator (mimalloc) — but `ShouldRateLimit` does no work: it answers `OK` with one
//! `OK` status per descriptor and nothing else (no matching, no store, no metrics).
//!
//! shardgate's port now sends the rate-limit call past tonic's router and runs it without
//! tonic's unary machinery (`src/server/grpc.rs`, `rls.rs`); the ceiling stays the plain
//! tonic server, the stack the targets are set against, so a shardgate call can cost less
//! than it.
//!
//! Like shardgate, it serves a `TcpListener` through `serve_with_incoming_shutdown` and
//! sets `TCP_NODELAY` on each accepted socket (tonic leaves them as the OS made them).
//!
//!     cargo run --release --example noop_rls -- 127.0.0.1:9081

/// The same allocator as the server's (src/main.rs), so the ceiling stays the same stack.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::process::ExitCode;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::http;
use tonic::{Request, Response, Status};

struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

type GrpcResponse = http::Response<tonic::body::Body>;

/// shardgate maps every response through one function (to rewrite undecodable-request
/// errors); this keeps a layer of the same shape so the stacks match.
fn pass(response: GrpcResponse) -> GrpcResponse {
    response
}

async fn serve(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<RateLimitServiceServer<Noop>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    eprintln!("noop_rls: serving on {addr}");
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        move |conn| {
            if let Ok(c) = &conn {
                let _ = c.set_nodelay(true);
            }
            conn
        },
    );
    tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            pass as fn(GrpcResponse) -> GrpcResponse,
        ))
        .add_service(health)
        .add_service(reflection)
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.iter().find(|a| !a.starts_with("--")).cloned() else {
        eprintln!("usage: noop_rls LISTEN_ADDR (e.g. 127.0.0.1:9081)");
        return ExitCode::FAILURE;
    };
    let addr: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("noop_rls: bad listen address {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The same log subscriber as `shardgate serve` (it decides what tracing's spans in
    // h2 and tonic cost), and the same runtime: tokio's default multi-thread runtime.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("noop_rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(addr)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("noop_rls: {e}");
            ExitCode::FAILURE
        }
    }
}

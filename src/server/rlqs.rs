//! The `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` route: Envoy's
//! `rate_limit_quota` filter keeps one bidirectional stream open, sends usage reports and
//! is answered, report by report, with the assignments `service/rlqs/` decides. Served
//! through tonic's router on the gRPC port (`grpc.rs`), its request messages bounded by
//! the port's message bound, ended as the connection closes (`others.rs`).
//!
//! Each stream runs in a task of its own, fenced: a panic while answering it ends that
//! stream alone with INTERNAL (its demand leaves the shares as its state is dropped), and
//! the connection, its other calls and the other streams go on. On a store a fleet shares,
//! the server's draws run in one more task (`service/rlqs/fleet.rs`), stopped with the
//! service; a stream also answers when its buckets' rates move, without a report. It
//! decides nothing.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::service::metrics::Metrics;
use crate::service::rlqs::board::RlqsBoard;
use crate::service::rlqs::demand::{Demands, Subscription};
use crate::service::rlqs::fleet::Fleet;
use crate::service::rlqs::stream::Stream;
use crate::service::RateLimiter;
use crate::store::BucketStore;
use crate::support::text::panic_text;

/// Most buckets one stream may hold: a filter's bucket id builder can make one per
/// header value, so a client could otherwise grow the server's tables without bound.
pub const MAX_BUCKETS_PER_STREAM: usize = 4096;

/// Answers queued for a stream whose client reads slowly: past it the stream's task
/// waits, reading no further report.
const ANSWERS_QUEUED: usize = 4;

type Answers = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

/// The service: the limiter (for the rules in force), the server's demand table and, in a
/// fleet, its grants and the task that draws them.
pub struct Rlqs<S: BucketStore> {
    limiter: Arc<RateLimiter<S>>,
    demands: Arc<Demands>,
    next_stream: AtomicU64,
    fleet: Option<(Arc<Fleet>, Drawing)>,
}

/// The fleet's draw task (of the service that made the board), stopped when the service
/// is dropped.
struct Drawing(Option<tokio::task::JoinHandle<()>>);

impl Drop for Drawing {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl<S: BucketStore> Rlqs<S> {
    /// The service as tonic's router serves it, request messages bounded to
    /// `max_message_len`; its limits shared with a fleet through the store when `fleet`.
    pub fn server(
        limiter: Arc<RateLimiter<S>>,
        max_message_len: usize,
        fleet: bool,
    ) -> RateLimitQuotaServiceServer<Rlqs<S>> {
        let metrics = limiter.metrics().clone();
        let (board, made) = limiter.rlqs_board(|| RlqsBoard {
            demands: Arc::default(),
            fleet: fleet.then(|| Arc::new(Fleet::new(metrics))),
        });
        let demands = board.demands.clone();
        // The port that made the board draws for it.
        let fleet = board.fleet.clone().map(|grants| {
            let task =
                made.then(|| tokio::spawn(grants.clone().run(limiter.clone(), demands.clone())));
            (grants, Drawing(task))
        });
        let service = Rlqs {
            limiter,
            demands,
            next_stream: AtomicU64::new(1),
            fleet,
        };
        RateLimitQuotaServiceServer::new(service).max_decoding_message_size(max_message_len)
    }
}

#[tonic::async_trait]
impl<S: BucketStore> RateLimitQuotaService for Rlqs<S> {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut stream = Stream::new(
            Subscription::new(self.demands.clone(), id),
            MAX_BUCKETS_PER_STREAM,
        );
        let fleet = self.fleet.as_ref().map(|(grants, _)| grants.clone());
        if let Some(grants) = &fleet {
            stream = stream.in_fleet(grants.clone());
        }
        let (tx, rx) = mpsc::channel(ANSWERS_QUEUED);
        self.limiter.metrics().rlqs().stream_opened();
        let served = served(
            self.limiter.clone(),
            fleet,
            stream,
            request.into_inner(),
            tx.clone(),
        );
        tokio::spawn(async move {
            if let Err(panic) = AssertUnwindSafe(served).catch_unwind().await {
                let text = panic_text(&*panic, 256);
                tracing::error!(stream = id, panic = %text, "an RLQS stream panicked; it alone was ended");
                let _ = tx
                    .send(Err(Status::internal("the stream's answer failed")))
                    .await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One stream, until its client ends it or stops reading, or a report is refused.
async fn served<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    fleet: Option<Arc<Fleet>>,
    stream: Stream,
    reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let metrics = limiter.metrics().clone();
    let mut stream = Counted { stream, metrics };
    answered(&limiter, fleet.as_deref(), &mut stream, reports, answers).await;
}

/// A stream whose end is counted, the buckets it held with it, however it ends (an
/// unwinding panic too).
struct Counted {
    stream: Stream,
    metrics: Arc<Metrics>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.metrics.rlqs().stream_closed(self.stream.buckets());
    }
}

/// Answers each report of `reports` on `answers`, and, in a fleet, each move of its
/// buckets' rates.
async fn answered<S: BucketStore>(
    limiter: &RateLimiter<S>,
    fleet: Option<&Fleet>,
    counted: &mut Counted,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let metrics = counted.metrics.rlqs();
    let stream = &mut counted.stream;
    let mut moves = fleet.map(Fleet::changes);
    loop {
        let report = tokio::select! {
            report = reports.message() => report,
            _ = answers.closed() => return,
            moved = moved(&mut moves) => {
                if moved.is_err() {
                    return;
                }
                let answer = stream.reassign(&limiter.config());
                metrics.answered(0, 0, &answer.sent);
                metrics.shares(&answer.shares);
                if !answer.response.bucket_action.is_empty() {
                    tracing::debug!(answer = ?answer.response, "an RLQS reassignment");
                    if answers.send(Ok(answer.response)).await.is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let report = match report {
            Ok(Some(report)) => report,
            Ok(None) => return,
            Err(status) => {
                // A report past the message bound, or the client's own end: said back, in
                // case the client still reads.
                tracing::debug!(%status, "an RLQS stream ended");
                let _ = answers.try_send(Err(status));
                return;
            }
        };
        tracing::debug!(report = ?report, "an RLQS report");
        let config = limiter.config();
        if let Some(fleet) = fleet {
            // A bucket's first report: its first tokens drawn before it is answered.
            fleet.draw_new(limiter, stream.keys(&report, &config)).await;
        }
        let answer = match stream.answer(report, &config, Instant::now()) {
            Ok(answer) => answer,
            Err(e) => {
                let _ = answers
                    .send(Err(Status::invalid_argument(e.to_string())))
                    .await;
                return;
            }
        };
        metrics.reported(answer.allowed, answer.denied, answer.refused);
        metrics.answered(answer.buckets_added, answer.buckets_removed, &answer.sent);
        metrics.shares(&answer.shares);
        if answer.response.bucket_action.is_empty() {
            continue;
        }
        tracing::debug!(answer = ?answer.response, "an RLQS answer");
        if answers.send(Ok(answer.response)).await.is_err() {
            return;
        }
    }
}

/// The next move of the fleet's rates (never, outside a fleet); an error once the fleet
/// is gone.
async fn moved(moves: &mut Option<tokio::sync::watch::Receiver<u64>>) -> Result<(), ()> {
    match moves {
        Some(rx) => rx.changed().await.map_err(|_| ()),
        None => std::future::pending().await,
    }
}

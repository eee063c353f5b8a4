//! A test xDS control plane of our own (Envoy Gateway's is not runnable here): an ADS
//! server on a loopback port whose test pushes `RateLimitConfig` responses on the stream
//! open at the moment, sees every request the client sends (ACKs and NACKs), and can
//! close the stream or stop listening.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use shardgate::config::xds::RATE_LIMIT_CONFIG_TYPE;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

type Responses = mpsc::Sender<Result<DiscoveryResponse, Status>>;

#[derive(Default)]
struct Shared {
    /// The open stream's sender (the latest stream's).
    stream: Mutex<Option<Responses>>,
    /// Streams opened so far.
    streams: Mutex<usize>,
    /// The client certificate (DER) each stream was opened with, in order.
    client_certs: Mutex<Vec<Option<Vec<u8>>>>,
}

struct Ads {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let cert = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.as_ref().to_vec()));
        self.shared.client_certs.lock().unwrap().push(cert);
        let mut incoming = request.into_inner();
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Some(Ok(r)) = incoming.next().await {
                let _ = requests.send(r);
            }
        });
        let (tx, rx) = mpsc::channel(16);
        *self.shared.stream.lock().unwrap() = Some(tx);
        *self.shared.streams.lock().unwrap() += 1;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// The running control plane.
pub struct ControlPlane {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    server: tokio::task::JoinHandle<()>,
}

impl ControlPlane {
    /// Listens on a free loopback port (or on `addr`, to come back where it was).
    pub async fn start(addr: Option<SocketAddr>) -> ControlPlane {
        ControlPlane::start_with(addr, None).await
    }

    /// As [`ControlPlane::start`], speaking TLS with `tls` (Envoy Gateway's requires a
    /// client certificate).
    pub async fn start_with(
        addr: Option<SocketAddr>,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> ControlPlane {
        let listener = tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into()))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let (tx, requests) = mpsc::unbounded_channel();
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            shared: shared.clone(),
            requests: tx,
        });
        let server = tokio::spawn(async move {
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                builder = builder.tls_config(tls).expect("TLS");
            }
            let _ = builder
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        ControlPlane {
            addr,
            shared,
            requests,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Streams opened so far.
    /// The client certificate (DER) each stream was opened with, in order.
    pub fn client_certs(&self) -> Vec<Option<Vec<u8>>> {
        self.shared.client_certs.lock().unwrap().clone()
    }

    pub fn streams(&self) -> usize {
        *self.shared.streams.lock().unwrap()
    }

    /// The next request the client sends (within 10 s).
    pub async fn request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(Duration::from_secs(10), self.requests.recv())
            .await
            .expect("a request within 10 s")
            .expect("the control plane runs")
    }

    /// Pushes `resources` as `version` with `nonce` on the open stream.
    pub async fn push(&self, version: &str, nonce: &str, resources: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources: resources
                .iter()
                .map(|r| Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: r.encode_to_vec(),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: nonce.into(),
            ..Default::default()
        };
        let sender = self.shared.stream.lock().unwrap().clone();
        sender
            .expect("a stream is open")
            .send(Ok(response))
            .await
            .expect("the stream is open");
    }

    /// Ends the open stream (the control plane restarting its side).
    pub fn close_stream(&self) {
        self.shared.stream.lock().unwrap().take();
    }

    /// Stops listening and drops every stream.
    pub fn stop(self) -> SocketAddr {
        self.server.abort();
        self.shared.stream.lock().unwrap().take();
        self.addr
    }
}

//! Parts of the `shardgate` binary's command line (`main.rs` keeps the commands and
//! their dispatch): `serve`'s arguments (`serve`, with the gRPC port's in `grpc_port`,
//! the rules over xDS in `xds`, upstream's Prometheus port in `upstream_prometheus`),
//! their translation into the server's options (`serve_options`), the store arguments
//! and commands (`stores`), the rules' path every command reads (`rules`), `explain`
//! (one descriptor in words), and the value parsers they share (`values`). Not part of the
//! library: no module of it uses these.

pub(crate) mod explain;
pub(crate) mod grpc_port;
pub(crate) mod rules;
pub(crate) mod serve;
pub(crate) mod serve_options;
pub(crate) mod stores;
pub(crate) mod upstream_prometheus;
pub(crate) mod values;
pub(crate) mod xds;

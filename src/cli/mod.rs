//! Parts of the `shardgate` binary's command line (`main.rs` keeps the commands and the
//! server's own flags). Not part of the library: no module of it uses these.

pub(crate) mod stores;
pub(crate) mod upstream_prometheus;
pub(crate) mod xds;

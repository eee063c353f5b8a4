//! What shardgate sets on every accepted socket, plain or TLS alike.

/// Sends each answer as soon as it is written. tonic configures accepted sockets only
/// when it binds the listener itself; left to the OS, Nagle's algorithm holds a small
/// answer back until the client acknowledges the previous one, which with delayed ACKs
/// costs tens of milliseconds whenever two answers on one connection are written close
/// together (bench/README.md has the measured tail).
pub(crate) fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
}

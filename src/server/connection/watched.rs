//! A connection's bytes as hyper reads and writes them, watched for two things hyper does
//! not report: whether the client has sent the HTTP/2 connection preface yet (until then
//! hyper cannot close the connection gracefully, and waits), and the RST_STREAM and GOAWAY
//! frames the server sends (h2 sends some on its own: a stream refused past the limit, a
//! flood answered ENHANCE_YOUR_CALM), counted by error code.
//!
//! It reads the frame headers of what was written (9 bytes each, the payload skipped but
//! for the error code of those two frames); it changes no byte.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::service::metrics::Metrics;

/// The client's connection preface: `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_BYTES: usize = 24;

const FRAME_HEADER_BYTES: usize = 9;
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;

/// Whether the client's preface has arrived (its bytes, at least: hyper judges them).
#[derive(Debug, Default)]
pub(super) struct Preface(AtomicBool);

impl Preface {
    pub(super) fn seen(&self) -> bool {
        self.0.load(Relaxed)
    }
}

/// Where the written bytes are in their frames.
#[derive(Debug)]
enum Scan {
    /// Inside a frame header, `have` of its 9 bytes seen.
    Header {
        bytes: [u8; FRAME_HEADER_BYTES],
        have: usize,
    },
    /// Inside a payload, `left` bytes to skip; for RST_STREAM and GOAWAY the error code
    /// is gathered from offset `code_at`.
    Payload {
        kind: u8,
        at: usize,
        left: usize,
        code_at: usize,
        code: [u8; 4],
    },
}

/// The connection's socket, watched.
pub(super) struct Watched<IO> {
    io: IO,
    /// Bytes read so far, until the preface is in.
    read: usize,
    preface: Arc<Preface>,
    scan: Scan,
    metrics: Arc<Metrics>,
}

impl<IO> Watched<IO> {
    pub(super) fn new(io: IO, metrics: Arc<Metrics>) -> (Watched<IO>, Arc<Preface>) {
        let preface = Arc::new(Preface::default());
        let watched = Watched {
            io,
            read: 0,
            preface: preface.clone(),
            scan: Scan::Header {
                bytes: [0; FRAME_HEADER_BYTES],
                have: 0,
            },
            metrics,
        };
        (watched, preface)
    }

    /// Follows the frames through `written`, the next bytes the server sent.
    fn scan(&mut self, mut written: &[u8]) {
        while !written.is_empty() {
            match &mut self.scan {
                Scan::Header { bytes, have } => {
                    let (head, rest) =
                        written.split_at((FRAME_HEADER_BYTES - *have).min(written.len()));
                    for (slot, byte) in bytes.iter_mut().skip(*have).zip(head) {
                        *slot = *byte;
                    }
                    *have += head.len();
                    written = rest;
                    if *have == FRAME_HEADER_BYTES {
                        let [a, b, c, kind, ..] = *bytes;
                        let left = u32::from_be_bytes([0, a, b, c]) as usize;
                        let code_at = if kind == GOAWAY { 4 } else { 0 };
                        self.scan = Scan::Payload {
                            kind,
                            at: 0,
                            left,
                            code_at,
                            code: [0; 4],
                        };
                        self.end_of_payload();
                    }
                }
                Scan::Payload {
                    kind,
                    at,
                    left,
                    code_at,
                    code,
                } => {
                    let (payload, rest) = written.split_at((*left).min(written.len()));
                    if *kind == RST_STREAM || *kind == GOAWAY {
                        for (i, byte) in payload.iter().enumerate() {
                            // The error code's four bytes start `code_at` into the payload.
                            let slot = (*at + i)
                                .checked_sub(*code_at)
                                .and_then(|offset| code.get_mut(offset));
                            if let Some(slot) = slot {
                                *slot = *byte;
                            }
                        }
                    }
                    *at += payload.len();
                    *left -= payload.len();
                    written = rest;
                    self.end_of_payload();
                }
            }
        }
    }

    /// At a payload's end, counts the frame if it is one of ours and starts a header.
    fn end_of_payload(&mut self) {
        let Scan::Payload {
            kind,
            left: 0,
            code,
            ..
        } = self.scan
        else {
            return;
        };
        let code = u32::from_be_bytes(code);
        match kind {
            RST_STREAM => self.metrics.port().reset_sent(code),
            GOAWAY => self.metrics.port().goaway_sent(code),
            _ => {}
        }
        self.scan = Scan::Header {
            bytes: [0; FRAME_HEADER_BYTES],
            have: 0,
        };
    }

    /// Follows the first `n` bytes of `bufs`, which were written.
    fn scan_vectored(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                return;
            }
            let (written, _) = buf.split_at(buf.len().min(n));
            self.scan(written);
            n -= written.len();
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.read < PREFACE_BYTES {
            this.read += buf.filled().len() - before;
            if this.read >= PREFACE_BYTES {
                this.preface.0.store(true, Relaxed);
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            // `n <= buf.len()` is `AsyncWrite`'s contract; a writer breaking it is not
            // followed past the buffer.
            this.scan(buf.get(..n).unwrap_or(buf));
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.scan_vectored(bufs, n);
        }
        polled
    }

    /// Not vectored, whatever the socket can do: h2 then copies an answer's DATA of up to
    /// 1 KiB into its write buffer, so the answers ready at a poll leave in one write. Told
    /// the socket writes vectored, h2 copies only up to 256 bytes and writes each larger
    /// DATA frame (an answer of 16 descriptors is ~360 bytes) as a `writev` of its own:
    /// one system call per answer.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, 0]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// Resets and GOAWAYs are counted by code however the writes cut the frames.
    #[test]
    fn frames_are_followed_through_any_cut() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x0, 1, &[7; 300])); // DATA
        bytes.extend(frame(RST_STREAM, 3, &7u32.to_be_bytes())); // REFUSED_STREAM
        let mut goaway = 5u32.to_be_bytes().to_vec();
        goaway.extend(11u32.to_be_bytes()); // ENHANCE_YOUR_CALM
        goaway.extend(b"debug data");
        bytes.extend(frame(GOAWAY, 0, &goaway));
        for cut in [1, 2, 5, 9, 10, 13, 100, bytes.len()] {
            let metrics = Arc::new(Metrics::new());
            let (mut watched, _) = Watched::new((), metrics.clone());
            for chunk in bytes.chunks(cut) {
                watched.scan(chunk);
            }
            let page = metrics.render();
            for line in [
                "shardgate_grpc_stream_resets_sent_total{code=\"refused_stream\"} 1",
                "shardgate_grpc_goaways_sent_total{code=\"enhance_your_calm\"} 1",
                "shardgate_grpc_stream_resets_sent_total{code=\"no_error\"} 0",
            ] {
                assert!(page.contains(line), "cut {cut}: {line}");
            }
        }
    }
}

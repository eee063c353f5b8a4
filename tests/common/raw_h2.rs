//! A raw HTTP/2 connection for the port's hostile-client tests: frames written byte by
//! byte, so a test can do what no well-behaved client library does (open streams past the
//! server's limit, send malformed requests, never answer a PING) and read every frame the
//! server sends back, GOAWAY and RST_STREAM included.
//!
//! Header blocks use HPACK's static table and literals without Huffman coding only.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// HTTP/2 error codes (RFC 9113 §7).
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// SETTINGS identifiers.
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const MAX_FRAME_SIZE: u16 = 0x5;
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame as the server sent it.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY frame.
    pub fn error_code(&self) -> u32 {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            other => panic!("frame type {other} carries no error code"),
        };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }

    /// The `(identifier, value)` pairs of a SETTINGS frame.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        assert_eq!(self.kind, SETTINGS);
        self.payload
            .chunks(6)
            .map(|s| {
                (
                    u16::from_be_bytes([s[0], s[1]]),
                    u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                )
            })
            .collect()
    }
}

/// A frame's bytes: the 9-byte header and the payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend((stream & 0x7fff_ffff).to_be_bytes());
    out.extend(payload);
    out
}

/// A HEADERS frame ending the header block.
pub fn headers(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
    frame(HEADERS, flags, stream, block)
}

pub fn data(stream: u32, bytes: &[u8], end_stream: bool) -> Vec<u8> {
    frame(DATA, if end_stream { END_STREAM } else { 0 }, stream, bytes)
}

pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// An HPACK string literal, not Huffman-coded (lengths below 127).
fn literal(s: &str) -> Vec<u8> {
    assert!(s.len() < 127, "short literals only");
    let mut out = vec![s.len() as u8];
    out.extend(s.as_bytes());
    out
}

/// The header block of a gRPC call to `path`: POST, http, the path, `content-type:
/// application/grpc` and `te: trailers`.
pub fn grpc_request(path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table 3 and 6)
    block.push(0x04); // :path, literal without indexing, name from static table 4
    block.extend(literal(path));
    block.extend([0x0f, 0x10]); // content-type (static 31), literal without indexing
    block.extend(literal("application/grpc"));
    block.push(0x00); // a new name, literal without indexing
    block.extend(literal("te"));
    block.extend(literal("trailers"));
    block
}

/// A request header block without `:method`: malformed, so the server resets the stream
/// itself (a stream error it counts against the connection).
pub fn malformed_request() -> Vec<u8> {
    vec![0x86, 0x84] // :scheme http, :path / (static table 6 and 4)
}

/// A raw client connection: the preface and an empty SETTINGS frame are sent on open.
pub struct RawConnection {
    tcp: TcpStream,
    read: Vec<u8>,
}

impl RawConnection {
    pub async fn open(addr: SocketAddr) -> RawConnection {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tcp.write_all(&hello).await.unwrap();
        RawConnection {
            tcp,
            read: Vec::new(),
        }
    }

    /// Writes `bytes` (frames); a connection the server has closed is not an error here,
    /// as a test reads what the server said next.
    pub async fn send(&mut self, bytes: &[u8]) {
        let _ = self.tcp.write_all(bytes).await;
    }

    /// The next frame the server sends, or `None` once it has closed the connection.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if self.read.len() >= 9 {
                let len = u32::from_be_bytes([0, self.read[0], self.read[1], self.read[2]]);
                let len = len as usize;
                if self.read.len() >= 9 + len {
                    let frame = Frame {
                        kind: self.read[3],
                        flags: self.read[4],
                        stream: u32::from_be_bytes(self.read[5..9].try_into().unwrap())
                            & 0x7fff_ffff,
                        payload: self.read[9..9 + len].to_vec(),
                    };
                    self.read.drain(..9 + len);
                    return Some(frame);
                }
            }
            let mut buf = [0u8; 16 * 1024];
            match self.tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.read.extend(&buf[..n]),
            }
        }
    }

    /// Every frame until the server closes the connection or `patience` passes, and
    /// whether it closed.
    pub async fn frames_until_closed(&mut self, patience: Duration) -> (Vec<Frame>, bool) {
        let mut frames = Vec::new();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match tokio::time::timeout_at(deadline, self.next_frame()).await {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => return (frames, true),
                Err(_) => return (frames, false),
            }
        }
    }

    /// Frames until one matches `wanted` (returned) or `patience` passes (`None`).
    pub async fn frame_where(
        &mut self,
        patience: Duration,
        mut wanted: impl FnMut(&Frame) -> bool,
    ) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match tokio::time::timeout_at(deadline, self.next_frame()).await {
                Ok(Some(frame)) if wanted(&frame) => return Some(frame),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

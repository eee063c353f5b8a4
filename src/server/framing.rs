//! gRPC length-prefixed framing of a request body, checked as it streams in: a body that
//! holds no whole message, announces one over the size limit, or is not whole in time is
//! refused with its own status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED),
//! never INTERNAL or OUT_OF_RANGE, which read as a server fault.
//!
//! It hands on the first message's bytes as received; what they mean is `wire.rs`'
//! concern.

use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use thiserror::Error;
use tokio::time::Instant;
use tonic::codegen::http;
use tonic::Status;

use crate::service::deadline::Bounded;
use crate::support::text::elide;

/// The most of a client's `grpc-encoding` value quoted back to it.
const NAME_BYTES: usize = 64;

/// The prefix of every gRPC message: a compression flag and a 4-byte big-endian length.
const PREFIX_BYTES: usize = 5;

/// The message length a prefix announces (its last four bytes, big-endian).
fn announced(prefix: &[u8; PREFIX_BYTES]) -> usize {
    let [_, a, b, c, d] = *prefix;
    u32::from_be_bytes([a, b, c, d]) as usize
}

/// Why a request body is not a sequence of whole gRPC messages, in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FramingError {
    #[error("the request body holds no message")]
    NoMessage,
    #[error("the request body ends {have} bytes into a {need}-byte message prefix")]
    PrefixCut { have: usize, need: usize },
    #[error("the request body ends {missing} bytes short of its {announced}-byte message")]
    MessageCut { announced: usize, missing: usize },
    #[error("the request message announces {announced} bytes, more than the {limit}-byte limit")]
    TooLarge { announced: usize, limit: usize },
    /// No compression is negotiated, so no message may be compressed (under an encoding
    /// the client declared, [`Encoding::status`] makes it UNIMPLEMENTED).
    #[error(
        "protocol error: received message with compressed-flag but no grpc-encoding was specified"
    )]
    Compressed,
    #[error("protocol error: received message with invalid compression flag {flag} (valid flags are 0 and 1)")]
    UnknownFlag { flag: u8 },
    /// The body had not ended when the time a body is given (`--store-timeout`) was up.
    #[error("the request body was not whole within {} (--store-timeout)", humantime::format_duration(*.within))]
    Late { within: Duration },
}

impl From<FramingError> for Status {
    fn from(e: FramingError) -> Status {
        match e {
            FramingError::TooLarge { .. } => Status::resource_exhausted(e.to_string()),
            // The server's own deadline for the request passed before the request was
            // whole: a timeout (which a client may retry), not the caller cancelling
            // (CANCELLED) nor anything wrong with what it sent.
            FramingError::Late { .. } => Status::deadline_exceeded(e.to_string()),
            // gRPC's protocol says INTERNAL for a message whose flag does not match what
            // was negotiated.
            FramingError::Compressed | FramingError::UnknownFlag { .. } => {
                Status::internal(e.to_string())
            }
            _ => Status::invalid_argument(e.to_string()),
        }
    }
}

/// Where a body is in its framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Inside a prefix, `have` of its 5 bytes seen (0: between messages).
    Prefix {
        have: usize,
        bytes: [u8; PREFIX_BYTES],
    },
    /// Inside a message body, `left` of its `announced` bytes still to come.
    Message { announced: usize, left: usize },
}

/// The framing state of one body: fed its bytes in order, then told it ended.
#[derive(Debug, Clone)]
pub struct Framing {
    position: Position,
    messages: usize,
    limit: usize,
}

impl Framing {
    pub fn new(limit: usize) -> Framing {
        Framing {
            position: Position::Prefix {
                have: 0,
                bytes: [0; PREFIX_BYTES],
            },
            messages: 0,
            limit,
        }
    }

    /// The next bytes of the body. Fails as soon as a prefix announces too much.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), FramingError> {
        while !chunk.is_empty() {
            match &mut self.position {
                Position::Prefix { have, bytes } => {
                    let (head, rest) = chunk.split_at((PREFIX_BYTES - *have).min(chunk.len()));
                    for (slot, byte) in bytes.iter_mut().skip(*have).zip(head) {
                        *slot = *byte;
                    }
                    *have += head.len();
                    chunk = rest;
                    if *have == PREFIX_BYTES {
                        let [flag, ..] = *bytes;
                        match flag {
                            0 => {}
                            1 => return Err(FramingError::Compressed),
                            flag => return Err(FramingError::UnknownFlag { flag }),
                        }
                        let announced = announced(bytes);
                        if announced > self.limit {
                            return Err(FramingError::TooLarge {
                                announced,
                                limit: self.limit,
                            });
                        }
                        self.start_message(announced);
                    }
                }
                Position::Message { left, .. } => {
                    let (taken, rest) = chunk.split_at((*left).min(chunk.len()));
                    *left -= taken.len();
                    chunk = rest;
                    if *left == 0 {
                        self.end_message();
                    }
                }
            }
        }
        Ok(())
    }

    /// The body ended: it must have ended between messages, after at least one.
    pub fn finish(&self) -> Result<(), FramingError> {
        match self.position {
            Position::Prefix { have: 0, .. } if self.messages > 0 => Ok(()),
            Position::Prefix { have: 0, .. } => Err(FramingError::NoMessage),
            Position::Prefix { have, .. } => Err(FramingError::PrefixCut {
                have,
                need: PREFIX_BYTES,
            }),
            Position::Message { announced, left } => Err(FramingError::MessageCut {
                announced,
                missing: left,
            }),
        }
    }

    fn start_message(&mut self, announced: usize) {
        if announced == 0 {
            self.end_message();
        } else {
            self.position = Position::Message {
                announced,
                left: announced,
            };
        }
    }

    fn end_message(&mut self) {
        self.messages += 1;
        self.position = Position::Prefix {
            have: 0,
            bytes: [0; PREFIX_BYTES],
        };
    }
}

/// How much of a request body is read, for how long.
#[derive(Debug, Clone, Copy)]
pub struct BodyBounds {
    /// The largest message accepted.
    pub max_message_len: usize,
    /// When the body must have ended.
    pub due: Instant,
    /// What `due` allowed, for the message of a late body.
    pub within: Duration,
}

/// The first message of a request body, read to the body's end with its framing checked:
/// the message without its prefix. A unary call carries one message; any after it are
/// checked and dropped, as tonic drops them. What is kept is bounded by the first
/// message's size (and one HTTP/2 frame), however long the body.
///
/// A message announced larger than `bounds.max_message_len` is refused as soon as its
/// prefix is in, without waiting for (or keeping) its bytes; a body not ended by
/// `bounds.due` is refused then, whatever deadline its caller sent (or did not), so a
/// client trickling or stalling its body holds a stream for that long at most. The timer
/// is armed only when the body is not whole at once (Envoy sends it with the headers).
///
/// A message compressed without a negotiated encoding (flag 1), or with a flag gRPC does
/// not define, is INTERNAL, as gRPC's protocol asks, whichever message it is, as soon as its
/// prefix is in (as tonic answered).
///
/// The kept bytes are a slice of the HTTP/2 frame they came in, which keeps that frame's
/// read buffer allocated until the call ends: at most one such buffer per call in flight.
pub async fn first_message<B>(
    body: B,
    bounds: BodyBounds,
    encoding: Encoding,
) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes, Error = Status>,
{
    let read = read_first_message(body, bounds.max_message_len, encoding);
    let mut read = std::pin::pin!(read);
    // Read first: a body already whole is never late, however late the call was polled.
    if let Poll::Ready(read) = futures::poll!(read.as_mut()) {
        return read;
    }
    match Bounded::new(read, bounds.due).await {
        Some(read) => read,
        None => Err(FramingError::Late {
            within: bounds.within,
        }
        .into()),
    }
}

async fn read_first_message<B>(body: B, limit: usize, encoding: Encoding) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes, Error = Status>,
{
    let mut body = std::pin::pin!(body);
    let mut framing = Framing::new(limit);
    let mut first = FirstMessage::default();
    while let Some(frame) = body.frame().await {
        // Trailers (a client may send some) are not the message's.
        if let Ok(data) = frame?.into_data() {
            framing.feed(&data).map_err(|e| encoding.status(e))?;
            first.add(data);
        }
    }
    framing.finish()?;
    first.into_message()
}

/// The bytes of a body's first message (prefix included) as they arrive: the first frame
/// as it is when the message is in it — the usual case, with no copy — or gathered.
#[derive(Debug, Default)]
struct FirstMessage {
    /// The first frame's bytes while nothing had to be gathered.
    single: Option<Bytes>,
    gathered: BytesMut,
}

impl FirstMessage {
    fn held(&self) -> &[u8] {
        self.single.as_deref().unwrap_or(&self.gathered)
    }

    /// The prefix and message's length, once the prefix is in.
    fn wanted(&self) -> Option<usize> {
        let held = self.held();
        let prefix: &[u8; PREFIX_BYTES] = held.get(..PREFIX_BYTES)?.try_into().ok()?;
        Some(PREFIX_BYTES + announced(prefix))
    }

    /// Takes the body's next bytes, keeping those of the first message.
    fn add(&mut self, data: Bytes) {
        let held = self.held().len();
        if self.wanted().is_some_and(|w| held >= w) {
            return;
        }
        if held == 0 {
            self.single = Some(data);
        } else {
            if let Some(single) = self.single.take() {
                self.gathered.extend_from_slice(&single);
            }
            self.gathered.extend_from_slice(&data);
        }
        if let Some(wanted) = self.wanted() {
            match &mut self.single {
                Some(single) => single.truncate(wanted),
                None => self.gathered.truncate(wanted),
            }
        }
    }

    /// The message, once the body's framing has been found whole (so it is all held, and
    /// its flag says uncompressed).
    fn into_message(self) -> Result<Bytes, Status> {
        let whole = match self.single {
            Some(single) => single,
            None => self.gathered.freeze(),
        };
        if whole.len() < PREFIX_BYTES {
            return Err(FramingError::NoMessage.into());
        }
        Ok(whole.slice(PREFIX_BYTES..))
    }
}

/// What a request's `grpc-encoding` declares: no compression (`identity`, or none), or
/// another encoding. shardgate negotiates none, but a client may declare one and send its
/// messages uncompressed (grpc-go's does, with a compressor registered): only a message
/// that is actually compressed is refused.
#[derive(Debug, Clone, Default)]
pub enum Encoding {
    #[default]
    Identity,
    Other(http::HeaderValue),
}

impl Encoding {
    pub fn of(headers: &http::HeaderMap) -> Encoding {
        match headers.get("grpc-encoding") {
            Some(v) if v.as_bytes() != b"identity" => Encoding::Other(v.clone()),
            _ => Encoding::Identity,
        }
    }

    /// The status of a framing error in a body sent with this encoding: a compressed
    /// message under a declared encoding is UNIMPLEMENTED, naming what is accepted
    /// (`grpc-accept-encoding`); without one it is the protocol error it always is.
    fn status(&self, e: FramingError) -> Status {
        match (e, self) {
            (FramingError::Compressed, Encoding::Other(name)) => refused_encoding(name),
            _ => e.into(),
        }
    }
}

/// UNIMPLEMENTED for a message compressed with `name`, naming what is accepted.
fn refused_encoding(name: &http::HeaderValue) -> Status {
    let mut status = Status::unimplemented(format!(
        "the request is compressed with '{}', and only identity is accepted",
        elide(&String::from_utf8_lossy(name.as_bytes()), NAME_BYTES)
    ));
    status.metadata_mut().insert(
        "grpc-accept-encoding",
        tonic::metadata::MetadataValue::from_static("identity"),
    );
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body::Frame;

    /// `first_message` of a body sent as these DATA frames, then `trailers` if set.
    fn first_of(chunks: &[&[u8]], trailers: bool) -> Result<Bytes, Status> {
        let mut frames: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        if trailers {
            frames.push(Ok(Frame::trailers(http::HeaderMap::new())));
        }
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(first_message(
            body,
            bounds(Duration::from_secs(60)),
            Encoding::Identity,
        ))
    }

    fn bounds(within: Duration) -> BodyBounds {
        BodyBounds {
            max_message_len: 10,
            due: Instant::now() + within,
            within,
        }
    }

    #[tokio::test]
    async fn a_body_not_whole_in_time_is_deadline_exceeded() {
        let within = Duration::from_millis(20);
        // The prefix and part of the message, then nothing: the body never ends.
        let stalled = http_body_util::StreamBody::new(
            futures::stream::iter([Ok::<_, Status>(Frame::data(Bytes::from_static(
                b"\x00\x00\x00\x00\x03a",
            )))])
            .chain(futures::stream::pending()),
        );
        let status = first_message(stalled, bounds(within), Encoding::Identity)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            status.message(),
            "the request body was not whole within 20ms (--store-timeout)"
        );
        // A whole body is read however little time is left.
        let whole = http_body_util::Full::new(Bytes::from_static(b"\x00\x00\x00\x00\x01a"))
            .map_err(|never| match never {});
        let message =
            first_message(whole, bounds(Duration::from_nanos(1)), Encoding::Identity).await;
        assert_eq!(&message.unwrap()[..], b"a");
    }

    #[test]
    fn the_first_message_is_read_from_any_chunking() {
        let body: &[u8] = b"\x00\x00\x00\x00\x03abc\x00\x00\x00\x00\x01z";
        for split in 0..=body.len() {
            let (a, b) = body.split_at(split);
            for trailers in [false, true] {
                let got = first_of(&[a, b], trailers).unwrap();
                assert_eq!(&got[..], b"abc", "split at {split}");
            }
        }
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(&first_of(&bytewise, false).unwrap()[..], b"abc");
        assert_eq!(
            &first_of(&[b"\x00\x00\x00\x00\x00"], false).unwrap()[..],
            b""
        );
    }

    #[test]
    fn only_the_first_message_is_kept() {
        let mut first = FirstMessage::default();
        first.add(Bytes::from_static(b"\x00\x00"));
        first.add(Bytes::from_static(b"\x00\x00\x02a"));
        for _ in 0..100 {
            first.add(Bytes::from(vec![0u8; 1000]));
        }
        assert_eq!(first.held().len(), 7, "prefix and message, nothing after");
        assert_eq!(&first.into_message().unwrap()[..], b"a\x00");
        let mut first = FirstMessage::default();
        first.add(Bytes::from(b"\x00\x00\x00\x00\x01a".repeat(50)));
        assert_eq!(first.held().len(), 6, "one frame holding many messages");
    }

    #[test]
    fn a_compressed_or_unknown_flag_is_internal() {
        let status = first_of(&[b"\x01\x00\x00\x00\x01z"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("compressed-flag"), "{status:?}");
        let status = first_of(&[b"\x07\x00\x00\x00\x00"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("flag 7"), "{status:?}");
        // On a later message too, and before a cut body is judged: at the prefix.
        let status = first_of(&[b"\x00\x00\x00\x00\x01a\x01\x00\x00\x00\x01z"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        let status = first_of(&[b"\x01\x00\x00\x00\x09ab"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    }

    #[test]
    fn framing_errors_keep_their_codes() {
        let status = first_of(&[], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "the request body holds no message");
        let status = first_of(&[b"\x00\x00\x00\x00\x0b"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let status = first_of(&[b"\x00\x00\x00\x00\x02a"], false).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    /// A declared encoding is refused only for a message actually compressed.
    #[tokio::test]
    async fn a_declared_encoding_is_refused_only_when_used() {
        let mut headers = http::HeaderMap::new();
        assert!(matches!(Encoding::of(&headers), Encoding::Identity));
        headers.insert("grpc-encoding", "identity".parse().unwrap());
        assert!(matches!(Encoding::of(&headers), Encoding::Identity));
        headers.insert("grpc-encoding", "gzip".parse().unwrap());
        let gzip = Encoding::of(&headers);
        let read = |body: &'static [u8], encoding: Encoding| {
            let body =
                http_body_util::Full::new(Bytes::from_static(body)).map_err(|never| match never {});
            first_message(body, bounds(Duration::from_secs(60)), encoding)
        };
        let plain = read(b"\x00\x00\x00\x00\x01a", gzip.clone()).await;
        assert_eq!(&plain.unwrap()[..], b"a");
        let status = read(b"\x01\x00\x00\x00\x01a", gzip).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(status.message().contains("'gzip'"), "{status:?}");
        assert_eq!(
            status.metadata().get("grpc-accept-encoding").unwrap(),
            "identity"
        );
        headers.insert("grpc-encoding", "y".repeat(5000).parse().unwrap());
        let status = read(b"\x01\x00\x00\x00\x01a", Encoding::of(&headers))
            .await
            .unwrap_err();
        assert!(status.message().len() < 200);
        let status = read(b"\x01\x00\x00\x00\x01a", Encoding::Identity)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
    }

    fn framed(chunks: &[&[u8]]) -> Result<(), FramingError> {
        let mut f = Framing::new(10);
        for c in chunks {
            f.feed(c)?;
        }
        f.finish()
    }

    #[test]
    fn whole_messages_pass_in_any_chunking() {
        let body: &[u8] = b"\x00\x00\x00\x00\x03abc\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01z";
        for split in 0..=body.len() {
            let (a, b) = body.split_at(split);
            assert_eq!(framed(&[a, b]), Ok(()), "split at {split}");
        }
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(framed(&bytewise), Ok(()));
    }

    #[test]
    fn bodies_without_a_whole_message_say_where_they_end() {
        assert_eq!(framed(&[]), Err(FramingError::NoMessage));
        assert_eq!(framed(&[b""]), Err(FramingError::NoMessage));
        assert_eq!(
            framed(&[b"\x00\x00"]),
            Err(FramingError::PrefixCut { have: 2, need: 5 })
        );
        assert_eq!(
            framed(&[b"\x00\x00\x00\x00\x0a", b"abc"]),
            Err(FramingError::MessageCut {
                announced: 10,
                missing: 7
            })
        );
        // A second message cut short fails too.
        assert_eq!(
            framed(&[b"\x00\x00\x00\x00\x01a\x00\x00\x00\x00\x02b"]),
            Err(FramingError::MessageCut {
                announced: 2,
                missing: 1
            })
        );
    }

    #[test]
    fn an_oversized_announcement_fails_at_its_prefix() {
        let mut f = Framing::new(10);
        assert_eq!(f.feed(b"\x00\x00\x00\x00\x0a"), Ok(()), "at the limit");
        let mut f = Framing::new(10);
        assert_eq!(
            f.feed(b"\x00\x00\x00\x00"),
            Ok(()),
            "not yet: the length is incomplete"
        );
        assert_eq!(
            f.feed(b"\x0b"),
            Err(FramingError::TooLarge {
                announced: 11,
                limit: 10
            })
        );
        let status = Status::from(FramingError::TooLarge {
            announced: 11,
            limit: 10,
        });
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            Status::from(FramingError::NoMessage).code(),
            tonic::Code::InvalidArgument
        );
    }
}

//! gRPC length-prefixed framing of a request body, checked as it streams in: a body that
//! holds no whole message, or announces one over the size limit, is refused with its own
//! status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) before tonic decodes anything. tonic
//! would answer INTERNAL or OUT_OF_RANGE, which read as a server fault.
//!
//! It only watches the frame boundaries and passes every byte through unchanged; the
//! compression flag and the message itself are tonic's and the codec's concern.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use thiserror::Error;
use tonic::Status;

/// The largest request message accepted (gRPC's customary 4 MiB; a rate-limit request is
/// a few hundred bytes).
pub const MAX_REQUEST_MESSAGE_BYTES: usize = 4 << 20;

/// The prefix of every gRPC message: a compression flag and a 4-byte big-endian length.
const PREFIX_BYTES: usize = 5;

/// Why a request body is not a sequence of whole gRPC messages.
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
}

impl From<FramingError> for Status {
    fn from(e: FramingError) -> Status {
        match e {
            FramingError::TooLarge { .. } => Status::resource_exhausted(e.to_string()),
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
                    let take = (PREFIX_BYTES - *have).min(chunk.len());
                    bytes[*have..*have + take].copy_from_slice(&chunk[..take]);
                    *have += take;
                    chunk = &chunk[take..];
                    if *have == PREFIX_BYTES {
                        let [_, a, b, c, d] = *bytes;
                        let announced = u32::from_be_bytes([a, b, c, d]) as usize;
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
                    let take = (*left).min(chunk.len());
                    *left -= take;
                    chunk = &chunk[take..];
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

pin_project_lite::pin_project! {
    /// A request body whose framing is checked as it passes: a [`FramingError`] becomes
    /// the body's error, which tonic answers with as it is.
    pub struct Checked<B> {
        #[pin]
        inner: B,
        framing: Framing,
        failed: bool,
    }
}

impl<B> Checked<B> {
    pub fn new(inner: B, limit: usize) -> Checked<B> {
        Checked {
            inner,
            framing: Framing::new(limit),
            failed: false,
        }
    }
}

impl<B> Body for Checked<B>
where
    B: Body<Data = Bytes, Error = Status>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        let checked = match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => match frame.data_ref() {
                Some(data) => this.framing.feed(data).map(|()| frame),
                None => Ok(frame),
            },
            Some(Err(status)) => return Poll::Ready(Some(Err(status))),
            None => match this.framing.finish() {
                Ok(()) => return Poll::Ready(None),
                Err(e) => Err(e),
            },
        };
        Poll::Ready(Some(checked.map_err(|e| {
            *this.failed = true;
            Status::from(e)
        })))
    }

    fn is_end_stream(&self) -> bool {
        // The end is where the framing is judged: never skip the final poll.
        self.failed
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

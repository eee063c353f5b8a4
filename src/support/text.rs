//! Bounded texts: request values end up in error messages and log lines (an entity is
//! built from them), and a status message of several kilobytes breaks clients (grpcio
//! refuses trailers past its 8 KB soft limit). Anything quoted from a request is elided
//! to a short head that says how long the whole was. URLs that may carry a password are
//! logged with it masked (`without_password`).

use std::borrow::Cow;

/// Most bytes of a quoted value (an entity, a key) kept in a message.
pub const QUOTE_BYTES: usize = 128;

/// Most bytes of one error message (a gRPC status message, a log line's error).
pub const MESSAGE_BYTES: usize = 1_024;

/// `scheme://user:password@host…` with the user and password masked (`***@`); any other
/// text as it is. For logging a store's address.
pub fn without_password(url: &str) -> Cow<'_, str> {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            Cow::Owned(format!("{}://***@{}", &url[..scheme_end], &url[at + 1..]))
        }
        _ => Cow::Borrowed(url),
    }
}

/// `text` if it is at most `max` bytes long, else its first bytes (cut at a character
/// boundary) followed by `…(N bytes)`.
pub fn elide(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…({} bytes)", &text[..end], text.len()))
}

/// A quoted value, elided to [`QUOTE_BYTES`].
pub fn quote(text: &str) -> Cow<'_, str> {
    elide(text, QUOTE_BYTES)
}

/// A panic's message, as `panic!` was given it, at most `max` bytes (cut as [`elide`]
/// cuts): what a log line says of a caught panic.
pub fn panic_text(panic: &(dyn std::any::Any + Send), max: usize) -> String {
    let text = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s,
        (_, Some(s)) => s.as_str(),
        _ => "(not a message)",
    };
    elide(text, max).into_owned()
}

/// `err` and each of its sources, joined by ": ", for a log line; a source whose text the
/// line already ends with (an error that shows its source in its own text) is not
/// repeated.
pub fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut at = err.source();
    while let Some(e) = at {
        let text = e.to_string();
        if !text.is_empty() && !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        at = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_pass_long_ones_say_their_length() {
        assert_eq!(elide("abc", 3), "abc");
        assert_eq!(elide("abcdef", 3), "abc…(6 bytes)");
        // Never splits a character: 'é' is two bytes.
        assert_eq!(elide("éé", 3), "é…(4 bytes)");
        let long = "/".repeat(10_000);
        assert!(quote(&long).len() < QUOTE_BYTES + 20);
    }

    #[test]
    fn a_source_shown_in_its_parent_text_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("bucket b: {0}")]
        struct Shows(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("bucket b")]
        struct Hides(#[source] std::io::Error);
        let io = || std::io::Error::other("refused");
        assert_eq!(with_causes(&Shows(io())), "bucket b: refused");
        assert_eq!(with_causes(&Hides(io())), "bucket b: refused");
    }
}

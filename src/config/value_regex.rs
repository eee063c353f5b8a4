//! `value_regex` (an extension): a descriptor node whose value is a regular expression
//! matched against the whole request value. It owns what makes such a pattern safe to
//! run on every request descriptor: compiled once at load by the `regex` crate (linear in
//! the value's length, no backtracking), anchored at both ends, and bounded in its text
//! and its compiled size. It knows nothing of the tree; `matcher.rs` places it among the
//! wildcards in file order.

use regex::{Regex, RegexBuilder};

/// Longest `value_regex` text accepted, in bytes.
pub const MAX_REGEX_BYTES: usize = 1024;

/// Most memory one compiled `value_regex` may take (the `regex` crate's program and its
/// lazy DFA's cache): a pattern like `\w{1000}` compiles to megabytes, and every node's
/// pattern is held for the life of the config.
const MAX_COMPILED_BYTES: usize = 256 * 1024;

/// A compiled `value_regex`: the text as written (for messages, stats keys and
/// `share_threshold` entities) and the anchored program.
#[derive(Debug, Clone)]
pub struct ValueRegex {
    text: String,
    whole: Regex,
}

impl ValueRegex {
    /// Compiles `text`, which must match the whole value; a short reason when it cannot.
    pub fn new(text: &str) -> Result<ValueRegex, String> {
        if text.len() > MAX_REGEX_BYTES {
            return Err(format!(
                "it is {} bytes long, at most {MAX_REGEX_BYTES}",
                text.len()
            ));
        }
        // The text alone first: wrapped, an unbalanced `a)|(b` would parse as two
        // alternatives and escape the anchors.
        build(text)?;
        let whole = build(&format!("^(?:{text})$"))?;
        Ok(ValueRegex {
            text: text.to_string(),
            whole,
        })
    }

    /// Whether the whole of `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        self.whole.is_match(value)
    }

    /// The pattern as written in the file.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

fn build(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .size_limit(MAX_COMPILED_BYTES)
        .dfa_size_limit(MAX_COMPILED_BYTES)
        .build()
        .map_err(short_reason)
}

/// The `regex` crate's error in one line: its syntax errors are several lines (the
/// pattern, a caret, then `error: <what>`); the last says what is wrong.
fn short_reason(e: regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(limit) => {
            format!("it compiles to more than {} KiB", limit / 1024)
        }
        other => {
            let text = other.to_string();
            let reason = text
                .lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix("error: "))
                .unwrap_or(text.trim());
            reason.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_value_must_match() {
        let r = ValueRegex::new(r"[a-z]+\.example\.com").unwrap();
        assert!(r.matches("api.example.com"));
        assert!(!r.matches("api.example.com.evil"));
        assert!(!r.matches("x.api.example.com:443"));
        assert!(!r.matches(""));
        let alternatives = ValueRegex::new("gold|silver").unwrap();
        assert!(alternatives.matches("silver"));
        assert!(!alternatives.matches("goldsilver"));
        assert!(!alternatives.matches("gold2"));
    }

    #[test]
    fn an_unbalanced_pattern_cannot_escape_the_anchors() {
        let e = ValueRegex::new("a)|(b").unwrap_err();
        assert!(e.contains("unopened group"), "{e}");
    }

    #[test]
    fn errors_are_one_short_line() {
        for bad in ["(", "[z-a]", "a{5,2}", r"\p{Nope}"] {
            let e = ValueRegex::new(bad).unwrap_err();
            assert!(
                !e.contains('\n') && !e.is_empty() && e.len() < 80,
                "{bad}: {e}"
            );
        }
        let huge = ValueRegex::new(r"\w{1000}").unwrap_err();
        assert!(huge.contains("compiles to more than 256 KiB"), "{huge}");
        let long = ValueRegex::new(&"a".repeat(MAX_REGEX_BYTES + 1)).unwrap_err();
        assert!(long.contains("at most 1024"), "{long}");
    }

    #[test]
    fn unicode_values_match_by_character() {
        let r = ValueRegex::new("é.ü").unwrap();
        assert!(r.matches("éàü"));
        assert!(!r.matches("éaaü"));
    }
}

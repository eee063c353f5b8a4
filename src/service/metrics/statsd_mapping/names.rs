//! The text rules of a statsd_exporter mapping: which metric-name templates and label
//! names a file may hold, how a glob mapping's `$1`/`${1}` references are filled, and how
//! a statsd name becomes a Prometheus one. Pure string functions; which mapping applies
//! is `glob.rs`' and the parent's business, not this file's.

/// Whether `template` is a metric name statsd_exporter accepts in a mapping's `name`: ASCII
/// letters, digits and `_`, not starting with a digit, with `$N` or `${N}` references
/// anywhere (a reference may start it).
pub(super) fn valid_name_template(template: &str) -> bool {
    let bytes = template.as_bytes();
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        if byte == b'$' {
            match reference_end(bytes, at) {
                Some(end) => at = end,
                None => return false,
            }
        } else if byte.is_ascii_alphabetic() || byte == b'_' || (at > 0 && byte.is_ascii_digit()) {
            at += 1;
        } else {
            return false;
        }
    }
    !bytes.is_empty()
}

/// The end of a numeric reference starting at the `$` at `at` (`$12`, `${12}`, and as
/// statsd_exporter's pattern has it `${12` or `$12}`), or `None` without digits.
fn reference_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = at + 1;
    if bytes.get(end) == Some(&b'{') {
        end += 1;
    }
    let digits = bytes
        .iter()
        .skip(end)
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 {
        return None;
    }
    end += digits;
    if bytes.get(end) == Some(&b'}') {
        end += 1;
    }
    Some(end)
}

/// Whether `name` is a label name statsd_exporter accepts: an ASCII letter or `_`, then
/// at least one more letter, digit or `_` (it refuses one-character names).
pub(super) fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest = chars.as_str();
    first && !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A glob mapping's template with its references filled from `captures` (what each `*`
/// matched, in order). As statsd_exporter's glob formatter reads a template: `$` then an
/// optional `{`, a run of letters, digits, `_` and `$`, and an optional `}`; a run that is
/// a number from 1 to the number of captures is replaced by that capture, any other run
/// (`$0`, `$9` past the captures, `$name`, `$1$2` read as one run) by nothing. A `$` not
/// followed by such a run stays as it is.
pub(super) fn fill_glob_template(template: &str, captures: &[&str]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let body = after.strip_prefix('{').unwrap_or(after);
        let run_len = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .unwrap_or(body.len());
        if run_len == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        let run = &body[..run_len];
        if let Some(capture) = run
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| captures.get(i))
        {
            out.push_str(capture);
        }
        let tail = &body[run_len..];
        rest = tail.strip_prefix('}').unwrap_or(tail);
    }
    out.push_str(rest);
    out
}

/// A statsd (or mapped) name as a Prometheus metric name, as statsd_exporter escapes it:
/// every character other than ASCII letters, digits and `_` becomes `_`, except that a
/// run of `-` becomes a single `_`; a name starting with a digit gets a leading `_`.
pub(crate) fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == Some('-')) {
            out.push('_');
        }
        previous = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_templates_are_statsd_exporters() {
        for good in [
            "ratelimit_service_total_requests",
            "_x",
            "$1",
            "${1}_total",
            "a$2b",
            "x${12",
            "x$3}",
        ] {
            assert!(valid_name_template(good), "{good}");
        }
        for bad in ["", "1abc", "a.b", "a-b", "$", "${x}", "$name", "a b", "é"] {
            assert!(!valid_name_template(bad), "{bad}");
        }
    }

    #[test]
    fn label_names_need_two_characters_as_statsd_exporter_has_it() {
        for good in ["domain", "key1", "_x", "err_type"] {
            assert!(valid_label_name(good), "{good}");
        }
        for bad in ["", "a", "1a", "a-b", "a.b", "ké"] {
            assert!(!valid_label_name(bad), "{bad}");
        }
    }

    #[test]
    fn glob_templates_fill_in_range_references_and_drop_others() {
        let caps = ["edge", "user"];
        assert_eq!(fill_glob_template("$1", &caps), "edge");
        assert_eq!(fill_glob_template("${2}_x", &caps), "user_x");
        assert_eq!(fill_glob_template("a$1.$2", &caps), "aedge.user");
        // Past the captures, zero, names, and runs that swallow a second reference.
        assert_eq!(fill_glob_template("<$3>", &caps), "<>");
        assert_eq!(fill_glob_template("<$0>", &caps), "<>");
        assert_eq!(fill_glob_template("<$name>", &caps), "<>");
        assert_eq!(fill_glob_template("<$1$2>", &caps), "<>");
        assert_eq!(fill_glob_template("<$1x>", &caps), "<>");
        // A `$` with nothing it could refer to stays.
        assert_eq!(fill_glob_template("5$ and ${", &caps), "5$ and ${");
        assert_eq!(fill_glob_template("no refs", &caps), "no refs");
    }

    #[test]
    fn names_escape_as_statsd_exporter_escapes_them() {
        assert_eq!(
            escape_metric_name("ratelimit.service.rate_limit.d.k.total_hits"),
            "ratelimit_service_rate_limit_d_k_total_hits"
        );
        assert_eq!(escape_metric_name("a:b/c d"), "a_b_c_d");
        assert_eq!(escape_metric_name("a--b---c-d"), "a_b_c_d");
        assert_eq!(escape_metric_name("5xx.count"), "_5xx_count");
        assert_eq!(escape_metric_name("ünï"), "_n_");
        assert_eq!(escape_metric_name(""), "");
    }
}

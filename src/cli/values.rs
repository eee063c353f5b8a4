//! The command line's value parsers shared by several commands: durations and sizes.
//! Each error names the value and gives an example.

use std::time::Duration;

/// A duration as humantime writes it (`10s`, `500ms`, `1m30s`), or a bare number of
/// seconds (`2`, `0.5`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(seconds) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("'{s}' is not a non-negative number of seconds"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration ({e}; try 10s, 500ms, 1m30s)"))
}

/// A duration above zero.
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("'{}' must be more than zero", s.trim())),
        d => Ok(d),
    }
}

/// `--store-timeout`: a duration within the bounds the server takes
/// (`store::check_store_timeout`: more than zero, at most an hour).
pub(crate) fn store_timeout(s: &str) -> Result<Duration, String> {
    shardgate::store::check_store_timeout(parse_duration(s)?)
        .map_err(|e| format!("'{}': {e}", s.trim()))
}

/// A size in bytes: a bare number, or with a unit (`256MiB`, `1GiB`, `512MB`).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    s.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|_| format!("'{s}' is not a size (try 256MiB, 1GiB, or a number of bytes)"))
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, parse_duration};
    use std::time::Duration;

    #[test]
    fn sizes_parse_with_units_or_as_bytes_and_the_default_is_the_stores() {
        assert_eq!(
            parse_bytes("256MiB"),
            Ok(shardgate::store::memory::DEFAULT_MAX_BYTES)
        );
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("512MB"), Ok(512_000_000));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        for bad in ["-1", "ten", "5 parsecs", ""] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_parse_as_humantime_or_bare_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration(" 2 "), Ok(ms(2_000)));
        assert_eq!(parse_duration("0.25"), Ok(ms(250)));
        for bad in ["-1", "NaN", "inf", "ten", "5x", ""] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("'{}'", bad.trim())), "{bad}: {e}");
        }
    }
}

//! The summaries against exact counts: on Zipf streams split over stripes and minutes,
//! the merged top 10 is the exact top 10 wherever the stated error allows no doubt, every
//! estimate is within its stated error, that error is within `N / CAPACITY`, and memory
//! stays fixed under a million distinct values.

use std::collections::HashMap;

use proptest::prelude::*;

use super::sketch::{CAPACITY, LABEL_BYTES};
use super::window::{Merged, Ring, Side, SLOTS};

/// A small deterministic generator (splitmix64): the test needs a reproducible stream,
/// not good randomness.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// `len` draws of ranks `0..values`, rank r with weight `1 / (r+1)^s`.
fn zipf(seed: u64, s: f64, values: usize, len: usize) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(values);
    let mut sum = 0.0;
    for r in 0..values {
        sum += 1.0 / ((r + 1) as f64).powf(s);
        cdf.push(sum);
    }
    let mut mix = Mix(seed);
    (0..len)
        .map(|_| {
            let u = (mix.next() >> 11) as f64 / (1u64 << 53) as f64 * sum;
            cdf.partition_point(|&c| c < u) as u64
        })
        .collect()
}

/// The stream recorded over `stripes` rings and the window's minutes, merged as `/top`
/// merges; with the exact counts.
/// Listed values: (value, count, error).
type Listed = Vec<(u64, u64, u64)>;

fn run(stream: &[u64], stripes: usize) -> (Listed, HashMap<u64, u64>) {
    let mut rings: Vec<Ring> = (0..stripes).map(|_| Ring::default()).collect();
    let mut exact = HashMap::new();
    let per_minute = stream.len().div_ceil(SLOTS as usize);
    for (i, &v) in stream.iter().enumerate() {
        let minute = (i / per_minute) as u64;
        rings[i % stripes].record(minute, Side::Refused, v, 1, |l| l.push_str(&v.to_string()));
        *exact.entry(v).or_insert(0) += 1;
    }
    let mut merged = Merged::default();
    for r in &rings {
        r.read(SLOTS - 1, Side::Refused, &mut merged);
    }
    assert_eq!(merged.total(), stream.len() as u64);
    let top = merged
        .top(CAPACITY)
        .into_iter()
        .map(|e| (e.label.parse().unwrap(), e.count, e.error))
        .collect();
    (top, exact)
}

fn exact_top(exact: &HashMap<u64, u64>) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = exact.iter().map(|(&v, &c)| (v, c)).collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The bound: `|true - count| <= error <= N / CAPACITY` for every value listed, and
    /// a value of the exact top 10 that beats the 11th by more than twice the largest
    /// error is in the listed top 10.
    #[test]
    fn the_top_ten_is_the_exact_one_within_the_stated_error(
        seed in any::<u64>(),
        s in 1.0f64..1.6,
        stripes in 1usize..4,
    ) {
        let n = 60_000;
        let stream = zipf(seed, s, 50_000, n);
        let (top, exact) = run(&stream, stripes);
        let bound = n as u64 / CAPACITY as u64;
        let mut worst = 0;
        for &(v, count, error) in &top {
            let truth = exact[&v];
            prop_assert!(truth.abs_diff(count) <= error, "value {v}: true {truth}, {count} ± {error}");
            prop_assert!(error <= bound, "error {error} over N/K = {bound}");
            worst = worst.max(error);
        }
        let exact = exact_top(&exact);
        let listed: Vec<u64> = top.iter().take(10).map(|t| t.0).collect();
        let eleventh = exact[10].1;
        for &(v, c) in exact.iter().take(10) {
            if c > eleventh + 2 * worst {
                prop_assert!(listed.contains(&v), "value {v} ({c}) missing from {listed:?}");
            }
        }
    }
}

#[test]
fn on_a_skewed_stream_the_top_ten_match_exactly() {
    let stream = zipf(46, 1.2, 100_000, 200_000);
    let (top, exact) = run(&stream, 2);
    let listed: Vec<u64> = top.iter().take(10).map(|t| t.0).collect();
    let expected: Vec<u64> = exact_top(&exact).iter().take(10).map(|t| t.0).collect();
    assert_eq!(listed, expected);
    // Measured here: the largest error among the ten is far under N / K.
    let worst = top.iter().take(10).map(|t| t.2).max().unwrap();
    assert!(worst < 200_000 / CAPACITY as u64 / 4, "worst error {worst}");
}

#[test]
fn memory_is_fixed_under_a_million_distinct_values() {
    let mut ring = Ring::default();
    let long = "x".repeat(4 * LABEL_BYTES);
    let record = |ring: &mut Ring, i: u64| {
        let minute = i % SLOTS;
        let side = if i.is_multiple_of(3) {
            Side::Refused
        } else {
            Side::Admitted
        };
        ring.record(minute, side, i, 1, |l| {
            l.push_str(&long);
            l.push_str(&i.to_string());
        });
    };
    for i in 0..20_000 {
        record(&mut ring, i);
    }
    let warm = ring.heap_bytes();
    for i in 20_000..1_000_000 {
        record(&mut ring, i);
    }
    assert_eq!(ring.heap_bytes(), warm, "grew after warm-up");
    // Per slot and side: CAPACITY hashes and counters, each label at most LABEL_BYTES.
    let counter = std::mem::size_of::<super::sketch::Counter>() + 8 + LABEL_BYTES;
    let bound = SLOTS as usize * 2 * (2 * CAPACITY * counter) + 4096;
    assert!(warm <= bound, "{warm} > {bound}");
}

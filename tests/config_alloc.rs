//! The matcher walk must not allocate (it runs for every request descriptor).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use shardgate::config::Config;

/// Counts allocations made by the current thread, so other test threads do not interfere.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwards the caller's contract unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwards the caller's contract unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn matching_allocates_nothing() {
    let yaml = r#"
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api/*/v*
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        value: /exact
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 3}
"#;
    let c = Config::from_yaml("a.yaml", yaml).unwrap();
    let d = c.domain("d").unwrap();
    let requests: [&[(&str, &str)]; 5] = [
        &[("tenant", "acme"), ("path", "/api/users/v2")],
        &[("tenant", "acme"), ("path", "/exact")],
        &[("tenant", "acme"), ("path", "/other")],
        &[("tenant", "acme")],
        &[("nope", "x")],
    ];
    let before = allocations();
    let mut found = 0;
    for r in requests {
        found += usize::from(d.match_descriptor(r).is_some());
    }
    assert_eq!(allocations(), before);
    assert_eq!(found, 3);
}

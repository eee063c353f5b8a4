//! The gRPC port when the process runs out of file descriptors: a connection it cannot
//! accept (EMFILE) waits in the listen queue and keeps the listener readable, so an accept
//! loop that retries at once spins a core until a descriptor frees. The port pauses
//! instead, counts the failures, keeps serving the connections it has, and accepts again
//! once descriptors free up.
//!
//! A binary of its own: it lowers this process's descriptor limit, which every test in
//! the process would share.

mod common;

use std::time::Duration;

use common::server::{one, TestServer};

const RULES: &str = "
domain: fd
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

/// This process's CPU time so far (user and system, every thread).
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Sets this process's soft limit on open descriptors; returns the previous limit.
fn set_fd_limit(soft: libc::rlim_t) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on structs owned here.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &new), 0);
    }
    old
}

fn restore_fd_limit(limit: libc::rlimit) {
    // SAFETY: as above.
    unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0) };
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn accept_failures(server: &TestServer) -> f64 {
    let metrics = server.limiter.metrics().render();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("shardgate_grpc_accept_failures_total "))
        .expect("the accept failures counter")
        .parse()
        .unwrap()
}

#[test]
fn accepting_pauses_while_descriptors_run_out_and_resumes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = TestServer::start(RULES).await;
        let mut calm = server.client().await;
        calm.ok(one("fd", &[("user", "before")])).await;

        // A few descriptors to spare, then connections until none is left on either side.
        // Whether the last connection waits in the listen queue is a race: the server's
        // accept and the client's next socket() want the same last descriptor. So one is
        // held back and freed once the limit is reached; nothing is then waiting to be
        // accepted (or the race already left a connection waiting), so only the client can
        // take it, and the connection it opens cannot be accepted.
        let previous = set_fd_limit((open_descriptors() + 24) as libc::rlim_t);
        let held_back = std::fs::File::open("/dev/null").expect("a descriptor to hold back");
        let mut hostile = Vec::new();
        while hostile.len() < 200 {
            match tokio::net::TcpStream::connect(server.addr).await {
                Ok(tcp) => hostile.push(tcp),
                Err(_) => break,
            }
        }
        assert!(hostile.len() < 200, "the descriptor limit was reached");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held_back);
        if let Ok(tcp) = tokio::net::TcpStream::connect(server.addr).await {
            hostile.push(tcp);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Over a second out of descriptors, the process (server, clients, runtime) keeps
        // its CPU: a spinning accept loop would take most of a core.
        let before = cpu_time();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let spent = cpu_time() - before;
        assert!(
            spent < Duration::from_millis(100),
            "{spent:?} of CPU in a second out of descriptors"
        );
        assert!(
            accept_failures(&server) >= 1.0,
            "the server could not accept"
        );
        // The connection the server has is still served.
        calm.ok(one("fd", &[("user", "during")])).await;

        drop(hostile);
        restore_fd_limit(previous);
        let mut fresh = server.client().await;
        fresh.ok(one("fd", &[("user", "after")])).await;
    });
}

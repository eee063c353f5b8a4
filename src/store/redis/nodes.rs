//! Operations per Redis node: which node each keyed call (a script, a read) was sent to,
//! counted for `shardgate_redis_node_operations_total{node}`. redis-rs's Cluster client
//! does not say which node served a command, so on a Cluster the node is found the way
//! the client finds it: the key's slot (CRC16, `codec::slot`) looked up in a slot map the
//! store reads itself (`CLUSTER SLOTS`) when it connects, every
//! [`REFRESH_INTERVAL`] after, and soon after a call fails (a failover, a resharding).
//! On one server, or the master Sentinel names, it is that server.
//!
//! The request path only loads the slot table (an atomic pointer swap publishes a new
//! one) and adds to its stripe of the node's counter: no lock, no allocation. The label
//! set is bounded: a node is an address the cluster reported (never anything from a
//! request), at most [`MAX_NODES`] of them over the process's life, later ones counted
//! under `other`.
//!
//! What the count means: calls sent to the node that owned the key's slot by the map
//! last read. Between a topology change and the next read of the map (at most
//! [`REFRESH_INTERVAL`], usually one failed call's time), calls are counted under the old
//! owner; a call the client sends again after `MOVED`, `ASK` or a lost connection is
//! counted once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use crate::support::striped::StripedCells;

/// How often the slot map is read again when nothing failed.
pub(super) const REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// Node addresses counted apart over the process's life (a Cluster's masters, with
/// room for those failovers and resharding add); the last cell is `other`.
pub(super) const MAX_NODES: usize = 64;

/// The cell of calls on a node past [`MAX_NODES`] (or of a map not read yet).
const OTHER: u8 = (MAX_NODES - 1) as u8;

/// Redis Cluster's slot count.
const SLOTS: usize = 16_384;

/// Where each key's calls are counted.
enum Table {
    /// Every key on this node's cell.
    One(u8),
    /// The cell of each slot's master.
    Slots(Box<[u8; SLOTS]>),
}

/// The counts, and what maps a key to its node.
pub(super) struct NodeOps {
    table: ArcSwap<Table>,
    counts: StripedCells<MAX_NODES>,
    /// Each node's address, by cell (only when a map is read and at a scrape).
    names: Mutex<Vec<String>>,
    /// Set by a failed call: read the map again now rather than at the next interval.
    stale: tokio::sync::Notify,
    /// Whether a refresher runs (one per Cluster connection).
    refreshing: AtomicBool,
}

impl NodeOps {
    pub(super) fn new() -> NodeOps {
        NodeOps {
            table: ArcSwap::from_pointee(Table::One(OTHER)),
            counts: StripedCells::default(),
            names: Mutex::new(Vec::new()),
            stale: tokio::sync::Notify::new(),
            refreshing: AtomicBool::new(false),
        }
    }

    /// Counts one call on the node that holds `slot` (read only on a Cluster).
    pub(super) fn count(&self, slot: impl FnOnce() -> u16) {
        let cell = self.cell_of(slot);
        self.counts.add(usize::from(cell), 1);
    }

    /// The cell of the node that holds `slot` by the map last read (`slot` read only on a
    /// Cluster): the store's fault domain for the key (`BucketStore::fault_domain`).
    pub(super) fn cell_of(&self, slot: impl FnOnce() -> u16) -> u8 {
        match &**self.table.load() {
            Table::One(cell) => *cell,
            Table::Slots(slots) => slots[usize::from(slot()) % SLOTS],
        }
    }

    /// After a failed call on a Cluster: the topology may have moved.
    pub(super) fn suspect(&self) {
        self.stale.notify_one();
    }

    /// Every key now goes to `node` (one server, or the master a Sentinel named).
    pub(super) fn one_node(&self, node: &str) {
        let cell = self.cell(node);
        self.table.store(Arc::new(Table::One(cell)));
    }

    /// Each node's count so far: `(address, operations)`, `other` last when used.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, u64)> = names
            .iter()
            .enumerate()
            .map(|(cell, name)| (name.clone(), self.counts.get(cell)))
            .collect();
        let other = self.counts.get(usize::from(OTHER));
        if other > 0 {
            out.push(("other".into(), other));
        }
        out
    }

    /// The cell of `node`, given one the first time it is seen.
    fn cell(&self, node: &str) -> u8 {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = names.iter().position(|n| n == node) {
            return i as u8;
        }
        if names.len() >= usize::from(OTHER) {
            return OTHER;
        }
        names.push(node.to_string());
        (names.len() - 1) as u8
    }

    /// Reads the slot map over `conn` and publishes it; an answer it cannot read leaves
    /// the table as it was.
    pub(super) async fn refresh(&self, conn: &mut ClusterConnection) -> redis::RedisResult<()> {
        let reply: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let ranges = slot_ranges(&reply).ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "CLUSTER SLOTS answered in an unknown form",
            ))
        })?;
        let mut cells: HashMap<String, u8> = HashMap::new();
        let mut slots = Box::new([OTHER; SLOTS]);
        for (start, end, node) in ranges {
            let cell = *cells.entry(node).or_insert_with_key(|n| self.cell(n));
            for s in start..=end.min(SLOTS as u16 - 1) {
                slots[usize::from(s)] = cell;
            }
        }
        self.table.store(Arc::new(Table::Slots(slots)));
        Ok(())
    }

    /// Keeps the slot map fresh while `owner` (the open Cluster connection) lives: every
    /// [`REFRESH_INTERVAL`], and at once after [`NodeOps::suspect`]. Off the request path.
    pub(super) fn keep_fresh<T: Send + Sync + 'static>(
        self: &Arc<Self>,
        mut conn: ClusterConnection,
        owner: Weak<T>,
    ) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let ops = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
                    _ = ops.stale.notified() => {}
                }
                if owner.strong_count() == 0 {
                    break;
                }
                if let Err(e) = ops.refresh(&mut conn).await {
                    tracing::debug!(error = %e, "Redis Cluster slot map not read");
                }
            }
            ops.refreshing.store(false, Ordering::Release);
        });
    }
}

/// `CLUSTER SLOTS`'s ranges: `(first slot, last slot, master "host:port")`.
fn slot_ranges(reply: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return None;
        };
        let host = match master.first()? {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        out.push((
            u16::try_from(*start).ok()?,
            u16::try_from(*end).ok()?,
            format!("{host}:{port}"),
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn the_slot_maps_masters_are_its_first_node_per_range() {
        let reply = Value::Array(vec![
            range(0, 5460, "10.0.0.1", 6379),
            range(5461, 16383, "10.0.0.2", 6380),
        ]);
        assert_eq!(
            slot_ranges(&reply).unwrap(),
            vec![
                (0, 5460, "10.0.0.1:6379".to_string()),
                (5461, 16383, "10.0.0.2:6380".to_string())
            ]
        );
        assert!(slot_ranges(&Value::Int(1)).is_none());
    }

    #[test]
    fn nodes_past_the_bound_are_counted_as_other() {
        let ops = NodeOps::new();
        for i in 0..MAX_NODES + 5 {
            ops.one_node(&format!("10.0.0.{i}:6379"));
            ops.count(|| 0);
        }
        let snap = ops.snapshot();
        assert_eq!(snap.len(), MAX_NODES);
        assert_eq!(snap.last().unwrap(), &("other".to_string(), 6));
        assert!(snap[..MAX_NODES - 1].iter().all(|(_, n)| *n == 1));
    }
}

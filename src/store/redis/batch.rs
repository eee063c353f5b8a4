//! Debits sent together. On one Redis server (standalone, or Sentinel's master) the
//! debits that queue while the store's sender is busy leave as one script,
//! `lua/debits.lua`, which runs each exactly as `lua/debit.lua` would alone and answers
//! each in its place: a group commit. Redis runs scripts one at a time, and most of what
//! one debit costs it is the call (reading and parsing the command, setting up Lua,
//! writing the reply), not the debit; so it is for the client (encoding, the connection's
//! queue, parsing). Distinct buckets, each debited once, are the case leases cannot help.
//!
//! Nothing waits to fill a batch: the sender takes what has queued by the time it runs,
//! after letting the calls woken with the first one queue theirs (`yield_now`), so an idle
//! server sends each debit at once and a busy one sends many per round trip. A few
//! batches fly at once, so one slow answer does not hold the rest.
//!
//! What a batch changes for a debit: nothing it decides (each debit is atomic on its own
//! item, as alone, and no debit sees another's item), and its failures stay its own — an
//! item of another type under its key fails that debit only (`{-1, error}` in its
//! place); a failure of the whole call (the connection, a timeout, `BUSY`) is every
//! debit's, as it would have been for each alone.
//!
//! Owns: the queue and the task that empties it. Must not: decide anything (the scripts
//! and `store.rs` do), or batch on a Cluster, where one script's keys must share a slot.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::failure::{classify, is_demoted, reported};
use super::link::Link;
use super::scripts::DEBITS;
use crate::store::StoreError;

/// Most debits in one script. Redis runs nothing else while a script runs: 64 debits are
/// well under a millisecond of it.
pub(super) const MAX_BATCH: usize = 64;

/// Batches in flight at once; past that, debits queue for the next.
const MAX_IN_FLIGHT: usize = 4;

/// Most debits waiting for a batch: sixteen full rounds of batches in flight. Past that
/// Redis answers slower than calls arrive, and a debit is refused at once as the store's
/// failure (its rule's `failure_mode`) rather than held in memory until Redis catches up.
pub(super) const MAX_WAITING: usize = MAX_BATCH * MAX_IN_FLIGHT * 16;

/// One debit waiting for its batch.
struct Queued {
    /// The Redis key of its item.
    key: String,
    /// Its arguments as `lua/debit.lua` takes them.
    args: Vec<String>,
    /// Where its own answer goes: `debit.lua`'s answer, or its failure.
    reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// The queue of one store's debits, and (behind it) the task that sends them.
pub(super) struct Batches {
    queue: mpsc::Sender<Queued>,
}

impl Batches {
    /// Starts the sender on the current runtime.
    pub(super) fn start(link: Arc<Link>, timeout: Duration) -> Batches {
        let (queue, waiting) = mpsc::channel(MAX_WAITING);
        tokio::spawn(send_batches(link, waiting, timeout));
        Batches { queue }
    }

    /// Queues one debit and waits for its answer (`None`: the sender stopped before
    /// answering, its runtime ending; the store's failure when [`MAX_WAITING`] debits
    /// wait already). `Err`: its arguments back, not sent, the sender having stopped: the
    /// caller sends the debit alone.
    pub(super) async fn debit(
        &self,
        key: String,
        args: Vec<String>,
    ) -> Result<Option<Result<Value, StoreError>>, Vec<String>> {
        let (reply, answer) = oneshot::channel();
        match self.queue.try_send(Queued { key, args, reply }) {
            Ok(()) => Ok(answer.await.ok()),
            Err(mpsc::error::TrySendError::Closed(refused)) => Err(refused.args),
            Err(mpsc::error::TrySendError::Full(refused)) => {
                Ok(Some(Err(StoreError::Unavailable {
                    key: refused.key,
                    reason: format!("{MAX_WAITING} debits already wait for Redis: not sent"),
                    source: None,
                })))
            }
        }
    }
}

/// Empties the queue into batches until every sender is gone (the store dropped).
async fn send_batches(link: Arc<Link>, mut waiting: mpsc::Receiver<Queued>, timeout: Duration) {
    let mut flying = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(()) = flying.next(), if !flying.is_empty() => {}
            first = waiting.recv(), if flying.len() < MAX_IN_FLIGHT => {
                let Some(first) = first else { break };
                // The calls woken with this one run first and queue theirs.
                tokio::task::yield_now().await;
                let mut batch = Vec::with_capacity(MAX_BATCH);
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match waiting.try_recv() {
                        Ok(q) => batch.push(q),
                        Err(_) => break,
                    }
                }
                // A caller that gave up (past its deadline) is not sent for.
                batch.retain(|q| !q.reply.is_closed());
                if !batch.is_empty() {
                    flying.push(send(link.clone(), batch, timeout));
                }
            }
        }
    }
    while flying.next().await.is_some() {}
}

/// One batch: one script, each answer to its debit.
async fn send(link: Arc<Link>, batch: Vec<Queued>, timeout: Duration) {
    let keys: Vec<&str> = batch.iter().map(|q| q.key.as_str()).collect();
    let mut call = DEBITS.call(&keys);
    for q in &batch {
        call.arg(q.args.len());
        for a in &q.args {
            call.arg(a.as_str());
        }
    }
    let Some(Queued { key: first, .. }) = batch.first() else {
        return; // nothing queued, nobody to answer
    };
    let run = link.run_reporting(first, &DEBITS, &call);
    let (outcome, served) = match tokio::time::timeout(timeout, run).await {
        Ok((result, served)) => (Ok(result), served),
        Err(late) => (Err(late), None),
    };
    let answers = match outcome {
        Ok(Ok(Value::Array(answers))) if answers.len() == batch.len() => answers,
        outcome => {
            for q in batch {
                let failure = match &outcome {
                    Ok(Ok(other)) => StoreError::Corrupt {
                        key: q.key.clone(),
                        reason: format!("a batch of debits answered {}", kind(other)),
                        source: None,
                    },
                    Ok(Err(e)) => classify(&q.key, e),
                    Err(_) => StoreError::Unavailable {
                        key: q.key.clone(),
                        reason: format!("no answer from Redis within {timeout:?}"),
                        source: None,
                    },
                };
                let _ = q.reply.send(Err(failure));
            }
            return;
        }
    };
    let mut demoted = false;
    for (q, answer) in batch.into_iter().zip(answers) {
        let result = match &answer {
            Value::Array(parts) => match parts.as_slice() {
                [Value::Int(-1), text] => {
                    let text = redis::from_redis_value_ref::<String>(text).unwrap_or_default();
                    let error = reported(&text);
                    demoted |= is_demoted(&error);
                    Err(classify(&q.key, &error))
                }
                _ => Ok(answer),
            },
            _ => Ok(answer),
        };
        let _ = q.reply.send(result);
    }
    // A debit refused `READONLY` inside the answer: the server was demoted under us.
    if let (true, Some(served)) = (demoted, &served) {
        link.demoted(served);
    }
}

/// What an unexpected answer was, without its contents.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "a list of another length",
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        _ => "another type",
    }
}

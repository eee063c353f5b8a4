//! The Redis store itself ([`RedisStore`]): the contract's calls as Lua scripts run on
//! the item's node (a debit, a read, a credit, a commit — over several Cluster slots by
//! `spread.rs`), their replies decoded, their failures classified. The connection is
//! `link.rs`'s, the item format `codec.rs`'s, the scripts' arguments `args.rs`'s and
//! `commit_args.rs`'s.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::Value;

use super::args::{created, credit_args, debit_args, debited};
use super::batch::Batches;
use super::codec::{decode, decode_joined, op_id, redis_key, slot};
use super::commit_args::script_write;
use super::failure::classify;
use super::link::Link;
use super::options::{redact, RedisMode, RedisOptions};
use super::scripts::{Lua, COMMIT, CREDIT, DEBIT};

use super::super::key::{check_commit, check_item, check_key, check_once, MAX_ITEM_BYTES};
use super::super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
};

/// The write budget of one shard item on Redis (`wcu` per second, `--partition-write-budget`):
/// a Redis node is one thread, and measured here it runs about 95,000 debit scripts a
/// second (`redis-benchmark`, `EVALSHA` of `lua/debit.lua` pipelined; 55,000 unpipelined;
/// `bench/README.md`). A key taking a nineteenth of that is hot: its bucket doubles, and the
/// new shards' keys hash to other slots, so a hot bucket spreads over the masters instead
/// of filling one.
pub const DEFAULT_KEY_WRITE_BUDGET: u64 = 5_000;

/// One item a commit script wrote, as it was and as it left it (its hash fields, flat).
pub(super) struct Written {
    /// `None` when the answer came from a second run of the commit (its first run's
    /// answer was lost): the item as it was is not known, so it cannot be put back
    /// exactly (`spread.rs` gives the claim back instead).
    pub(super) before: Option<Vec<String>>,
    pub(super) after: Vec<String>,
    /// `after`, decoded.
    pub(super) image: BucketItem,
}

/// What one commit script did.
pub(super) enum Applied {
    /// Every write applied; each item before and after (when asked for).
    Committed(Vec<Written>),
    /// Nothing written: the refused writes (positions in the script's list) and their
    /// items as they are.
    Refused(Vec<(usize, Option<BucketItem>)>),
}

/// Bucket items in Redis.
pub struct RedisStore {
    pub(super) link: Arc<Link>,
    /// Debits sent together on one server (`batch.rs`), started on first use.
    batches: OnceLock<Batches>,
    pub(super) namespace: String,
    /// The deadline of one contract call.
    pub(super) timeout: Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "urls",
                &self
                    .link
                    .options()
                    .urls
                    .iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>(),
            )
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl RedisStore {
    /// A store on the Redis `options` name; connects on first use.
    pub fn new(options: RedisOptions) -> RedisStore {
        RedisStore {
            namespace: options.namespace.clone(),
            timeout: options.timeout,
            link: Link::new(options),
            batches: OnceLock::new(),
        }
    }

    /// Where the store connects.
    pub fn options(&self) -> &RedisOptions {
        self.link.options()
    }

    /// Keyed calls sent to each node so far, `(address, operations)` (see `nodes.rs`).
    pub fn node_operations(&self) -> Vec<(String, u64)> {
        self.link.nodes().snapshot()
    }

    /// The prefix of every key this store writes.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether one atomic script may write every key: one server, or one Cluster slot.
    fn one_node(&self, keys: &[String]) -> bool {
        match self.link.options().mode() {
            RedisMode::Single | RedisMode::Sentinel { .. } => true,
            RedisMode::Cluster => {
                let slots: BTreeSet<u16> = keys.iter().map(|k| slot(k)).collect();
                slots.len() <= 1
            }
        }
    }

    /// Connects (once) and answers a `PING`: what the server waits for before it reports
    /// ready.
    pub async fn warm_up(&self) -> Result<(), StoreError> {
        self.call("PING", self.link.query(None, &redis::cmd("PING")))
            .await
            .map(|_| ())
    }

    /// `call` under the store's deadline, its failure classified for the item `key`.
    pub(super) async fn call<T>(
        &self,
        key: &str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(key, &e)),
            Err(_) => Err(self.late(key)),
        }
    }

    /// Runs `call`, a call of `lua` that carries an operation id (a commit, a credit, an
    /// undo), under the store's deadline; sent once more when the connection was lost
    /// before its answer came. The script may have run: its operation id makes a second
    /// run answer as the first did and write nothing (`lua/lib.lua`, `record`), so a
    /// call the client or the store sends again never gives tokens twice. (The Cluster
    /// client sends such calls again by itself; so does this on one server.)
    pub(super) async fn run_once(
        &self,
        key: &str,
        lua: &Lua,
        call: &redis::Cmd,
    ) -> Result<Value, StoreError> {
        let twice = async {
            match self.link.run(key, lua, call).await {
                Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                    self.link.run(key, lua, call).await
                }
                answered => answered,
            }
        };
        self.call(key, twice).await
    }

    /// A call past the store's deadline: the store's failure.
    fn late(&self, key: &str) -> StoreError {
        StoreError::Unavailable {
            key: key.to_string(),
            reason: format!("no answer from Redis within {:?}", self.timeout),
            source: None,
        }
    }

    fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            key: key.to_string(),
            reason: reason.into(),
            source: None,
        }
    }

    fn image(key: &str, v: &Value) -> Result<Option<BucketItem>, StoreError> {
        let decoded = match v {
            // One string, the fields joined (what the debit scripts answer).
            Value::BulkString(joined) => std::str::from_utf8(joined)
                .map_err(|_| "an image that is not UTF-8".to_string())
                .and_then(decode_joined),
            _ => {
                let flat: Vec<String> = redis::from_redis_value_ref(v)
                    .map_err(|e| Self::corrupt(key, e.to_string()))?;
                decode(&flat)
            }
        };
        decoded.map_err(|reason| Self::corrupt(key, reason))
    }

    /// The items a commit answered, one per key: `before, after` pairs (`with_before`),
    /// or each `after` alone (a second run's answer).
    fn written(
        keys: &[String],
        images: &[Value],
        with_before: bool,
    ) -> Result<Vec<Written>, StoreError> {
        let bad = |what: &str| Self::corrupt(&keys[0], format!("commit answered {what}"));
        let step = if with_before { 2 } else { 1 };
        if images.len() != keys.len() * step {
            return Err(bad("another count of images"));
        }
        let written = images.chunks(step).zip(keys).map(|(chunk, key)| {
            let flat = |v| -> Result<Vec<String>, StoreError> {
                redis::from_redis_value_ref(v).map_err(|e| Self::corrupt(key, e.to_string()))
            };
            let after = flat(&chunk[step - 1])?;
            let before = if with_before {
                Some(flat(&chunk[0])?)
            } else {
                None
            };
            let image = decode(&after)
                .map_err(|reason| Self::corrupt(key, reason))?
                .ok_or_else(|| bad("a missing item"))?;
            Ok(Written {
                before,
                after,
                image,
            })
        });
        written.collect()
    }

    /// One commit script over `writes`, whose keys are `keys`; `images`: answer the
    /// items as the commit left them. `op`: its operation id (the same id sent again
    /// answers what the first run did).
    #[expect(clippy::expect_used, reason = "plain strings and booleans")]
    pub(super) async fn commit_together(
        &self,
        writes: &[Write],
        keys: &[String],
        images: bool,
        op: &str,
    ) -> Result<Applied, StoreError> {
        let json: Vec<_> = writes.iter().map(script_write).collect();
        let json = serde_json::to_string(&json).expect("plain strings and booleans");
        let mut call = COMMIT.call(keys);
        call.arg(json)
            .arg(if images { "images" } else { "" })
            .arg(op);
        let out = self.run_once(&keys[0], &COMMIT, &call).await?;
        let bad = |what: &str| Self::corrupt(&keys[0], format!("commit answered {what}"));
        let Value::Array(parts) = &out else {
            return Err(bad("no array"));
        };
        match parts.first() {
            Some(Value::Int(1 | 3)) if !images => Ok(Applied::Committed(Vec::new())),
            Some(Value::Int(1)) => Self::written(keys, &parts[1..], true).map(Applied::Committed),
            // A second run: the first applied every write (its answer was lost).
            Some(Value::Int(3)) => Self::written(keys, &parts[1..], false).map(Applied::Committed),
            Some(Value::Int(0)) => {
                let mut failed = Vec::new();
                for pair in parts[1..].chunks(2) {
                    let [Value::Int(i), image] = pair else {
                        return Err(bad("a malformed refusal"));
                    };
                    let i = usize::try_from(*i)
                        .ok()
                        .filter(|i| *i < writes.len())
                        .ok_or_else(|| bad("a refusal out of range"))?;
                    failed.push((i, Self::image(&keys[i], image)?));
                }
                Ok(Applied::Refused(failed))
            }
            Some(Value::Int(2)) => {
                let [Value::Int(i), Value::Int(bytes)] = &parts[1..] else {
                    return Err(bad("a malformed size refusal"));
                };
                let key = usize::try_from(*i)
                    .ok()
                    .and_then(|i| keys.get(i))
                    .ok_or_else(|| bad("a size refusal out of range"))?;
                Err(StoreError::Invalid {
                    key: key.clone(),
                    reason: format!("the item would be {bytes} bytes (at most {MAX_ITEM_BYTES})"),
                    source: None,
                })
            }
            _ => Err(bad("an unknown status")),
        }
    }
}

impl RedisStore {
    /// The batches of a store on one server; none on a Cluster.
    fn batches(&self) -> Option<&Batches> {
        match self.link.options().mode() {
            RedisMode::Cluster => None,
            RedisMode::Single | RedisMode::Sentinel { .. } => Some(
                self.batches
                    .get_or_init(|| Batches::start(self.link.clone(), self.timeout)),
            ),
        }
    }

    /// One debit, its own script.
    async fn debit_alone(&self, rk: &str, args: Vec<String>) -> Result<Value, StoreError> {
        let mut call = DEBIT.call(&[rk]);
        for a in args {
            call.arg(a);
        }
        self.call(rk, self.link.run(rk, &DEBIT, &call)).await
    }

    /// One debit script; where the key holds no item and `created` is given (the seed,
    /// debited: `args::created`), the script writes it (see
    /// [`BucketStore::debit_or_create`]).
    async fn debit_seeded(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        created: Option<BucketItem>,
    ) -> Result<DebitOutcome, StoreError> {
        check_key(key)?;
        check_once(key, debits, |d| &d.limit)?;
        let rk = redis_key(&self.namespace, key);
        let args = debit_args(debits, mode, created.as_ref());
        let out = match self.batches() {
            Some(batches) => {
                match tokio::time::timeout(self.timeout, batches.debit(rk.clone(), args)).await {
                    Ok(Ok(Some(answer))) => answer?,
                    Ok(Ok(None)) => {
                        return Err(StoreError::Unavailable {
                            key: rk,
                            reason: "the batch sender stopped before answering".into(),
                            source: None,
                        })
                    }
                    Ok(Err(args)) => self.debit_alone(&rk, args).await?,
                    Err(_) => return Err(self.late(&rk)),
                }
            }
            None => self.debit_alone(&rk, args).await?,
        };
        match &out {
            Value::Array(parts) => match parts.as_slice() {
                [Value::Int(0)] => Ok(DebitOutcome::Refused(None)),
                // Created as sent.
                [Value::Int(2)] => created
                    .map(DebitOutcome::Applied)
                    .ok_or_else(|| Self::corrupt(&rk, "created an item it was not sent")),
                [Value::Int(0), image] => Ok(DebitOutcome::Refused(Self::image(&rk, image)?)),
                // The item as the script found it: its writes are applied here.
                [Value::Int(1), image] => {
                    let before = Self::image(&rk, image)?
                        .ok_or_else(|| Self::corrupt(&rk, "debit applied to no item"))?;
                    debited(before, debits, mode)
                        .map(DebitOutcome::Applied)
                        .map_err(|reason| Self::corrupt(&rk, reason))
                }
                _ => Err(Self::corrupt(&rk, format!("debit answered {out:?}"))),
            },
            _ => Err(Self::corrupt(&rk, format!("debit answered {out:?}"))),
        }
    }
}

impl BucketStore for RedisStore {
    /// The node that holds the key's slot (each master of a Cluster; the one server, or
    /// the master the Sentinels name, otherwise), as the calls per node count it.
    fn fault_domain(&self, key: &BucketKey) -> usize {
        let cell = self
            .link
            .nodes()
            .cell_of(|| super::codec::slot(&super::codec::redis_key(self.namespace(), key)));
        usize::from(cell)
    }

    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.debit_seeded(key, debits, mode, None).await
    }

    /// One script: the seed goes with the debit (a script cannot ask back for it), so it
    /// is built for every call, found item or not. A seed larger than an item may be is
    /// not sent: a missing item is then refused as missing, and the create the caller
    /// commits next is refused for its size, as the memory store refuses the seed.
    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        let item = seed();
        let created = if check_item(key, &item).is_ok() {
            created(&item, debits, mode)
        } else {
            None
        };
        self.debit_seeded(key, debits, mode, created).await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        for k in keys {
            check_key(k)?;
        }
        let reads = keys.iter().map(|k| async move {
            let rk = redis_key(&self.namespace, k);
            let v = self
                .call(
                    &rk,
                    self.link.query(Some(&rk), redis::cmd("HGETALL").arg(&rk)),
                )
                .await?;
            Self::image(&rk, &v)
        });
        futures::future::try_join_all(reads).await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        check_commit(writes, |k| redis_key(&self.namespace, k))?;
        let keys: Vec<String> = writes
            .iter()
            .map(|w| redis_key(&self.namespace, w.key()))
            .collect();
        if !self.one_node(&keys) {
            return self.commit_spread(writes, &keys).await;
        }
        Ok(
            match self.commit_together(writes, &keys, false, &op_id()).await? {
                Applied::Committed(_) => CommitOutcome::Committed,
                Applied::Refused(failed) => CommitOutcome::Conflict(failed),
            },
        )
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        check_key(key)?;
        check_once(key, credits, |c| &c.limit)?;
        let rk = redis_key(&self.namespace, key);
        let mut call = CREDIT.call(&[&rk]);
        for a in credit_args(guard, credits, &op_id()) {
            call.arg(a);
        }
        let out = self.run_once(&rk, &CREDIT, &call).await?;
        let applied: Vec<usize> =
            redis::from_redis_value_ref(&out).map_err(|e| Self::corrupt(&rk, e.to_string()))?;
        Ok(applied
            .into_iter()
            .filter_map(|i| credits.get(i).cloned())
            .collect())
    }
}

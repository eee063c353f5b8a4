//! Shared test fixtures: a store wrapper that records every call (operation, key and
//! outcome) and can inject a concurrent writer's action at a chosen moment.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, BumpOutcome, CommitOutcome, Credit, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

/// One store call as the engine made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Debit {
        shard: u32,
        retry_only: bool,
        applied: bool,
        missing: bool,
    },
    Read {
        shards: Vec<u32>,
    },
    Commit {
        kinds: Vec<&'static str>,
        committed: bool,
    },
    Bump {
        old: u32,
        new: u32,
        outcome: BumpOutcome,
    },
    Raise {
        shard: u32,
        wrote: bool,
    },
    Credit {
        shard: u32,
    },
}

type Hook = Box<dyn FnOnce(&MemoryStore) + Send>;

/// A [`MemoryStore`] that records calls and runs one-shot hooks before a commit or bump
/// (standing in for another server acting in between).
#[derive(Default)]
pub struct Recorder {
    pub inner: MemoryStore,
    calls: Mutex<Vec<Call>>,
    before_commit: Mutex<Option<Hook>>,
    before_bump: Mutex<Option<Hook>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    pub fn before_commit(&self, hook: impl FnOnce(&MemoryStore) + Send + 'static) {
        *self.before_commit.lock().unwrap() = Some(Box::new(hook));
    }

    pub fn before_bump(&self, hook: impl FnOnce(&MemoryStore) + Send + 'static) {
        *self.before_bump.lock().unwrap() = Some(Box::new(hook));
    }

    fn log(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }
}

impl BucketStore for Recorder {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        let out = self.inner.debit(key, debits, mode).await?;
        self.log(Call::Debit {
            shard: key.shard,
            retry_only: mode == DebitMode::RetryOnly,
            applied: matches!(out, DebitOutcome::Applied(_)),
            missing: matches!(out, DebitOutcome::Refused(None)),
        });
        Ok(out)
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.log(Call::Read {
            shards: keys.iter().map(|k| k.shard).collect(),
        });
        self.inner.read(keys).await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        if let Some(hook) = self.before_commit.lock().unwrap().take() {
            hook(&self.inner);
        }
        let out = self.inner.commit(writes).await?;
        self.log(Call::Commit {
            kinds: writes
                .iter()
                .map(|w| match w {
                    Write::Create { .. } => "create",
                    Write::Update { .. } => "update",
                    Write::Debit { .. } => "debit",
                })
                .collect(),
            committed: matches!(out, CommitOutcome::Committed),
        });
        Ok(out)
    }

    async fn bump_shard_count(
        &self,
        entity: &str,
        resource: &str,
        old: u32,
        new: u32,
    ) -> Result<BumpOutcome, StoreError> {
        if let Some(hook) = self.before_bump.lock().unwrap().take() {
            hook(&self.inner);
        }
        let outcome = self
            .inner
            .bump_shard_count(entity, resource, old, new)
            .await?;
        self.log(Call::Bump { old, new, outcome });
        Ok(outcome)
    }

    async fn raise_shard_count(&self, key: &BucketKey, new: u32) -> Result<bool, StoreError> {
        let wrote = self.inner.raise_shard_count(key, new).await?;
        self.log(Call::Raise {
            shard: key.shard,
            wrote,
        });
        Ok(wrote)
    }

    async fn credit(&self, key: &BucketKey, credits: &[Credit]) -> Result<Vec<Credit>, StoreError> {
        self.log(Call::Credit { shard: key.shard });
        self.inner.credit(key, credits).await
    }
}

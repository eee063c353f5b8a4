//! Reaching DynamoDB: the client from the standard AWS chain with the store's deadline
//! and the retries a call may make, credentials resolved so that no caller's deadline can
//! cut a fetch short, the table's creation, and the start-up warm-up that has the store
//! answering before the server says SERVING.

use std::time::Duration;

use aws_credential_types::provider::{self, ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_dynamodb::config::interceptors::InterceptorContext;
use aws_sdk_dynamodb::config::retry::{ClassifyRetry, RetryAction};
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, KeysAndAttributes,
    ReturnConsumedCapacity, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use aws_smithy_runtime_api::client::retries::classifiers::{RetryClassifierPriority, RetryReason};
use aws_smithy_runtime_api::client::retries::ErrorKind;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::failure::{cause, describe};
use super::ledger::capacity_all;
use super::{DynamoOptions, DynamoStore};
use crate::store::detached::caller_gone;
use crate::store::{BucketKey, Cause, StoreError};

/// Attempts of one SDK call, the first included; all within the call's deadline (the
/// operation timeout covers them and the waits between them).
const MAX_ATTEMPTS: u32 = 3;

/// Builds a DynamoDB client from the standard AWS configuration chain. Its calls are
/// bounded by `options.timeout`; its credentials are resolved by [`DetachedCredentials`].
pub async fn client(options: &DynamoOptions) -> Client {
    connection(options).await.0
}

/// A client (see [`client`]) and the credentials provider it uses, if the chain found one.
pub(super) async fn connection(
    options: &DynamoOptions,
) -> (Client, Option<SharedCredentialsProvider>) {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &options.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &options.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let shared = loader.load().await;
    let mut builder = aws_sdk_dynamodb::config::Builder::from(&shared)
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .operation_timeout(options.timeout)
                .operation_attempt_timeout(options.timeout)
                .connect_timeout(options.timeout.max(Duration::from_millis(100)))
                .build(),
        )
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(MAX_ATTEMPTS)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff((options.timeout / 4).max(Duration::from_millis(1))),
        )
        .retry_classifier(WithinTheCall);
    let credentials = shared
        .credentials_provider()
        .map(|p| SharedCredentialsProvider::new(DetachedCredentials::new(p)));
    if let Some(provider) = &credentials {
        builder = builder.credentials_provider(provider.clone());
    }
    if shared.region().is_none() && options.endpoint.is_some() {
        // DynamoDB Local ignores the region, but the SDK needs one to sign requests.
        builder = builder.region(aws_config::Region::new("us-east-1"));
    }
    (Client::from_conf(builder.build()), credentials)
}

/// The retries the SDK's standard mode would make that a call of this store must not.
///
/// - A throttling error: on a hot partition a retry adds load where there is too much
///   already, spends the client's retry quota that every other bucket's transient errors
///   share, and delays the answer the engine has for it (a doubling of the bucket, or its
///   short refusal). A table-wide throttle is an outage, and a retry loads it too.
/// - Anything, once the call's caller has given up (`detached::caller_gone`): nobody reads
///   the answer, and a store that answered too late for the caller is behind already. The
///   attempt in flight runs to its end (its connection and credentials serve later calls).
#[derive(Debug)]
struct WithinTheCall;

impl ClassifyRetry for WithinTheCall {
    fn classify_retry(&self, _ctx: &InterceptorContext) -> RetryAction {
        RetryAction::NoActionIndicated
    }

    fn classify_retry_v2(&self, _ctx: &InterceptorContext, previous: &RetryAction) -> RetryAction {
        let throttled = matches!(
            previous,
            RetryAction::RetryIndicated(RetryReason::RetryableError {
                kind: ErrorKind::ThrottlingError,
                ..
            })
        );
        if previous.should_retry() && (throttled || caller_gone()) {
            RetryAction::RetryForbidden
        } else {
            RetryAction::NoActionIndicated
        }
    }

    fn name(&self) -> &'static str {
        "shardgate: retries within the call"
    }

    /// After the SDK's own classifiers, so as to see (and forbid) what they decided.
    fn priority(&self) -> RetryClassifierPriority {
        RetryClassifierPriority::run_after(RetryClassifierPriority::transient_error_classifier())
    }
}

/// A fetch of credentials, shared by every caller waiting for it; its error as text (the
/// SDK's error is not `Clone`).
type CredentialsFetch = Shared<BoxFuture<'static, Result<Credentials, String>>>;

/// Credentials resolved in a task of their own, shared by concurrent callers.
///
/// The SDK resolves credentials inside the call that needs them (its identity cache
/// loads them in the caller's future), so a call that gives up mid-fetch — an IMDS or
/// STS round trip on a cold start or a refresh — cancels the fetch, and the next call
/// starts it over; with every call bounded by a deadline shorter than the fetch, none
/// would ever get credentials. Here a fetch runs to its end whatever its callers do, and
/// the next caller finds its result.
#[derive(Debug)]
pub struct DetachedCredentials {
    inner: SharedCredentialsProvider,
    /// The fetch in flight or last finished.
    fetch: parking_lot::Mutex<Option<CredentialsFetch>>,
}

/// A finished fetch is handed to a later caller only while its credentials have this
/// much left before they expire (the SDK asks again ten seconds before expiry).
const CREDENTIALS_REUSE_MARGIN: Duration = Duration::from_secs(60);

impl DetachedCredentials {
    pub fn new(inner: SharedCredentialsProvider) -> DetachedCredentials {
        DetachedCredentials {
            inner,
            fetch: parking_lot::Mutex::new(None),
        }
    }

    /// The fetch to wait for: the one in flight, or a finished one whose credentials are
    /// still good (its caller gave up before receiving them), else a new one.
    #[expect(clippy::expect_used, reason = "set above")]
    fn current(&self) -> CredentialsFetch {
        let mut fetch = self.fetch.lock();
        let reusable = fetch.as_ref().is_some_and(|f| match f.peek() {
            None => true,
            Some(Ok(c)) => c.expiry().is_none_or(|at| {
                at.duration_since(std::time::SystemTime::now())
                    .is_ok_and(|left| left > CREDENTIALS_REUSE_MARGIN)
            }),
            Some(Err(_)) => false,
        });
        if !reusable {
            let inner = self.inner.clone();
            let task = tokio::spawn(async move {
                inner
                    .provide_credentials()
                    .await
                    .map_err(|e| DisplayErrorContext(e).to_string())
            });
            let shared: BoxFuture<'static, Result<Credentials, String>> = Box::pin(async move {
                task.await
                    .unwrap_or_else(|e| Err(format!("credentials fetch ended: {e}")))
            });
            *fetch = Some(shared.shared());
        }
        fetch.clone().expect("set above")
    }
}

impl ProvideCredentials for DetachedCredentials {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let fetch = self.current();
        provider::future::ProvideCredentials::new(async move {
            fetch
                .await
                .map_err(provider::error::CredentialsError::provider_error)
        })
    }
}

/// What `table create` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCreated {
    Created,
    AlreadyExisted,
}

/// Creates the bucket table (on-demand billing, TTL on `ttl`) if it does not exist, and
/// makes sure TTL is enabled either way. Idempotent.
#[expect(
    clippy::expect_used,
    reason = "the builders are given every required field"
)]
pub async fn create_table(client: &Client, table: &str) -> Result<TableCreated, StoreError> {
    let err = |reason: String, source: Option<Cause>| StoreError::Unavailable {
        key: table.to_string(),
        reason,
        source,
    };
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .expect("name and type are set")
    };
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .expect("name and type are set")
    };
    let created = match client
        .create_table()
        .table_name(table)
        .attribute_definitions(attr("PK"))
        .attribute_definitions(attr("SK"))
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
    {
        Ok(_) => TableCreated::Created,
        Err(e) if e.code() == Some("ResourceInUseException") => TableCreated::AlreadyExisted,
        Err(e) => return Err(err(describe(&e), cause(&e))),
    };
    // Wait until the table is active before touching its TTL.
    for _ in 0..60 {
        let d = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| err(describe(&e), cause(&e)))?;
        let active = d
            .table()
            .and_then(|t| t.table_status())
            .is_some_and(|s| s.as_str() == "ACTIVE");
        if active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ttl = TimeToLiveSpecification::builder()
        .attribute_name("ttl")
        .enabled(true)
        .build()
        .expect("name and flag are set");
    match client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(ttl)
        .send()
        .await
    {
        Ok(_) => {}
        // Already enabled on this attribute.
        Err(e) if e.code() == Some("ValidationException") => {}
        Err(e) => return Err(err(describe(&e), cause(&e))),
    }
    Ok(created)
}

impl DynamoStore {
    /// Gets the store ready to answer within its deadline: resolves credentials, then
    /// makes a first call and opens `connections` connections (one concurrent call each),
    /// every step under `patience` instead of the store timeout, so that a cold process
    /// (credentials through IMDS or IRSA, a first TLS handshake) or a cold store (a JVM
    /// just started) is ready before it serves. Succeeds once the first call is answered.
    pub async fn warm_up(&self, connections: usize, patience: Duration) -> Result<(), StoreError> {
        let probe = BucketKey::new("%health", "%health", 0);
        if let Some(provider) = &self.credentials {
            match tokio::time::timeout(patience, provider.provide_credentials()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let reason = format!("no credentials: {}", DisplayErrorContext(e));
                    return Err(self.unavailable(&probe, reason));
                }
                Err(_) => {
                    let reason = format!("no credentials within {patience:?}");
                    return Err(self.unavailable(&probe, reason));
                }
            }
        }
        let first = self.patient_read(&probe, patience).await;
        first?;
        let more = (1..connections).map(|_| self.patient_read(&probe, patience));
        for r in futures::future::join_all(more).await {
            if let Err(e) = r {
                tracing::debug!(error = %e, "a warm-up connection failed");
            }
        }
        Ok(())
    }

    /// One strongly consistent read of `key` under `patience` (not the store timeout).
    async fn patient_read(&self, key: &BucketKey, patience: Duration) -> Result<(), StoreError> {
        let ka = KeysAndAttributes::builder()
            .set_keys(Some(vec![self.key_of(key)]))
            .consistent_read(true)
            .build()
            .map_err(|e| self.unavailable(key, e.to_string()))?;
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .operation_timeout(patience)
            .operation_attempt_timeout(patience)
            .connect_timeout(patience)
            .build();
        let out = Box::pin(
            self.client
                .batch_get_item()
                .request_items(&self.table, ka)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .customize()
                .config_override(aws_sdk_dynamodb::config::Builder::new().timeout_config(timeouts))
                .send(),
        )
        .await;
        match out {
            Ok(o) => {
                self.ledger
                    .record("BatchGetItem", "ok", capacity_all(o.consumed_capacity()));
                Ok(())
            }
            Err(err) => Err(self.failed("BatchGetItem", key, &err)),
        }
    }
}

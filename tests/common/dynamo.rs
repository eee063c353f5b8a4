//! DynamoDB Local for tests: `scripts/test` (and `.ci/run`) start it and export its
//! endpoint as `SHARDGATE_TEST_DYNAMODB_ENDPOINT`. Each test gets its own namespace in one
//! shared table, so tests never see each other's items.

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::Client;
use shardgate::store::dynamodb::{create_table, DynamoStore};
use tokio::sync::OnceCell;

pub const TABLE: &str = "shardgate_tests";

/// The DynamoDB Local endpoint; tests that need it fail loudly without it.
pub fn endpoint() -> String {
    std::env::var("SHARDGATE_TEST_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SHARDGATE_TEST_DYNAMODB_ENDPOINT is not set: run the tests with scripts/test, \
             which installs and starts DynamoDB Local"
        )
    })
}

/// A client with static local credentials (never the instance-metadata chain).
pub fn client() -> Client {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(endpoint())
        .build();
    Client::from_conf(conf)
}

static TABLE_READY: OnceCell<()> = OnceCell::const_new();

/// A store on the shared test table in a namespace of its own.
pub async fn store() -> DynamoStore {
    let client = client();
    TABLE_READY
        .get_or_init(|| async {
            create_table(&client, TABLE)
                .await
                .expect("create the test table");
        })
        .await;
    let ns = super::unique_namespace();
    let store = DynamoStore::new(client, TABLE, &ns);
    store.ledger().record_sequence();
    store
}

/// What DynamoDB's TTL sweeper does (DynamoDB Local has none): deletes every item of the
/// store's namespace whose `ttl` is at or before `now_s`. Returns how many.
pub async fn sweep(store: &DynamoStore, now_s: i64) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = client();
    let prefix = format!("{}/", store.namespace());
    let mut deleted = 0;
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(TABLE)
            .filter_expression("begins_with(PK, :p) AND #ttl <= :now")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":p", AttributeValue::S(prefix.clone()))
            .expression_attribute_values(":now", AttributeValue::N(now_s.to_string()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan the test table");
        for item in page.items() {
            client
                .delete_item()
                .table_name(TABLE)
                .key("PK", item["PK"].clone())
                .key("SK", item["SK"].clone())
                .send()
                .await
                .expect("delete an expired item");
            deleted += 1;
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return deleted;
        }
    }
}

/// The tests that offer DynamoDB Local hundreds of writes a second take turns. Two of them
/// at once on a cold JVM (as in CI, where DynamoDB Local has just started) cannot get the
/// load they offer answered, and each then measures the other instead of itself.
pub async fn load_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// Brings DynamoDB Local up to speed before a load test: rounds of `concurrency`
/// concurrent writes (to keys no store uses) until one round is answered within
/// `target`, for at most 30 s; a JVM that has just started answers its first thousands of
/// calls many times slower. Returns the rounds it took.
pub async fn warm_up(concurrency: usize, target: std::time::Duration) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = client();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut rounds = 0;
    loop {
        rounds += 1;
        let started = std::time::Instant::now();
        let writes = (0..concurrency).map(|i| {
            client
                .put_item()
                .table_name(TABLE)
                .item("PK", AttributeValue::S(format!("%warm-up/{i}")))
                .item("SK", AttributeValue::S("%warm-up".into()))
                .send()
        });
        for w in futures::future::join_all(writes).await {
            w.expect("a warm-up write to DynamoDB Local");
        }
        if started.elapsed() <= target || std::time::Instant::now() >= give_up {
            return rounds;
        }
    }
}

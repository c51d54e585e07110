//! Runs every check of [`crate::conformance`] on a fresh SQLite store and on a
//! fresh PostgreSQL database: on `INHOOK_TEST_DATABASE` when it is a
//! PostgreSQL URL (CI), else on `127.0.0.1:5432` when it answers (skipped,
//! with a note on stderr, when it does not). Both stores must answer alike.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use inhook::store::{PoolSettings, PostgresStore, SqliteStore, Store, Upkeep};

use crate::support::Backend;

/// Runs `check` on a fresh, migrated SQLite store.
async fn on_sqlite<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("inhook.db"), Duration::from_secs(5))
        .expect("open SQLite");
    store.migrate().await.expect("migrate SQLite");
    run(check(Arc::new(store))).await;
}

/// Runs `check` on a fresh SQLite store that commits each delivery on its own (no group commit).
async fn on_sqlite_one_by_one<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("inhook.db"), Duration::from_secs(5))
        .expect("open SQLite")
        .without_group_commit();
    store.migrate().await.expect("migrate SQLite");
    run(check(Arc::new(store))).await;
}

/// The PostgreSQL server to create test databases on, if there is one.
async fn postgres_server() -> Option<String> {
    match std::env::var("INHOOK_TEST_DATABASE") {
        Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            return Some(url)
        }
        _ => {}
    }
    let local = "postgres://root@127.0.0.1:5432/postgres";
    let probe = tokio_postgres::connect(local, tokio_postgres::NoTls);
    match tokio::time::timeout(Duration::from_secs(2), probe).await {
        Ok(Ok(_)) => Some(local.to_owned()),
        _ => None,
    }
}

/// Runs `check` on a fresh, migrated PostgreSQL database, dropped afterwards.
async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    on_postgres_with("", check).await;
}

/// Runs `check` on a fresh PostgreSQL database created with `options`.
async fn on_postgres_with<F, Fut>(options: &str, check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    on_postgres_store(options, true, check).await;
}

/// Runs `check` on a fresh PostgreSQL database that commits each delivery on its own.
async fn on_postgres_one_by_one<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    on_postgres_store("", false, check).await;
}

/// Runs `check` on a fresh PostgreSQL database created with `options`, with or without group commit.
async fn on_postgres_store<F, Fut>(options: &str, group_commit: bool, check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(server) = postgres_server().await else {
        eprintln!("skipped: no PostgreSQL (set INHOOK_TEST_DATABASE or run one on 127.0.0.1:5432)");
        return;
    };
    let backend = Backend::fresh_postgres_with(server, options).await;
    let settings = PoolSettings {
        max_size: 4,
        timeout: Duration::from_secs(10),
    };
    let url = backend.url(std::path::Path::new(""));
    let mut store = PostgresStore::connect(&url, settings).expect("connect PostgreSQL");
    if !group_commit {
        store = store.without_group_commit();
    }
    store.migrate().await.expect("migrate PostgreSQL");
    let outcome = tokio::spawn(check(Arc::new(store))).await;
    backend.drop_database().await;
    if let Err(failure) = outcome {
        std::panic::resume_unwind(failure.into_panic());
    }
}

/// Runs a check to its end, passing its panic on.
async fn run(check: impl Future<Output = ()> + Send + 'static) {
    if let Err(failure) = tokio::spawn(check).await {
        std::panic::resume_unwind(failure.into_panic());
    }
}

/// One test per check and store: `store_conformance::{sqlite,postgres}::<check>`, and again
/// on each store committing every delivery on its own (`*_one_by_one`), another ingest path.
macro_rules! conformance {
    ($($module:ident :: $check:ident),* $(,)?) => {
        mod sqlite {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_sqlite(|store| async move { $module::$check(&*store).await }).await;
                }
            )*
        }
        mod postgres {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_postgres(|store| async move { $module::$check(&*store).await }).await;
                }
            )*
        }
        mod sqlite_one_by_one {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_sqlite_one_by_one(|store| async move { $module::$check(&*store).await }).await;
                }
            )*
        }
        mod postgres_one_by_one {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_postgres_one_by_one(|store| async move { $module::$check(&*store).await }).await;
                }
            )*
        }
    };
}

conformance! {
    concurrency::racing_resends_log_exactly_one_event,
    concurrency::racing_keys_decided_at_ingest_apply_only_the_logged_event,
    concurrency::racing_deliveries_never_overshoot_max_backlog,
    concurrency::decisions_free_exactly_their_share_of_max_backlog,
    concurrency::racing_deltas_never_overshoot_max_held_per_aggregate,
    concurrency::racing_sync_deliveries_end_at_the_highest_sequence,
    concurrency::counts_stay_exact_while_reads_race_writes,
    ingest::a_resent_event_id_is_a_duplicate_and_a_changed_body_is_flagged,
    ingest::a_known_idempotency_key_is_a_duplicate_of_the_first_event,
    ingest::the_out_of_order_flag_compares_with_the_highest_sequence_received,
    ingest::max_backlog_refuses_and_stores_nothing,
    ingest::max_held_per_aggregate_refuses_only_events_ahead_of_the_gap,
    ingest::a_body_without_event_id_is_kept_under_its_delivery_id,
    ingest::a_resent_body_under_a_new_delivery_id_is_a_duplicate_by_body,
    ingest::a_delivery_carrying_a_logged_signed_content_is_a_duplicate_whatever_its_body,
    settle::sync_ingest_answers_applied_stale_held_and_dead,
    settle::async_events_are_due_until_settled,
    settle::a_gap_is_skipped_after_the_hold_timeout,
    settle::the_change_feed_lists_applied_changes_in_order,
    settle::a_taken_sequence_is_a_conflict,
    settle::presence_pages_order_by_user_and_filter_by_status,
    settle::a_json_source_settles_through_the_generic_aggregate_state,
    retries::failures_back_off_then_the_event_is_dead_with_its_history,
    retries::replaying_one_event_requeues_only_dead_or_retrying_events,
    retries::a_bulk_replay_advances_by_aggregate_from_a_stored_cursor,
    retries::replays_apply_late_deltas_and_bulk_replays_take_a_status,
    log::listings_filter_and_page_newest_first,
    log::overview_counts_every_status_per_source,
    log::purge_deletes_decided_events_and_keeps_their_dedup_keys,
    log::a_purged_key_kept_again_names_the_newer_event,
    log::text_orders_are_byte_orders,
    log::ids_are_never_reused_after_a_purge,
    log::counts_match_the_log_after_every_transition,
    forwarding::applied_events_write_deliveries_with_the_decision,
    forwarding::claims_follow_the_applied_order_one_in_flight_per_aggregate,
    forwarding::an_expired_lease_is_claimed_again,
    forwarding::released_deliveries_are_claimable_at_once,
    forwarding::a_batch_of_verdicts_records_only_the_lease_holders,
    forwarding::a_dead_in_order_delivery_blocks_only_its_aggregate,
    forwarding::replays_requeue_supersede_or_refuse,
    forwarding::deliveries_page_newest_first_and_filter,
    forwarding::a_bulk_replay_requeues_dead_deliveries_queue_by_queue,
    forwarding::retention_keeps_events_a_destination_still_needs,
}

/// Runs `check` with an opener of handles on one fresh SQLite file.
async fn on_sqlite_nodes<F, Fut>(check: F)
where
    F: FnOnce(crate::conformance::forwarding::Opener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("inhook.db");
    let store = SqliteStore::open(&path, Duration::from_secs(5)).expect("open SQLite");
    store.migrate().await.expect("migrate SQLite");
    // SQLite serves one process: handles opened while one lives share it (its one
    // writer), and one opened after the last was dropped is a restart.
    let live: std::sync::Mutex<std::sync::Weak<dyn Store>> =
        std::sync::Mutex::new(std::sync::Weak::<SqliteStore>::new());
    let open: crate::conformance::forwarding::Opener = Arc::new(move || {
        let mut live = live.lock().expect("live handle");
        if let Some(store) = live.upgrade() {
            return store;
        }
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&path, Duration::from_secs(5)).expect("open SQLite"));
        *live = Arc::downgrade(&store);
        store
    });
    run(check(open)).await;
    drop(dir);
}

/// Runs `check` with an opener of handles (pools) on one fresh PostgreSQL database.
async fn on_postgres_nodes<F, Fut>(check: F)
where
    F: FnOnce(crate::conformance::forwarding::Opener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(server) = postgres_server().await else {
        eprintln!("skipped: no PostgreSQL (set INHOOK_TEST_DATABASE or run one on 127.0.0.1:5432)");
        return;
    };
    let backend = Backend::fresh_postgres_with(server, "").await;
    let url = backend.url(std::path::Path::new(""));
    let connect = move || {
        let settings = PoolSettings {
            max_size: 2,
            timeout: Duration::from_secs(10),
        };
        PostgresStore::connect(&url, settings).expect("connect PostgreSQL")
    };
    connect().migrate().await.expect("migrate PostgreSQL");
    let open: crate::conformance::forwarding::Opener =
        Arc::new(move || Arc::new(connect()) as Arc<dyn Store>);
    let outcome = tokio::spawn(check(open)).await;
    backend.drop_database().await;
    if let Err(failure) = outcome {
        std::panic::resume_unwind(failure.into_panic());
    }
}

/// Checks that need several handles on one database: nodes racing, a node's crash.
macro_rules! conformance_nodes {
    ($($module:ident :: $check:ident),* $(,)?) => {
        mod sqlite_nodes {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_sqlite_nodes($module::$check).await;
                }
            )*
        }
        mod postgres_nodes {
            use crate::conformance::*;
            $(
                #[tokio::test]
                async fn $check() {
                    super::on_postgres_nodes($module::$check).await;
                }
            )*
        }
    };
}

conformance_nodes! {
    forwarding::racing_claimers_never_lease_two_of_one_aggregate,
    forwarding::a_crashed_claim_is_claimed_again_after_its_lease,
    concurrency::nodes_ingesting_one_burst_in_opposite_orders_never_deadlock,
}

/// A claim passes over the queues another node's open transaction holds (PostgreSQL's
/// advisory locks; SQLite's one writer has no such node).
mod postgres_held_queues {
    use crate::conformance::forwarding;
    use inhook::store::Upkeep;

    #[tokio::test]
    async fn a_claim_passes_over_queues_another_node_holds() {
        let Some(server) = super::postgres_server().await else {
            eprintln!(
                "skipped: no PostgreSQL (set INHOOK_TEST_DATABASE or run one on 127.0.0.1:5432)"
            );
            return;
        };
        let backend = crate::support::Backend::fresh_postgres_with(server, "").await;
        let url = backend.url(std::path::Path::new(""));
        let settings = inhook::store::PoolSettings {
            max_size: 2,
            timeout: std::time::Duration::from_secs(10),
        };
        let store = inhook::store::PostgresStore::connect(&url, settings).expect("connect");
        store.migrate().await.expect("migrate PostgreSQL");
        let outcome = tokio::spawn(async move {
            let hold = |keys: Vec<String>| async move {
                let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect the other node");
                tokio::spawn(connection);
                let (taken, locks_held) = tokio::sync::oneshot::channel();
                let (release, released) = tokio::sync::oneshot::channel::<()>();
                let holder = tokio::spawn(async move {
                    let tx = client.transaction().await.expect("begin");
                    for key in &keys {
                        tx.query(
                            "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) l",
                            &[key],
                        )
                        .await
                        .expect("lock a queue");
                    }
                    let _ = taken.send(());
                    let _ = released.await;
                    tx.rollback().await.expect("roll back");
                });
                locks_held.await.expect("locks taken");
                move || async move {
                    let _ = release.send(());
                    holder.await.expect("the other node");
                }
            };
            forwarding::a_claim_passes_over_queues_another_node_holds(&store, hold).await;
        })
        .await;
        backend.drop_database().await;
        if let Err(failure) = outcome {
            std::panic::resume_unwind(failure.into_panic());
        }
    }
}

/// The checks whose answers could depend on the database's collation, on a
/// database whose default collation is linguistic (ICU `en-US`), as a
/// PostgreSQL initialised with `en_US.UTF-8` would have.
mod postgres_linguistic_collation {
    use crate::conformance::log;

    const ICU_EN_US: &str = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'";

    #[tokio::test]
    async fn text_orders_are_byte_orders() {
        super::on_postgres_with(ICU_EN_US, |store| async move {
            log::text_orders_are_byte_orders(&*store).await
        })
        .await;
    }
}

//! Forwarding's store (docs/forwarding.md): delivery rows written with the decision,
//! claims under a lease in applied order with one request in flight per aggregate,
//! verdicts, blocking, replay and skip, listings and a destination's figures.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use inhook::config::Config;
use inhook::domain::kind::{DeliveryOrder, Lane};
use inhook::forward::answer::{AttemptRecord, AttemptResult, Verdict};
use inhook::forward::message::WebhookId;
use inhook::forward::queue::DeliveryStatus;
use inhook::store::{
    DeliveryFilter, DeliveryRecord, DeliveryReplay, DeliverySkip, PendingVerdict, SourceRules,
    Store,
};
use serde_json::json;

use super::{delta, ingest_save, ingest_sync, presence, save, slot, PRESENCE, SAVES, T0};

/// A store opener: each call is another handle on the same database (another node).
pub type Opener = Arc<dyn Fn() -> Arc<dyn Store> + Send + Sync>;

/// The sources of the checks and two destinations: `app` takes every event of both,
/// `audit` only the save slots' inventory events.
const CONFIG: &str = r#"
    [[sources]]
    name = "presence"
    kind = "presence"
    secrets = ["p"]
    [[sources]]
    name = "saves"
    kind = "save-game"
    secrets = ["s"]
    [[destinations]]
    name = "app"
    url = "http://127.0.0.1:9/hooks"
    sources = ["presence", "saves"]
    secret = "whsec_c2VjcmV0"
    [[destinations]]
    name = "audit"
    url = "http://127.0.0.1:9/audit"
    sources = ["saves"]
    event_types = ["inventory.*"]
    secret = "whsec_c2VjcmV0"
"#;

const APP: &str = "app";
const LEASE_MS: i64 = 30_000;

fn config() -> Config {
    Config::from_parts(Some(CONFIG), &HashMap::new()).expect("config")
}

/// The rules of `source` with the checks' destinations.
fn rules(source: &str) -> SourceRules {
    let config = config();
    SourceRules::for_source(config.source(source).expect("source"), &config.destinations)
}

/// Every delivery of `destination`, oldest first, read page by page.
async fn all(store: &dyn Store, destination: &str) -> Vec<DeliveryRecord> {
    let mut items = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .deliveries(destination, &DeliveryFilter::default(), 2, cursor)
            .await
            .expect("deliveries");
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    items.reverse();
    items
}

/// Claims for `owner` at `now` with a 30 s lease.
async fn claim(store: &dyn Store, owner: &str, now: i64, limit: usize) -> Vec<DeliveryRecord> {
    store
        .claim_deliveries(APP, owner, now, now + LEASE_MS, limit)
        .await
        .expect("claim")
}

fn ids(deliveries: &[DeliveryRecord]) -> Vec<i64> {
    deliveries.iter().map(|d| d.id).collect()
}

/// Records `verdict` for a claimed delivery, answered `status` (or failed) at `now`.
async fn answer(
    store: &dyn Store,
    owner: &str,
    delivery: &DeliveryRecord,
    verdict: Verdict,
    now: i64,
) -> bool {
    let result = match &verdict {
        Verdict::Delivered => AttemptResult::http(200, None),
        _ => AttemptResult::http(500, None),
    };
    let attempt = AttemptRecord::new(delivery.attempts as u32, now, 12, &result);
    store
        .record_delivery_attempt(delivery.id, owner, &verdict, &attempt, now)
        .await
        .expect("record attempt")
}

fn dead() -> Verdict {
    Verdict::Dead {
        error: "HTTP 500".into(),
    }
}

/// Only applied events of the named sources make deliveries, one per destination that
/// wants them, in applied order, in sync and worker settling alike.
pub async fn applied_events_write_deliveries_with_the_decision(store: &dyn Store) {
    let presence_rules = rules(PRESENCE);
    ingest_sync(
        store,
        &presence_rules,
        presence("p2", "u1", "ONLINE", 2),
        T0,
    )
    .await;
    ingest_sync(
        store,
        &presence_rules,
        presence("p1", "u1", "AWAY", 1),
        T0 + 1,
    )
    .await; // stale
    let saves = rules(SAVES);
    ingest_sync(store, &saves, delta("d1", "slot_a", 1, 2), T0 + 2).await;
    ingest_sync(store, &saves, delta("d3", "slot_a", 3, 1), T0 + 3).await; // held: 2 is missing
    let progress = save("s2", "slot_a", "progress.saved", 2, json!({"level": 7}));
    ingest_save(store, &progress, T0 + 4).await;
    assert!(
        all(store, APP).await.len() == 2,
        "nothing before the worker settles"
    );
    store
        .settle(&saves, &slot("slot_a"), T0 + 5)
        .await
        .expect("settle");

    let app = all(store, APP).await;
    let seen: Vec<(&str, &str, &str)> = app
        .iter()
        .map(|d| {
            (
                d.source.as_str(),
                d.event_id.as_str(),
                d.event_type.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (PRESENCE, "p2", "presence.changed"),
            (SAVES, "d1", "inventory.updated"),
            (SAVES, "s2", "progress.saved"),
            (SAVES, "d3", "inventory.updated"),
        ],
        "applied events only, in applied order (the held delta after the progress that filled its gap)"
    );
    assert!(app.windows(2).all(|w| w[0].id < w[1].id));
    for d in &app {
        assert_eq!(d.status, DeliveryStatus::Pending);
        assert_eq!(d.attempts, 0);
        assert_eq!(d.webhook_id, WebhookId::of(&d.source, &d.event_id).as_str());
    }
    assert_eq!(app[0].order, DeliveryOrder::LatestWins(Lane::Aggregate));
    assert_eq!(app[0].aggregate, "u1");
    assert_eq!(
        app[1].order,
        DeliveryOrder::InOrder(Lane::Part("inventory"))
    );
    assert_eq!(
        (app[1].aggregate.clone(), app[1].sequence),
        (slot("slot_a"), 1)
    );
    assert_eq!(
        app[2].order,
        DeliveryOrder::LatestWins(Lane::Part("progress"))
    );
    assert_eq!(app[2].created_at_ms, T0 + 5);

    let audit = all(store, "audit").await;
    let audited: Vec<&str> = audit.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(audited, ["d1", "d3"], "audit wants inventory events only");
    assert_eq!(
        audit[0].webhook_id, app[1].webhook_id,
        "one id for every destination"
    );
    assert!(all(store, "nowhere").await.is_empty());
}

/// Per aggregate one delivery at a time, in applied order; other aggregates go in
/// parallel; a retry waits for its time and goes with the same `webhook-id`.
pub async fn claims_follow_the_applied_order_one_in_flight_per_aggregate(store: &dyn Store) {
    let saves = rules(SAVES);
    for seq in 1..=3 {
        ingest_sync(
            store,
            &saves,
            delta(&format!("a{seq}"), "slot_a", seq, 1),
            T0,
        )
        .await;
    }
    ingest_sync(store, &saves, delta("b1", "slot_b", 1, 1), T0).await;
    let app = all(store, APP).await;
    let (a1, a2, a3, b1) = (app[0].id, app[1].id, app[2].id, app[3].id);

    let now = T0 + 10;
    let first = claim(store, "node-a", now, 10).await;
    assert_eq!(
        ids(&first),
        [a1, b1],
        "the head of each queue, oldest first"
    );
    for d in &first {
        assert_eq!(d.status, DeliveryStatus::InFlight);
        assert_eq!(d.attempts, 1);
        assert_eq!(d.lease_owner.as_deref(), Some("node-a"));
        assert_eq!(d.lease_until_ms, Some(now + LEASE_MS));
    }
    assert!(
        claim(store, "node-a", now, 10).await.is_empty(),
        "one in flight per aggregate"
    );
    assert_eq!(
        ids(&claim(store, "node-b", now, 10).await),
        Vec::<i64>::new()
    );

    assert!(answer(store, "node-a", &first[0], Verdict::Delivered, now + 1).await);
    let second = claim(store, "node-a", now + 2, 1).await;
    assert_eq!(
        ids(&second),
        [a2],
        "the next of slot_a once the first got its 2xx"
    );
    let retry_at = now + 5_000;
    let verdict = Verdict::RetryAt {
        at_ms: retry_at,
        error: "HTTP 500".into(),
    };
    assert!(answer(store, "node-a", &second[0], verdict, now + 3).await);
    let retrying = store.delivery(APP, a2).await.unwrap().unwrap();
    assert_eq!(retrying.status, DeliveryStatus::Retrying);
    assert_eq!(retrying.next_attempt_at_ms, Some(retry_at));
    assert_eq!(retrying.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(retrying.lease_owner, None);
    assert!(
        claim(store, "node-a", retry_at - 1, 10).await.is_empty(),
        "a3 never passes a2, which waits to retry"
    );
    let again = claim(store, "node-a", retry_at, 10).await;
    assert_eq!(ids(&again), [a2]);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(again[0].webhook_id, app[1].webhook_id);
    assert!(answer(store, "node-a", &again[0], Verdict::Delivered, retry_at + 1).await);
    assert_eq!(ids(&claim(store, "node-a", retry_at + 2, 10).await), [a3]);

    let delivered = store.delivery(APP, a2).await.unwrap().unwrap();
    assert_eq!(delivered.status, DeliveryStatus::Delivered);
    assert_eq!(delivered.delivered_at_ms, Some(retry_at + 1));
    let history: Vec<(u32, Option<u16>)> = delivered
        .history
        .iter()
        .map(|a| (a.attempt, a.status))
        .collect();
    assert_eq!(history, [(1, Some(500)), (2, Some(200))]);
}

/// A node that dies holding a lease loses it once it expires: another node claims the
/// same delivery (same `webhook-id`), and the late answer of the first records nothing.
pub async fn an_expired_lease_is_claimed_again(store: &dyn Store) {
    ingest_sync(
        store,
        &rules(PRESENCE),
        presence("p1", "u1", "ONLINE", 1),
        T0,
    )
    .await;
    let taken = claim(store, "node-a", T0, 10).await;
    assert_eq!(taken.len(), 1);
    let until = T0 + LEASE_MS;
    assert!(claim(store, "node-b", until - 1, 10).await.is_empty());
    let retaken = claim(store, "node-b", until, 10).await;
    assert_eq!(ids(&retaken), ids(&taken));
    assert_eq!(retaken[0].webhook_id, taken[0].webhook_id);
    assert_eq!(retaken[0].lease_owner.as_deref(), Some("node-b"));
    assert_eq!(retaken[0].attempts, 2, "the lost request counts");
    assert!(
        !answer(store, "node-a", &taken[0], Verdict::Delivered, until + 1).await,
        "node-a no longer holds it"
    );
    assert_eq!(
        store
            .delivery(APP, taken[0].id)
            .await
            .unwrap()
            .unwrap()
            .status,
        DeliveryStatus::InFlight
    );
    assert!(answer(store, "node-b", &retaken[0], Verdict::Delivered, until + 2).await);
    let done = store.delivery(APP, taken[0].id).await.unwrap().unwrap();
    assert_eq!(done.status, DeliveryStatus::Delivered);
    assert_eq!(
        done.history.len(),
        1,
        "only the lease holder's answer is recorded"
    );
}

/// Releasing deliveries claimed but never sent undoes their claims, only for those the
/// releasing node still holds in flight: a first attempt goes back to `pending`, a retry
/// to `retrying` due at once, each without the claim's attempt, and both are claimable
/// again at once, by any node, long before their leases would have run out.
pub async fn released_deliveries_are_claimable_at_once(store: &dyn Store) {
    for (id, user) in [("p1", "u1"), ("p2", "u2"), ("p3", "u3")] {
        ingest_sync(store, &rules(PRESENCE), presence(id, user, "ONLINE", 1), T0).await;
    }
    let taken = claim(store, "node-a", T0, 3).await;
    assert_eq!(taken.len(), 3);
    let (fresh, retried, kept) = (&taken[0], &taken[1], &taken[2]);
    // The second one failed once and is claimed again for its retry.
    let retry = Verdict::RetryAt {
        at_ms: T0 + 1_000,
        error: "HTTP 500".into(),
    };
    assert!(answer(store, "node-a", retried, retry, T0 + 10).await);
    let again = claim(store, "node-a", T0 + 1_000, 3).await;
    assert_eq!(ids(&again), [retried.id]);
    assert_eq!(again[0].attempts, 2);

    let at = T0 + 1_500;
    assert_eq!(
        store
            .release_deliveries("node-b", &[fresh.id, retried.id], at)
            .await
            .expect("release"),
        0,
        "another node's claims are not released"
    );
    assert_eq!(
        store
            .release_deliveries("node-a", &[fresh.id, retried.id], at)
            .await
            .expect("release"),
        2
    );
    assert_eq!(
        store
            .release_deliveries("node-a", &[fresh.id], at)
            .await
            .expect("release"),
        0,
        "released once"
    );
    let row = |id: i64| async move { store.delivery(APP, id).await.unwrap().unwrap() };
    let released = row(fresh.id).await;
    assert_eq!(
        (
            released.status,
            released.attempts,
            released.next_attempt_at_ms
        ),
        (DeliveryStatus::Pending, 0, None)
    );
    assert_eq!(
        (released.lease_owner, released.lease_until_ms),
        (None, None)
    );
    let released = row(retried.id).await;
    assert_eq!(
        (
            released.status,
            released.attempts,
            released.next_attempt_at_ms
        ),
        (DeliveryStatus::Retrying, 1, Some(at))
    );
    assert_eq!(released.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(
        (released.lease_owner, released.lease_until_ms),
        (None, None)
    );
    assert_eq!(row(kept.id).await.status, DeliveryStatus::InFlight);

    let retaken = claim(store, "node-b", at, 10).await;
    assert_eq!(ids(&retaken), [fresh.id, retried.id]);
    assert_eq!(
        retaken.iter().map(|d| d.attempts).collect::<Vec<_>>(),
        [1, 2],
        "the released claims did not count"
    );
    assert!(answer(store, "node-b", &retaken[1], Verdict::Delivered, at + 1).await);
    assert_eq!(
        row(retried.id).await.history.len(),
        2,
        "the failed attempt and the delivered one"
    );
}

/// A claim hands each delivery over with its event's body; a batch of verdicts is
/// recorded in one call, each only if its sender still holds the lease, with the same
/// attempt history, retry time and dead end as one verdict at a time.
pub async fn a_batch_of_verdicts_records_only_the_lease_holders(store: &dyn Store) {
    for (id, user) in [("p1", "u1"), ("p2", "u2"), ("p3", "u3")] {
        ingest_sync(store, &rules(PRESENCE), presence(id, user, "ONLINE", 1), T0).await;
    }
    let mut taken = claim(store, "node-a", T0, 2).await;
    taken.extend(claim(store, "node-a", T0 + 1_000, 1).await);
    assert_eq!(taken.len(), 3);
    for d in &taken {
        let event = store.event(PRESENCE, &d.event_id).await.unwrap().unwrap();
        assert_eq!(
            d.body.as_deref(),
            Some(event.body.as_slice()),
            "{}",
            d.event_id
        );
        assert_eq!(d.event_headers, event.headers);
    }
    let (d1, d2, d3) = (&taken[0], &taken[1], &taken[2]);
    let retaken = claim(store, "node-b", T0 + LEASE_MS, 10).await;
    assert_eq!(ids(&retaken), [d1.id, d2.id], "d3's lease still holds");

    let pending = |d: &DeliveryRecord, verdict: Verdict, status: u16, at: i64| PendingVerdict {
        id: d.id,
        verdict,
        attempt: AttemptRecord::new(d.attempts as u32, at, 7, &AttemptResult::http(status, None)),
        at_ms: at,
    };
    let late = T0 + LEASE_MS + 10;
    let recorded = store
        .record_delivery_attempts(
            "node-a",
            &[
                pending(d1, Verdict::Delivered, 200, late),
                pending(d3, dead(), 500, late),
                pending(d2, Verdict::Delivered, 200, late),
            ],
        )
        .await
        .expect("record a batch");
    assert_eq!(recorded, [false, true, false], "node-a holds only d3 now");
    let retry_at = late + 5_000;
    let retry = Verdict::RetryAt {
        at_ms: retry_at,
        error: "HTTP 503".into(),
    };
    let recorded = store
        .record_delivery_attempts(
            "node-b",
            &[
                pending(&retaken[0], Verdict::Delivered, 200, late + 1),
                pending(&retaken[1], retry, 503, late + 2),
            ],
        )
        .await
        .expect("record a batch");
    assert_eq!(recorded, [true, true]);

    let read = |id| async move { store.delivery(APP, id).await.unwrap().unwrap() };
    let (r1, r2, r3) = (read(d1.id).await, read(d2.id).await, read(d3.id).await);
    assert_eq!(r1.status, DeliveryStatus::Delivered);
    assert_eq!(r1.delivered_at_ms, Some(late + 1));
    assert_eq!(r1.lease_owner, None);
    let history = |d: &DeliveryRecord| -> Vec<(u32, Option<u16>)> {
        d.history.iter().map(|a| (a.attempt, a.status)).collect()
    };
    assert_eq!(history(&r1), [(2, Some(200))], "only node-b's answer");
    assert_eq!(r2.status, DeliveryStatus::Retrying);
    assert_eq!(r2.next_attempt_at_ms, Some(retry_at));
    assert_eq!(r2.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(history(&r2), [(2, Some(503))]);
    assert_eq!(r3.status, DeliveryStatus::Dead);
    assert_eq!(r3.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(history(&r3), [(1, Some(500))]);
    assert!(store
        .record_delivery_attempts("node-b", &[])
        .await
        .unwrap()
        .is_empty());
}

/// A dead in-order delivery holds its aggregate only, until it is skipped; the figures
/// of `GET /v1/destinations` count it.
pub async fn a_dead_in_order_delivery_blocks_only_its_aggregate(store: &dyn Store) {
    let saves = rules(SAVES);
    for s in ["slot_a", "slot_b"] {
        for seq in 1..=2 {
            let id = format!("{s}-{seq}");
            ingest_sync(store, &saves, delta(&id, s, seq, 1), T0).await;
        }
    }
    let app = all(store, APP).await;
    let (a1, a2, b1, b2) = (app[0].id, app[1].id, app[2].id, app[3].id);
    let first = claim(store, "n", T0, 10).await;
    assert_eq!(ids(&first), [a1, b1]);
    assert!(answer(store, "n", &first[0], dead(), T0 + 1).await);
    assert!(answer(store, "n", &first[1], Verdict::Delivered, T0 + 1).await);
    assert_eq!(
        ids(&claim(store, "n", T0 + 2, 10).await),
        [b2],
        "slot_a is blocked"
    );
    assert!(claim(store, "n", T0 + 3, 10).await.is_empty());

    let stats = store.destination_stats(APP).await.expect("stats");
    assert_eq!(
        (
            stats.backlog,
            stats.in_flight,
            stats.dead,
            stats.blocked_aggregates
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(stats.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(store.destination_stats("audit").await.unwrap().backlog, 4);

    assert_eq!(
        store.skip_delivery(APP, b1).await.unwrap(),
        DeliverySkip::NotSkippable(DeliveryStatus::Delivered)
    );
    assert_eq!(
        store.skip_delivery(APP, 999_999).await.unwrap(),
        DeliverySkip::NotFound
    );
    assert_eq!(
        store.skip_delivery("audit", a1).await.unwrap(),
        DeliverySkip::NotFound,
        "a delivery id is its destination's"
    );
    assert_eq!(
        store.skip_delivery(APP, a1).await.unwrap(),
        DeliverySkip::Skipped
    );
    assert_eq!(ids(&claim(store, "n", T0 + 4, 10).await), [a2], "unblocked");
    let stats = store.destination_stats(APP).await.unwrap();
    assert_eq!((stats.dead, stats.blocked_aggregates), (0, 0));
}

/// Replay requeues a dead or skipped delivery, answers `superseded` when a newer one of
/// its lane was delivered, refuses other statuses and never reorders an in-order queue;
/// a replay requeued while the newer one was on the wire is superseded at the claim.
pub async fn replays_requeue_supersede_or_refuse(store: &dyn Store) {
    let presence_rules = rules(PRESENCE);
    for seq in 1..=2 {
        let id = format!("u{seq}");
        ingest_sync(
            store,
            &presence_rules,
            presence(&id, "u", "ONLINE", seq),
            T0,
        )
        .await;
    }
    let app = all(store, APP).await;
    let (u1, u2) = (app[0].id, app[1].id);
    let c = claim(store, "n", T0, 10).await;
    assert!(answer(store, "n", &c[0], dead(), T0 + 1).await);
    let c = claim(store, "n", T0 + 2, 10).await;
    assert_eq!(ids(&c), [u2], "a dead snapshot does not block");
    assert_eq!(
        store.replay_delivery(APP, u2).await.unwrap(),
        DeliveryReplay::NotReplayable(DeliveryStatus::InFlight)
    );
    // Requeued while the newer one is on the wire: the claim catches it afterwards.
    assert_eq!(
        store.replay_delivery(APP, u1).await.unwrap(),
        DeliveryReplay::Requeued
    );
    assert!(answer(store, "n", &c[0], Verdict::Delivered, T0 + 3).await);
    assert!(
        claim(store, "n", T0 + 4, 10).await.is_empty(),
        "superseded, not sent"
    );
    let superseded = store.delivery(APP, u1).await.unwrap().unwrap();
    assert_eq!(superseded.status, DeliveryStatus::Skipped);
    assert_eq!(superseded.attempts, 0, "a replay starts a fresh budget");
    assert_eq!(
        store.replay_delivery(APP, u1).await.unwrap(),
        DeliveryReplay::Superseded { by: u2 }
    );
    assert_eq!(
        store.replay_delivery(APP, 999_999).await.unwrap(),
        DeliveryReplay::NotFound
    );

    // In order: a skipped delta cannot be replayed after a later one went.
    let saves = rules(SAVES);
    ingest_sync(store, &saves, delta("a1", "slot_a", 1, 1), T0).await;
    ingest_sync(store, &saves, delta("a2", "slot_a", 2, 1), T0).await;
    let achievement = save(
        "x3",
        "slot_a",
        "achievement.unlocked",
        3,
        json!({"achievement_id": "first_letter"}),
    );
    ingest_sync(store, &saves, achievement, T0).await;
    let slot_a: Vec<i64> = all(store, APP).await[2..].iter().map(|d| d.id).collect();
    let c = claim(store, "n", T0 + 5, 10).await;
    assert_eq!(ids(&c), [slot_a[0]]);
    assert!(answer(store, "n", &c[0], dead(), T0 + 6).await);
    assert_eq!(
        store.replay_delivery(APP, slot_a[0]).await.unwrap(),
        DeliveryReplay::Requeued,
        "nothing after it went: it is sent in its place"
    );
    let c = claim(store, "n", T0 + 7, 10).await;
    assert_eq!((ids(&c), c[0].attempts), (vec![slot_a[0]], 1));
    assert!(answer(store, "n", &c[0], dead(), T0 + 8).await);
    assert_eq!(
        store.skip_delivery(APP, slot_a[0]).await.unwrap(),
        DeliverySkip::Skipped
    );
    let c = claim(store, "n", T0 + 9, 10).await;
    assert_eq!(ids(&c), [slot_a[1]]);
    assert!(answer(store, "n", &c[0], Verdict::Delivered, T0 + 10).await);
    assert_eq!(
        store.replay_delivery(APP, slot_a[0]).await.unwrap(),
        DeliveryReplay::WouldReorder { after: slot_a[1] }
    );
    // Order-free: always replayable.
    let c = claim(store, "n", T0 + 11, 10).await;
    assert_eq!(ids(&c), [slot_a[2]]);
    assert!(answer(store, "n", &c[0], dead(), T0 + 12).await);
    assert_eq!(
        store.replay_delivery(APP, slot_a[2]).await.unwrap(),
        DeliveryReplay::Requeued
    );
    assert_eq!(ids(&claim(store, "n", T0 + 13, 10).await), [slot_a[2]]);
}

/// Listings page newest first and filter by status and aggregate.
pub async fn deliveries_page_newest_first_and_filter(store: &dyn Store) {
    let presence_rules = rules(PRESENCE);
    for (n, user) in ["u1", "u2", "u3", "u1", "u2"].iter().enumerate() {
        let id = format!("p{n}");
        ingest_sync(
            store,
            &presence_rules,
            presence(&id, user, "ONLINE", n as i64 + 1),
            T0,
        )
        .await;
    }
    let every = all(store, APP).await;
    assert_eq!(every.len(), 5);
    let page = store
        .deliveries(APP, &DeliveryFilter::default(), 3, None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), [every[4].id, every[3].id, every[2].id]);
    assert_eq!(page.next_cursor, Some(every[2].id));
    let rest = store
        .deliveries(APP, &DeliveryFilter::default(), 3, page.next_cursor)
        .await
        .unwrap();
    assert_eq!(ids(&rest.items), [every[1].id, every[0].id]);
    assert_eq!(rest.next_cursor, None);

    let of_u1 = DeliveryFilter {
        aggregate: Some("u1".into()),
        ..DeliveryFilter::default()
    };
    let u1 = store.deliveries(APP, &of_u1, 10, None).await.unwrap();
    assert_eq!(ids(&u1.items), [every[3].id, every[0].id]);
    let claimed = claim(store, "n", T0, 10).await;
    assert_eq!(ids(&claimed), [every[0].id, every[1].id, every[2].id]);
    let in_flight = DeliveryFilter {
        status: Some(DeliveryStatus::InFlight),
        aggregate: Some("u2".into()),
    };
    let u2 = store.deliveries(APP, &in_flight, 10, None).await.unwrap();
    assert_eq!(ids(&u2.items), [every[1].id]);
}

/// Claimers on several store handles (nodes) racing never lease two deliveries of one
/// aggregate, and between them claim the head of every aggregate.
pub async fn racing_claimers_never_lease_two_of_one_aggregate(open: Opener) {
    let store = open();
    let saves = rules(SAVES);
    let slots: Vec<String> = (0..6).map(|n| format!("slot_{n}")).collect();
    for s in &slots {
        for seq in 1..=3 {
            let id = format!("{s}-{seq}");
            ingest_sync(&*store, &saves, delta(&id, s, seq, 1), T0).await;
        }
    }
    let nodes: Vec<Arc<dyn Store>> = (0..4).map(|_| open()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, node) in nodes.iter().enumerate() {
        for round in 0..3 {
            let node = Arc::clone(node);
            tasks.spawn(async move {
                let owner = format!("node-{n}-{round}");
                node.claim_deliveries(APP, &owner, T0, T0 + LEASE_MS, 4)
                    .await
                    .expect("claim")
            });
        }
    }
    let mut claimed = Vec::new();
    while let Some(done) = tasks.join_next().await {
        claimed.extend(done.expect("claimer"));
    }
    claimed.extend(claim(&*store, "late", T0, 100).await);
    let mut per_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for d in &claimed {
        per_aggregate
            .entry(d.aggregate.clone())
            .or_default()
            .push(d.id);
    }
    assert_eq!(
        per_aggregate.len(),
        slots.len(),
        "every aggregate's head claimed"
    );
    for (aggregate, ids) in &per_aggregate {
        assert_eq!(ids.len(), 1, "{aggregate}: two leased at once: {ids:?}");
    }
    let heads: HashSet<i64> = claimed.iter().map(|d| d.id).collect();
    let every = all(&*store, APP).await;
    for d in every.iter().filter(|d| d.sequence == 1) {
        assert!(heads.contains(&d.id), "not the head claimed: {d:?}");
    }
}

/// A node that crashes mid-request (the store dropped, nothing recorded) leaves the
/// delivery to be claimed again, same `webhook-id`, once its lease ends.
pub async fn a_crashed_claim_is_claimed_again_after_its_lease(open: Opener) {
    let first = open();
    ingest_sync(
        &*first,
        &rules(PRESENCE),
        presence("p1", "u1", "ONLINE", 1),
        T0,
    )
    .await;
    let taken = claim(&*first, "dies", T0, 10).await;
    assert_eq!(taken.len(), 1);
    drop(first);
    let reopened = open();
    assert!(claim(&*reopened, "lives", T0 + LEASE_MS - 1, 10)
        .await
        .is_empty());
    let again = claim(&*reopened, "lives", T0 + LEASE_MS, 10).await;
    assert_eq!(ids(&again), ids(&taken));
    assert_eq!(again[0].webhook_id, taken[0].webhook_id);
    assert_eq!(again[0].lease_owner.as_deref(), Some("lives"));
}

/// A bulk replay walks the destination's queues from a stored cursor, replaying each
/// matching delivery by the single replay's rules (a superseded one stays dead).
pub async fn a_bulk_replay_requeues_dead_deliveries_queue_by_queue(store: &dyn Store) {
    let presence_rules = rules(PRESENCE);
    for (id, user, seq) in [
        ("u1a", "u1", 1),
        ("u1b", "u1", 2),
        ("u2a", "u2", 1),
        ("u3a", "u3", 1),
    ] {
        ingest_sync(
            store,
            &presence_rules,
            presence(id, user, "ONLINE", seq),
            T0,
        )
        .await;
    }
    let saves = rules(SAVES);
    ingest_sync(store, &saves, delta("a1", "slot_a", 1, 1), T0).await;
    ingest_sync(store, &saves, delta("a2", "slot_a", 2, 1), T0).await;
    let app = all(store, APP).await;
    let heads = claim(store, "n", T0, 10).await;
    assert_eq!(ids(&heads), [app[0].id, app[2].id, app[3].id, app[4].id]);
    for d in &heads {
        assert!(answer(store, "n", d, dead(), T0 + 1).await);
    }
    let newer = claim(store, "n", T0 + 2, 10).await;
    assert_eq!(
        ids(&newer),
        [app[1].id],
        "slot_a is blocked, u1's snapshot is not"
    );
    assert!(answer(store, "n", &newer[0], Verdict::Delivered, T0 + 3).await);

    let job = store
        .create_delivery_replay_job(APP, &DeliveryFilter::default(), T0 + 4)
        .await
        .expect("create job");
    assert_eq!((job.total, job.state.as_str()), (4, "running"));
    assert_eq!(job.filter.status, Some(DeliveryStatus::Dead));
    assert_eq!(
        store.advance_delivery_replay_jobs(T0 + 5, 2).await.unwrap(),
        1
    );
    assert_eq!(
        store.advance_delivery_replay_jobs(T0 + 6, 2).await.unwrap(),
        2
    );
    assert_eq!(
        store.advance_delivery_replay_jobs(T0 + 7, 2).await.unwrap(),
        0
    );
    let done = store
        .delivery_replay_job(job.id)
        .await
        .unwrap()
        .expect("job");
    assert_eq!(
        (done.state.as_str(), done.requeued, done.updated_at_ms),
        ("done", 3, T0 + 7)
    );
    let status = |d: &DeliveryRecord| d.status;
    let now: Vec<DeliveryStatus> = all(store, APP).await.iter().map(status).collect();
    use DeliveryStatus::*;
    assert_eq!(
        now,
        [Dead, Delivered, Pending, Pending, Pending, Pending],
        "u1's dead snapshot is superseded by its delivered newer one"
    );
    assert_eq!(
        store.advance_delivery_replay_jobs(T0 + 8, 2).await.unwrap(),
        0
    );
    let audit = store
        .create_delivery_replay_job("audit", &DeliveryFilter::default(), T0 + 9)
        .await
        .unwrap();
    assert_eq!(
        audit.total, 0,
        "another destination's deliveries are its own"
    );
    assert_eq!(store.delivery_replay_job(999_999).await.unwrap(), None);
}

/// Retention keeps an applied event's body while a destination has yet to get it (or
/// may get it again by a replay), and purges it once every delivery is decided.
pub async fn retention_keeps_events_a_destination_still_needs(store: &dyn Store) {
    use inhook::store::EventFilter;
    ingest_sync(
        store,
        &rules(PRESENCE),
        presence("p1", "u1", "ONLINE", 1),
        T0,
    )
    .await;
    let (before, keep_until) = (T0 + 10_000, T0 + 100_000);
    let kept = store
        .purge(before, keep_until, T0 + 20_000, 100)
        .await
        .unwrap();
    assert_eq!(kept.events, 0, "pending delivery: kept");
    let taken = claim(store, "n", T0 + 1, 10).await;
    assert!(answer(store, "n", &taken[0], dead(), T0 + 2).await);
    let kept = store
        .purge(before, keep_until, T0 + 20_000, 100)
        .await
        .unwrap();
    assert_eq!(kept.events, 0, "dead delivery, replayable: kept");
    assert_eq!(
        store.skip_delivery(APP, taken[0].id).await.unwrap(),
        DeliverySkip::Skipped
    );
    let purged = store
        .purge(before, keep_until, T0 + 20_000, 100)
        .await
        .unwrap();
    assert_eq!(purged.events, 1);
    let left = store
        .events(&EventFilter::default(), 10, None)
        .await
        .unwrap();
    assert!(left.items.is_empty());
}

/// A claim passes over the queues another node is claiming (its transaction open, their
/// locks taken on the queue key texts as every version takes them) and fills its limit
/// from the later queues; once that node is done, the held queues are claimed. `hold`
/// takes the locks of the keys it is given and answers, once they are held, what
/// releases them.
pub async fn a_claim_passes_over_queues_another_node_holds<H, F, R, D>(store: &dyn Store, hold: H)
where
    H: FnOnce(Vec<String>) -> F,
    F: std::future::Future<Output = R>,
    R: FnOnce() -> D,
    D: std::future::Future<Output = ()>,
{
    let saves = rules(SAVES);
    let slots: Vec<String> = (0..8).map(|n| format!("slot_{n}")).collect();
    for seq in 1..=2 {
        for s in &slots {
            ingest_sync(store, &saves, delta(&format!("{s}-{seq}"), s, seq, 1), T0).await;
        }
    }
    let heads: Vec<DeliveryRecord> = all(store, APP)
        .await
        .into_iter()
        .filter(|d| d.sequence == 1)
        .collect();
    assert_eq!(heads.len(), slots.len());
    let held: Vec<String> = heads[..3]
        .iter()
        .map(|d| {
            format!(
                "deliveries\u{1f}{APP}\u{1f}{}\u{1f}{}",
                d.source, d.aggregate
            )
        })
        .collect();
    let release = hold(held).await;
    assert_eq!(
        ids(&claim(store, "node-b", T0, 4).await),
        ids(&heads[3..7]),
        "the oldest four queues not held"
    );
    assert_eq!(ids(&claim(store, "node-b", T0, 10).await), ids(&heads[7..]));
    release().await;
    assert_eq!(
        ids(&claim(store, "node-b", T0, 10).await),
        ids(&heads[..3]),
        "the held queues once their holder is done"
    );
}

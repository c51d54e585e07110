//! End-to-end tests: the real binary, real HTTP, the real store (SQLite, or
//! PostgreSQL when `INHOOK_TEST_DATABASE` is set).

mod support;

mod admin_auth;
mod aggregate_keys;
mod application;
mod bench;
mod conformance;
mod connections;
mod crash;
mod durability;
mod encryption;
mod event_log;
mod examples;
mod forward_crash;
mod forwarding;
mod forwarding_ahead;
mod held_limits;
mod hostile_ingress;
mod hygiene;
mod json_permutations;
mod json_sources;
mod masking;
mod metrics;
mod multinode;
mod openapi;
mod outbound_tls;
mod postgres_outage;
mod postgres_tls;
mod presence;
mod rejections;
mod retries;
mod revocation;
mod save_game;
mod signatures;
mod simulate;
mod sink_nats;
mod sink_rabbitmq;
mod sink_redis;
mod sinks;
mod slow_clients;
mod store_conformance;
mod stream;
mod telemetry;
mod text_order;
mod upgrade;

//! End-to-end tests: the real binary, real HTTP, the real SQLite file.

mod support;

mod crash;
mod durability;
mod event_log;
mod presence;
mod rejections;
mod retries;
mod save_game;
mod simulate;

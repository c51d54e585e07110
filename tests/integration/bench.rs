//! `inhook bench --duration-s --sample-ms` (issue #14): flat out for a time, reading the
//! overview with the admin token as it sends, then the run end to end.

use inhook::domain::EventStatus;

use crate::support::TestServer;

const TOKEN: &str = "bench-admin-token";

/// The number after `prefix` in the first line of `out` that holds it.
fn number_after(out: &str, prefix: &str) -> u64 {
    let at = out
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in {out}"));
    out[at + prefix.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in {out}"))
}

#[tokio::test]
async fn a_timed_run_samples_the_overview_and_reports_what_it_accepted_and_decided() {
    let server = TestServer::spawn_configured(&format!("admin_token = \"{TOKEN}\""), "").await;
    let pid = server.pid().to_string();
    let (ok, out) = server.cli(&[
        "bench",
        "--url",
        &server.url,
        "--duration-s",
        "2",
        "--sample-ms",
        "250",
        "--connections",
        "4",
        "--run-id",
        "timed",
        "--server-pid",
        &pid,
    ]);
    assert!(ok, "{out}");
    let sent: u64 = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("bench: ")?
                .split_once(" requests in ")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no request count in {out}"));
    assert!(sent > 0, "{out}");
    assert!(
        out.contains(&format!("answers {{\"202\": {sent}}}")),
        "{out}"
    );
    assert!(
        out.contains("bench: at ") && out.contains(" backlog "),
        "{out}"
    );
    assert_eq!(number_after(&out, "end to end: accepted "), sent, "{out}");
    let decided = number_after(&out, "decided during the run ");
    assert!(decided <= sent, "{out}");
    assert!(out.contains("s after the last answer"), "{out}");
    assert!(
        out.contains("server RSS MiB, highest per minute: "),
        "{out}"
    );
    // The drain it reports is over: the store holds every sent event, decided.
    let logged = server.logged().await;
    assert_eq!(logged.len() as u64, sent);
    assert!(
        logged.iter().all(|e| e.status == EventStatus::Processed),
        "an event left undecided after the reported drain"
    );
}

#[tokio::test]
async fn sampling_without_the_admin_token_says_how_to_pass_it() {
    let server = TestServer::spawn_configured(&format!("admin_token = \"{TOKEN}\""), "").await;
    let (ok, out) = crate::support::run_cli(
        &[
            "bench",
            "--url",
            &server.url,
            "--events",
            "10",
            "--sample-ms",
            "100",
            "--secret",
            crate::support::SAVE_SECRETS[0],
        ]
        .map(std::ffi::OsStr::new),
        &[("INHOOK_ADMIN_TOKEN", "")],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("pass --admin-token or set INHOOK_ADMIN_TOKEN"),
        "{out}"
    );
    assert_eq!(
        server.count().await,
        0,
        "nothing is sent before the overview answers"
    );
}

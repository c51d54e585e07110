#!/usr/bin/env python3
"""Issue #25 item 5: what unauthenticated `/metrics` scrapes cost ingest.

Starts BINARY (`inhook serve`) on a fresh SQLite store holding DEAD dead deliveries (each
in-order, on an aggregate of its own: that many blocked aggregates), with
`metrics_public = true`; then sends signed deliveries one after another, first with no
scraper, then while SCRAPERS threads each fetch `/metrics` every SCRAPE_INTERVAL seconds
(default 1: eight Prometheus servers scraping every second); prints the p50 and p99
latency of each phase, their ratio, and how long a scrape took.

  scripts/scrape_load.py BINARY [DEAD] [SCRAPERS]

Run it on two builds in one sitting to compare them (the machine is shared and noisy).
"""
import hashlib, hmac, json, os, socket, sqlite3, subprocess, sys, tempfile, threading, time
import http.client

DEAD = int(sys.argv[2]) if len(sys.argv) > 2 else 400_000
SCRAPERS = int(sys.argv[3]) if len(sys.argv) > 3 else 8
DELIVERIES = int(os.environ.get("DELIVERIES", "300"))
SCRAPE_INTERVAL = float(os.environ.get("SCRAPE_INTERVAL", "1"))
SECRET = b"scrape-load-secret"
CONFIG = """listen = "127.0.0.1:0"
database = "sqlite://{dir}/inhook.db"
metrics_public = true
[[sources]]
name = "ledger"
kind = "json"
signature = "hmac-hex"
mode = "sync"
secrets = ["scrape-load-secret"]
event_id = "/event_id"
ordering = "unordered"
[[sources]]
name = "other"
kind = "json"
signature = "hmac-hex"
secrets = ["other-secret"]
event_id = "/event_id"
aggregate = "/k"
sequence = "/n"
ordering = "in-order"
[[destinations]]
name = "app"
url = "http://127.0.0.1:9/hooks"
sources = ["other"]
secret = "whsec_c2NyYXBlLWxvYWQtZGVzdGluYXRpb24="
"""

stop = threading.Event()


def fill_dead(path):
    db = sqlite3.connect(path)
    now = int(time.time() * 1000)
    rows = ((f"e{i}", f"k{i}", f"msg_{i}", now) for i in range(DEAD))
    db.executemany(
        "INSERT INTO deliveries (destination, source, event_row, event_id, aggregate, sequence,"
        " event_type, webhook_id, ordering, status, attempts, last_error, created_at)"
        " VALUES ('app', 'other', 0, ?, ?, 1, 't', ?, 'in-order', 'dead', 8, 'HTTP 500', ?)",
        rows,
    )
    db.commit()
    db.close()


def post(port, n):
    body = json.dumps({"event_id": f"evt-{n}-{time.time_ns()}", "amount": n}).encode()
    signature = hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.perf_counter()
    conn.request("POST", "/webhooks/ledger", body,
                 {"Content-Type": "application/json", "X-Signature": signature})
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return answer.status, time.perf_counter() - started


def scraper(port, took):
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        started = time.perf_counter()
        try:
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            took.append(time.perf_counter() - started)
        except OSError:
            pass
        finally:
            conn.close()
        stop.wait(max(0.0, SCRAPE_INTERVAL - (time.perf_counter() - started)))


def phase(port):
    latencies, codes = [], {}
    for n in range(DELIVERIES):
        code, took = post(port, n)
        codes[code] = codes.get(code, 0) + 1
        latencies.append(took)
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
    return pick(0.5), pick(0.99), codes


def main():
    binary = sys.argv[1]
    work = tempfile.mkdtemp(prefix="inhook-scrape-")
    config = os.path.join(work, "inhook.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(dir=work))
    env = dict(os.environ, INHOOK_LOG="warn", INHOOK_ADMIN_OPEN_TO_LOOPBACK="true")
    subprocess.run([binary, "--config", config, "migrate"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    filled = time.perf_counter()
    fill_dead(os.path.join(work, "inhook.db"))
    print(f"{DEAD} dead deliveries written in {time.perf_counter() - filled:.1f} s")
    server = subprocess.Popen([binary, "--config", config, "serve"], env=env,
                              stdout=subprocess.PIPE, stderr=open(os.path.join(work, "err"), "w"))
    line = server.stdout.readline().decode()
    port = int(line.rsplit(":", 1)[1])
    try:
        quiet = phase(port)
        took = []
        threads = [threading.Thread(target=scraper, args=(port, took), daemon=True)
                   for _ in range(SCRAPERS)]
        for t in threads:
            t.start()
        time.sleep(1)
        loaded = phase(port)
        stop.set()
        scrape_ms = sorted(took)[len(took) // 2] * 1000 if took else float("nan")
        print(f"no scraper:   p50 {quiet[0]:.1f} ms, p99 {quiet[1]:.1f} ms, answers {quiet[2]}")
        print(f"{SCRAPERS} scrapers:  p50 {loaded[0]:.1f} ms, p99 {loaded[1]:.1f} ms, "
              f"answers {loaded[2]}; {len(took)} scrapes, p50 {scrape_ms:.1f} ms")
        print(f"with/without: p50 {loaded[0] / quiet[0]:.2f}x, p99 {loaded[1] / quiet[1]:.2f}x")
    finally:
        stop.set()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Issue #25 item 1: slow bodies against genuine deliveries.

Holds SLOW connections from the attacker addresses, each declaring a 256 KiB body and
trickling one byte every TRICKLE seconds (reconnecting when answered), while one client
on GENUINE_ADDR sends signed deliveries; prints their answer codes and p50/p99 latency.

  scripts/slowloris.py BINARY [SECONDS]

Starts BINARY (`inhook serve`) itself on 127.0.0.1 with the `ledger` source of
docs/examples/plain-hmac.toml, in a temporary directory. Needs ulimit -n above SLOW.
"""
import collections, hashlib, hmac, json, os, socket, subprocess, sys, tempfile, threading, time

SLOW = int(os.environ.get("SLOW", "256"))
TRICKLE = float(os.environ.get("TRICKLE", "3"))
ATTACKERS = os.environ.get("ATTACKERS", "127.0.0.1,127.0.0.3").split(",")
GENUINE_ADDR = os.environ.get("GENUINE_ADDR", "127.0.0.2")
SECRET = b"slowloris-secret"
CONFIG = """listen = "0.0.0.0:{port}"
database = "sqlite://{dir}/inhook.db"
[[sources]]
name = "ledger"
kind = "json"
signature = "hmac-hex"
mode = "sync"
event_id = "/event_id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
first_sequence = 1
event_type = "/type"
"""

stop = threading.Event()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def slow_client(port, addr):
    """One slow body at a time, for ever: reconnects after each answer or reset."""
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(addr, 0))
            s.sendall(b"POST /webhooks/ledger HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"X-Signature: 00\r\nContent-Length: 262144\r\n\r\n")
            s.setblocking(False)
            while not stop.is_set():
                try:
                    if s.recv(1024) == b"":
                        break
                    break  # answered (408, 503, ...): reconnect
                except BlockingIOError:
                    pass
                s.sendall(b" ")
                stop.wait(TRICKLE)
            s.close()
        except OSError:
            stop.wait(0.2)


def genuine(port, n):
    body = json.dumps({"event_id": f"led_{n}", "type": "entry.posted", "account": f"acct_{n}",
                       "seq": 1, "entry": {}, "balance_cents": 1}).encode()
    sig = hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    req = (f"POST /webhooks/ledger HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"X-Signature: {sig}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    started = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(GENUINE_ADDR, 0))
        s.sendall(req)
        answer = s.recv(64)
        s.close()
        code = answer.split(b" ")[1].decode() if answer else "closed"
    except OSError as err:
        code = type(err).__name__
    return code, time.monotonic() - started


def main():
    binary, seconds = sys.argv[1], float(sys.argv[2] if len(sys.argv) > 2 else 40)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/inhook.toml", "w") as f:
            f.write(CONFIG.format(port=port, dir=tmp))
        env = dict(os.environ, INHOOK_LEDGER_SECRET=SECRET.decode(), INHOOK_LOG="error")
        server = subprocess.Popen([binary, "serve", "--config", f"{tmp}/inhook.toml"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            threads = [threading.Thread(target=slow_client, args=(port, ATTACKERS[i % len(ATTACKERS)]), daemon=True)
                       for i in range(SLOW)]
            for t in threads:
                t.start()
            time.sleep(5)  # let the slow bodies settle in
            codes, latencies, n = collections.Counter(), [], 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                code, latency = genuine(port, n)
                codes[code] += 1
                latencies.append(latency)
                n += 1
                time.sleep(0.2)
            latencies.sort()
            p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
            print(f"{binary}: {SLOW} slow bodies from {','.join(ATTACKERS)}; {n} genuine deliveries "
                  f"from {GENUINE_ADDR}: codes {dict(codes)}, p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms")
        finally:
            stop.set()
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()

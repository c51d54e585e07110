#!/usr/bin/env python3
"""PostgreSQL's own CPU time spent for one database, for CPU per event beside inhook's.

Usage: scripts/pg_cpu.py URL DBNAME OUT  (runs until SIGTERM or SIGINT, then writes OUT)

Every half second it lists the server processes connected to DBNAME (pg_stat_activity,
through psql at URL) and reads each one's user + system time from /proc; a connection's
last reading counts, so a connection that closed keeps what it had used. It also reads the
server's background processes (the WAL writer, the checkpointer, autovacuum's launcher…)
at the start and at the end: their delta serves every database, this run's included.
OUT gets two lines: `database_cpu_s S` and `background_cpu_s S`. Linux only (/proc).
"""
import os
import signal
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None


def pids(url, condition):
    out = subprocess.run(
        ["psql", "-Atq", url, "-c",
         f"SELECT pid FROM pg_stat_activity WHERE {condition} AND pid <> pg_backend_pid()"],
        capture_output=True, text=True, check=False).stdout
    return [line for line in out.split() if line.isdigit()]


def background(url):
    return {pid: cpu_of(pid) for pid in pids(url, "backend_type <> 'client backend'")}


def main():
    url, db, out = sys.argv[1:4]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    start = background(url)
    last = {}
    while not stop:
        for pid in pids(url, f"datname = '{db}'"):
            used = cpu_of(pid)
            if used is not None:
                last[pid] = used
        time.sleep(0.5)
    with open(out, "w") as f:
        f.write(f"database_cpu_s {sum(last.values()):.3f}\n")
        end = background(url)
        spent = sum(end[p] - start[p] for p in end if end[p] is not None and start.get(p) is not None)
        f.write(f"background_cpu_s {spent:.3f}\n")


if __name__ == "__main__":
    main()

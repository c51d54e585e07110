"""Reads inhook's Redis stream entries in order and hands each event to `handle` once.

inhook adds each applied event to the stream with one XADD, per aggregate in applied
order. A resend after a crash or a lost reply can add an entry twice (same webhook-id):
this consumer keeps the first entry of each webhook-id and drops later ones, which keeps
each aggregate's events in applied order. The ids it has seen are kept in a Redis set
(SADD answers whether the id is new), so a restarted consumer still drops them.

Usage: python consumer.py [--url redis://127.0.0.1:6379/0] [--stream webhooks:ledger]
"""

import argparse
import json
import sys

import redis

FIELDS = (
    "webhook-id",
    "inhook-source",
    "inhook-event-id",
    "inhook-event-type",
    "inhook-aggregate",
    "inhook-sequence",
    "inhook-attempt",
    "content-type",
)


def handle(meta, body):
    """Your application's work: here, one line per event."""
    print(
        json.dumps(
            {
                "aggregate": meta["inhook-aggregate"],
                "sequence": meta["inhook-sequence"],
                "event_id": meta["inhook-event-id"],
                "type": meta["inhook-event-type"],
                "body": body.decode("utf-8", "replace"),
            }
        ),
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--stream", default="webhooks:ledger")
    parser.add_argument("--from-id", default="0", help="the entry id to read after")
    parser.add_argument("--once", action="store_true", help="stop at the stream's end")
    args = parser.parse_args()

    r = redis.Redis.from_url(args.url)
    seen_key = f"{args.stream}:seen-webhook-ids"
    # The position is kept too, so a restart goes on where it stopped.
    position_key = f"{args.stream}:consumer-position"
    last_id = r.get(position_key) or args.from_id.encode()
    while True:
        batch = r.xread({args.stream: last_id}, count=100, block=None if args.once else 5000)
        if not batch:
            if args.once:
                return 0
            continue
        for _stream, entries in batch:
            for entry_id, fields in entries:
                meta = {k.decode(): v.decode() for k, v in fields.items() if k != b"body"}
                body = fields.get(b"body", b"")
                missing = [f for f in FIELDS if f not in meta]
                if missing:
                    print(f"entry {entry_id.decode()} lacks {missing}", file=sys.stderr)
                elif r.sadd(seen_key, meta["webhook-id"]) == 1:
                    handle(meta, body)
                # else: a resend of an event already handled: dropped.
                last_id = entry_id
                r.set(position_key, last_id)


if __name__ == "__main__":
    sys.exit(main())

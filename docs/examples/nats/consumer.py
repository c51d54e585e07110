"""Reads inhook's messages from a JetStream stream, in stream order.

inhook publishes the events of one aggregate one at a time, each only after the previous one
was stored (its PubAck), so the stream holds each aggregate's events in applied order. A
single durable consumer that acks each message after handling it reads them in that order.

The server drops a resend inside the stream's duplicate window (Nats-Msg-Id = webhook-id),
but a consumer can still be handed a message twice (an ack lost in a crash), so handling is
made idempotent by webhook-id here too.

    pip install -r requirements.txt
    python consumer.py --server nats://127.0.0.1:4222 --stream WEBHOOKS --subject 'webhooks.>'
"""

import argparse
import asyncio
import json

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="nats://127.0.0.1:4222")
    parser.add_argument("--stream", default="WEBHOOKS")
    parser.add_argument("--subject", default="webhooks.>")
    parser.add_argument("--durable", default="webhook-reader")
    parser.add_argument("--once", action="store_true", help="stop when the stream is read")
    args = parser.parse_args()

    nc = await nats.connect(args.server)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        args.subject,
        durable=args.durable,
        stream=args.stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL),
    )
    # A real consumer keeps this in its own database, with the effect of each message.
    handled: set[str] = set()
    try:
        while True:
            try:
                batch = await sub.fetch(1, timeout=5)
            except nats.errors.TimeoutError:
                if args.once:
                    break
                continue
            for msg in batch:
                headers = msg.headers or {}
                webhook_id = headers.get("webhook-id", "")
                if webhook_id in handled:
                    await msg.ack()
                    continue
                source = headers.get("inhook-source", "")
                aggregate = headers.get("inhook-aggregate", "")
                sequence = int(headers.get("inhook-sequence", "0"))
                key = f"{source}/{aggregate}"
                # Handle the event here: messages of one aggregate come in applied order.
                print(
                    json.dumps(
                        {
                            "aggregate": key,
                            "sequence": sequence,
                            "event_type": headers.get("inhook-event-type"),
                            "event_id": headers.get("inhook-event-id"),
                            "webhook_id": webhook_id,
                            "bytes": len(msg.data),
                        }
                    )
                )
                handled.add(webhook_id)
                await msg.ack()
    finally:
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())

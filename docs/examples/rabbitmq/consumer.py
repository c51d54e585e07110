"""Reads inhook's messages from RabbitMQ in order per aggregate, once each.

inhook publishes each event persistent to the exchange, with its metadata in the
message's headers (webhook-id, inhook-source, inhook-aggregate, inhook-sequence, ...)
and message_id = webhook-id. Per aggregate, a message is published only after the
previous one was confirmed, so one queue read by one consumer sees each aggregate's
events in applied order. A message can come twice (inhook resends one whose confirm
it never saw, after a crash or a broken connection), always with the same
webhook-id: this consumer skips a webhook-id it has already handled.

    pip install -r requirements.txt
    AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f EXCHANGE=webhooks python consumer.py
"""

import base64
import hashlib
import hmac
import os
from collections import OrderedDict

import pika

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
EXCHANGE = os.environ.get("EXCHANGE", "webhooks")
QUEUE = os.environ.get("QUEUE", "webhooks-consumer")
BINDING = os.environ.get("BINDING", "#")
# The destination's secret, to check each message's Standard Webhooks signature.
SECRET = os.environ.get("INHOOK_DEST_SECRET")
# How many webhook-ids to remember: a resend comes soon after the first copy.
REMEMBER = 100_000

handled = OrderedDict()


def header(properties, name):
    value = (properties.headers or {}).get(name)
    return value.decode() if isinstance(value, bytes) else value


def signature_ok(properties, body):
    if SECRET is None:
        return True
    msg_id = header(properties, "webhook-id")
    timestamp = header(properties, "webhook-timestamp")
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = (header(properties, "webhook-signature") or "").split()
    return any(
        hmac.compare_digest(sig.split(",", 1)[-1], expected)
        for sig in offered
        if sig.startswith("v1,")
    )


def on_message(channel, method, properties, body):
    webhook_id = properties.message_id or header(properties, "webhook-id")
    if webhook_id in handled:
        # A resend of a message already handled: acknowledge and drop it.
        channel.basic_ack(method.delivery_tag)
        return
    if not signature_ok(properties, body):
        print(f"bad signature on {webhook_id}; rejected")
        channel.basic_reject(method.delivery_tag, requeue=False)
        return
    # Handle the event here: body is the webhook's raw body, byte for byte.
    print(
        f"{header(properties, 'inhook-source')} {header(properties, 'inhook-aggregate')} "
        f"#{header(properties, 'inhook-sequence')} {header(properties, 'inhook-event-type')} "
        f"{header(properties, 'inhook-event-id')} ({len(body)} bytes)"
    )
    handled[webhook_id] = True
    if len(handled) > REMEMBER:
        handled.popitem(last=False)
    channel.basic_ack(method.delivery_tag)


def main():
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.exchange_declare(EXCHANGE, exchange_type="topic", durable=True)
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_bind(QUEUE, EXCHANGE, routing_key=BINDING)
    # One message at a time: the next is handled only after this one is acknowledged,
    # which keeps each aggregate's order even if handling fails and is retried.
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(QUEUE, on_message)
    print(f"reading {EXCHANGE} ({BINDING}) through queue {QUEUE}")
    try:
        channel.start_consuming()
    except KeyboardInterrupt:
        connection.close()


if __name__ == "__main__":
    main()

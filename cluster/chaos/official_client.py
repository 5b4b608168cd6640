"""The official RocketMQ 5 Python client's share of the broker workload, in
its own process (it registers apache.rocketmq.v2 in protobuf's pool, as our
generated code does, so the two cannot share one).

    python -m cluster.chaos.official_client --servers A;B;C --topic T --group G --rate 5 --prefix o

A Producer sends one message at a time (each body `bchaos:<uid> ...`, the uid
also its key) and a SimpleConsumer of the group receives and acks. Every
event goes to stdout as one JSON line with monotonic times (the same clock as
the parent's: CLOCK_MONOTONIC is system-wide). A line `stop` on stdin stops
the sends; the consumer goes on until `finish` (or stdin closes).

On a secured cluster it signs and speaks TLS as every client of the run
does, from DLEDGER_USER, DLEDGER_SECRET_FILE and DLEDGER_TLS_CA (the CA
through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, the official client's way).

Nothing here imports the project's protobuf code.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--prefix", default="o")
    args = parser.parse_args()

    user, secret_file, ca = (os.environ.get(n, "") for n in ("DLEDGER_USER", "DLEDGER_SECRET_FILE", "DLEDGER_TLS_CA"))
    if ca:
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = ca   # read when the first TLS channel opens
    secret = ""
    if secret_file:
        with open(secret_file, encoding="utf-8") as f:
            secret = f.readline().strip()

    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    config = ClientConfiguration(args.servers, Credentials(user, secret) if user else Credentials())
    producer = Producer(config, (args.topic,), tls_enable=bool(ca))
    consumer = SimpleConsumer(config, args.group, {args.topic: FilterExpression("*")}, await_duration=5,
                              tls_enable=bool(ca))
    producer.startup()
    consumer.startup()
    emit(type="started", time=time.monotonic())
    sending = threading.Event()
    sending.set()
    finished = threading.Event()

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                sending.clear()
            elif line.strip() == "finish":
                break
        sending.clear()
        finished.set()

    def send_loop() -> None:
        n = 0
        next_at = time.monotonic()
        while sending.is_set():
            uid = f"{args.prefix}-{n}"
            n += 1
            message = Message()
            message.topic, message.body, message.keys = args.topic, f"bchaos:{uid} official".encode(), uid
            emit(type="send", uid=uid, time=time.monotonic())
            try:
                receipt = producer.send(message)
            except Exception as error:  # noqa: BLE001 - every failure is recorded, none hidden
                emit(type="send-fail", uid=uid, time=time.monotonic(), error=str(error)[:300])
            else:
                emit(type="send-ok", uid=uid, time=time.monotonic(), message_id=receipt.message_id)
            next_at = max(next_at + 1.0 / args.rate, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))

    def consume_loop() -> None:
        while not finished.is_set():
            invoked = time.monotonic()
            try:
                messages = consumer.receive(16, 15)
            except Exception as error:  # noqa: BLE001
                emit(type="receive-fail", time=time.monotonic(), invoked=invoked, error=str(error)[:300])
                time.sleep(0.05)
                continue
            now = time.monotonic()
            wall_ms = int(time.time() * 1000)
            emit(type="receive-ok", time=now, invoked=invoked)
            for message in messages:
                uid = bytes(message.body).split(b" ", 1)[0][len(b"bchaos:"):].decode()
                emit(type="delivery", uid=uid, time=now, invoked=invoked, wall_ms=wall_ms,
                     message_id=message.message_id, attempt=message.delivery_attempt)
                acked_at = time.monotonic()
                try:
                    consumer.ack(message)
                except Exception as error:  # noqa: BLE001
                    emit(type="ack-fail", uid=uid, time=time.monotonic(), invoked=acked_at, error=str(error)[:300])
                else:
                    emit(type="ack-ok", uid=uid, time=time.monotonic(), invoked=acked_at)

    threading.Thread(target=control, daemon=True).start()
    sender = threading.Thread(target=send_loop)
    receiver = threading.Thread(target=consume_loop)
    sender.start()
    receiver.start()
    sender.join()
    finished.wait()
    receiver.join(timeout=30)
    for client in (producer, consumer):
        try:
            client.shutdown()
        except Exception:  # noqa: BLE001 - the run's events are already out
            pass
    emit(type="finished", time=time.monotonic())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Single-core throughput of the store's on-disk formats, no cluster needed:
codec (encode, decode, peek of 1 KiB messages), ConsumeQueue (put one by one,
put in batches, get 32), IndexService (put, query). One JSON line per figure.

    python -m bench.store_formats [--count 100000]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable

from store import message_const as mc
from store.codec import MessageExt, decode, encode, peek
from store.consume_queue import ConsumeQueue
from store.index_service import IndexService, build_key
from store.message_id import MessageIdGenerator
from store.socket_address import SocketAddress

BODY_SIZE = 1024


def rate(name: str, count: int, run: Callable[[], object]) -> None:
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    print(json.dumps({"bench": name, "count": count, "seconds": round(elapsed, 3),
                      "per_second": round(count / elapsed)}), flush=True)


def sample_record() -> tuple[MessageExt, bytes]:
    message = MessageExt(
        topic="BenchTopic", body=bytes(range(256)) * (BODY_SIZE // 256), queue_id=1,
        born_host=SocketAddress("10.0.0.7", 50123), store_host=SocketAddress("10.0.0.1", 10911),
        born_timestamp=1_700_000_000_000, store_timestamp=1_700_000_000_001,
        properties={mc.TAGS: "TagA", mc.KEYS: "order-1", mc.UNIQ_KEY: MessageIdGenerator().next_id()})
    return message, encode(message)


def bench_codec(count: int) -> None:
    message, record = sample_record()
    rate("codec.encode_1KiB", count, lambda: [encode(message) for _ in range(count)])
    rate("codec.decode_1KiB", count, lambda: [decode(record) for _ in range(count)])
    rate("codec.peek_1KiB", count, lambda: [peek(record) for _ in range(count)])


def bench_consume_queue(directory: str, count: int) -> None:
    units = [(1000 + n * 1100, 1100, n % 7) for n in range(count)]
    single = ConsumeQueue.open(directory, "Bench", 0)
    rate("consume_queue.put", count, lambda: [single.put(n, *units[n]) for n in range(count)])
    batched = ConsumeQueue.open(directory, "Bench", 1)
    rate("consume_queue.put_batch_256", count,
         lambda: [batched.put_batch(n, units[n:n + 256]) for n in range(0, count, 256)])
    reads = count // 32
    rate("consume_queue.get_32_units", reads, lambda: [single.get(n * 32, 32) for n in range(reads)])
    start = time.perf_counter()
    single.flush()
    batched.flush()
    print(json.dumps({"bench": "consume_queue.flush_ms", "ms": round((time.perf_counter() - start) * 1000, 1)}))


def bench_index(directory: str, count: int) -> None:
    service = IndexService.open(directory, hash_slot_num=count, index_num=count * 2 + 1)
    keys = [build_key("BenchTopic", f"order-{n}") for n in range(count)]

    def put_all() -> None:
        for n in range(count):
            service.put(keys[n], 1000 + n * 1100, 1_700_000_000_000 + n)

    rate("index.put", count, put_all)
    queries = count // 10
    rate("index.query", queries, lambda: [service.query("BenchTopic", f"order-{n * 10}", 32, 0, 1 << 62)
                                          for n in range(queries)])


def main(count: int) -> None:
    bench_codec(count)
    with tempfile.TemporaryDirectory() as directory:
        bench_consume_queue(directory, count)
        bench_index(directory, count)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    main(parser.parse_args().count)

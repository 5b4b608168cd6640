"""The timeline PNG: acknowledged entries per second and append latency over
the run, with every fault window shaded and named. For the broker workload:
sends, receives (messages delivered) and acks per second, their latencies,
and the fault windows."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from cluster.chaos.history import PROBE_PREFIX, History, Operation, Outcome  # noqa: E402

BUCKET_S = 0.5
KIND_COLOURS = {
    "kill-leader": "tab:red", "kill-random": "tab:pink", "crash-write": "darkred",
    "isolate-leader": "tab:purple", "split": "tab:blue", "one-way": "tab:cyan",
    "pause-leader": "tab:orange", "delay": "tab:olive",
}


def plot_timeline(history: History, path: Path, title: str) -> None:
    if any(op.kind != "append" for op in history.operations):
        plot_broker_timeline(history, path, title)
        return
    ops = [op for op in history.operations if not op.client.startswith(PROBE_PREFIX)]
    end = max([op.complete_s or op.invoke_s for op in ops] + [w.end_s or w.start_s for w in history.faults] + [1.0])
    figure, (throughput, latency) = plt.subplots(2, 1, sharex=True, figsize=(14, 7), dpi=100)
    _throughput(throughput, ops, end)
    _latency(latency, ops)
    for axis in (throughput, latency):
        _shade_faults(axis, history, end, label=axis is throughput)
    latency.set_xlabel("seconds since start")
    latency.set_xlim(0, end)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _throughput(axis: plt.Axes, ops: list[Operation], end: float) -> None:
    buckets = int(end / BUCKET_S) + 1
    acked = [0.0] * buckets
    failed = [0.0] * buckets
    for op in ops:
        if op.complete_s is None:
            continue
        slot = min(int(op.complete_s / BUCKET_S), buckets - 1)
        if op.outcome is Outcome.OK:
            acked[slot] += len(op.ids) / BUCKET_S
        else:
            failed[slot] += 1 / BUCKET_S
    times = [i * BUCKET_S for i in range(buckets)]
    axis.step(times, acked, where="post", color="tab:green", label="acknowledged entries/s")
    axis.step(times, failed, where="post", color="tab:red", alpha=0.6, label="failed or unknown appends/s")
    # Heavy bursts run at a hundred times the normal rate: keep both readable.
    axis.set_yscale("symlog", linthresh=10)
    axis.set_ylabel("per second")
    axis.legend(loc="lower right", fontsize="small")  # the fault labels hang from the top


def _latency(axis: plt.Axes, ops: list[Operation]) -> None:
    for outcome, colour, marker in ((Outcome.OK, "tab:green", "."), (Outcome.FAIL, "tab:red", "x"),
                                    (Outcome.UNKNOWN, "black", "x")):
        chosen = [op for op in ops if op.outcome is outcome and op.complete_s is not None]
        axis.scatter([op.invoke_s for op in chosen], [max(op.complete_s - op.invoke_s, 1e-4) for op in chosen],
                     s=4, c=colour, marker=marker, label=f"{outcome.value} ({len(chosen)})")
    axis.set_yscale("log")
    axis.set_ylabel("latency (s), at invoke time")
    axis.legend(loc="upper right", fontsize="small")


def _shade_faults(axis: plt.Axes, history: History, end: float, label: bool) -> None:
    for window in history.faults:
        colour = KIND_COLOURS.get(window.kind, "grey")
        axis.axvspan(window.start_s, window.end_s if window.end_s is not None else end, color=colour, alpha=0.15)
        if label:
            axis.annotate(f"{window.kind} {','.join(window.targets)}", (window.start_s, 1.0),
                          xycoords=("data", "axes fraction"), rotation=90, fontsize=6, va="top",
                          color=colour)


BROKER_KINDS = (("send", "tab:green", "sends acknowledged"), ("receive", "tab:blue", "messages delivered"),
                ("ack", "tab:purple", "acks acknowledged"))


def plot_broker_timeline(history: History, path: Path, title: str) -> None:
    ops = history.operations
    end = max([op.complete_s or op.invoke_s for op in ops] + [w.end_s or w.start_s for w in history.faults] + [1.0])
    figure, (rates, latency) = plt.subplots(2, 1, sharex=True, figsize=(14, 7), dpi=100)
    buckets = int(end / BUCKET_S) + 1
    times = [i * BUCKET_S for i in range(buckets)]
    for kind, colour, label in BROKER_KINDS:
        counts = [0.0] * buckets
        if kind == "receive":
            for d in history.deliveries:
                counts[min(int(d.time_s / BUCKET_S), buckets - 1)] += 1 / BUCKET_S
        else:
            for op in ops:
                if op.kind == kind and op.outcome is Outcome.OK and op.complete_s is not None:
                    counts[min(int(op.complete_s / BUCKET_S), buckets - 1)] += len(op.ids) / BUCKET_S
        rates.step(times, counts, where="post", color=colour, label=f"{label}/s")
    failed = [0.0] * buckets
    for op in ops:
        if op.outcome in (Outcome.FAIL, Outcome.UNKNOWN) and op.complete_s is not None:
            failed[min(int(op.complete_s / BUCKET_S), buckets - 1)] += 1 / BUCKET_S
    rates.step(times, failed, where="post", color="tab:red", alpha=0.6, label="failed or unknown calls/s")
    rates.set_yscale("symlog", linthresh=10)
    rates.set_ylabel("per second")
    rates.legend(loc="lower right", fontsize="small")
    for kind, colour, label in BROKER_KINDS:
        chosen = [op for op in ops if op.kind == kind and op.complete_s is not None]
        latency.scatter([op.invoke_s for op in chosen], [max(op.complete_s - op.invoke_s, 1e-4) for op in chosen],
                        s=3, c=colour, marker=".", label=f"{kind} calls ({len(chosen)})")
    bad = [op for op in ops if op.outcome in (Outcome.FAIL, Outcome.UNKNOWN) and op.complete_s is not None]
    latency.scatter([op.invoke_s for op in bad], [max(op.complete_s - op.invoke_s, 1e-4) for op in bad],
                    s=8, c="tab:red", marker="x", label=f"failed or unknown ({len(bad)})")
    latency.set_yscale("log")
    latency.set_ylabel("call latency (s), at invoke time\n(receives long-poll up to 5 s)")
    latency.legend(loc="upper right", fontsize="small")
    for axis in (rates, latency):
        _shade_faults(axis, history, end, label=axis is rates)
    latency.set_xlabel("seconds since start")
    latency.set_xlim(0, end)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)

"""A node collects its youngest generation less often than Python's default
(cluster/node.py, tune_collector); PYDLEDGER_GC_TUNING=0 keeps the default."""
from __future__ import annotations

import gc

import pytest

from cluster.node import GC_YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def thresholds():  # noqa: ANN201
    before = gc.get_threshold()
    gc.set_threshold(700, *before[1:])
    yield
    gc.set_threshold(*before)


def test_the_young_generation_is_collected_every_gc_young_threshold_allocations(thresholds, monkeypatch):
    monkeypatch.delenv("PYDLEDGER_GC_TUNING", raising=False)
    older = gc.get_threshold()[1:]
    assert tune_collector()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older)


def test_gc_tuning_off_keeps_pythons_thresholds(thresholds, monkeypatch):
    monkeypatch.setenv("PYDLEDGER_GC_TUNING", "0")
    assert not tune_collector()
    assert gc.get_threshold()[0] == 700

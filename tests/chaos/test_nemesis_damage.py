"""Which nodes the nemesis counts as damaged when it draws a membership
change: those a storage fault hit and that have not shown since that they
are whole again (running, not repairing, and given the time to find it)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace

from cluster.chaos.history import History
from cluster.chaos.nemesis import DAMAGE_FOUND_WITHIN_S, ActiveFault, Nemesis


@dataclass
class FakeCluster:
    ids: list[str]
    down: set[str]

    @property
    def addresses(self) -> dict[str, str]:
        return {n: f"addr-{n}" for n in self.ids}

    def running(self, node: str) -> bool:
        return node not in self.down


class FakeAdmin:
    def __init__(self, repairing: set[str]) -> None:
        self.repairing = repairing

    async def metadata(self, address: str) -> SimpleNamespace:
        node = address.removeprefix("addr-")
        return SimpleNamespace(repairing=node in self.repairing, cluster_id="c1")


class RecordingChanger:
    def __init__(self, history: History) -> None:
        self.history = history
        self.skips: list[str] = []

    async def start(self, rng: random.Random, skip: str) -> tuple[object, object]:
        self.skips.append(skip)
        return self.history.fault_started("member-change", (), skip), None


def nemesis(repairing: set[str], down: set[str] = frozenset()) -> tuple[Nemesis, RecordingChanger, History]:
    history = History()
    n = Nemesis(FakeCluster(["n0", "n1", "n2"], set(down)), None, history, None, FakeAdmin(repairing))  # type: ignore[arg-type]
    changer = RecordingChanger(history)
    n.membership = changer  # type: ignore[assignment]
    return n, changer, history


async def test_a_change_after_the_damaged_node_repaired_is_made():
    n, changer, history = nemesis(repairing=set())
    n._damaged["n2"] = history.now() - DAMAGE_FOUND_WITHIN_S - 1   # hit long ago, whole again since
    fault = await n.member_change(random.Random(1))
    assert isinstance(fault, ActiveFault)
    assert changer.skips == [""]
    assert "n2" not in n._damaged


async def test_a_change_waits_for_a_node_that_repairs_or_was_hit_too_recently():
    n, changer, history = nemesis(repairing={"n1"})
    n._damaged["n1"] = history.now() - DAMAGE_FOUND_WITHIN_S - 1   # still repairing
    n._damaged["n2"] = history.now()                              # its damage may not be found yet
    await n.member_change(random.Random(1))
    assert changer.skips and "n1,n2 not yet repaired" in changer.skips[0]


async def test_a_stopped_damaged_node_stays_damaged():
    n, changer, history = nemesis(repairing=set(), down={"n2"})
    n._damaged["n2"] = history.now() - DAMAGE_FOUND_WITHIN_S - 1
    await n.member_change(random.Random(1))
    assert "n2 not yet repaired" in changer.skips[0]

"""bench.peers' verdicts: each goal is a ratio of ours to NATS's figure, an
upper bound for latencies and a lower bound for rates (NATS itself is an
optional benchmark dependency, not needed here)."""
from __future__ import annotations

from bench.peers import beside, goals, median_beside, median_goals, stability


def test_latency_goals_are_upper_bounds_and_rate_goals_lower_bounds():
    ours = {"log_1": {"p50_ms": 2.0, "p99_ms": 3.0}, "log_128": {"messages_per_s": 900.0},
            "log_128x64": {"messages_per_s": 2500.0}}
    nats = {"log_1": {"p50_ms": 1.0, "p99_ms": 2.0}, "publish_128": {"messages_per_s": 1000.0}}
    verdicts = goals(ours, nats)
    assert verdicts["log_1_p50"] == {"ours_over_nats": 2.0, "goal": "at most 1.4", "met": False}
    assert verdicts["log_1_p99"]["met"] is True                  # 1.5 <= 2
    assert verdicts["log_128"] == {"ours_over_nats": 0.9, "goal": "at least 1.0", "met": False}
    assert verdicts["log_128x64"]["met"] is True                 # 2.5 >= 2
    assert "receive_ack" not in verdicts                         # a workload not run has no verdict


def test_an_election_while_the_workloads_ran_fails_the_stability_goal():
    calm = stability({"ours": {"at_start": 1, "at_end": 1}, "official": {"at_start": 2, "at_end": 2}})
    assert calm["elections"] == 0 and calm["met"] is True
    moved = stability({"ours": {"at_start": 1, "at_end": 3}, "official": {"at_start": 1, "at_end": 1}})
    assert moved["elections"] == 2 and moved["met"] is False


def test_rounds_are_judged_by_the_median_ratio_of_each_goal():
    def round_with(p50_ratio: float, rate_ratio: float) -> dict:
        ours = {"log_1": {"p50_ms": p50_ratio, "p99_ms": 1.0}, "log_128": {"messages_per_s": rate_ratio}}
        nats = {"log_1": {"p50_ms": 1.0, "p99_ms": 1.0}, "publish_128": {"messages_per_s": 1.0}}
        return {"goals": goals(ours, nats)}
    verdicts = median_goals([round_with(1.6, 0.9), round_with(1.3, 1.2), round_with(1.2, 1.1)])
    assert verdicts["log_1_p50"] == {"ours_over_nats": 1.3, "goal": "at most 1.4", "met": True,
                                     "each_round": [1.6, 1.3, 1.2]}
    assert verdicts["log_128"]["ours_over_nats"] == 1.1 and verdicts["log_128"]["met"] is True
    assert "receive_ack" not in verdicts


def test_receive_and_ack_is_also_compared_with_acks_the_server_confirms_judged_by_no_goal():
    ours = {"receive_ack": {"messages_per_s": 900.0}}
    nats = {"pull_ack": {"messages_per_s": 1500.0}, "pull_ack_confirmed": {"messages_per_s": 1000.0}}
    assert goals(ours, nats)["receive_ack"]["ours_over_nats"] == 0.6
    assert beside(ours, nats) == {"receive_ack_vs_confirmed_acks": 0.9}
    assert beside(ours, {"pull_ack": {"messages_per_s": 1500.0}}) == {}
    rounds = [{"beside_goals": {"receive_ack_vs_confirmed_acks": r}} for r in (0.8, 1.1, 0.95)] + [{}]
    assert median_beside(rounds) == {"receive_ack_vs_confirmed_acks": 0.95}

"""The broker's tunables from the node's TOML file ([broker] table)."""
from __future__ import annotations

import argparse

import pytest

from cluster.config import ConfigError, add_node_arguments, broker_settings_from_args, config_from_args
from cluster.node import broker_config

PEERS = "n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913"


def parse(tmp_path, toml: str) -> argparse.Namespace:
    path = tmp_path / "node.toml"
    path.write_text(toml)
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return parser.parse_args(["--id", "n0", "--peers", PEERS, "--data-dir", str(tmp_path), "--config", str(path)])


def test_the_broker_table_tunes_the_broker_and_leaves_the_log_config_alone(tmp_path):
    args = parse(tmp_path, 'heartbeat_interval_s = 0.2\n[broker]\ntransaction_check_max = "5"\n'
                           'transaction_check_interval_s = 2\nmax_delay_s = 3600\n')
    config = config_from_args(args)
    broker = broker_config(config, broker_settings_from_args(args))
    assert config.heartbeat_interval_s == 0.2
    assert (broker.transaction_check_max, broker.transaction_check_interval_s, broker.max_delay_s) == (5, 2.0, 3600.0)
    assert broker.broker_name == config.group and len(broker.endpoints) == 3


@pytest.mark.parametrize("table, complaint", [
    ("[broker]\nno_such_setting = 1\n", "no_such_setting"),
    ("[broker]\nendpoints = 'x:1'\n", "endpoints"),          # follows from the peers
    ("[broker]\ntransaction_check_max = 'many'\n", "transaction_check_max"),
    ("broker = 3\n", "table"),
])
def test_a_bad_broker_setting_is_named(tmp_path, table, complaint):
    with pytest.raises(ConfigError, match=complaint):
        broker_settings_from_args(parse(tmp_path, table))

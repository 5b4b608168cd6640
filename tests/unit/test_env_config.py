"""A node's configuration from DLEDGER_ environment variables (the container
entry point): which source wins, and errors that name the variable; and the
container's health check, which reads the same variables."""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cluster.config import ConfigError, add_node_arguments, config_from_args
from cluster.healthcheck import SERVICE, check, own_address
from dledger.config import DLedgerConfig, FlushMode

PEERS = "n0=n0:20911,n1=n1:20911,n2=n2:20911"
CONTAINER_ENV = {
    "DLEDGER_ID": "n1",
    "DLEDGER_PEERS": PEERS,
    "DLEDGER_DATA_DIR": "/var/lib/dledger",
    "DLEDGER_GROUP": "g1",
    "DLEDGER_METRICS_PORT": "21011",
    "DLEDGER_METRICS_HOST": "0.0.0.0",
    "DLEDGER_ADVERTISED_ADDRESSES": "n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913",
    "DLEDGER_LISTEN_ADDRESS": "0.0.0.0:20911",
}


def node_config(environ: dict[str, str], *argv: str) -> DLedgerConfig:
    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), environ)


def write_toml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_the_environment_alone_configures_a_container_node():
    config = node_config(CONTAINER_ENV)
    assert config.self_id == "n1" and config.group == "g1"
    assert config.self_peer.address == "n1:20911"
    assert config.bind_address == "0.0.0.0:20911"
    assert config.data_dir == "/var/lib/dledger"
    assert config.metrics_address == "0.0.0.0:21011"
    assert config.client_address_of("n2") == "127.0.0.1:20913"


def test_every_field_is_reachable_as_dledger_field_name_and_converted():
    config = node_config({**CONTAINER_ENV, "DLEDGER_FLUSH_MODE": "async",
                          "DLEDGER_HEARTBEAT_INTERVAL_S": "0.05", "DLEDGER_PREALLOCATE": "false",
                          "DLEDGER_DATA_FILE_SIZE": "67108864", "DLEDGER_SELF_ID": "n1"})
    assert config.flush_mode is FlushMode.ASYNC
    assert config.heartbeat_interval_s == 0.05
    assert config.preallocate is False
    assert config.data_file_size == 64 << 20


def test_flags_override_the_environment_which_overrides_the_file(tmp_path):
    toml = write_toml(tmp_path / "node.toml",
                      f'self_id = "n0"\npeers = "{PEERS}"\ndata_dir = "/from/file"\n'
                      'group = "file-group"\nheartbeat_interval_s = 0.2\nmax_wait_ack_s = 7.0\n'
                      'metrics_address = "127.0.0.1:9000"\n')
    env = {"DLEDGER_CONFIG": toml, "DLEDGER_ID": "n1", "DLEDGER_GROUP": "env-group",
           "DLEDGER_HEARTBEAT_INTERVAL_S": "0.1", "DLEDGER_METRICS_PORT": "9100"}
    from_env = node_config(env)
    assert from_env.self_id == "n1" and from_env.group == "env-group"    # env over file
    assert from_env.heartbeat_interval_s == 0.1
    assert from_env.max_wait_ack_s == 7.0 and from_env.data_dir == "/from/file"  # only the file says
    assert from_env.metrics_address == "127.0.0.1:9100"
    from_flags = node_config(env, "--id", "n2", "--heartbeat-interval", "0.05",
                             "--metrics-port", "9200", "--metrics-host", "0.0.0.0")
    assert from_flags.self_id == "n2" and from_flags.heartbeat_interval_s == 0.05
    assert from_flags.metrics_address == "0.0.0.0:9200"
    assert from_flags.group == "env-group"


def test_the_config_flag_overrides_the_config_variable(tmp_path):
    env_file = write_toml(tmp_path / "env.toml", 'group = "env-file"\n')
    flag_file = write_toml(tmp_path / "flag.toml", 'group = "flag-file"\n')
    base = {k: v for k, v in CONTAINER_ENV.items() if k != "DLEDGER_GROUP"}
    assert node_config({**base, "DLEDGER_CONFIG": env_file}).group == "env-file"
    assert node_config({**base, "DLEDGER_CONFIG": env_file}, "--config", flag_file).group == "flag-file"


def test_an_empty_variable_counts_as_unset():
    config = node_config({**CONTAINER_ENV, "DLEDGER_GROUP": "", "DLEDGER_METRICS_PORT": "",
                          "DLEDGER_PREFERRED_LEADER_ID": ""})
    assert config.group == "default" and config.metrics_address == ""


def test_variables_without_the_prefix_are_ignored():
    assert node_config({**CONTAINER_ENV, "GROUP": "x", "dledger_group": "y"}).group == "g1"


@pytest.mark.parametrize("variable, value, fragment", [
    ("DLEDGER_HEARTBEAT_INTERVAL_S", "fast", "DLEDGER_HEARTBEAT_INTERVAL_S: expected a number, got 'fast'"),
    ("DLEDGER_DATA_FILE_SIZE", "1.5", "DLEDGER_DATA_FILE_SIZE: expected an integer"),
    ("DLEDGER_FLUSH_MODE", "never", "DLEDGER_FLUSH_MODE: 'never' is not one of sync, async"),
    ("DLEDGER_PREALLOCATE", "maybe", "DLEDGER_PREALLOCATE: expected true or false"),
    ("DLEDGER_PEERS", "n0=n0", "DLEDGER_PEERS: peer 'n0=n0': expected ID=HOST:PORT"),
    ("DLEDGER_METRICS_PORT", "http", "DLEDGER_METRICS_PORT: expected an integer, got 'http'"),
    ("DLEDGER_METRICS_PORT", "70000", "DLEDGER_METRICS_PORT: 70000 is not in 1..65535"),
    ("DLEDGER_HEARTBEAT_INTERVAL", "0.1", "unknown environment variable DLEDGER_HEARTBEAT_INTERVAL"),
    ("DLEDGER_SELF_ID", "n2", "DLEDGER_ID and DLEDGER_SELF_ID disagree"),
    ("DLEDGER_LISTEN_ADDRESS", "0.0.0.0", "listen_address '0.0.0.0': expected HOST:PORT"),
    ("DLEDGER_ID", "n7", "'n7' is not among the peers"),
])
def test_a_bad_variable_fails_with_one_line_naming_it(variable, value, fragment):
    with pytest.raises(ConfigError) as raised:
        node_config({**CONTAINER_ENV, variable: value})
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_flag_does_not_rescue_a_bad_variable():
    # Every variable is checked, even one a flag overrides: a broken container
    # spec should fail loudly rather than work until someone drops the flag.
    with pytest.raises(ConfigError, match="DLEDGER_GROUP|DLEDGER_DATA_FILE_SIZE"):
        node_config({**CONTAINER_ENV, "DLEDGER_DATA_FILE_SIZE": "big"}, "--data-file-size", "1048576")


def test_missing_settings_name_the_variable_too():
    with pytest.raises(ConfigError, match="missing --peers \\(or DLEDGER_PEERS"):
        node_config({"DLEDGER_ID": "n0", "DLEDGER_DATA_DIR": "d"})


# ------------------------------------------------------ container health check

def test_the_health_check_asks_loopback_on_the_port_the_node_listens_on():
    assert own_address(CONTAINER_ENV) == "127.0.0.1:20911"
    assert own_address({**CONTAINER_ENV, "DLEDGER_LISTEN_ADDRESS": "0.0.0.0:30000"}) == "127.0.0.1:30000"
    without_listen = {k: v for k, v in CONTAINER_ENV.items() if k != "DLEDGER_LISTEN_ADDRESS"}
    assert own_address({**without_listen, "DLEDGER_PEERS": "n0=a:1,n1=b:2,n2=c:3"}) == "127.0.0.1:2"
    assert own_address({}) == "127.0.0.1:20911"  # configured by flags it cannot see


async def test_the_health_check_passes_only_while_the_node_serves():
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        await servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        assert await asyncio.to_thread(check, address) == (True, f"{address}: SERVING")
        await servicer.enter_graceful_shutdown()
        assert await asyncio.to_thread(check, address) == (False, f"{address}: NOT_SERVING")
    finally:
        await server.stop(None)
    healthy, message = await asyncio.to_thread(check, address, 1.0)
    assert not healthy and "UNAVAILABLE" in message


def test_the_event_loop_comes_from_the_flag_then_the_variable_and_a_bad_one_is_named():
    from cluster.config import event_loop_from_args

    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    assert event_loop_from_args(parser.parse_args([]), {}) == "asyncio"
    assert event_loop_from_args(parser.parse_args([]), {"DLEDGER_EVENT_LOOP": "uvloop"}) == "uvloop"
    assert event_loop_from_args(parser.parse_args(["--event-loop", "asyncio"]),
                                {"DLEDGER_EVENT_LOOP": "uvloop"}) == "asyncio"
    with pytest.raises(ConfigError, match="DLEDGER_EVENT_LOOP: 'trio' is not an event loop"):
        event_loop_from_args(parser.parse_args([]), {"DLEDGER_EVENT_LOOP": "trio"})
    # The variable is the node's: the config reader accepts it beside the fields.
    assert node_config({**CONTAINER_ENV, "DLEDGER_EVENT_LOOP": "uvloop"}).self_id == "n1"

"""A node's DLedgerConfig from command-line flags, environment variables and
an optional TOML file.

The TOML file uses DLedgerConfig's own field names as keys (`self_id`,
`peers`, `data_dir`, `heartbeat_interval_s`, ...), so that every tunable is
reachable without a flag of its own. `peers` may be a string
(`"n0=127.0.0.1:20911,n1=..."`), a list of such items, or a table
`{n0 = "127.0.0.1:20911", ...}`.

Environment variables serve containers, whose entry point is fixed:
`DLEDGER_<FIELD NAME>` sets any field (`DLEDGER_PEERS`, `DLEDGER_DATA_DIR`,
`DLEDGER_FLUSH_MODE`, `DLEDGER_HEARTBEAT_INTERVAL_S`, ...), `DLEDGER_ID` is
`self_id`, and `DLEDGER_CONFIG`, `DLEDGER_METRICS_PORT`, `DLEDGER_METRICS_HOST` and
`DLEDGER_EVENT_LOOP` stand for the flags of those names. An empty variable counts as unset; any
other `DLEDGER_` variable is an error, so that a misspelt one does not go
unnoticed. Flags override the environment, which overrides the file.

The broker's tunables (broker/config.py, BrokerConfig) go in the file's
`[broker]` table, by their field names too (`transaction_check_interval_s`,
`max_delay_s`, ...).

Every problem is a ConfigError with a one-line message naming the key or flag.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from broker.config import BrokerConfig
from cluster.event_loop import DEFAULT_EVENT_LOOP, EVENT_LOOPS, check_event_loop
from dledger import failpoints
from dledger.servers import parse_servers
from dledger.config import DLedgerConfig, FlushMode, PeerAddress, parse_peers, parse_routes
from dledger.rpc.credentials import ENV_SECRET_FILE, ENV_TLS_CA, ENV_USER

BROKER_TABLE = "broker"
# Follow from the group and its peers, not from configuration.
_DERIVED_BROKER_FIELDS = ("broker_name", "endpoints")


class ConfigError(ValueError):
    """A configuration a node cannot start with; the message is one line."""


# Flags beyond --id/--peers/--data-dir/--group/--config/--metrics-port: the
# tunables an operator reaches for most. (flag, DLedgerConfig field, metavar, help)
TUNING_FLAGS: list[tuple[str, str, str, str]] = [
    ("--flush-mode", "flush_mode", "sync|async",
     "sync (default): acknowledge only what a majority has on disk; async: flush on a timer"),
    ("--data-file-size", "data_file_size", "BYTES", "bytes per data segment file"),
    ("--index-file-size", "index_file_size", "BYTES", "bytes per index segment file (a multiple of 32)"),
    ("--max-entry-size", "max_entry_size", "BYTES", "largest entry body accepted"),
    ("--heartbeat-interval", "heartbeat_interval_s", "SECONDS", "time between leader heartbeats"),
    ("--election-timeout-min", "election_timeout_min_s", "SECONDS",
     "lower bound of the randomized election timeout"),
    ("--election-timeout-max", "election_timeout_max_s", "SECONDS",
     "upper bound of the randomized election timeout"),
    ("--max-wait-ack", "max_wait_ack_s", "SECONDS",
     "how long an append waits for a quorum before WAIT_QUORUM_ACK_TIMEOUT"),
    ("--preferred-leader", "preferred_leader_id", "ID", "a node that takes leadership back whenever it can"),
    ("--retention", "retention_s", "SECONDS", "how long a segment is kept"),
    ("--preallocate", "preallocate", "true|false", "allocate segment files up front"),
    ("--scrub-pass-interval", "scrub_pass_interval_s", "SECONDS",
     "start a pass of the scrubber (re-verifying committed entries) at most this often"),
    ("--replay-yield-wait-share", "replay_yield_wait_share", "SHARE",
     "replays (raw reads) slow down while the event loop's thread waits for a core more than this share "
     "of its runnable time (default 0.35; 0: never)"),
    ("--advertised-addresses", "advertised_addresses", "ID=HOST:PORT,...",
     "where clients should connect to each node, when that differs from --peers (docker, proxies)"),
    ("--peer-routes", "peer_routes", "HOST:PORT=HOST:PORT,...",
     "dial the second address to reach the first (a peer behind a proxy); the chaos harness uses it"),
    ("--peer-link", "peer_link_enabled", "true|false",
     "serve leaders' pushes on a TCP link of their own (default true; false: on the gRPC port's stream)"),
    ("--peer-link-port", "peer_link_port", "PORT",
     "the peer link's port (default 0: any free port, told to leaders in heartbeat answers)"),
    ("--client-link", "client_link_enabled", "true|false",
     "serve log clients' appends on a TCP link of their own (default true; false: AppendStream only)"),
    ("--client-link-port", "client_link_port", "PORT",
     "the client link's port (default 0: any free port, told to clients in AppendStream answers; "
     "behind a port mapping give a fixed one published as itself)"),
    ("--listen-address", "listen_address", "HOST:PORT",
     "where the gRPC port binds, when not this node's peer address (0.0.0.0:PORT in a container)"),
    # Security (README, "Security").
    ("--tls-cert-file", "tls_cert_file", "FILE", "this node's certificate (PEM): every port speaks TLS"),
    ("--tls-key-file", "tls_key_file", "FILE", "the key of --tls-cert-file"),
    ("--peer-tls-ca-file", "peer_tls_ca_file", "FILE",
     "the cluster CA: peers talk mutual TLS on their own port, clients use the advertised address"),
    ("--client-listen-address", "client_listen_address", "HOST:PORT",
     "with mutual TLS, where the client port binds (default: this node's advertised address)"),
    ("--auth-enabled", "auth_enabled", "true|false", "require RocketMQ 5 request signatures and ACLs"),
    ("--auth-super-user", "auth_super_user", "NAME", "the first super user's name (default admin)"),
    ("--auth-super-secret-file", "auth_super_secret_file", "FILE", "the first super user's secret"),
]

ENV_PREFIX = "DLEDGER_"
# Variables that are not `DLEDGER_<FIELD NAME>`: a shorter name for the id,
# and the flags that are not fields (the file, the metrics port and host).
ENV_ID = "DLEDGER_ID"
ENV_CONFIG = "DLEDGER_CONFIG"
ENV_METRICS_PORT = "DLEDGER_METRICS_PORT"
ENV_METRICS_HOST = "DLEDGER_METRICS_HOST"
# The broker's name servers (a container's way to say --namesrv-addrs).
ENV_NAMESRV_ADDRS = "DLEDGER_NAMESRV_ADDRS"
# The node process's event loop (cluster/event_loop.py), --event-loop.
ENV_EVENT_LOOP = "DLEDGER_EVENT_LOOP"
DEFAULT_METRICS_HOST = "127.0.0.1"
# Read by our clients, so a shell that exported them can still start nodes.
CLIENT_ENV = frozenset({ENV_USER, ENV_SECRET_FILE, ENV_TLS_CA})


@dataclass
class EnvSettings:
    """What the environment says, in the shape the flags have."""
    values: dict[str, Any] = field(default_factory=dict)  # field name -> the variable's text
    config_file: str | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    event_loop: str | None = None


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a TOML file whose keys are DLedgerConfig field names")
    parser.add_argument("--id", dest="self_id", metavar="ID", help="this node's id, one of the ids in --peers")
    parser.add_argument("--peers", metavar="ID=HOST:PORT,...", help="every member of the group")
    parser.add_argument("--data-dir", metavar="DIR", help="directory for this node's files")
    parser.add_argument("--group", metavar="NAME", help="the DLedger group name (default: default)")
    parser.add_argument("--metrics-port", type=int, metavar="P",
                        help="serve Prometheus metrics on HOST:P (see --metrics-host)")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="the interface metrics listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    for flag, field_name, metavar, help_text in TUNING_FLAGS:
        parser.add_argument(flag, dest=field_name, metavar=metavar, help=help_text)
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, metavar="asyncio|uvloop",
                        help="the process's event loop (default asyncio; uvloop: see docs/running.md)")
    parser.add_argument("--join", dest="join", action="store_const", const=True,
                        help="join a running group: --peers names its current members and this node, which "
                             "waits until `dledger member add` adds it")


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> DLedgerConfig:
    """Merge the TOML file (if any), the environment (`os.environ` unless
    given) and the flags; flags win over the environment, which wins over the file."""
    env = settings_from_env(os.environ if environ is None else environ)
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) or env.config_file
    if config_file:
        values.update(load_toml(config_file))
        values.pop(BROKER_TABLE, None)
    values.update(env.values)
    flag_fields = ["self_id", "peers", "data_dir", "group", "join"] + [f for _, f, _, _ in TUNING_FLAGS]
    for name in flag_fields:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    metrics_port = getattr(args, "metrics_port", None)
    if metrics_port is None:
        metrics_port = env.metrics_port
    if metrics_port is not None:
        host = getattr(args, "metrics_host", None) or env.metrics_host or DEFAULT_METRICS_HOST
        values["metrics_address"] = metrics_address_for_port(metrics_port, host)
    return build_config(values)


def event_loop_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str:
    """The node's event loop: --event-loop, else DLEDGER_EVENT_LOOP, else asyncio's."""
    flag = getattr(args, "event_loop", None)
    if flag is not None:
        where, name = "--event-loop", flag
    else:
        name = settings_from_env(os.environ if environ is None else environ).event_loop or DEFAULT_EVENT_LOOP
        where = ENV_EVENT_LOOP
    try:
        return check_event_loop(name, where)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def settings_from_env(environ: Mapping[str, str]) -> EnvSettings:
    """The `DLEDGER_` variables, each checked here so that an error names the
    variable rather than a field the user never typed."""
    hints = typing.get_type_hints(DLedgerConfig)
    env = EnvSettings()
    for variable, text in sorted(environ.items()):
        if not variable.startswith(ENV_PREFIX) or text == "":
            continue
        if variable == ENV_CONFIG:
            env.config_file = text
        elif variable == ENV_METRICS_HOST:
            env.metrics_host = text
        elif variable == ENV_EVENT_LOOP:
            env.event_loop = text
        elif variable == ENV_NAMESRV_ADDRS:
            continue  # a broker setting: broker_settings_from_args
        elif variable == failpoints.ENV_DIR:
            continue  # read by dledger.failpoints: test harnesses only
        elif variable in CLIENT_ENV:
            continue  # a client's credentials and CA (dledger/rpc/credentials.py), not the node's
        elif variable == ENV_METRICS_PORT:
            env.metrics_port = env_metrics_port(text)
        else:
            name = env_field_name(variable, hints)
            if name in env.values and env.values[name] != text:
                raise ConfigError(f"{ENV_ID} and {ENV_PREFIX}SELF_ID disagree: pick one")
            check_env_value(variable, name, text, hints[name])
            env.values[name] = text
    return env


def env_field_name(variable: str, hints: dict[str, Any]) -> str:
    if variable == ENV_ID:
        return "self_id"
    name = variable[len(ENV_PREFIX):].lower()
    if name not in hints:
        raise ConfigError(f"unknown environment variable {variable} "
                          f"(expected {ENV_PREFIX}<DLedgerConfig field name>, {ENV_ID}, {ENV_CONFIG}, "
                          f"{ENV_METRICS_PORT}, {ENV_METRICS_HOST} or {ENV_EVENT_LOOP})")
    return name


def check_env_value(variable: str, name: str, text: str, hint: Any) -> None:
    try:
        convert(name, text, hint)
    except ConfigError as error:
        message = str(error).removeprefix(f"{name}: ")
        raise ConfigError(f"{variable}: {message}") from None


def env_metrics_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{ENV_METRICS_PORT}: expected an integer, got {text!r}") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{ENV_METRICS_PORT}: {port} is not in 1..65535")
    return port


def broker_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None
                              ) -> dict[str, Any]:
    """The `[broker]` table of the TOML file (--config or DLEDGER_CONFIG),
    checked and converted to BrokerConfig's field types (empty without a
    file or a table)."""
    environ = os.environ if environ is None else environ
    config_file = getattr(args, "config", None) or environ.get(ENV_CONFIG)
    table: Any = load_toml(config_file).get(BROKER_TABLE, {}) if config_file else {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{BROKER_TABLE}] must be a table of BrokerConfig settings")
    settings = build_broker_settings(table)
    if environ.get(ENV_NAMESRV_ADDRS):
        settings["namesrv_addrs"] = convert_namesrv_addrs(ENV_NAMESRV_ADDRS, environ[ENV_NAMESRV_ADDRS])
    return settings


def build_broker_settings(table: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(BrokerConfig)
    known = {f.name for f in dataclasses.fields(BrokerConfig)} - set(_DERIVED_BROKER_FIELDS)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown broker setting {unknown[0]!r} (settings are BrokerConfig field names)")
    return {name: convert_broker_setting(name, value, hints[name]) for name, value in table.items()}


def convert_broker_setting(name: str, value: Any, hint: Any) -> Any:
    key = f"{BROKER_TABLE}.{name}"
    if name == "namesrv_addrs":
        return convert_namesrv_addrs(key, value)
    if name == "front_ends":
        return tuple(convert_peers(value, key))
    return convert(key, value, hint)


def convert_namesrv_addrs(name: str, value: Any) -> tuple[str, ...]:
    """Name servers: "host:port,host:port" or a list of host:port."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected HOST:PORT,..., got {value!r}")
    try:
        return tuple(parse_servers(value))
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path}: {error}") from None
    except OSError as error:
        raise ConfigError(f"config file {path}: {error.strerror}") from None


def metrics_address_for_port(port: int, host: str = "127.0.0.1") -> str:
    if not 0 < port < 65536:
        raise ConfigError(f"--metrics-port {port}: expected 1..65535")
    return f"{host}:{port}"


def build_config(values: dict[str, Any]) -> DLedgerConfig:
    """A validated DLedgerConfig from field-name keyed values (TOML or flags)."""
    hints = typing.get_type_hints(DLedgerConfig)
    known = {f.name for f in dataclasses.fields(DLedgerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]!r} (settings are DLedgerConfig field names)")
    for required, flag, variable in (("self_id", "--id", ENV_ID), ("peers", "--peers", "DLEDGER_PEERS"),
                                     ("data_dir", "--data-dir", "DLEDGER_DATA_DIR")):
        if values.get(required) in (None, ""):
            raise ConfigError(f"missing {flag} (or {variable}, or {required!r} in the config file)")
    converted = {name: convert(name, value, hints[name]) for name, value in values.items()}
    try:
        config = DLedgerConfig(**converted)
        config.validate()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return config


def convert(name: str, value: Any, hint: Any) -> Any:
    """Coerce one value (a TOML value or a flag's string) to the field's type."""
    if name in ("peers", "advertised_addresses"):
        return tuple(convert_peers(value, name))
    if name == "peer_routes":
        if isinstance(value, (list, tuple)):
            value = ",".join(str(item) if isinstance(item, str) else "=".join(item) for item in value)
        try:
            return parse_routes(str(value))
        except ValueError as error:
            raise ConfigError(f"{name}: {error}") from None
    if hint is FlushMode:
        try:
            return FlushMode(str(value).lower())
        except ValueError:
            raise ConfigError(f"{name}: {value!r} is not one of sync, async") from None
    if hint is bool:
        return convert_bool(name, value)
    if hint in (int, float):
        return convert_number(name, value, hint)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    return value


def convert_number(name: str, value: Any, hint: type) -> int | float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value) if hint is float else int(value.replace("_", ""), 0)
        except ValueError:
            raise ConfigError(f"{name}: expected {'a number' if hint is float else 'an integer'}, "
                              f"got {value!r}") from None
    if hint is int and not isinstance(value, int):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{name}: must not be negative, got {value!r}")
    return hint(value)


def convert_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def convert_peers(value: Any, name: str = "peers") -> list[PeerAddress]:
    if isinstance(value, dict):
        value = ",".join(f"{peer_id}={address}" for peer_id, address in value.items())
    elif isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    elif not isinstance(value, str):
        raise ConfigError(f"{name}: expected ID=HOST:PORT,..., got {value!r}")
    try:
        peers = parse_peers(value)
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None
    for peer in peers:
        if not peer.id:
            raise ConfigError(f"{name}: empty id in {value!r}")
        if not 0 < peer.port < 65536:
            raise ConfigError(f"{name}: {peer.id} port {peer.port} is out of range")
    return peers

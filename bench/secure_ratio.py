"""Throughput with TLS, mutual TLS and auth on against the same with all
off, in one session, with the `dledger bench send` and `bench consume`
commands a user would run (the issue asks secured >= 80% of plaintext).

    python -m bench.secure_ratio [--duration 8] [--size 1024] [--inflight 64] [--messages 20000]

Each mode starts its own three-node cluster (cluster/process_cluster.py, the
same file sizes), runs send then consume, and stops it; the secured one with
certificates from cluster/certs.py, auth on and the super user's
credentials (a super user is checked like any other: the signature is
verified and cached; only the ACL lookup is skipped, so a Normal user is
measured too, with Pub and Sub granted by policy). One JSON line per run,
then one with the ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster import certs
from cluster.process_cluster import ROOT, ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.rpc.credentials import ClientSecurity

ADMIN_SECRET = "bench-admin-secret"
USER_SECRET = "bench-user-secret"


def dledger(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"dledger {' '.join(args)}: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def wait_leader(cluster: ProcessCluster, security: ClientSecurity) -> None:
    servers = list(cluster.addresses.values())
    async with DLedgerClient(servers, security=security) as client:
        await find_leader(client, servers, timeout=30)


def run_mode(base: Path, secure: bool, options: argparse.Namespace) -> list[dict[str, Any]]:
    env: dict[str, str] = {}
    extra: list[str] = []
    pki = base / "pki" if secure else None
    base.mkdir(parents=True, exist_ok=True)
    if secure:
        (base / "admin.secret").write_text(ADMIN_SECRET + "\n")
        (base / "user.secret").write_text(USER_SECRET + "\n")
        extra = ["--auth-enabled", "true", "--auth-super-secret-file", str(base / "admin.secret")]
    cluster = ProcessCluster(base / "nodes", extra_args=extra, tls_dir=pki)
    if pki is not None:
        certs.create(pki, cluster.ids, endpoints=list(cluster.addresses.values()))
    cluster.start()
    try:
        admin_env = {"DLEDGER_USER": "admin", "DLEDGER_SECRET_FILE": str(base / "admin.secret"),
                     "DLEDGER_TLS_CA": str(pki / "ca.pem")} if pki is not None else {}
        security = ClientSecurity.from_settings(environ=admin_env) if secure else ClientSecurity()
        asyncio.run(wait_leader(cluster, security))
        servers = ",".join(cluster.addresses.values())
        if secure:
            dledger(["user", "create", "--json", "--servers", servers, "--name", "bench", "--new-secret-file",
                     str(base / "user.secret")], admin_env)
            dledger(["acl", "create", "--json", "--servers", servers, "--subject", "User:bench", "--resource", "Topic:Bench*",
                     "--resource", "Group:Bench*", "--actions", "Pub,Sub,Create"], admin_env)
            env = {**admin_env, "DLEDGER_USER": "bench", "DLEDGER_SECRET_FILE": str(base / "user.secret")}
        results = []
        send = dledger(["bench", "send", "--servers", servers, "--json", "--topic", "BenchSend",
                        "--size", str(options.size), "--inflight", str(options.inflight),
                        "--duration", str(options.duration)], env)
        results.append({**send, "mode": "secure" if secure else "plaintext", "bench": "send",
                        "per_s": send["messages_per_s"]})
        consume = dledger(["bench", "consume", "--servers", servers, "--json", "--topic", "BenchConsume",
                           "--size", str(options.size), "--messages", str(options.messages),
                           "--duration", "60"], env)
        results.append({**consume, "mode": "secure" if secure else "plaintext", "bench": "consume",
                        "per_s": consume["acked_per_s"]})
        for line in results:
            print(json.dumps(line), flush=True)
        return results
    finally:
        cluster.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--messages", type=int, default=20_000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="secure-ratio-") as tmp:
        plain = run_mode(Path(tmp) / "plain", False, options)
        secured = run_mode(Path(tmp) / "secure", True, options)
    ratios = {f"{p['bench']}_ratio": round(s["per_s"] / p["per_s"], 3)
              for p, s in zip(plain, secured)}
    print(json.dumps({"summary": "secured / plaintext messages per second", **ratios}), flush=True)


if __name__ == "__main__":
    main()

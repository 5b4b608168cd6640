#!/usr/bin/env bash
# Certificates and the admin secret for deploy/docker-compose.secure.yml, in
# deploy/secure/ (made once; delete the directory to start over). Node
# certificates name the service (n0), localhost, 127.0.0.1 and the published
# client ports as the official RocketMQ Python client verifies them.
#
# `deploy/secure-setup.sh groups`: the same for deploy/docker-compose.groups-secure.yml
# in deploy/secure-groups/: nodes g0n0..g1n2 (each group's published ports
# verified as one name) and the name server namesrv0.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ "${1:-}" = groups ]; then
  SECURE=${PYDLEDGER_SECURE_DIR:-secure-groups}
  if [ ! -f "$SECURE/ca.pem" ]; then
    PYTHONPATH=.. "$PYTHON" -m cluster.cli certs create --out "$SECURE" \
      --nodes g0n0,g0n1,g0n2,g1n0,g1n1,g1n2,namesrv0 \
      --endpoints 127.0.0.1:20911,127.0.0.1:20912,127.0.0.1:20913 \
      --endpoints 127.0.0.1:20921,127.0.0.1:20922,127.0.0.1:20923
  fi
else
  # Where the compose file mounts them from (PYDLEDGER_SECURE_DIR there too).
  SECURE=${PYDLEDGER_SECURE_DIR:-secure}
  if [ ! -f "$SECURE/ca.pem" ]; then
    PYTHONPATH=.. "$PYTHON" -m cluster.cli certs create --out "$SECURE" --nodes n0,n1,n2 \
      --endpoints "127.0.0.1:${PYDLEDGER_N0_PORT:-20911},127.0.0.1:${PYDLEDGER_N1_PORT:-20912},127.0.0.1:${PYDLEDGER_N2_PORT:-20913}"
  fi
fi
if [ ! -f "$SECURE/admin.secret" ]; then
  (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$SECURE/admin.secret")
fi
# The containers run as uid 10001; the keys stay unreadable to others.
if [ "$(id -u)" = 0 ]; then
  chown -R 10001 "$SECURE"
else
  echo "run as root (or chown -R 10001 deploy/$SECURE) so the containers can read the keys" >&2
fi

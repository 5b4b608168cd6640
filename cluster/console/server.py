"""The HTTP server of a node's metrics port, and of `dledger console`:

    /metrics              Prometheus text (a node's registry; absent in `dledger console`)
    /                     redirects to /console/
    /console/             the console: static files shipped in cluster/console/static
    /console/api/...      JSON read from the cluster through its gRPC APIs (backend.py)

Reads are GETs. The actions (offset reset, resend; users and ACLs) are
POSTs with a JSON body and the header `X-Console-Action: confirmed`, which a
browser sends only from a page of the same origin (any other origin would
need a CORS preflight this server never grants): a link or a form elsewhere
cannot reset a group. The page asks the user to confirm before it sends one.

On a cluster with authentication (`sign_in`), every API request but
`/console/api/config` must carry the page's signature (`Authorization` and
`X-Mq-Date-Time`, RocketMQ 5's MQv2-HMAC-SHA1, computed in the browser from
the secret the user typed); it is passed on to the nodes, which check it and
the user's ACLs (backend.py). Unsigned: 401, and the page asks to sign in.

A ThreadingHTTPServer in daemon threads, as prometheus_client's own: nothing
runs on the node's event loop, and nothing runs at all while nobody asks.
"""
from __future__ import annotations

import json
import logging
import mimetypes
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cluster.console.backend import ConsoleBackend, ConsoleError, Signature, Target
from cluster.raw_read_http import RawReadEndpoint
from dledger.raw_run import RAW_READ_PATH
from dledger.rpc.credentials import ClientSecurity
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

log = logging.getLogger(__name__)

ACTION_HEADER = "X-Console-Action"
ACTION_VALUE = "confirmed"
MAX_BODY_BYTES = 64 << 10
STATIC_PACKAGE = "cluster.console"


def static_file(name: str) -> bytes | None:
    """A file of the console's static directory (no subdirectories, no dot files)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    path = resources.files(STATIC_PACKAGE).joinpath("static", name)
    return path.read_bytes() if path.is_file() else None


class ConsoleHandler(BaseHTTPRequestHandler):
    server: "ConsoleHttpServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("console %s: " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ GET
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        path = url.path
        if path == RAW_READ_PATH and self.server.raw_reads is not None:
            self.server.raw_reads.serve(self, url.query)
        elif path == "/metrics" and self.server.registry is not None:
            self._send(HTTPStatus.OK, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path in ("/", "/console"):
            self._redirect("/console/")
        elif path == "/console/api/config":
            self._send_json(HTTPStatus.OK, {"sign_in": self.server.backend.sign_in})
        elif path.startswith("/console/api/"):
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            self._api(lambda: self._read(path[len("/console/api/"):], query))
        elif path.startswith("/console/"):
            name = path[len("/console/"):] or "index.html"
            content = static_file(name)
            if content is None:
                self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page {path}"})
            else:
                self._send(HTTPStatus.OK, content, mimetypes.guess_type(name)[0] or "application/octet-stream")
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such page {path}"})

    def _read(self, name: str, query: dict[str, str]) -> dict[str, Any]:
        backend = self.server.backend
        if name == "cluster":
            return backend.cluster()
        if name == "topics":
            return backend.topics(query.get("all") == "1")
        if name == "groups":
            return backend.groups()
        if name == "progress":
            return backend.progress(query.get("group", ""), query.get("topic", ""))
        if name == "messages":
            return backend.messages(query)
        if name == "dead-letters":
            return backend.dead_letters(query.get("group", ""), int(query.get("max") or 0))
        if name == "whoami":
            return backend.whoami()
        if name == "users":
            return backend.users()
        if name == "acls":
            return backend.acls()
        raise ConsoleError(pb.NOT_FOUND, f"no such API {name!r}")

    # ----------------------------------------------------------------- POST
    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if self.headers.get(ACTION_HEADER) != ACTION_VALUE:
            self._drain_body()
            self._send_json(HTTPStatus.FORBIDDEN, {"error": f"an action needs the header {ACTION_HEADER}: "
                                                            f"{ACTION_VALUE} (sent by the console page)"})
            return
        backend = self.server.backend
        actions: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "/console/api/reset": backend.reset,
            "/console/api/resend": backend.resend,
            "/console/api/dead-letters/resend": backend.resend_dead_letter,
            "/console/api/users/create": backend.create_user,
            "/console/api/users/delete": backend.delete_user,
            "/console/api/acls/create": backend.create_acl,
            "/console/api/acls/delete": backend.delete_acl}
        action = actions.get(path)
        if action is None:
            self._drain_body()
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such action {path}"})
            return
        body = self._json_body()
        if body is not None:
            shown = {k: ("(not shown)" if k == "secret" else v) for k, v in body.items()}
            log.info("console action %s from %s: %s", path, self.address_string(), shown)
            self._api(lambda: action(body))

    def _json_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._drain_body()
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": f"a JSON body of 1 to {MAX_BODY_BYTES} bytes, please"})
            return None
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as error:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": f"the body is not JSON: {error}"})
            return None
        if not isinstance(body, dict):
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "the body must be a JSON object"})
            return None
        return body

    def _drain_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    # -------------------------------------------------------------- replies
    def _signature(self) -> Signature | None:
        """The page's signature, when it sent one (required in sign-in mode)."""
        authorization = self.headers.get("Authorization", "")
        date_time = self.headers.get("X-Mq-Date-Time", "")
        if not authorization and not date_time:
            if self.server.backend.sign_in:
                raise ConsoleError(pb.UNAUTHORIZED, "sign in: this cluster requires credentials")
            return None
        return Signature.parse(authorization, date_time)

    def _api(self, produce: Callable[[], dict[str, Any]]) -> None:
        try:
            with self.server.backend.signed_as(self._signature()):
                answer = produce()
            self._send_json(HTTPStatus.OK, answer)
        except ConsoleError as error:
            self._send_json(error.http_status, error.to_json())
        except Exception as error:  # noqa: BLE001 - a page must get an answer, the log the trace
            log.exception("console API %s failed", self.path)
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"})

    def _send_json(self, status: int, data: dict[str, Any]) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.FOUND)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Nothing is loaded from elsewhere, and the page may not be framed.
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                                    "style-src 'self'; frame-ancestors 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)


class ConsoleHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: ConsoleBackend,
                 registry: CollectorRegistry | None = None, raw_reads: RawReadEndpoint | None = None) -> None:
        super().__init__(address, ConsoleHandler)
        self.backend = backend
        self.registry = registry
        self.raw_reads = raw_reads


def start_console_server(address: str, target: Target, registry: CollectorRegistry | None = None,
                         security: ClientSecurity | None = None, sign_in: bool = False,
                         raw_reads: RawReadEndpoint | None = None) -> tuple[ConsoleHttpServer, threading.Thread]:
    """Serve on `address` (host:port; port 0 picks one) from a daemon thread.
    `security` and `sign_in`: see ConsoleBackend; `raw_reads`: a node's
    committed-range reads for the Spark reader (cluster/raw_read_http.py)."""
    host, _, port = address.rpartition(":")
    server = ConsoleHttpServer((host or "127.0.0.1", int(port)), ConsoleBackend(target, security, sign_in),
                               registry, raw_reads)
    thread = threading.Thread(target=server.serve_forever, name="ConsoleHttpServer", daemon=True)
    thread.start()
    return server, thread


def stop_console_server(server: ConsoleHttpServer, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    server.backend.close()
    thread.join(timeout=2.0)

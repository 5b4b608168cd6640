"""ConsoleBackend: the web console's reads and actions, as JSON, through the
same gRPC APIs the CLI uses (DLedgerService.Metadata, AdminService,
OperationsService).

It runs in the HTTP server's threads, so it uses gRPC's synchronous
channels: nothing here touches the node's event loop, and a node nobody
looks at pays nothing (channels open on the first request). Queries go to
the first reachable server; actions too, and the node forwards them to the
leader as it does for the CLI.

Sign-in (`sign_in`): on a cluster with authentication the console holds no
credentials of its own. The page signs each request in the browser, as the
CLI signs its calls (RocketMQ 5's MQv2-HMAC-SHA1 over x-mq-date-time, with
WebCrypto; the secret never leaves the page), and the backend passes the
two headers on as the metadata of the gRPC calls it makes for that request
(`signed_as`), so every node checks that user's signature and ACLs exactly
as for the CLI. Nothing is kept between requests: there is no session, no
cookie to ride along with a forged request (CSRF), and no secret on the
server. Users and ACLs change only for a super user (`whoami` asks).
"""
from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import grpc

from dledger.rpc import tls
from dledger.rpc.credentials import ClientSecurity
from rpcgen import dledger_pb2 as dpb
from rpcgen import dledger_pb2_grpc
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import admin_pb2 as apb
from rpcgen.pydledger.admin.v1 import admin_pb2_grpc
from rpcgen.pydledger.admin.v1 import operations_pb2 as opb
from rpcgen.pydledger.admin.v1 import operations_pb2_grpc
from rpcgen.pydledger.auth.v1 import auth_pb2 as authpb
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc

# LAZY_CLIENT_IMPORTS: the client packages' views of admin answers
# (broker.client, dledger.client) are imported where the console first uses
# them, not with this module: every node imports it, and they cost each node
# process about a sixth of its start-up imports (the suite starts hundreds of
# nodes) for a page most nodes never serve.
PROBE_TIMEOUT_S = 1.0
CALL_TIMEOUT_S = 10.0
# Groups whose progress one overview request reads: each is a scan of its queues.
MAX_GROUPS_IN_OVERVIEW = 200
# What a signed request may carry (the page's MQv2-HMAC-SHA1 headers).
_AUTHORIZATION = re.compile(r"MQv2-HMAC-SHA1 Credential=([A-Za-z0-9._-]{1,64}), SignedHeaders=x-mq-date-time, "
                            r"Signature=[0-9a-fA-F]{40}")
_DATE_TIME = re.compile(r"\d{8}T\d{6}Z")
# gRPC codes of the auth, log and admin services' refusals, as the protocol's.
_REFUSALS = {grpc.StatusCode.UNAUTHENTICATED: pb.UNAUTHORIZED, grpc.StatusCode.PERMISSION_DENIED: pb.FORBIDDEN,
             grpc.StatusCode.INVALID_ARGUMENT: pb.BAD_REQUEST, grpc.StatusCode.NOT_FOUND: pb.NOT_FOUND,
             grpc.StatusCode.ALREADY_EXISTS: pb.BAD_REQUEST}


class ConsoleError(Exception):
    """A refusal to show the user: the protocol's code and its message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        # The protocol's codes are HTTP status * 100 + detail (40402: 404).
        status = self.code // 100
        return status if 400 <= status <= 599 else 500

    def to_json(self) -> dict[str, Any]:
        try:
            name = pb.Code.Name(self.code)
        except ValueError:
            name = str(self.code)
        return {"error": self.message, "code": name}


@dataclass(frozen=True)
class Target:
    """What a console talks to: some nodes of one DLedger group."""
    servers: tuple[str, ...]
    group: str = "default"


@dataclass(frozen=True)
class Signature:
    """The two headers a signed page request carries."""
    authorization: str
    date_time: str

    @classmethod
    def parse(cls, authorization: str, date_time: str) -> "Signature":
        if not _AUTHORIZATION.fullmatch(authorization) or not _DATE_TIME.fullmatch(date_time):
            raise ConsoleError(pb.UNAUTHORIZED, "the request's signature headers are malformed: sign in again")
        return cls(authorization, date_time)

    @property
    def user(self) -> str:
        match = _AUTHORIZATION.fullmatch(self.authorization)
        return match.group(1) if match else ""


class ConsoleBackend:
    def __init__(self, target: Target, security: ClientSecurity | None = None, sign_in: bool = False) -> None:
        """`security`: the CA to trust and, for `dledger console`, the
        operator's credentials (default: from DLEDGER_USER, DLEDGER_SECRET_FILE,
        DLEDGER_TLS_CA); `sign_in`: every request must be signed by the page."""
        self.target = target
        self.sign_in = sign_in
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._security = ClientSecurity.from_env() if security is None else security
        self._signer = None if sign_in else self._security.signer()
        self._caller = threading.local()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    @contextmanager
    def signed_as(self, signature: Signature | None) -> Iterator[None]:
        """The calls this thread makes meanwhile carry `signature` (one page
        request, served by one of the HTTP server's threads)."""
        self._caller.signature = signature
        try:
            yield
        finally:
            self._caller.signature = None

    def _signed(self) -> tuple[tuple[str, str], ...] | None:
        """The page's signature when it sent one; else, outside sign-in mode,
        the console's own (once a second; the signer is shared by the HTTP
        server's threads: a race only recomputes the same headers)."""
        signature: Signature | None = getattr(self._caller, "signature", None)
        if signature is not None:
            return (("x-mq-date-time", signature.date_time), ("authorization", signature.authorization))
        if self.sign_in:
            raise ConsoleError(pb.UNAUTHORIZED, "sign in: this cluster requires credentials")
        return self._signer.headers() if self._signer is not None else None

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                # TLS and credentials from DLEDGER_TLS_CA, DLEDGER_USER and
                # DLEDGER_SECRET_FILE (`dledger console --user ... --tls-ca ...`).
                channel = self._channels[address] = tls.sync_channel(address, self._security.ca)
            return channel

    # ---------------------------------------------------------------- cluster
    def cluster(self) -> dict[str, Any]:
        """Every node's role, term, indexes and applied index; the leader's
        view of each follower's lag."""
        probed: dict[str, dpb.MetadataResponse | None] = {}
        applied: dict[str, int | None] = {}
        peer_ids: dict[str, str] = {}
        pending = list(self.target.servers)
        while pending:
            for address in pending:
                # The applied index first: read after the committed index it could pass it.
                applied[address] = self._applied_index(address)
                probed[address] = self._metadata(address)
                for peer in probed[address].peers if probed[address] else ():
                    peer_ids.setdefault(peer.address, peer.id)
            pending = [a for a in peer_ids if a not in probed]
        nodes, seen = [], set()
        lag: dict[str, int] = {}
        from dledger.client import node_status_row   # imported here: see LAZY_CLIENT_IMPORTS
        for address, answer in probed.items():
            row = node_status_row(address, answer, peer_ids.get(address))
            if row["id"] in seen:
                continue
            if answer is None and row["id"] in {a.self_id for a in probed.values() if a}:
                continue
            seen.add(row["id"])
            row["applied_index"] = applied[address] if answer is not None else None
            nodes.append(row)
            if answer is not None and answer.role == "LEADER":
                lag = {p.id: p.lag for p in answer.peers if p.id != answer.self_id}
        for row in nodes:
            row["lag"] = lag.get(row["id"]) if row["role"] != "LEADER" else 0
        leader = next((n["id"] for n in nodes if n["role"] == "LEADER"), None)
        term = max((n["term"] for n in nodes if n["term"] is not None), default=None)
        return {"group": self.target.group, "leader": leader, "term": term, "nodes": nodes}

    def _metadata(self, address: str) -> dpb.MetadataResponse | None:
        stub = dledger_pb2_grpc.DLedgerServiceStub(self._channel(address))
        try:
            answer = stub.Metadata(dpb.MetadataRequest(header=dpb.Header(group=self.target.group)),
                                   metadata=self._signed(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as error:
            _raise_unauthenticated(error)
            return None
        return answer if answer.header.code in (0, 200) else None

    def _applied_index(self, address: str) -> int | None:
        stub = operations_pb2_grpc.OperationsServiceStub(self._channel(address))
        try:
            answer = stub.DescribeStore(opb.DescribeStoreRequest(), metadata=self._signed(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as error:
            _raise_unauthenticated(error)
            return None   # unreachable, or a user without Get on the Cluster: no applied index shown
        return answer.applied_index if answer.status.code == pb.OK else None

    # -------------------------------------------------------- topics, groups
    def topics(self, include_system: bool = False) -> dict[str, Any]:
        answer = self._admin("ListTopics", apb.ListTopicsRequest(include_system=include_system))
        from broker.client.admin import _topic as topic_info   # see LAZY_CLIENT_IMPORTS
        return {"topics": [topic_info(t).to_json() for t in answer.topics]}

    def groups(self) -> dict[str, Any]:
        answer = self._admin("ListGroups", apb.ListGroupsRequest())
        groups = []
        from broker.client.admin import _group as group_info   # see LAZY_CLIENT_IMPORTS
        for info in answer.groups[:MAX_GROUPS_IN_OVERVIEW]:
            row = group_info(info).to_json()
            progress = self.progress(info.group)
            row.update(total_lag=progress["total_lag"], dead_letters=progress["dead_letters"],
                       in_flight=sum(q["in_flight"] for q in progress["queues"]), queues=progress["queues"])
            groups.append(row)
        return {"groups": groups}

    def progress(self, group: str, topic: str = "") -> dict[str, Any]:
        answer = self._ops("GroupProgress", opb.GroupProgressRequest(group=group, topic=topic))
        return {"group": group, "total_lag": answer.total_lag, "dead_letters": answer.dead_letters,
                "dead_letters_by_topic": {t.topic: t.count for t in answer.dead_letters_by_topic},
                "queues": [{"topic": q.topic, "queue_id": q.queue_id, "committed_offset": q.committed_offset,
                            "min_offset": q.min_offset, "max_offset": q.max_offset, "lag": q.lag,
                            "in_flight": q.in_flight, "retrying": q.retrying, "expired": q.expired,
                            "blocked": q.blocked, "last_consumed_store_ms": q.last_consumed_store_ms}
                           for q in answer.queues]}

    # --------------------------------------------------------------- messages
    def messages(self, query: dict[str, str]) -> dict[str, Any]:
        """By `id`; by `topic` and `key` (optional `begin`, `end`, `max`); by
        `topic`, `queue` and `offset` or `time` (optional `count`)."""
        group = query.get("group", "")
        if query.get("id"):
            answer = self._ops("QueryMessageById", opb.QueryMessageByIdRequest(
                message_id=query["id"], topic=query.get("topic", ""), group=group))
        elif query.get("key"):
            answer = self._ops("QueryMessageByKey", opb.QueryMessageByKeyRequest(
                topic=query.get("topic", ""), key=query["key"], begin_ms=_int(query, "begin"),
                end_ms=_int(query, "end"), max=_int(query, "max"), group=group))
        elif query.get("offset") or query.get("time"):
            request = opb.QueryMessageByOffsetRequest(topic=query.get("topic", ""), queue_id=_int(query, "queue"),
                                                      count=_int(query, "count"), group=group)
            if query.get("offset"):
                request.offset = _int(query, "offset")
            else:
                request.timestamp_ms = _int(query, "time")
            answer = self._ops("QueryMessageByOffset", request)
        else:
            raise ConsoleError(pb.BAD_REQUEST, "search by id, by topic and key, or by topic, queue and offset or time")
        return {"messages": [_message_json(m) for m in answer.messages], "next_offset": answer.next_offset}

    def dead_letters(self, group: str, max_results: int = 0) -> dict[str, Any]:
        answer = self._ops("ListDeadLetters", opb.ListDeadLettersRequest(group=group, max=max_results))
        return {"group": group, "messages": [_message_json(m) for m in answer.messages],
                "next_offset": answer.next_offset}

    # ---------------------------------------------------------------- actions
    def reset(self, body: dict[str, Any]) -> dict[str, Any]:
        request = opb.ResetOffsetRequest(group=str(body.get("group", "")), topic=str(body.get("topic", "")))
        if body.get("to") in ("earliest", "latest"):
            request.position = opb.EARLIEST if body["to"] == "earliest" else opb.LATEST
        elif body.get("to_time") not in (None, ""):
            request.timestamp_ms = _number(body["to_time"], "to_time")
        elif body.get("queue") not in (None, "") and body.get("offset") not in (None, ""):
            request.queue_offset.CopyFrom(opb.QueueOffset(queue_id=_number(body["queue"], "queue"),
                                                          offset=_number(body["offset"], "offset")))
        answer = self._ops("ResetOffset", request)
        return {"entry_index": answer.entry_index, "queues": [
            {"queue_id": q.queue_id, "previous_offset": q.previous_offset, "offset": q.offset} for q in answer.queues]}

    def resend(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._ops("ResendMessage", opb.ResendMessageRequest(
            message_id=str(body.get("id", "")), topic=str(body.get("topic", "")), group=str(body.get("group", ""))))
        return {"entry_index": answer.entry_index, "message": _message_json(answer.message)}

    def resend_dead_letter(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._ops("ResendDeadLetter", opb.ResendDeadLetterRequest(
            group=str(body.get("group", "")), message_id=str(body.get("id", ""))))
        return {"entry_index": answer.entry_index, "message": _message_json(answer.message)}

    # --------------------------------------------------------------- plumbing
    def _admin(self, method: str, request: Any) -> Any:
        return self._call(admin_pb2_grpc.AdminServiceStub, method, request)

    def _ops(self, method: str, request: Any) -> Any:
        return self._call(operations_pb2_grpc.OperationsServiceStub, method, request)

    def _call(self, stub_type: Callable[[grpc.Channel], Any], method: str, request: Any,
              with_status: bool = True) -> Any:
        """The first reachable server's answer (it forwards changes to the
        leader). A refusal of the caller is the answer, not a reason to try
        another node."""
        failure = ""
        metadata = self._signed()
        for address in self.target.servers:
            try:
                answer = getattr(stub_type(self._channel(address)), method)(request, metadata=metadata,
                                                                            timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as error:
                code = error.code()  # type: ignore[attr-defined]
                if code in _REFUSALS:
                    raise ConsoleError(_REFUSALS[code], error.details() or code.name) from None  # type: ignore[attr-defined]
                failure = f"{address}: {code.name} {error.details() or ''}".strip()  # type: ignore[attr-defined]
                continue
            if with_status and answer.status.code != pb.OK:
                raise ConsoleError(answer.status.code, answer.status.message)
            return answer
        raise ConsoleError(pb.HA_NOT_AVAILABLE, f"no node answered ({failure})")

    # ---------------------------------------------------------- users, ACLs
    def _auth(self, method: str, request: Any) -> Any:
        return self._call(auth_pb2_grpc.AuthServiceStub, method, request, with_status=False)

    def whoami(self) -> dict[str, Any]:
        """Who signs this request, and whether a super user: the user list is
        the cluster's to give (List on the Cluster); one who may not list it
        is no super user (a super user passes every check)."""
        signature: Signature | None = getattr(self._caller, "signature", None)
        name = signature.user if signature is not None else self._security.user
        try:
            users = self._auth("ListUsers", authpb.ListUsersRequest()).users
        except ConsoleError as error:
            if error.code != pb.FORBIDDEN:
                raise
            return {"user": name, "type": "Normal", "sign_in": self.sign_in}
        kind = next((u.user_type for u in users if u.name == name), "Normal" if name else "")
        return {"user": name, "type": kind, "sign_in": self.sign_in}

    def users(self) -> dict[str, Any]:
        return {"users": [{"name": u.name, "type": u.user_type}
                          for u in self._auth("ListUsers", authpb.ListUsersRequest()).users]}

    def acls(self) -> dict[str, Any]:
        return {"acls": [{"subject": a.subject, "entries": [
            {"resource": e.resource, "actions": list(e.actions), "decision": e.decision,
             "source_ips": list(e.source_ips)} for e in a.entries]}
            for a in self._auth("ListAcls", authpb.ListAclsRequest()).acls]}

    def _super_only(self) -> None:
        if self.whoami()["type"] != "Super":
            raise ConsoleError(pb.FORBIDDEN, "users and ACLs are changed from the console by a super user only")

    def create_user(self, body: dict[str, Any]) -> dict[str, Any]:
        self._super_only()
        reply = self._auth("CreateUser", authpb.UserRequest(name=str(body.get("name", "")),
                                                            secret=str(body.get("secret", "")),
                                                            user_type=str(body.get("type", "Normal"))))
        return {"user": {"name": reply.user.name, "type": reply.user.user_type}}

    def delete_user(self, body: dict[str, Any]) -> dict[str, Any]:
        self._super_only()
        reply = self._auth("DeleteUser", authpb.DeleteUserRequest(name=str(body.get("name", ""))))
        return {"user": {"name": reply.user.name, "type": reply.user.user_type}}

    def create_acl(self, body: dict[str, Any]) -> dict[str, Any]:
        self._super_only()
        entry = authpb.AclEntry(resource=str(body.get("resource", "")), actions=_list(body.get("actions")),
                                decision=str(body.get("decision") or "Allow"),
                                source_ips=_list(body.get("source_ips")))
        reply = self._auth("CreateAcl", authpb.CreateAclRequest(subject=str(body.get("subject", "")),
                                                                entries=[entry]))
        return {"subject": reply.acl.subject, "entries": len(reply.acl.entries)}

    def delete_acl(self, body: dict[str, Any]) -> dict[str, Any]:
        self._super_only()
        resources = [str(body["resource"])] if body.get("resource") else []
        reply = self._auth("DeleteAcl", authpb.DeleteAclRequest(subject=str(body.get("subject", "")),
                                                                resources=resources))
        return {"subject": reply.acl.subject, "entries": len(reply.acl.entries)}


def _message_json(view: opb.MessageView) -> dict[str, Any]:
    from broker.client.operations import view_of as message_view   # see LAZY_CLIENT_IMPORTS
    data = message_view(view).to_json()
    try:
        data["body_text"] = view.body.decode("utf-8")
    except UnicodeDecodeError:
        data["body_text"] = None
    return data


def _raise_unauthenticated(error: grpc.RpcError) -> None:
    """A probe that fails is an unreachable node, unless the node refused the
    caller's signature: that is the answer to the whole request."""
    if error.code() == grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
        raise ConsoleError(pb.UNAUTHORIZED, error.details() or "the signature was refused")  # type: ignore[attr-defined]


def requires_sign_in(target: Target, security: ClientSecurity) -> bool:
    """Whether the cluster refuses unsigned calls (asked of the first node
    that answers): `dledger console` without an operator's credentials then
    has the page sign in."""
    for address in target.servers:
        with tls.sync_channel(address, security.ca) as channel:
            try:
                dledger_pb2_grpc.DLedgerServiceStub(channel).Metadata(
                    dpb.MetadataRequest(header=dpb.Header(group=target.group)), timeout=PROBE_TIMEOUT_S * 3)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
                    return True
                continue
            return False
    return False


def _list(value: Any) -> list[str]:
    """A JSON list, or "a,b" text, as a list of non-empty strings."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def _int(query: dict[str, str], name: str) -> int:
    value = query.get(name, "")
    return _number(value, name) if value != "" else 0


def _number(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConsoleError(pb.BAD_REQUEST, f"{name} must be a whole number, not {value!r}") from None

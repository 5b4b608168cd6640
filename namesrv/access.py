"""NameServerAccess: who may register a broker group, and who may look
routes up, on a secured name server. Decisions only: the servicer hands in
what a call presents (`Caller`) and gets a refusal (BrokerError with the
protocol's code) or an answer; cluster/nameserver.py opens the ports.

How a name server is secured, as a node is (docs/groups.md, "Security"):

- **TLS** (`tls_cert_file`, `tls_key_file` and the cluster CA
  `peer_tls_ca_file`): clients reach a TLS port (`--listen`), members a
  port of their own (`--peer-listen`) that requires a client certificate
  signed by the cluster CA. Registrations are served on the members' port
  only; on the clients' port they are refused FORBIDDEN. A process without
  a certificate of the cluster CA cannot even complete a handshake with the
  members' port, so only members of the cluster register a group.
- **Authentication** (`auth_enabled`, with the cluster's bootstrap super
  user and its secret file, the same as the nodes'): every call on the
  clients' port carries RocketMQ 5's signature. Without TLS (one shared
  port) a registration must be signed by that super user, whose secret
  every member holds (as for the peer protocol on a shared port).
- **Route queries are answered as the groups would answer QueryRoute.**
  Groups share nothing, each has its own users and ACLs; a secured group's
  leader sends them with its registration. A caller is authenticated in
  each live group where its user exists and its signature verifies; a
  group's route is included only where the caller may Pub or Sub on the
  topic (ClusterInfo: List on the Cluster). Signed in nowhere:
  UNAUTHORIZED; signed in but allowed nowhere: FORBIDDEN. So the name
  server tells no one more than a node of the group would.

Calls on the members' port are trusted: only members can reach it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from broker.auth.acl import CLUSTER, Action, topic
from broker.auth.authn import AuthFailure
from broker.auth.guard import AccessGuard, AuthSettings
from broker.auth.metadata import AuthMetadataManager
from broker.auth.requirements import Requirement
from broker.errors import BrokerError
from namesrv.route_table import GroupRecord
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

# Authentication failures, most telling first: a caller whose user exists
# somewhere but whose signature is wrong hears that, not "unknown user".
_REASON_ORDER = ("bad_signature", "stale", "malformed", "missing", "unknown_user")
MAX_AUTH_METADATA_BYTES = 4 << 20


@dataclass(frozen=True)
class Caller:
    """What a call presents."""
    authorization: str = ""
    date_time: str = ""
    source_ip: str = ""
    client: str = ""             # for the denial log: the client id or the peer
    members_port: bool = False   # came in on the members-only mutual-TLS port


def route_requirements(topic_name: str) -> list[Requirement]:
    """QueryRoute's rule: Pub or Sub on the topic."""
    return [((Action.PUB, Action.SUB), topic(topic_name))]


def cluster_requirements() -> list[Requirement]:
    """ClusterInfo: List on the Cluster (the admin service's ListBrokerGroups)."""
    return [((Action.LIST,), CLUSTER)]


def check_auth_metadata(blob: bytes) -> None:
    """A registration's users and ACLs must parse (BAD_REQUEST otherwise)."""
    if len(blob) > MAX_AUTH_METADATA_BYTES:
        raise BrokerError(pb.BAD_REQUEST, f"auth_metadata is {len(blob)} bytes, over {MAX_AUTH_METADATA_BYTES}")
    _metadata_of(blob)


def _metadata_of(blob: bytes) -> AuthMetadataManager:
    metadata = AuthMetadataManager("")
    if not blob:
        return metadata
    try:
        data = json.loads(blob)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        metadata.decode(data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise BrokerError(pb.BAD_REQUEST, f"auth_metadata cannot be read: {error}") from None
    return metadata


class NameServerAccess:
    def __init__(self, settings: AuthSettings, tls: bool) -> None:
        self.settings = settings
        self.tls = tls
        # The bootstrap super user alone: signs registrations on a shared
        # port, is counted and logged for every refusal.
        self.bootstrap = AccessGuard(settings, AuthMetadataManager(""))
        # group -> (the auth metadata it registered, a guard over it)
        self._groups: dict[str, tuple[bytes, AccessGuard]] = {}
        # Told of every refusal (reason, method): the name server's metrics.
        self.on_denied: Callable[[str, str], None] | None = None

    @property
    def secured(self) -> bool:
        return self.tls or self.settings.enabled

    # ------------------------------------------------------------ register
    def check_registration(self, caller: Caller, method: str) -> None:
        """Register and unregister: members only."""
        if caller.members_port:
            return
        if self.tls:
            raise self._refused(AuthFailure(
                "forbidden", f"{method} is served to members of the cluster only: on the name server's "
                             f"mutual-TLS port (--peer-listen), with a certificate of the cluster CA"), method, caller)
        if not self.settings.enabled:
            return
        try:
            self.bootstrap.authenticate(caller.authorization, caller.date_time)
        except AuthFailure as failure:
            raise self._refused(AuthFailure(failure.reason, f"{method} needs the signature of the cluster's "
                                                            f"super user: {failure.message}"), method, caller) from None

    # -------------------------------------------------------------- lookups
    def allowed(self, caller: Caller, method: str, live: list[GroupRecord], candidates: list[GroupRecord],
                needs: list[Requirement]) -> list[GroupRecord]:
        """The `candidates` (groups an answer would include) the caller may
        see; `live` are every live group (where a caller may sign in).
        Raises UNAUTHORIZED when the caller signs in nowhere, FORBIDDEN when
        it may see none of the candidates."""
        if caller.members_port or not self.settings.enabled:
            return candidates
        failures: list[AuthFailure] = []
        signed_in: dict[str, tuple[AccessGuard, object]] = {}
        for group in live:
            guard = self._guard(group)
            try:
                signed_in[group.broker_name] = (guard, guard.authenticate(caller.authorization, caller.date_time))
            except AuthFailure as failure:
                failures.append(failure)
        if not signed_in:
            try:   # no group registered, or the user is in none: the bootstrap super user still signs in
                self.bootstrap.authenticate(caller.authorization, caller.date_time)
                return candidates
            except AuthFailure as failure:
                failures.append(failure)
            raise self._refused(_most_telling(failures), method, caller)
        visible: list[GroupRecord] = []
        refusal: AuthFailure | None = None
        for group in candidates:
            entry = signed_in.get(group.broker_name)
            if entry is None:
                continue
            guard, user = entry
            try:
                guard.authorize(user, needs, caller.source_ip)  # type: ignore[arg-type]
            except AuthFailure as failure:
                refusal = refusal or AuthFailure(failure.reason, f"{failure.message} in group {group.broker_name!r}")
                continue
            visible.append(group)
        if candidates and not visible:
            raise self._refused(refusal or AuthFailure(
                "forbidden", "the caller is not a user of any group that holds this"), method, caller)
        return visible

    def _guard(self, group: GroupRecord) -> AccessGuard:
        known = self._groups.get(group.broker_name)
        if known is not None and known[0] == group.auth_metadata:
            return known[1]
        guard = AccessGuard(self.settings, _metadata_of(group.auth_metadata))
        self._groups[group.broker_name] = (group.auth_metadata, guard)
        return guard

    def forget(self, groups: set[str]) -> None:
        """Drop the guards of groups no longer registered."""
        for name in [n for n in self._groups if n not in groups]:
            del self._groups[name]

    # -------------------------------------------------------------- refusals
    def _refused(self, failure: AuthFailure, method: str, caller: Caller) -> BrokerError:
        self.bootstrap.note_denial(failure, method, caller.client)
        if self.on_denied is not None:
            self.on_denied(failure.reason, method)
        code = pb.FORBIDDEN if failure.reason == "forbidden" else pb.UNAUTHORIZED
        return BrokerError(code, failure.message)


def _most_telling(failures: list[AuthFailure]) -> AuthFailure:
    return min(failures, key=lambda f: _REASON_ORDER.index(f.reason) if f.reason in _REASON_ORDER
               else len(_REASON_ORDER))

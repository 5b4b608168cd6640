"""Who may open a client link (dledger/rpc/client_link.py): with auth on,
what may open an AppendStream on the client port: a known user whose hello
proves its secret (an HMAC of the listener's nonce keyed by it, instead of
a signed date-time) and whom the ACLs let Pub on the Cluster from the
link's source address. Checked once, when the link opens; a refusal is
counted and logged as the gRPC port's are (method "ClientLink").

A messaging link (broker/messaging_link.py) needs only the proof that its
user is who it says: each call on it carries the client's signed headers and
is checked by the client port's own interceptors (authentication and the
ACLs of what the call does), as the same call on gRPC is."""
from __future__ import annotations

import hmac
from typing import Callable

from broker.auth.authn import AuthFailure
from broker.auth.guard import AccessGuard
from broker.auth.requirements import LOG, REQUIREMENTS
from dledger.rpc.client_link import CredentialCheck
from dledger.rpc.link import proof
from rpcgen import dledger_pb2 as pb

METHOD = "ClientLink"
# The same requirement as the stream it stands in for.
_APPEND_REQUIREMENTS = REQUIREMENTS[f"/{LOG}/AppendStream"](None)


def credential_check(guard_of: Callable[[], AccessGuard | None]) -> CredentialCheck:
    """The check for a node whose guard is made after its link listens."""
    def check(hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> str:
        guard = guard_of()
        if guard is None:
            return "the node is still starting"
        failure = _failure(guard, hello, nonce, source_ip)
        if failure is None:
            return ""
        guard.note_denial(failure, METHOD, hello.sender_id or source_ip)
        return failure.message
    return check


def _failure(guard: AccessGuard, hello: pb.PeerLinkHello, nonce: bytes, source_ip: str) -> AuthFailure | None:
    if not hello.user:
        return AuthFailure("missing", "auth is on: the hello must name a user and prove its secret")
    user = guard.lookup(hello.user)
    if user is None:
        return AuthFailure("unknown_user", f"no user {hello.user!r}")
    if not hmac.compare_digest(hello.proof, proof(user.secret, nonce, hello.group, hello.sender_id)):
        return AuthFailure("bad_signature", f"the hello's proof is not {hello.user!r}'s secret's")
    if hello.service:
        return None   # every call on it is checked as it arrives
    try:
        guard.authorize(user, _APPEND_REQUIREMENTS, source_ip)
    except AuthFailure as failure:
        return failure
    return None

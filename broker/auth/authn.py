"""Authentication: RocketMQ 5's request signature, checked on every call.

A call carries `x-mq-date-time` and
`authorization: MQv2-HMAC-SHA1 Credential=<user>, SignedHeaders=x-mq-date-time, Signature=<hex>`
where the signature is the HMAC-SHA1 of the date-time keyed by the user's
secret. RocketMQ checks no time; we also refuse a date-time more than
`max_skew_s` away from our clock, which bounds how long a captured header can
be replayed. The official Python client formats its *local* time with a `Z`
suffix, so the date-time is accepted when either reading (UTC, or this
node's local time) is within the window; on hosts kept in UTC the two are
the same.

The HMAC is cheap but not free; a client signs the same date-time for a
whole second, so verified (header, date-time) pairs are kept
until they leave the window or a user changes (`forget`).
"""
from __future__ import annotations

import calendar
import hmac
import time
from dataclasses import dataclass
from typing import Callable

from broker.auth.acl import User
from dledger.rpc.credentials import ALGORITHM, DATE_TIME, DATE_TIME_FORMAT, signature

MAX_CACHED = 50_000


@dataclass(frozen=True)
class AuthFailure(Exception):
    """`reason` is a metric label (missing, malformed, unknown_user,
    bad_signature, stale); `message` is for the client."""
    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Credential:
    user: str
    date_time: str
    signature: str


def parse_authorization(value: str, date_time: str) -> Credential | None:
    """The credential a call presents; None when it presents none (no header,
    or an empty access key, which the official client sends when it has no
    credentials). Raises AuthFailure for a header that cannot be read."""
    if not value:
        return None
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthFailure("malformed", f"authorization: unsupported scheme {algorithm!r} (expected {ALGORITHM})")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            raise AuthFailure("malformed", f"authorization: {part.strip()!r} is not KEY=VALUE")
        fields[key] = item.strip()
    user = fields.get("Credential", "")
    if not user:
        return None
    if fields.get("SignedHeaders", "").lower() != DATE_TIME:
        raise AuthFailure("malformed", f"authorization: SignedHeaders must be {DATE_TIME}")
    sig = fields.get("Signature", "")
    if not sig:
        raise AuthFailure("malformed", "authorization: no Signature")
    if not date_time:
        raise AuthFailure("malformed", f"the signed header {DATE_TIME} is missing")
    return Credential(user, date_time, sig.lower())


def valid_until(date_time: str, now: float, max_skew_s: float) -> float:
    """Until when (clock seconds) `date_time` is inside the window, read as
    UTC or as this node's local time; AuthFailure when it is not now."""
    try:
        parsed = time.strptime(date_time, DATE_TIME_FORMAT)
    except ValueError:
        raise AuthFailure("malformed", f"{DATE_TIME} {date_time!r} is not {DATE_TIME_FORMAT}") from None
    readings = [calendar.timegm(parsed), time.mktime(parsed)]
    inside = [r for r in readings if abs(now - r) <= max_skew_s]
    if not inside:
        raise AuthFailure("stale", f"{DATE_TIME} {date_time} is more than {max_skew_s:.0f} s from this "
                                   f"node's clock (replayed, or a clock out of sync)")
    return max(inside) + max_skew_s


class Authenticator:
    def __init__(self, lookup: Callable[[str], User | None], max_skew_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.lookup = lookup
        self.max_skew_s = max_skew_s
        self.clock = clock
        # (authorization header, date-time) -> the User they verified as, and
        # until when the date-time stays inside the window.
        self._verified: dict[tuple[str, str], tuple[User, float]] = {}

    def forget(self) -> None:
        """Users changed: verify everything again."""
        self._verified.clear()

    def authenticate(self, authorization: str, date_time: str) -> User:
        """The user a call is signed by; AuthFailure when it is not signed
        correctly by a known user within the time window."""
        now = self.clock()
        cached = self._verified.get((authorization, date_time))
        if cached is not None and now <= cached[1]:
            return cached[0]
        credential = parse_authorization(authorization, date_time)
        if credential is None:
            raise AuthFailure("missing", "this cluster requires credentials: sign requests with an access key "
                                         "and secret (RocketMQ 5 MQv2-HMAC-SHA1)")
        until = valid_until(credential.date_time, now, self.max_skew_s)
        user = self.lookup(credential.user)
        if user is None:
            raise AuthFailure("unknown_user", f"user {credential.user!r} is not known")
        if not hmac.compare_digest(signature(user.secret, credential.date_time), credential.signature):
            raise AuthFailure("bad_signature", f"the signature of user {credential.user!r} does not match "
                                               f"(wrong secret?)")
        if len(self._verified) >= MAX_CACHED:
            self._verified.clear()
        self._verified[(authorization, date_time)] = (user, until)
        return user

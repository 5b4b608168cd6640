"""AccessGuard: who is calling (authentication) and may they (authorization),
with the caches that keep both off the hot path.

Users are the bootstrap super user from the node's configuration plus the
replicated ones (broker/auth/metadata.py). Decisions are cached per (user,
resource, actions, source IP) and dropped, with the verified signatures,
whenever a user or a policy changes, which every node applies in log order:
a removed user is refused on every node as soon as its node has applied
the removal.

Denials are counted by reason and method (metrics) and logged at most once
a minute per client and reason, without secrets.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from broker.auth import acl
from broker.auth.acl import Action, Resource, User, UserType
from broker.auth.authn import AuthFailure, Authenticator
from broker.auth.metadata import AuthMetadataManager
from broker.auth.requirements import Requirement

log = logging.getLogger(__name__)

DENIAL_LOG_INTERVAL_S = 60.0
MAX_CACHED_DECISIONS = 100_000


@dataclass(frozen=True)
class AuthSettings:
    enabled: bool = False
    super_user: str = "admin"
    super_secret: str = ""
    max_skew_s: float = 900.0


class AccessGuard:
    def __init__(self, settings: AuthSettings, metadata: AuthMetadataManager,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.metadata = metadata
        self.bootstrap = User(settings.super_user, settings.super_secret, UserType.SUPER) \
            if settings.super_secret else None
        self.authenticator = Authenticator(self.lookup, settings.max_skew_s, clock)
        self._decisions: dict[tuple[str, Resource, tuple[Action, ...], str], acl.Verdict] = {}
        self.denied: dict[tuple[str, str], int] = {}   # (reason, method) -> count
        self._logged: dict[tuple[str, str], float] = {}
        # Told of every denial (reason, method): the node's metrics.
        self.on_denied: Callable[[str, str], None] | None = None
        metadata.listeners.append(self.invalidate)

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def lookup(self, name: str) -> User | None:
        if self.bootstrap is not None and name == self.bootstrap.name:
            return self.bootstrap
        return self.metadata.users.get(name)

    def invalidate(self) -> None:
        self.authenticator.forget()
        self._decisions.clear()

    def authenticate(self, authorization: str, date_time: str) -> User:
        return self.authenticator.authenticate(authorization, date_time)

    def authorize(self, user: User, requirements: Iterable[Requirement], source_ip: str) -> None:
        """AuthFailure("forbidden") naming the user, action and resource of
        the first requirement the user's policies do not satisfy."""
        if user.type == UserType.SUPER:
            return
        for actions, resource in requirements:
            if not any(self._verdict(user, resource, (action,), source_ip).allowed for action in actions):
                verdict = self._verdict(user, resource, (actions[0],), source_ip)
                wanted = " or ".join(a.value for a in actions)
                raise AuthFailure("forbidden", f"user {user.name!r} may not {wanted} on {resource} "
                                               f"({verdict.reason})")

    def _verdict(self, user: User, resource: Resource, actions: tuple[Action, ...], source_ip: str
                 ) -> acl.Verdict:
        key = (user.name, resource, actions, source_ip)
        verdict = self._decisions.get(key)
        if verdict is None:
            verdict = acl.decide(user, self.metadata.policies.get(user.name, ()), resource, actions[0], source_ip)
            if len(self._decisions) >= MAX_CACHED_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = verdict
        return verdict

    def note_denial(self, failure: AuthFailure, method: str, client: str) -> None:
        key = (failure.reason, method)
        self.denied[key] = self.denied.get(key, 0) + 1
        if self.on_denied is not None:
            self.on_denied(failure.reason, method)
        now = time.monotonic()
        seen = (client, failure.reason)
        if now - self._logged.get(seen, -DENIAL_LOG_INTERVAL_S) >= DENIAL_LOG_INTERVAL_S:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged[seen] = now
            log.warning("denied %s from %s: %s (%s; logged once a minute per client)", method, client,
                        failure.message, failure.reason)

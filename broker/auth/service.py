"""The gRPC servicer of pydledger.auth.v1.AuthService: users and ACLs.

Every call is served by the leader (a follower forwards it), which writes
each change to the log as a system entry and answers once it is applied, so
a list after a create sees the create. Secrets go in, never out.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

import grpc

from broker.auth import acl
from broker.auth.acl import AclError, User, UserType
from broker.auth.guard import AccessGuard
from broker.auth.metadata import AuthKind, policy_update_payload, user_update_payload
from broker.errors import BrokerError
from broker.forwarding import LeaderForwarder
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc
from store.errors import StoreError
from store.message_store import MessageStore

SUBJECT_PREFIX = "User:"
MAX_NAME = 64


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def add_auth_service(guard: AccessGuard, store: MessageStore, forwarder: LeaderForwarder,
                     server: grpc.aio.Server) -> None:
    auth_pb2_grpc.add_AuthServiceServicer_to_server(AuthServicer(guard, store, forwarder), server)


def _user_info(user: User) -> apb.UserInfo:
    return apb.UserInfo(name=user.name, user_type=user.type.value)


def _subject(text: str) -> str:
    if not text.startswith(SUBJECT_PREFIX) or not text[len(SUBJECT_PREFIX):]:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"subject {text!r}: expected User:<name>")
    return text[len(SUBJECT_PREFIX):]


def _acl(name: str, entries: list[acl.PolicyEntry]) -> apb.Acl:
    return apb.Acl(subject=SUBJECT_PREFIX + name, entries=[
        apb.AclEntry(resource=str(e.resource), actions=sorted(a.value for a in e.actions),
                     source_ips=[str(n) for n in e.source_ips], decision=e.decision.value) for e in entries])


class AuthServicer(auth_pb2_grpc.AuthServiceServicer):
    def __init__(self, guard: AccessGuard, store: MessageStore, forwarder: LeaderForwarder) -> None:
        self.guard = guard
        self.store = store
        self.forwarder = forwarder

    @property
    def users(self) -> dict[str, User]:
        return self.guard.metadata.users

    async def _serve(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                     handler: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            if not self.forwarder.is_leader():
                return await self.forwarder.unary(method, request, context, auth_pb2_grpc.AuthServiceStub)
            return await handler(request)
        except _Refused as refused:
            await context.abort(refused.code, refused.message)
        except AclError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except BrokerError as error:
            code = grpc.StatusCode.UNAVAILABLE if error.code == pb.HA_NOT_AVAILABLE else grpc.StatusCode.INTERNAL
            await context.abort(code, error.message)
        except StoreError as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))

    # ------------------------------------------------------------------ users
    def _checked_user(self, request: apb.UserRequest, creating: bool) -> User:
        name = request.name
        if not name or len(name) > MAX_NAME or not all(c.isalnum() or c in "-_." for c in name):
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"user name {name!r}: 1..{MAX_NAME} letters, digits, '-', '_' or '.'")
        if self.guard.bootstrap is not None and name == self.guard.bootstrap.name:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"{name!r} is the bootstrap super user of the node configuration")
        existing = self.users.get(name)
        if creating and existing is not None:
            raise _Refused(grpc.StatusCode.ALREADY_EXISTS, f"user {name!r} exists (use update)")
        if not creating and existing is None:
            raise _Refused(grpc.StatusCode.NOT_FOUND, f"user {name!r} does not exist")
        secret = request.secret or (existing.secret if existing else "")
        if len(secret) < 8:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "a secret needs at least 8 characters")
        try:
            user_type = UserType((request.user_type or (existing.type.value if existing else "Normal")).capitalize())
        except ValueError:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"user type {request.user_type!r}: expected Super or Normal") from None
        return User(name, secret, user_type)

    async def CreateUser(self, request: apb.UserRequest, context: grpc.aio.ServicerContext) -> apb.UserReply:
        async def create(r: apb.UserRequest) -> apb.UserReply:
            user = self._checked_user(r, creating=True)
            await self.store.append_system_entry(AuthKind.USER_UPDATE, user_update_payload(user))
            return apb.UserReply(user=_user_info(user))
        return await self._serve("CreateUser", request, context, create)

    async def UpdateUser(self, request: apb.UserRequest, context: grpc.aio.ServicerContext) -> apb.UserReply:
        async def update(r: apb.UserRequest) -> apb.UserReply:
            user = self._checked_user(r, creating=False)
            await self.store.append_system_entry(AuthKind.USER_UPDATE, user_update_payload(user))
            return apb.UserReply(user=_user_info(user))
        return await self._serve("UpdateUser", request, context, update)

    async def DeleteUser(self, request: apb.DeleteUserRequest, context: grpc.aio.ServicerContext
                         ) -> apb.UserReply:
        async def delete(r: apb.DeleteUserRequest) -> apb.UserReply:
            user = self.users.get(r.name)
            if user is None:
                raise _Refused(grpc.StatusCode.NOT_FOUND, f"user {r.name!r} does not exist")
            await self.store.append_system_entry(AuthKind.USER_DELETE, {"name": r.name})
            return apb.UserReply(user=_user_info(user))
        return await self._serve("DeleteUser", request, context, delete)

    async def ListUsers(self, request: apb.ListUsersRequest, context: grpc.aio.ServicerContext
                        ) -> apb.ListUsersReply:
        async def list_users(r: apb.ListUsersRequest) -> apb.ListUsersReply:
            users = sorted(self.users.values(), key=lambda u: u.name)
            if self.guard.bootstrap is not None:
                users.insert(0, self.guard.bootstrap)
            return apb.ListUsersReply(users=[_user_info(u) for u in users])
        return await self._serve("ListUsers", request, context, list_users)

    # ------------------------------------------------------------------- ACLs
    async def CreateAcl(self, request: apb.CreateAclRequest, context: grpc.aio.ServicerContext) -> apb.AclReply:
        async def create(r: apb.CreateAclRequest) -> apb.AclReply:
            name = _subject(r.subject)
            if name not in self.users:
                raise _Refused(grpc.StatusCode.NOT_FOUND, f"user {name!r} does not exist (create it first)")
            if not r.entries:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "an ACL needs at least one entry")
            entries = [acl.make_entry(e.resource, e.actions, e.decision or "Allow", e.source_ips)
                       for e in r.entries]
            await self.store.append_system_entry(AuthKind.POLICY_UPDATE, policy_update_payload(name, entries))
            return apb.AclReply(acl=_acl(name, self.guard.metadata.policies.get(name, [])))
        return await self._serve("CreateAcl", request, context, create)

    async def DeleteAcl(self, request: apb.DeleteAclRequest, context: grpc.aio.ServicerContext) -> apb.AclReply:
        async def delete(r: apb.DeleteAclRequest) -> apb.AclReply:
            name = _subject(r.subject)
            if name not in self.guard.metadata.policies:
                raise _Refused(grpc.StatusCode.NOT_FOUND, f"{r.subject} has no ACL")
            resources = [str(acl.ResourcePattern.parse(text)) for text in r.resources]
            await self.store.append_system_entry(AuthKind.POLICY_DELETE, {"user": name, "resources": resources})
            return apb.AclReply(acl=_acl(name, self.guard.metadata.policies.get(name, [])))
        return await self._serve("DeleteAcl", request, context, delete)

    async def ListAcls(self, request: apb.ListAclsRequest, context: grpc.aio.ServicerContext
                       ) -> apb.ListAclsReply:
        async def list_acls(r: apb.ListAclsRequest) -> apb.ListAclsReply:
            policies = self.guard.metadata.policies
            names = [_subject(r.subject)] if r.subject else sorted(policies)
            return apb.ListAclsReply(acls=[_acl(n, policies[n]) for n in names if n in policies])
        return await self._serve("ListAcls", request, context, list_acls)

"""ACL 2.0 matching, table-driven: literal beats prefix beats namespace beats
any, a longer prefix beats a shorter one, deny wins ties, IP ranges, super
users, and nothing matching denies."""
from __future__ import annotations

import pytest

from broker.auth import acl
from broker.auth.acl import Action, make_entry

NORMAL = acl.User("alice", "s")
SUPER = acl.User("root", "s", acl.UserType.SUPER)

E = make_entry
CASES = [
    # (name, entries, resource, action, ip, allowed)
    ("no entries deny", [], acl.topic("orders"), Action.PUB, "10.0.0.1", False),
    ("literal allow", [E("Topic:orders", ["Pub"])], acl.topic("orders"), Action.PUB, "", True),
    ("other action denied", [E("Topic:orders", ["Pub"])], acl.topic("orders"), Action.SUB, "", False),
    ("other topic denied", [E("Topic:orders", ["Pub"])], acl.topic("payments"), Action.PUB, "", False),
    ("All covers every action", [E("Topic:orders", ["All"])], acl.topic("orders"), Action.DELETE, "", True),
    ("prefix allow", [E("Topic:ord*", ["Pub"])], acl.topic("orders"), Action.PUB, "", True),
    ("prefix does not match", [E("Topic:ord*", ["Pub"])], acl.topic("payments"), Action.PUB, "", False),
    ("literal deny beats prefix allow", [E("Topic:ord*", ["Pub"]), E("Topic:orders", ["Pub"], "Deny")],
     acl.topic("orders"), Action.PUB, "", False),
    ("literal allow beats prefix deny", [E("Topic:ord*", ["Pub"], "Deny"), E("Topic:orders", ["Pub"])],
     acl.topic("orders"), Action.PUB, "", True),
    ("longer prefix wins", [E("Topic:o*", ["Pub"], "Deny"), E("Topic:orders-*", ["Pub"])],
     acl.topic("orders-eu"), Action.PUB, "", True),
    ("prefix beats any", [E("*", ["Pub"], "Deny"), E("Topic:ord*", ["Pub"])],
     acl.topic("orders"), Action.PUB, "", True),
    ("type-any beats any", [E("*", ["Pub"]), E("Topic:*", ["Pub"], "Deny")],
     acl.topic("orders"), Action.PUB, "", False),
    ("any allows", [E("*", ["Sub"])], acl.group("g1"), Action.SUB, "", True),
    ("deny wins a tie", [E("Topic:orders", ["Pub"]), E("Topic:orders", ["Pub", "Sub"], "Deny")],
     acl.topic("orders"), Action.PUB, "", False),
    ("group literal", [E("Group:g1", ["Sub"])], acl.group("g1"), Action.SUB, "", True),
    ("topic pattern does not cover a group", [E("Topic:g1", ["Sub"])], acl.group("g1"), Action.SUB, "", False),
    ("ip inside range", [E("Topic:orders", ["Pub"], "Allow", ["10.0.0.0/8"])],
     acl.topic("orders"), Action.PUB, "10.1.2.3", True),
    ("ip outside range", [E("Topic:orders", ["Pub"], "Allow", ["10.0.0.0/8"])],
     acl.topic("orders"), Action.PUB, "192.168.1.1", False),
    ("deny from one address only", [E("Topic:*", ["Pub"]), E("Topic:*", ["Pub"], "Deny", ["10.9.9.9"])],
     acl.topic("orders"), Action.PUB, "10.9.9.9", False),
    ("others still allowed", [E("Topic:*", ["Pub"]), E("Topic:*", ["Pub"], "Deny", ["10.9.9.9"])],
     acl.topic("orders"), Action.PUB, "10.9.9.8", True),
    ("ipv6 range", [E("Topic:orders", ["Pub"], "Allow", ["::1/128"])], acl.topic("orders"), Action.PUB, "::1", True),
    ("namespace grants its topics", [E("Namespace:ns1", ["Pub"])], acl.topic("orders", "ns1"), Action.PUB, "", True),
    ("namespace does not grant another's", [E("Namespace:ns1", ["Pub"])],
     acl.topic("orders", "ns2"), Action.PUB, "", False),
    ("namespaced topics are separate", [E("Topic:orders", ["Pub"])], acl.topic("orders", "ns1"), Action.PUB, "",
     False),
    ("wrapped literal", [E("Topic:ns1%orders", ["Pub"])], acl.topic("orders", "ns1"), Action.PUB, "", True),
    ("literal deny in an allowed namespace", [E("Namespace:ns1", ["Pub"]), E("Topic:ns1%orders", ["Pub"], "Deny")],
     acl.topic("orders", "ns1"), Action.PUB, "", False),
    ("namespace beats type-any", [E("Topic:*", ["Pub"]), E("Namespace:ns1", ["Pub"], "Deny")],
     acl.topic("orders", "ns1"), Action.PUB, "", False),
    ("cluster", [E("Cluster", ["Get"])], acl.CLUSTER, Action.GET, "", True),
    ("cluster other action", [E("Cluster", ["Get"])], acl.CLUSTER, Action.UPDATE, "", False),
]


@pytest.mark.parametrize("name, entries, resource, action, ip, allowed", CASES, ids=[c[0] for c in CASES])
def test_normal_user_decisions(name: str, entries: list[acl.PolicyEntry], resource: acl.Resource,
                               action: Action, ip: str, allowed: bool) -> None:
    assert acl.decide(NORMAL, entries, resource, action, ip).allowed is allowed


def test_super_users_skip_every_check() -> None:
    deny_all = [E("*", ["All"], "Deny")]
    assert acl.decide(SUPER, deny_all, acl.topic("orders"), Action.DELETE).allowed


@pytest.mark.parametrize("resource, actions, decision, ips, message", [
    ("Queue:x", ["Pub"], "Allow", [], "expected \\*, Cluster"),
    ("Topic:", ["Pub"], "Allow", [], "names no topic"),
    ("Topic:a", ["Publish"], "Allow", [], "action 'Publish'"),
    ("Topic:a", [], "Allow", [], "at least one action"),
    ("Topic:a", ["Pub"], "Maybe", [], "expected Allow or Deny"),
    ("Topic:a", ["Pub"], "Allow", ["10.0.0.300"], "not an address"),
])
def test_bad_entries_are_refused_with_a_reason(resource: str, actions: list[str], decision: str,
                                               ips: list[str], message: str) -> None:
    with pytest.raises(acl.AclError, match=message):
        make_entry(resource, actions, decision, ips)


def test_entries_round_trip_through_json() -> None:
    entry = E("Topic:orders*", ["Pub", "Sub"], "Deny", ["10.0.0.0/8"])
    assert acl.PolicyEntry.from_json(entry.to_json()) == entry


def test_secrets_stay_out_of_repr() -> None:
    assert "s3cret" not in repr(acl.User("bob", "s3cret"))

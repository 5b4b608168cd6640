"""When a group's leader registers with a name server (broker/registration.py),
and how a node is configured with name servers (cluster/config.py)."""
from __future__ import annotations

import argparse

import pytest

from broker.registration import Sent, registration_due
from cluster.config import ConfigError, broker_settings_from_args, build_broker_settings


def test_a_leader_registers_at_once_then_every_interval():
    assert registration_due(None, "term 3", now=0, interval_s=30)
    sent = Sent("term 3", at=0, ok=True)
    assert not registration_due(sent, "term 3", now=29.9, interval_s=30)
    assert registration_due(sent, "term 3", now=30, interval_s=30)


def test_a_change_of_term_topics_or_members_registers_at_once():
    sent = Sent(("term 3", "topics 7"), at=0, ok=True)
    assert registration_due(sent, ("term 3", "topics 8"), now=0.1, interval_s=30)
    assert registration_due(sent, ("term 4", "topics 7"), now=0.1, interval_s=30)


def test_a_failed_registration_is_tried_again_after_a_second():
    failed = Sent("x", at=0, ok=False)
    assert not registration_due(failed, "x", now=0.5, interval_s=30)
    assert registration_due(failed, "x", now=1.0, interval_s=30)
    assert registration_due(Sent("x", at=0, ok=False), "x", now=0.3, interval_s=0.2)


def test_name_servers_come_from_the_broker_table_or_the_environment(tmp_path):
    assert build_broker_settings({"namesrv_addrs": ["127.0.0.1:9876", "h:9877"]})["namesrv_addrs"] == \
        ("127.0.0.1:9876", "h:9877")
    assert build_broker_settings({"namesrv_addrs": "a:1,b:2", "register_interval_s": 5}) == \
        {"namesrv_addrs": ("a:1", "b:2"), "register_interval_s": 5.0}
    with pytest.raises(ConfigError, match="broker.namesrv_addrs"):
        build_broker_settings({"namesrv_addrs": "nohost"})
    args = argparse.Namespace(config=None)
    assert broker_settings_from_args(args, {"DLEDGER_NAMESRV_ADDRS": "ns1:9876,ns2:9876"}) == \
        {"namesrv_addrs": ("ns1:9876", "ns2:9876")}
    with pytest.raises(ConfigError, match="DLEDGER_NAMESRV_ADDRS"):
        broker_settings_from_args(args, {"DLEDGER_NAMESRV_ADDRS": "ns1"})

"""Child names and the name-length budget."""

from __future__ import annotations

import pytest

from agentrl.api.job import MAX_NAME_LENGTH
from agentrl.api.wire import config_map_name
from agentrl.reconcile import names


def test_children_are_named_after_the_job():
    assert config_map_name("swe") == "swe-config"
    assert names.engine("swe") == "swe-engine"
    assert names.engine_pod("swe", 3) == "swe-engine-3"
    assert names.trainer("swe") == "swe-trainer"
    assert names.trainer_hostname("swe", 0) == "swe-trainer-0"
    assert names.rollout("swe") == "swe-rollout"
    assert names.sandbox_policy("swe") == "swe-sandbox"
    assert names.sandbox_pod_prefix("swe") == "swe-sbx-"
    assert names.checkpoints("swe") == "swe-checkpoints"


def test_the_longest_job_name_keeps_the_revision_hash_label_a_dns_label():
    longest = "a" * MAX_NAME_LENGTH
    # 40 + len("-engine-") (8) + 10 hash characters = 58 ≤ 63.
    assert len(f"{names.engine(longest)}-{'x' * 10}") == MAX_NAME_LENGTH + 18
    assert MAX_NAME_LENGTH + 18 <= 63
    # The sandbox pod: 40 + len("-sbx-") (5) + 12 = 57.
    assert len(names.sandbox_pod_prefix(longest) + "x" * 12) == 57


def test_the_budget_check_fails_for_a_name_limit_that_is_too_long(monkeypatch):
    monkeypatch.setattr(names, "MAX_NAME_LENGTH", 50)
    # 50 + 18 = 68 > 63 for the revision hash label.
    with pytest.raises(AssertionError, match="controller-revision-hash"):
        names._check_name_budget()

"""Labels and selectors."""

from __future__ import annotations

from agentrl.reconcile import labels
from agentrl.reconcile.constants import Component
from tests.factories import make_job


def test_component_labels_add_ours_to_the_users_and_ours_win():
    job = make_job("swe").with_labels(team="rl", **{"app.kubernetes.io/name": "mine"}).obj()
    assert labels.component_labels(job, Component.TRAINER) == {
        "team": "rl",
        "app.kubernetes.io/name": "agentrl",
        "app.kubernetes.io/instance": "swe",
        "app.kubernetes.io/component": "trainer",
        "app.kubernetes.io/part-of": "agentrl",
        "app.kubernetes.io/managed-by": "agentrl-operator",
        "agentrl.dev/job": "swe",
    }


def test_selectors_ignore_user_labels():
    job = make_job("swe").with_labels(team="rl").obj()
    assert labels.selector(job, Component.ENGINE) == {
        "agentrl.dev/job": "swe",
        "app.kubernetes.io/component": "engine",
    }


def test_selector_string_is_sorted_key_value_pairs():
    job = make_job("swe").obj()
    assert (
        labels.selector_string(labels.sandbox_selector(job))
        == "agentrl.dev/job=swe,app.kubernetes.io/component=sandbox"
    )

"""The chart's PriorityClasses, as ``helm template`` renders them: five classes in the order
operator > trainer > engines > rollout workers > sandboxes, none the global default, sandboxes
never preempting; the first on the operator's own pod, the others' names handed to the operator;
off for a cluster that manages its own (the operator then gets the names given, or none).
Offline: no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.charting import Helm, HelmError, find

KINDS = ("trainer", "engines", "rollout", "sandboxes")
#: The operator's option for each kind (agentrl operator --help).
OPTIONS = {
    "trainer": "--trainer-priority-class",
    "engines": "--engine-priority-class",
    "rollout": "--rollout-priority-class",
    "sandboxes": "--sandbox-priority-class",
}


def _classes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}


def _class_options(docs: list[dict[str, Any]]) -> dict[str, str]:
    args = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    out = {}
    for arg in args:
        option, _, value = arg.partition("=")
        if option.endswith("-priority-class"):
            out[option] = value
    return out


def _operator_class(docs: list[dict[str, Any]]) -> str | None:
    spec = find(docs, "Deployment")["spec"]["template"]["spec"]
    return spec.get("priorityClassName")


def test_the_default_install_creates_five_ordered_classes_and_tells_the_operator(
    helm: Helm,
) -> None:
    docs = helm.template(release="rel")
    classes = _classes(docs)
    assert sorted(classes) == [
        "rel-agentrl-engines",
        "rel-agentrl-operator",
        "rel-agentrl-rollout",
        "rel-agentrl-sandboxes",
        "rel-agentrl-trainer",
    ]
    order = ("operator", *KINDS)
    by_kind = {kind: classes[f"rel-agentrl-{kind}"] for kind in order}
    assert [by_kind[k]["value"] for k in order] == [10000000, 1000000, 100000, 10000, 1000]
    assert [by_kind[k]["preemptionPolicy"] for k in order] == [
        "PreemptLowerPriority",
        "PreemptLowerPriority",
        "PreemptLowerPriority",
        "PreemptLowerPriority",
        "Never",
    ]
    # the operator's own pod is above every pod it manages: they never preempt it
    assert _operator_class(docs) == "rel-agentrl-operator"
    for pc in classes.values():
        assert pc["apiVersion"] == "scheduling.k8s.io/v1"
        assert pc["globalDefault"] is False
        assert "namespace" not in pc["metadata"]  # cluster-scoped
    assert _class_options(docs) == {OPTIONS[kind]: f"rel-agentrl-{kind}" for kind in KINDS}


def test_two_releases_never_share_a_class(helm: Helm) -> None:
    a = set(_classes(helm.template(release="team-a")))
    b = set(_classes(helm.template(release="team-b")))
    assert a and b and not a & b


def test_named_classes_are_created_under_those_names_with_their_values(helm: Helm) -> None:
    docs = helm.template(
        {
            "priorityClasses": {
                "trainer": {
                    "name": "agentrl-trainer",
                    "value": 2000000,
                    "preemptionPolicy": "Never",
                },
                "sandboxes": {"name": "agentrl-sandboxes", "value": -10},
            }
        }
    )
    classes = _classes(docs)
    assert sorted(classes) == [
        "agentrl-sandboxes",
        "agentrl-trainer",
        "rel-agentrl-engines",
        "rel-agentrl-operator",
        "rel-agentrl-rollout",
    ]
    trainer = classes["agentrl-trainer"]
    assert (trainer["value"], trainer["preemptionPolicy"]) == (2000000, "Never")
    assert classes["agentrl-sandboxes"]["value"] == -10
    options = _class_options(docs)
    assert options["--trainer-priority-class"] == "agentrl-trainer"
    assert options["--sandbox-priority-class"] == "agentrl-sandboxes"


def test_off_creates_no_class_and_passes_only_the_names_given(helm: Helm) -> None:
    docs = helm.template(
        {
            "priorityClasses": {
                "create": False,
                "trainer": {"name": "cluster-gold"},
                "engines": {"name": "cluster-silver"},
            }
        }
    )
    assert _classes(docs) == {}
    assert _operator_class(docs) is None
    # rollout workers and sandboxes get no class: the cluster's default applies to them
    assert _class_options(docs) == {
        "--trainer-priority-class": "cluster-gold",
        "--engine-priority-class": "cluster-silver",
    }


def test_off_without_names_gives_the_operator_no_class_at_all(helm: Helm) -> None:
    docs = helm.template({"priorityClasses": {"create": False}})
    assert _classes(docs) == {}
    assert _class_options(docs) == {}
    assert _operator_class(docs) is None


def test_the_operator_pod_takes_a_class_given_by_name(helm: Helm) -> None:
    named = helm.template(
        {"priorityClasses": {"create": False, "operator": {"name": "cluster-platform"}}}
    )
    assert _operator_class(named) == "cluster-platform"
    # operator.priorityClassName wins over the chart's class
    chosen = helm.template({"operator": {"priorityClassName": "system-cluster-critical"}})
    assert _operator_class(chosen) == "system-cluster-critical"
    assert "rel-agentrl-operator" in _classes(chosen)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"engines": {"value": 1000000}},
            "priorityClasses.trainer.value (1000000) must be above priorityClasses.engines.value "
            "(1000000): the order is operator > trainer > engines > rollout > sandboxes",
        ),
        (
            {"trainer": {"value": 20000000}},
            "priorityClasses.operator.value (10000000) must be above "
            "priorityClasses.trainer.value (20000000)",
        ),
        (
            {"sandboxes": {"value": 20000}},
            "priorityClasses.rollout.value (10000) must be above priorityClasses.sandboxes.value "
            "(20000)",
        ),
    ],
)
def test_classes_out_of_order_are_refused_naming_both(
    helm: Helm,
    values: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(HelmError) as err:
        helm.template({"priorityClasses": values})
    assert message in err.value.stderr


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"trainer": {"name": "Gold_Class"}}, "/priorityClasses/trainer/name"),
        ({"engines": {"value": 2000000000}}, "/priorityClasses/engines/value"),
        (
            {"sandboxes": {"preemptionPolicy": "Sometimes"}},
            "/priorityClasses/sandboxes/preemptionPolicy",
        ),
        ({"rollout": {"colour": "red"}}, "/priorityClasses/rollout"),
    ],
)
def test_a_bad_class_value_is_refused_naming_the_field(
    helm: Helm,
    values: dict[str, Any],
    field: str,
) -> None:
    with pytest.raises(HelmError) as err:
        helm.template({"priorityClasses": values})
    assert f"at '{field}'" in err.value.stderr

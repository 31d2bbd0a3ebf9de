"""The wire contract's version and skew policy (:mod:`agentrl.api.wire_version`): what each side
accepts of a peer one minor version apart, what it refuses beyond, and the pinned schema that
makes a change to the contract bump its version.

The documents are the real ones: the operator's ``runtime.yaml`` as ``reconcile.configmap``
writes it, turned into what an operator of the previous or the next minor version writes, read
back by the trainer's and the rollout tier's readers.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api import wire
from agentrl.api.wire import WireSkewError, receive_runtime
from agentrl.api.wire_version import WIRE_HISTORY, WIRE_VERSION, WireVersion, compatible
from agentrl.reconcile.configmap import config_map
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import pod_from_object
from agentrl.reconcile.policies.suspend import WorkloadScale
from agentrl.rollout.concurrency_source import InEffect, parse_runtime
from agentrl.trainer.config import TrainerEnv, load_config
from tests.factories import make_job

SCHEMAS = Path(__file__).parent / "wire_schemas"
SCALE = WorkloadScale(
    engines=2,
    rollout_workers=3,
    sandbox_concurrency=12,
    concurrency_limited_by=None,
    trainer_suspended=False,
)


def _runtime_doc() -> dict[str, Any]:
    """``runtime.yaml`` as this operator writes it (provider kubernetes: with sandbox.pods)."""
    job = make_job("swe", "rl").with_uid("u1").obj()
    text = config_map(job, BuildContext.for_job(job), SCALE)["data"][wire.CONFIG_RUNTIME_KEY]
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def test_the_operator_writes_its_contract_version_into_runtime_yaml() -> None:
    doc = _runtime_doc()
    assert WIRE_VERSION == "1.1"
    assert doc["wireVersion"] == "1.1"
    assert next(iter(doc)) == "wireVersion"  # the first line a reader of the file sees


def test_a_previous_minor_runtime_yaml_parses_with_defaults_and_reports_its_old_key() -> None:
    # What a 1.0 operator wrote: no wireVersion (the key 1.1 added), and a key 1.1 does not
    # know (rollout.concurrencyPerWorker, written by 1.0 operators before it was removed).
    old = _runtime_doc()
    del old["wireVersion"]
    old["rollout"]["concurrencyPerWorker"] = 4
    received = receive_runtime(old, reader="this trainer")
    assert received.version == "1.0"
    assert received.value.wire_version == "1.0"  # the missing key took the reader's default
    assert received.unknown == ("rollout.concurrencyPerWorker",)
    assert received.value.sandbox.concurrency == 12
    assert received.value.rollout.workers == 3
    assert received.value.sandbox.pods is not None
    # the rollout tier follows it, and says what it ignored
    assert parse_runtime(yaml.safe_dump(old)) == InEffect(concurrency=12, workers=3)


def test_the_trainer_reads_a_previous_minor_runtime_yaml_and_logs_the_key_it_ignores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = make_job("swe", "rl").with_uid("u1")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job.manifest()))
    old = _runtime_doc()
    del old["wireVersion"]
    old["rollout"]["concurrencyPerWorker"] = 4
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(old))
    with caplog.at_level(logging.WARNING, logger="agentrl.trainer.config"):
        config = load_config(TrainerEnv(config=tmp_path / "job.yaml"))
    assert config.runtime.wire_version == "1.0"
    assert config.runtime.engines.urls == _runtime_doc()["engines"]["urls"]
    assert caplog.messages == [
        "runtime.yaml (wire contract 1.0) has keys this trainer does not know, ignored: "
        "rollout.concurrencyPerWorker"
    ]


def test_a_runtime_yaml_of_the_next_minor_parses_and_reports_its_new_keys() -> None:
    new = _runtime_doc()
    new["wireVersion"] = "1.2"
    new["sandbox"]["warmPool"] = 4
    new["engines"]["grpcPort"] = 30001
    new["checkpointFormat"] = "dcp"
    received = receive_runtime(new, reader="this trainer")
    assert received.version == "1.2"
    assert received.unknown == ("engines.grpcPort", "sandbox.warmPool", "checkpointFormat")
    # everything this side knows is as the operator wrote it
    current = receive_runtime(_runtime_doc(), reader="this trainer")
    assert current.unknown == ()
    assert received.value == current.value.model_copy(update={"wire_version": "1.2"})


@pytest.mark.parametrize(
    ("theirs", "accepted"),
    [
        ("1.0", True),
        ("1.1", True),
        ("1.2", True),
        ("1.3", False),
        ("2.1", False),
        ("0.9", False),
        ("1", False),
        ("latest", False),
    ],
)
def test_a_version_is_read_within_one_minor_of_the_readers_own(theirs: str, accepted: bool) -> None:
    assert compatible(theirs) is accepted


def test_a_wider_skew_is_refused_naming_both_versions() -> None:
    doc = _runtime_doc()
    doc["wireVersion"] = "1.3"
    with pytest.raises(WireSkewError) as refused:
        receive_runtime(doc, reader="this trainer")
    assert str(refused.value) == (
        "wire contract skew: runtime.yaml is wire contract 1.3; this trainer speaks 1.1 and "
        "reads 1.0 to 1.2: run the operator and the job's images at most one minor version "
        "apart (docs/install.md, Upgrades and version skew)"
    )
    assert (refused.value.theirs, refused.value.ours) == ("1.3", "1.1")
    doc["wireVersion"] = "2.0"
    with pytest.raises(WireSkewError, match=r"runtime\.yaml is wire contract 2\.0; this"):
        parse_runtime(yaml.safe_dump(doc))  # the rollout tier keeps its last figure on it


def test_the_operator_reads_a_next_minor_annotation_and_ignores_a_wider_skews() -> None:
    def pod(progress: dict[str, Any]) -> Any:
        annotations = {wire.ANNOTATION_PROGRESS: json.dumps(progress)}
        return pod_from_object({"metadata": {"name": "swe-trainer-0", "annotations": annotations}})

    newer = {"wireVersion": "1.2", "step": 7, "rolloutLagSteps": 2}
    received = wire.receive_annotation(
        json.dumps(newer), wire.TrainerProgress, key=wire.ANNOTATION_PROGRESS
    )
    assert received.unknown == ("rolloutLagSteps",)
    assert pod(newer).progress == wire.TrainerProgress(wire_version="1.2", step=7)
    assert pod({"wireVersion": "1.3", "step": 7}).progress is None


def test_the_workloads_write_their_contract_version_into_their_annotations() -> None:
    for report in (wire.TrainerProgress(step=1), wire.WatchdogReport(state="Ready")):
        assert json.loads(report.to_annotation())["wireVersion"] == "1.1"


def test_a_refusal_is_read_back_from_a_workloads_last_words() -> None:
    error = WireSkewError("runtime.yaml", "1.3", reader="this trainer")
    log_tail = f"INFO starting\nError: {error}\n"
    refusal = wire.skew_line(log_tail)
    assert refusal is not None
    assert refusal.line == str(error)
    assert (refusal.what, refusal.writer_version, refusal.reader_version) == (
        "runtime.yaml",
        "1.3",
        "1.1",
    )
    assert wire.skew_line("Traceback ...\nOSError: no space left on device") is None


# ---- the pinned schemas -------------------------------------------------------------------------


def _pinned() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))}


def test_the_contract_is_the_schema_its_version_pins() -> None:
    pinned = _pinned().get(WIRE_VERSION)
    assert pinned is not None, (
        f"no schema pinned for wire contract {WIRE_VERSION}: run `make wire-schema`"
    )
    assert wire.contract_schema() == pinned, (
        f"the wire contract's schema changed but WIRE_VERSION is still {WIRE_VERSION}, whose "
        "schema tests/api/wire_schemas pins: bump WIRE_VERSION (a minor version for a key added "
        "with a default or an optional key removed, a major one for anything else), add its "
        "WIRE_HISTORY line and run `make wire-schema`"
    )


def test_every_version_is_pinned_in_the_history_and_the_latest_is_the_current() -> None:
    versions = sorted(WIRE_HISTORY, key=WireVersion.parse)
    assert list(WIRE_HISTORY) == versions
    assert versions[-1] == WIRE_VERSION
    assert sorted(_pinned(), key=WireVersion.parse) == versions
    for older, newer in itertools.pairwise(versions):
        a, b = WireVersion.parse(older), WireVersion.parse(newer)
        assert b in ((a.major, a.minor + 1), (a.major + 1, 0)), f"{older} -> {newer} skips one"


def _objects(schema: dict[str, Any]) -> dict[str, tuple[dict[str, Any], set[str]]]:
    """Every object of a document's schema by its path: (properties, required)."""
    defs = schema.get("$defs", {})
    found: dict[str, tuple[dict[str, Any], set[str]]] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        for alternative in node.get("anyOf", ()):
            walk(alternative, path)
        if "items" in node:
            walk(node["items"], f"{path}[]")
        if "properties" in node:
            found[path] = (node["properties"], set(node.get("required", ())))
            for key, sub in node["properties"].items():
                walk(sub, f"{path}.{key}" if path else key)

    walk(schema, "")
    return found


def _window_breaks(older: dict[str, Any], newer: dict[str, Any]) -> list[str]:
    """What keeps a reader of one version from a document of the other, one minor apart."""
    breaks = []
    for doc in sorted(set(older) | set(newer)):
        if doc not in older or doc not in newer:
            breaks.append(f"{doc}: added or removed")
            continue
        old, new = _objects(older[doc]), _objects(newer[doc])
        for path in sorted(set(old) & set(new)):
            (old_props, old_required), (new_props, new_required) = old[path], new[path]
            where = f"{doc} {path or '(top)'}"
            for key in sorted(new_required - old_required):
                breaks.append(f"{where}: {key} is required now; the older writer may omit it")
            for key in sorted(old_required - set(new_props)):
                breaks.append(f"{where}: {key} was required; the newer writer no longer writes it")
            for key in sorted(set(old_props) & set(new_props) - {wire.WIRE_VERSION_KEY}):
                if old_props[key] != new_props[key]:
                    breaks.append(f"{where}: {key} changed its type or default")
    return breaks


def test_each_minor_version_only_adds_defaulted_keys_or_drops_optional_ones() -> None:
    pinned = _pinned()
    versions = sorted(pinned, key=WireVersion.parse)
    for older, newer in itertools.pairwise(versions):
        if WireVersion.parse(older).major != WireVersion.parse(newer).major:
            continue  # a new major version owes the old one nothing
        assert _window_breaks(pinned[older], pinned[newer]) == [], f"{older} -> {newer}"


def test_the_window_check_catches_a_key_made_required() -> None:
    older = {"agentrl.dev/progress": _pinned()["1.1"]["agentrl.dev/progress"]}
    newer = json.loads(json.dumps(older))
    newer["agentrl.dev/progress"]["required"] = ["step"]
    newer["agentrl.dev/progress"]["properties"]["step"]["type"] = "number"
    assert _window_breaks(older, newer) == [
        "agentrl.dev/progress (top): step is required now; the older writer may omit it",
        "agentrl.dev/progress (top): step changed its type or default",
    ]


def test_a_trainer_refuses_a_wider_skew_in_the_last_line_the_operator_reads(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from agentrl.trainer.cli import trainer

    job = make_job("swe", "rl").with_uid("u1")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job.manifest()))
    newer = _runtime_doc()
    newer["wireVersion"] = "1.3"
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(newer))
    result = CliRunner().invoke(trainer, ["--config", str(tmp_path / "job.yaml"), "--dry-run"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last == (
        "Error: wire contract skew: runtime.yaml is wire contract 1.3; this trainer speaks 1.1 "
        "and reads 1.0 to 1.2: run the operator and the job's images at most one minor version "
        "apart (docs/install.md, Upgrades and version skew)"
    )
    refusal = wire.skew_line(result.output)  # what the operator lifts from its log tail
    assert refusal is not None
    assert (refusal.writer_version, refusal.reader_version) == ("1.3", "1.1")

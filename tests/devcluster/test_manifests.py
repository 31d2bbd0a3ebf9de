"""Pure parts of the local cluster: node manifests, kwok stages, profiles, ports."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agentrl.devcluster import nodes, stages, versions
from agentrl.devcluster.cluster import Ports
from agentrl.devcluster.profile import ClusterProfile


def test_default_profile_is_four_mi355x_nodes_and_two_cpu_nodes() -> None:
    manifests = nodes.nodes_for(ClusterProfile())
    names = [m["metadata"]["name"] for m in manifests]
    assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "cpu-0", "cpu-1"]
    gpu = manifests[0]
    assert gpu["status"]["capacity"]["amd.com/gpu"] == "8"
    assert gpu["metadata"]["labels"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI355X"
    assert gpu["metadata"]["labels"]["amd.com/gpu.device-id"] == "75a3"
    assert gpu["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    cpu = manifests[4]
    assert "amd.com/gpu" not in cpu["status"]["capacity"]
    assert cpu["metadata"]["labels"]["agentrl.dev/node-pool"] == "sandbox"


def test_counts_from_the_command_line_override_the_profile() -> None:
    profile = ClusterProfile().with_counts(gpu_nodes=1, cpu_nodes=0)
    assert [m["metadata"]["name"] for m in nodes.nodes_for(profile)] == ["gpu-0"]


def test_a_yaml_profile_with_an_unknown_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("gpu: {count: 2, gpuz: 4}\n")
    with pytest.raises(ValidationError) as err:
        ClusterProfile.load(path)
    assert "gpu.gpuz" in str(err.value)


def test_a_yaml_profile_sets_node_shapes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("gpu: {count: 2, gpus: 4, gpu_resource: nvidia.com/gpu}\ncpu: {count: 1}\n")
    manifests = nodes.nodes_for(ClusterProfile.load(path))
    assert [m["status"]["capacity"].get("nvidia.com/gpu") for m in manifests] == ["4", "4", None]


def test_stages_are_valid_kwok_stage_documents_with_unique_names() -> None:
    docs = list(yaml.safe_load_all(stages.stages_yaml()))
    assert all(d["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and d["kind"] == "Stage" for d in docs)
    names = [d["metadata"]["name"] for d in docs]
    assert len(names) == len(set(names))
    outcomes = {
        e["values"][0]
        for d in docs
        for e in d["spec"]["selector"]["matchExpressions"]
        if stages.OUTCOME in e["key"] and e["operator"] == "In"
    }
    assert outcomes == {"Succeeded", "Failed", "CrashLoop", "ImagePullError"}


def test_ports_are_consecutive_from_the_base() -> None:
    ports = Ports(16443)
    assert list(ports.all().values()) == [16443, 16444, 16445, 16446, 16447, 16448]


def test_staging_modules_follow_the_kubernetes_minor_and_patch() -> None:
    assert versions.staging_version("1.34.4") == "v0.34.4"
    with pytest.raises(ValueError):
        versions.staging_version("2.0.0")

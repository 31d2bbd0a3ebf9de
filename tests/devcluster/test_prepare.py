"""`agentrl dev prepare` builds everything before pytest starts, and a machine that cannot build
stops there with a message naming what is missing; a half-finished build is never mistaken for
a finished one."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.devcluster import binaries, prepare, versions

REPO = Path(__file__).resolve().parents[2]


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_cache_entry_without_its_stamp_is_not_a_finished_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("AGENTRL_DEV_BIN_DIR", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    final = tmp_path / "agentrl" / "bin" / f"kwok-{versions.KWOK}" / "kwok"
    # an interrupted build: the staging dir, and even a final dir someone copied by hand
    _executable(final.parent.with_name(final.parent.name + ".partial") / "kwok")
    _executable(final)
    assert binaries.find("kwok") is None
    assert "kwok" in binaries.missing(("kwok",))
    (final.parent / binaries.STAMP).write_text("{}\n")
    assert binaries.find("kwok") == final


def test_a_build_that_lacks_a_binary_is_not_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target, staging = binaries._staging_dir("kubernetes")
    _executable(staging / "kubectl")  # the build died before the other binaries were linked
    with pytest.raises(binaries.BinaryError, match="kube-apiserver"):
        binaries._finish("kubernetes", target, staging)
    assert not target.exists()
    assert not (staging / binaries.STAMP).exists()


def test_helm_is_stamped_with_the_kubernetes_minor_of_its_own_client_go() -> None:
    """helm 3.19.0's go.mod requires k8s.io/client-go v0.34.x: its release build assumes 1.34."""
    go_mod = Path(
        subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip(),
        "cache/download/helm.sh/helm/v3/@v",
        f"v{versions.HELM}.mod",
    )
    assert go_mod.is_file(), "helm's go.mod is downloaded by 'agentrl dev prepare'"
    flags = binaries.helm_ldflags(go_mod.read_text())
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34" in flags
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1" in flags
    assert "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=34" in flags
    assert f"-X helm.sh/helm/v3/internal/version.version=v{versions.HELM}" in flags


def _step(name: str, log: list[str], *, done: bool = False, tools: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    state = {"done": done}

    def run() -> None:
        log.append(name)
        state["done"] = True

    return lambda: prepare.Step(name, f"the {name} step", lambda: state["done"], run, tools)


def test_every_requirement_is_checked_before_any_step_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(
        prepare,
        "STEPS",
        [_step("first", ran), _step("second", ran, tools=("no-such-tool-agentrl",))],
    )
    with pytest.raises(prepare.PrepareError) as err:
        prepare.prepare()
    assert "second: no-such-tool-agentrl not found on PATH" in str(err.value)
    assert ran == []  # not even the first step, whose tools are there


def test_only_pending_steps_run_and_a_step_must_leave_itself_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(prepare, "STEPS", [_step("a", ran, done=True), _step("b", ran)])
    prepare.prepare()
    assert ran == ["b"]
    broken = prepare.Step("broken", "never finishes", lambda: False, lambda: None)
    monkeypatch.setattr(prepare, "STEPS", [lambda: broken])
    # a step still not done after running: its inputs changed meanwhile (files edited)
    with pytest.raises(prepare.PrepareError, match=r"broken: finished, but .* already out of date"):
        prepare.prepare()
    with pytest.raises(prepare.PrepareError, match="unknown step nope"):
        prepare.prepare(["nope"])


def _no_go_env(tmp_path: Path) -> dict[str, str]:
    """This machine's environment with an empty cache and no Go on PATH."""
    path = [p for p in os.environ["PATH"].split(":") if p and not Path(p, "go").exists()]
    path.insert(0, str(Path(sys.executable).parent))
    skip = {"AGENTRL_DEV_BIN_DIR", "KUBEBUILDER_ASSETS"}
    env = {k: v for k, v in os.environ.items() if k not in skip}
    return {**env, "PATH": ":".join(path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_prepare_without_go_names_what_is_missing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "dev", "prepare", "--only", "binaries"],
        capture_output=True,
        text=True,
        env=_no_go_env(tmp_path),
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "binaries: Go >= 1.24 is needed to build etcd, kube-apiserver" in proc.stderr
    assert "AGENTRL_DEV_BIN_DIR" in proc.stderr
    assert not (tmp_path / "cache" / "agentrl" / "bin").exists()  # nothing half-built


@pytest.mark.slow
def test_the_test_command_stops_before_pytest_when_it_cannot_build(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "scripts/test.sh", "--collect-only"],
        capture_output=True,
        text=True,
        env=_no_go_env(tmp_path),
        cwd=REPO,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Go >= 1.24 is needed" in proc.stderr
    # pytest never started: nothing was collected, no test errored one by one
    assert "collected" not in proc.stdout and "error" not in proc.stdout.lower()

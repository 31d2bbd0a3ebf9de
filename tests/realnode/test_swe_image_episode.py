"""SWE-bench-shaped episodes on the real node: the instance's own image, built here, runs as
the sandbox pods of the operator's template (the ``swebench`` profile: root, no capability), and
the project's ``KubernetesProvider`` execs into them through API server -> kubelet -> containerd.

The image (``swe_image/Dockerfile``) is what the harness's images are to its eval scripts: a
small real Python repository at ``/testbed`` (a git repository at the base commit, installed in
editable mode), ``/opt/miniconda3`` with a ``testbed`` environment that the harness's own lines
``source /opt/miniconda3/bin/activate`` and ``conda activate testbed`` activate, and pytest only
inside it. The task is read from a SWE-bench 5.x row (its ``eval_script`` has the harness's
structure, conda activation included), so the agent's ``bash`` runs in ``testbed`` through the
task's ``shell_setup``, and the episode runner grades the submitted patch in a fresh pod.

The agent is the token-level scaffold acting through native tool calls: a scripted engine
answers with the ids of Qwen ``<tool_call>`` JSON blocks (parser ``qwen25``) in the project's
own tokenizer and chat template. One episode runs the tests (they fail), fixes the bug with a
multi-line ``str_replace``, runs them again (they pass) and submits: resolved. The other makes
the failing test pass by editing the test instead of the code: not resolved, since the eval
script puts the test files back. Expected values are written by hand: the repository's files,
its base commit (made here by git from the same files), the patches, the test outcomes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.factories import make_job, sandbox_pods_of
from tests.realnode.test_project_images import ON_REAL_NODE
from tests.rollout.fakes import ScriptedEngine
from tests.rollout.swebench_rows import eval_script
from tests.rollout.test_native_tool_agent import JSON_SYNTAX, Turn, encode
from tests.rollout.test_swebench_local import base_commit_of, harness_resolved

from agentrl.api import AgentRLJob
from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.devcluster import images
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.rollout.agent import TokenAgent, TrajectoryBuilder
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.hf_model_files import build_tokenizer
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.swe_tools import SWEToolRunner, tool_schemas
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.swebench import task_from_instance
from agentrl.rollout.trajectory import Trajectory
from agentrl.rollout.verifier import EVAL_LOG_PATH, GradeStatus
from agentrl.sandbox.kubernetes import KubeApiTransport, KubernetesProvider
from agentrl.sandbox.provider import Sandbox, SandboxRequest

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.slow]

IMAGE_DIR = Path(__file__).parent / "swe_image"
#: The harness's name for the instance's image (``swebench_image``), under a local namespace and
#: with a tag other than ``latest`` (nothing can be pulled: the node has it, IfNotPresent).
IMAGE = "localhost/agentrl-tests/sweb.eval.x86_64.example_1776_tally-1:v1"

# ---------------------------------------------------------------------------------------------
# The repository at /testbed: median() is wrong for an even number of values.

STATS = '''\
"""Summary statistics of a sequence of numbers."""


def mean(values):
    """The arithmetic mean of a non-empty sequence."""
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    """The middle value of a non-empty sequence; with an even number of values, the mean of
    the two in the middle."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty sequence")
    middle = len(ordered) // 2
    return ordered[middle]
'''
TESTS = """\
import pytest

from tally import mean, median


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_mean_of_nothing():
    with pytest.raises(ValueError):
        mean([])


def test_median_of_an_odd_count():
    assert median([3, 1, 2]) == 2


def test_median_of_an_even_count():
    assert median([4, 1, 3, 2]) == 2.5
"""
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "tally"
version = "0.1.0"
requires-python = ">=3.9"

[tool.setuptools]
packages = ["tally"]
"""
REPO_FILES = {
    ".gitignore": "*.egg-info/\n__pycache__/\n.pytest_cache/\n",
    "pyproject.toml": PYPROJECT,
    "tally/__init__.py": '"""Small summary statistics."""\n\nfrom tally.stats import mean, median\n'
    '\n__all__ = ["mean", "median"]\n',
    "tally/stats.py": STATS,
    "tests/test_stats.py": TESTS,
}

# The dataset's side: the test the fix must also pass, and the reference fix.
TEST_PATCH = """\
diff --git a/tests/test_stats.py b/tests/test_stats.py
--- a/tests/test_stats.py
+++ b/tests/test_stats.py
@@ -18,3 +18,7 @@ def test_median_of_an_odd_count():

 def test_median_of_an_even_count():
     assert median([4, 1, 3, 2]) == 2.5
+
+
+def test_median_of_two():
+    assert median([2, 1]) == 1.5
"""
OLD = "    middle = len(ordered) // 2\n    return ordered[middle]\n"
NEW = (
    "    middle, odd = divmod(len(ordered), 2)\n"
    "    if odd:\n"
    "        return ordered[middle]\n"
    "    return (ordered[middle - 1] + ordered[middle]) / 2\n"
)
#: The fix as git writes it (without its ``index`` line, whose blob ids are git's business).
FIX_DIFF = """\
diff --git a/tally/stats.py b/tally/stats.py
--- a/tally/stats.py
+++ b/tally/stats.py
@@ -15,5 +15,7 @@ def median(values):
     ordered = sorted(values)
     if not ordered:
         raise ValueError("median of an empty sequence")
-    middle = len(ordered) // 2
-    return ordered[middle]
+    middle, odd = divmod(len(ordered), 2)
+    if odd:
+        return ordered[middle]
+    return (ordered[middle - 1] + ordered[middle]) / 2
"""
WEAK_OLD = "    assert median([4, 1, 3, 2]) == 2.5\n"
WEAK_NEW = "    assert median([4, 1, 3, 2]) == 3\n"
#: (Blank context lines are a lone space in git's output: ``\n \n`` below.)
CHEAT_DIFF = """\
diff --git a/tests/test_stats.py b/tests/test_stats.py
--- a/tests/test_stats.py
+++ b/tests/test_stats.py
@@ -17,4 +17,4 @@ def test_median_of_an_odd_count():
 \n \n def test_median_of_an_even_count():
-    assert median([4, 1, 3, 2]) == 2.5
+    assert median([4, 1, 3, 2]) == 3
"""
F2P = [
    "tests/test_stats.py::test_median_of_an_even_count",
    "tests/test_stats.py::test_median_of_two",
]
P2P = [
    "tests/test_stats.py::test_mean",
    "tests/test_stats.py::test_mean_of_nothing",
    "tests/test_stats.py::test_median_of_an_odd_count",
]
RUN_TESTS = "pytest -q tests"
#: The calls that edit: the fix, and the cheat (the failing test made to expect the bug).
FIX = ("str_replace_editor", {"command": "str_replace", "path": "tally/stats.py", "old_str": OLD,
       "new_str": NEW})  # fmt: skip
WEAKEN = ("str_replace_editor", {"command": "str_replace", "path": "tests/test_stats.py",
          "old_str": WEAK_OLD, "new_str": WEAK_NEW})  # fmt: skip


def record(base: str) -> dict[str, object]:
    """The instance as a SWE-bench 5.x row: its image and its eval script (conda lines in)."""
    return {
        "repo": "example/tally",
        "instance_id": "example__tally-1",
        "base_commit": base,
        "patch": FIX_DIFF,
        "test_patch": TEST_PATCH,
        "problem_statement": "median() of an even number of values is the upper middle value, "
        "not the mean of the two middle values.",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(F2P),
        "PASS_TO_PASS": json.dumps(P2P),
        "environment_setup_commit": base,
        "image": IMAGE,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "eval_script": eval_script(
            base_commit=base,
            test_files=["tests/test_stats.py"],
            test_patch=TEST_PATCH,
            test_command="pytest -rA tests/test_stats.py",
        ),
    }


# ---------------------------------------------------------------------------------------------
# fixtures: the image on the node, the job, the provider


@pytest.fixture(scope="module")
def swe_image(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image built (or found current) and imported into the real node's containerd."""
    if cluster.local is None:
        pytest.skip("imports an image built here: needs the local cluster's real node")
    context = tmp_path_factory.mktemp("swe-image") / "context"
    shutil.copytree(IMAGE_DIR, context)
    for rel, content in REPO_FILES.items():
        (context / "testbed" / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / "testbed" / rel).write_text(content)
    archive = images.build_test_image(context / "Dockerfile", context, IMAGE)
    cluster.local.load([archive], echo=lambda _: None)
    return IMAGE


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The base commit the image's build makes, made here by git from the same files."""
    return base_commit_of(tmp_path_factory.mktemp("base"), REPO_FILES)


@dataclass
class Lease:
    episode_id: str
    pod: str
    node: str = ""
    image: str = ""
    run_as_user: int | None = None
    eval_log: str | None = None


@dataclass
class PodLog:
    """The project's provider, noting each pod leased (where it ran, as whom) and its release;
    a grading pod's eval log is read just before the pod goes."""

    inner: KubernetesProvider
    kubectl: Kubectl
    events: list[tuple[str, str]] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    name = "kubernetes"

    async def create(self, request: SandboxRequest) -> Sandbox:
        sandbox = await self.inner.create(request)
        pod = await asyncio.to_thread(self.kubectl.json, "get", "pod", sandbox.id)
        container = pod["spec"]["containers"][0]
        lease = Lease(
            request.episode_id,
            sandbox.id,
            pod["spec"]["nodeName"],
            container["image"],
            pod["spec"]["securityContext"].get("runAsUser"),
        )
        self.leases.append(lease)
        self.events.append(("create", sandbox.id))
        close = sandbox.close

        async def logged_close() -> None:
            if request.episode_id.endswith("-grade"):
                lease.eval_log = (await sandbox.read_file(EVAL_LOG_PATH)).decode()
            self.events.append(("close", sandbox.id))
            await close()

        sandbox.close = logged_close  # type: ignore[method-assign]
        return sandbox

    async def aclose(self) -> None:
        await self.inner.aclose()


def _job(kubectl: Kubectl, name: str, image: str) -> AgentRLJob:
    kubectl.apply(
        make_job(name, None)
        .with_model_path("tiny")
        .with_dataset(format="swebench", path="/data/instances.jsonl")
        .with_sandbox(
            image=image,
            cpu="500m",
            memory="512Mi",
            startupTimeoutSeconds=120,
            nodeSelector=ON_REAL_NODE["nodeSelector"],
            tolerations=ON_REAL_NODE["tolerations"],
        )
        .manifest()
    )
    return AgentRLJob.model_validate(kubectl.json("get", "arj", name))


@pytest.fixture
async def provider(
    cluster: ClusterHandle, kubectl: Kubectl, crd_installed: None, swe_image: str
) -> AsyncIterator[PodLog]:
    job = _job(kubectl, "swe-sandbox", swe_image)
    namespace = kubectl.namespace or "default"
    prov = KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=str(cluster.kubeconfig)),
        pods=sandbox_pods_of(job, namespace=namespace),
        worker_id="realnode-swe",
        creates_per_second=10,
        poll_seconds=0.2,
    )
    yield PodLog(prov, kubectl)
    await prov.aclose()


# ---------------------------------------------------------------------------------------------
# the scripted model


class Keeping:
    """The agent, keeping what it built (the patch ``submit`` returned is not on the
    trajectory)."""

    def __init__(self, agent: TokenAgent) -> None:
        self.agent = agent
        self.out: TrajectoryBuilder | None = None

    async def run(
        self, episode_id: str, task: Task, tools: SWEToolRunner, out: TrajectoryBuilder
    ) -> None:
        self.out = out
        await self.agent.run(episode_id, task, tools, out)


CAPS = EpisodeCaps(
    max_turns=10,
    max_trajectory_tokens=32768,
    max_tokens_per_turn=512,
    tool_timeout_seconds=60,
    verifier_timeout_seconds=120,
    sandbox_startup_timeout_seconds=120,
)


async def episode(provider: PodLog, task: Task, script: list[Turn]) -> tuple[Trajectory, str]:
    """One episode of ``task`` whose model replies ``script`` (native tool calls, as ids);
    returns the trajectory and the submitted patch."""
    tok = build_tokenizer(template=JSON_SYNTAX.template)
    turns = HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser=JSON_SYNTAX.parser)
    engine = ScriptedEngine(
        [t.text(JSON_SYNTAX) for t in script],
        encode=lambda text: encode(tok, text),
        end_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    agent = Keeping(TokenAgent(EnginePool([engine]), turns, CAPS))
    runner = EpisodeRunner(
        provider=provider,  # type: ignore[arg-type]
        agent=agent,
        caps=CAPS,
        failure_policy=FailurePolicy(infra_retries=0),
    )
    trajectory = await runner.run(task, group_id="g", policy_version=1)
    assert agent.out is not None and agent.out.patch is not None, trajectory.infra_reason
    return trajectory, agent.out.patch


def without_index(patch: str) -> str:
    return "".join(line for line in patch.splitlines(True) if not line.startswith("index "))


def pytest_statuses(log: str) -> dict[str, str]:
    """``pytest -rA``'s summary lines (``PASSED path::name``) of an eval log."""
    found = {}
    for line in log.splitlines():
        status, _, test = line.partition(" ")
        if status in ("PASSED", "FAILED") and "::" in test:
            found[test.split(" ")[0]] = status
    return found


def assert_leased_then_graded(provider: PodLog, image: str) -> tuple[Lease, Lease]:
    """Two pods of the task's image on the real node, as root: the agent's, released before
    the grading one is created."""
    agent, grader = provider.leases
    assert provider.events == [
        ("create", agent.pod),
        ("close", agent.pod),
        ("create", grader.pod),
        ("close", grader.pod),
    ]
    assert agent.pod != grader.pod
    assert grader.episode_id == f"{agent.episode_id}-grade"
    for lease in (agent, grader):
        assert (lease.node, lease.image, lease.run_as_user) == ("real-0", image, 0)
    return agent, grader


# ---------------------------------------------------------------------------------------------
# tests


async def test_the_image_runs_the_tests_only_in_its_activated_environment(
    provider: PodLog, swe_image: str, base: str
) -> None:
    sandbox = await provider.create(
        SandboxRequest(episode_id="look", image=swe_image, workdir="/testbed")
    )
    try:
        plain = await sandbox.exec("id -u; command -v pytest || echo 'no pytest'", timeout=30)
        assert plain.stdout.splitlines() == ["0", "no pytest"]
        activated = await sandbox.exec(
            "/bin/bash -c 'set -u; source /opt/miniconda3/bin/activate; conda activate testbed; "
            'command -v pytest; echo "$CONDA_DEFAULT_ENV"; '
            'python -c "import tally; print(tally.__file__)"\'',
            timeout=30,
            cwd="/",
        )
        assert activated.exit_code == 0, activated.output
        assert activated.stdout.splitlines() == [
            "/opt/miniconda3/envs/testbed/bin/pytest",
            "testbed",
            "/testbed/tally/__init__.py",
        ]
        repo = await sandbox.exec(
            "stat -c %U /testbed; git rev-parse HEAD; git status --porcelain", timeout=30
        )
        assert repo.stdout.splitlines() == ["root", base]
    finally:
        await sandbox.close()


async def test_a_multi_line_fix_made_through_native_tool_calls_is_resolved_in_a_fresh_pod(
    provider: PodLog, swe_image: str, base: str, tmp_path: Path
) -> None:
    row = record(base)
    task = task_from_instance(row)
    assert (task.image, task.workdir) == (swe_image, "/testbed")
    script = [
        Turn(
            "Let me run the tests first.",
            (("bash", {"command": f"command -v pytest && {RUN_TESTS}"}),),
        ),
        Turn("", (FIX,)),
        Turn("Run them again.", (("bash", {"command": RUN_TESTS}),)),
        Turn("", (("submit", {}),)),
    ]
    trajectory, patch = await episode(provider, task, script)

    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        1.0,
        GradeStatus.RESOLVED,
    ), (trajectory.infra_reason, [t.observation for t in trajectory.turns])
    first, edit, second, _ = (t.observation for t in trajectory.turns)
    # the tests ran in testbed, and failed on the bug
    assert first.startswith("/opt/miniconda3/envs/testbed/bin/pytest\n")
    assert "FAILED tests/test_stats.py::test_median_of_an_even_count - assert 3 == 2.5" in first
    assert "1 failed, 3 passed" in first and "[exit code 1]" in first
    assert "return (ordered[middle - 1] + ordered[middle]) / 2" in edit
    assert "4 passed" in second and "[exit code 0]" in second
    assert without_index(patch) == FIX_DIFF
    _, grader = assert_leased_then_graded(provider, swe_image)
    # graded by the row's eval script in the fresh pod: environment activated, test patch in
    log = grader.eval_log or ""
    assert "+ conda activate testbed" in log and ">>>>> Test Exit Code: 0" in log
    assert pytest_statuses(log) == dict.fromkeys([*F2P, *P2P], "PASSED")
    assert harness_resolved(row, log, tmp_path) is True


async def test_an_episode_that_edits_the_failing_test_instead_of_the_code_is_not_resolved(
    provider: PodLog, swe_image: str, base: str, tmp_path: Path
) -> None:
    row = record(base)
    task = task_from_instance(row)
    script = [
        Turn("", (("bash", {"command": RUN_TESTS}),)),
        Turn("", (WEAKEN,)),
        Turn("", (("bash", {"command": RUN_TESTS}),)),
        Turn("", (("submit", {}),)),
    ]
    trajectory, patch = await episode(provider, task, script)

    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        0.0,
        GradeStatus.UNRESOLVED,
    ), (trajectory.infra_reason, [t.observation for t in trajectory.turns])
    first, _, second, _ = (t.observation for t in trajectory.turns)
    assert "1 failed, 3 passed" in first
    assert "4 passed" in second  # in the agent's pod, the weakened test passes
    assert without_index(patch) == CHEAT_DIFF
    _, grader = assert_leased_then_graded(provider, swe_image)
    # the eval script put the test file back: the bug fails both tests of the fix
    log = grader.eval_log or ""
    assert ">>>>> Test Exit Code: 1" in log
    assert pytest_statuses(log) == {
        **dict.fromkeys(F2P, "FAILED"),
        **dict.fromkeys(P2P, "PASSED"),
    }
    assert harness_resolved(row, log, tmp_path) is False

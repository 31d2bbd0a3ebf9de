"""The test suite's tiers and its per-test time budget: a pytest plugin.

The repository's ``conftest.py`` loads it (``pytest_plugins``); ``tests/test_tiers.py`` runs it
in pytest's own ``pytester``. ``scripts/test.sh`` (``make test``, ``make test-fast``) relies on
both parts.

**Tiers.** Every test that needs something ``agentrl dev prepare`` builds (the pinned Kubernetes
binaries and helm, a cluster started from them, the SGLang release's environment, the images,
Go's module cache) gets the marker ``prepared`` at collection, whatever it was marked by hand:

- a test marked ``apiserver``, ``realnode`` or ``e2e``;
- a test using a fixture whose code reaches a prepared product (:data:`PREPARED_USE`), directly
  or through the fixtures it requests (``cluster``, and so ``namespace``, ``kubectl``,
  ``operator``; the chart tests' ``helm``; the contract tests' ``sglang``);
- a test whose own code reaches one; code of its module outside the test functions (a helper,
  a module fixture) that reaches one marks every test of the module.

``make test-fast`` runs ``-m "not prepared and not slow"``: the unit tests of pure code (``slow``,
set by hand, marks a test that starts processes or trains; ``--unit-budget`` below keeps it
honest). It also runs them
with an empty cache, so a test that reaches a product some other way fails there instead of
silently using this machine's; a failing test whose message names ``agentrl dev prepare`` and
that is not marked gets a section saying how to classify it.

**Budget.** A test fails when its setup, call and teardown together take longer than the budget
(ini ``test_budget``, seconds, default 240; ``--test-budget`` overrides, 0 turns it off), unless
its node id is listed, with the reason, in the file named by ini ``slow_tests``
(``tests/slow_tests.txt``). Time spent setting up or tearing down a fixture shared beyond the
test (module, package or session scope: the cluster, a Ray instance, a built container) is not
counted: it is paid once for many tests. Over budget in setup plus call fails the call; over
only once teardown is counted fails the teardown.

**The fast tier's budget.** With ``--unit-budget SECONDS`` (``make test-fast``: 20), a test not
marked ``slow`` that takes longer fails, naming the marker: a new test that starts processes is
found the first time the fast tier runs it, not when the tier has grown slow.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: Markers that mean a cluster, so a prepared product.
PREPARED_MARKERS = ("apiserver", "realnode", "e2e")

#: Code that reaches what ``agentrl dev prepare`` builds or installs: the pinned binaries
#: (``prepared``, ``ensure``), a cluster started from them, the SGLang environment (its probe,
#: its Python, its stamp), an image's stamp (the built archive), a prepare step's done check,
#: Go's module cache (filled by the Go builds), the node's busybox image (made from the
#: busybox-static package the node step installs).
PREPARED_USE = re.compile(
    r"\bbinaries\.(?:prepared|ensure)\b"
    r"|\bsession_cluster\b"
    r"|\bsglang_env\.(?:probe|parser_lists|VENV\.(?:python|run_probe|is_done))\b"
    r"|\bstamp_of\("
    r"|\.is_done\(\)"
    r"|\bGOMODCACHE\b"
    r"|\bbuild_busybox\b"
)

PREPARE_HINT = (
    "this test needs what `agentrl dev prepare` builds but is not marked `prepared`, so "
    "`make test-fast` runs it: reach the product through a fixture that does (cluster, helm, "
    "sglang) or code that PREPARED_USE in tests/tiers.py recognises, or mark it "
    "`pytest.mark.prepared`"
)


# ---------------------------------------------------------------------------------------------
# Tiers
# ---------------------------------------------------------------------------------------------


@functools.cache
def _reaches_product(func: Callable[..., Any]) -> bool:
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):  # built-in fixtures, C functions
        return False
    return PREPARED_USE.search(source) is not None


@dataclass(frozen=True)
class ModuleUse:
    """Where a test module's source reaches a prepared product."""

    whole: bool = False
    """Outside its test functions and classes (a helper, a module fixture, module code)."""
    tests: frozenset[str] = frozenset()
    """Test functions and test classes (top-level names) whose own code does."""


@functools.cache
def module_use(path: Path) -> ModuleUse:
    """Scan a test module for :data:`PREPARED_USE`, line by line."""
    try:
        source = path.read_text(encoding="utf-8")
    except OSError:
        return ModuleUse()
    hits = [n for n, line in enumerate(source.splitlines(), 1) if PREPARED_USE.search(line)]
    if not hits:
        return ModuleUse()
    spans = [
        (node.lineno, node.end_lineno or node.lineno, node.name)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name.startswith(("test", "Test"))
    ]
    whole, tests = False, set()
    for line in hits:
        owner = next((name for start, end, name in spans if start <= line <= end), None)
        if owner is None:
            whole = True
        else:
            tests.add(owner)
    return ModuleUse(whole, frozenset(tests))


def prepared_reason(item: pytest.Item) -> str | None:
    """Why ``item`` needs ``agentrl dev prepare`` (None: it is a test of pure code)."""
    for name in PREPARED_MARKERS:
        if item.get_closest_marker(name) is not None:
            return f"marked {name}"
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name, defs in info.name2fixturedefs.items():
            if any(_reaches_product(d.func) for d in defs):
                return f"uses the fixture {name}"
    if not isinstance(item, pytest.Function) or item.path.suffix != ".py":
        return None
    use = module_use(item.path)
    if use.whole:
        return f"{item.path.name} reaches a prepared product outside its tests"
    owners = {item.originalname, *([item.cls.__name__] if item.cls else [])}
    if owners & use.tests:
        return "its code reaches a prepared product"
    return None


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------

#: The marker set at collection on the tests of the cluster stream: those that share the
#: session's cluster and its real node, or start clusters and nodes of their own.
CLUSTER_STREAM = "cluster_stream"
#: Directories whose tests start a cluster, a node or the node's processes without the fixture.
CLUSTER_DIRS = ("tests/devcluster", "tests/realnode")


def in_cluster_stream(item: pytest.Item) -> bool:
    """Whether ``item`` runs in the cluster stream when the suite's second tier runs its two
    streams side by side (``scripts/test.sh``: one pytest each, ``-m cluster_stream`` and
    ``-m "not cluster_stream"``); every other test is in the local stream (Ray, the trainer,
    ``agentrl run``, servers, builds, the SGLang contracts).

    The cluster stream's tests mostly wait on pods, watches and the kubelet; the local stream's
    mostly compute. Each stream runs one test at a time, so no two tests ever share the session
    cluster at once, and only one process starts it."""
    if any(item.get_closest_marker(name) is not None for name in PREPARED_MARKERS):
        return True
    if "cluster" in getattr(item, "fixturenames", ()):
        return True
    try:
        where = item.path.relative_to(item.config.rootpath).as_posix()
    except ValueError:  # a test file outside the repository (pytester's)
        return False
    return any(where.startswith(f"{d}/") for d in CLUSTER_DIRS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = prepared_reason(item)
        if reason is not None and item.get_closest_marker("prepared") is None:
            item.add_marker(pytest.mark.prepared(reason=reason))
        if in_cluster_stream(item) and item.get_closest_marker(CLUSTER_STREAM) is None:
            item.add_marker(CLUSTER_STREAM)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, Any]:
    report = yield
    if (
        report.failed
        and item.get_closest_marker("prepared") is None
        and "agentrl dev prepare" in report.longreprtext
    ):
        report.sections.append(("test tier", PREPARE_HINT))
    return report


# ---------------------------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "test_budget",
        "seconds a test may take (setup, call and teardown, without fixtures shared with other "
        "tests) unless listed in the slow_tests file; 0: no budget",
        default="240",
    )
    parser.addini(
        "slow_tests",
        "file (from the rootdir) listing the tests allowed over test_budget: `node-id reason`",
        default="tests/slow_tests.txt",
    )
    parser.addoption(
        "--test-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="override the ini test_budget (0: no budget)",
    )
    parser.addoption(
        "--unit-budget",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="a test not marked slow that takes longer fails (make test-fast's budget; 0: none)",
    )


class SlowListError(pytest.UsageError):
    """The slow-test list is malformed; the message names the file and line."""


def read_slow_list(path: Path, rootdir: Path) -> dict[str, str]:
    """Node id → reason, from ``path`` (``#`` comments and blank lines skipped). A missing file
    is an empty list. An entry without a reason, or naming a file or a test function that does
    not exist (a renamed test: the list must not go stale), is an error."""
    if not path.is_file():
        return {}
    listed: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        nodeid, _, reason = line.partition(" ")
        where = f"{path}:{number}"
        if not reason.strip():
            raise SlowListError(f"{where}: {nodeid} has no reason (`node-id reason`)")
        module = rootdir / nodeid.split("::")[0]
        if not module.is_file():
            raise SlowListError(f"{where}: {nodeid}: no such test file")
        function = nodeid.split("::")[-1].split("[")[0]
        if "::" in nodeid and f"def {function}(" not in module.read_text(encoding="utf-8"):
            raise SlowListError(f"{where}: {nodeid}: no test {function} in {module.name}")
        listed[nodeid] = reason.strip()
    return listed


@dataclass
class _Times:
    """Seconds one test spent in each phase, shared fixtures not counted."""

    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    judged_at_teardown: bool = False
    """The call passed within the budget: the teardown decides."""

    def total(self) -> float:
        return self.setup + self.call + self.teardown

    def phases(self) -> str:
        return f"setup {self.setup:.1f} s, call {self.call:.1f} s, teardown {self.teardown:.1f} s"


@dataclass(eq=False)  # hashable by identity, as pluggy needs its plugins
class Budget:
    """The budget's state for one pytest run (registered as a plugin by pytest_configure)."""

    seconds: float
    listed: dict[str, str]
    list_file: str
    unit_seconds: float = 0.0
    """The fast tier's budget for a test not marked ``slow`` (0: none; ``--unit-budget``)."""
    _shared: float = 0.0
    """Seconds the current phase spent setting up or tearing down shared fixtures."""
    _depth: int = 0
    _teardown_started: dict[int, float] = field(default_factory=dict)
    _times: dict[str, _Times] = field(default_factory=dict)

    def is_listed(self, nodeid: str) -> bool:
        """Listed by its node id, or (parametrized) by the id without its parameters."""
        return nodeid in self.listed or nodeid.split("[")[0] in self.listed

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any]
    ) -> Generator[None, Any, Any]:
        if fixturedef.scope == "function":
            return (yield)
        outermost = self._depth == 0  # one shared fixture may request another on the fly
        self._depth += 1
        started = time.perf_counter()
        try:
            return (yield)
        finally:
            self._depth -= 1
            if outermost:
                self._shared += time.perf_counter() - started
            # finalizers run last-added first: this one runs just before the fixture's own
            # teardown, and pytest_fixture_post_finalizer just after it
            fixturedef.addfinalizer(functools.partial(self._teardown_starts, id(fixturedef)))

    def _teardown_starts(self, key: int) -> None:
        self._teardown_started[key] = time.perf_counter()

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        started = self._teardown_started.pop(id(fixturedef), None)
        if started is not None:
            self._shared += time.perf_counter() - started

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield  # outermost wrapper: the outcome after xfail and the other plugins
        own = max(0.0, report.duration - self._shared)
        self._shared = 0.0
        if report.when == "setup":
            self._times[item.nodeid] = _Times(setup=own)
            return report
        times = self._times.setdefault(item.nodeid, _Times())
        if report.when == "call":
            times.call = own
            due = report.passed and not hasattr(report, "wasxfail")
        else:
            times.teardown = own
            del self._times[item.nodeid]
            due = times.judged_at_teardown and report.passed
        if not due:
            return report
        over = self._over_budget(item, times)
        if over is not None:
            report.outcome = "failed"
            report.longrepr = over
        elif report.when == "call":
            times.judged_at_teardown = True
        return report

    def _over_budget(self, item: pytest.Item, times: _Times) -> str | None:
        """Why ``item`` is over a budget so far (None: within both)."""
        spent = (
            f"{times.total():.1f} s ({times.phases()}; fixtures shared with other tests not "
            "counted)"
        )
        if self.seconds > 0 and not self.is_listed(item.nodeid) and times.total() > self.seconds:
            return (
                f"over the time budget: {spent} > {self.seconds:g} s (test_budget); a test that "
                f"must take longer is listed with its reason in {self.list_file}"
            )
        unmarked = item.get_closest_marker("slow") is None
        if self.unit_seconds > 0 and unmarked and times.total() > self.unit_seconds:
            return (
                f"over the fast tier's budget: {spent} > {self.unit_seconds:g} s "
                "(--unit-budget); a test that takes longer is marked `pytest.mark.slow`, which "
                "`make test-fast` leaves out, or made smaller"
            )
        return None


def pytest_configure(config: pytest.Config) -> None:
    if not any(str(line).startswith("prepared:") for line in config.getini("markers")):
        config.addinivalue_line(
            "markers", "prepared: needs what `agentrl dev prepare` builds (set at collection)"
        )
    if not any(str(line).startswith(f"{CLUSTER_STREAM}:") for line in config.getini("markers")):
        config.addinivalue_line(
            "markers",
            f"{CLUSTER_STREAM}: runs in the cluster stream of scripts/test.sh (set at collection)",
        )
    option = config.getoption("--test-budget")
    seconds = float(option if option is not None else config.getini("test_budget"))
    name = str(config.getini("slow_tests"))
    listed = read_slow_list(config.rootpath / name, config.rootpath)
    unit = float(config.getoption("--unit-budget") or 0)
    config.pluginmanager.register(Budget(seconds, listed, name, unit), "agentrl-test-budget")


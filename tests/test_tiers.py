"""The plugin :mod:`tests.tiers`, run in pytest's ``pytester`` on made-up test modules: which
tests it marks ``prepared``, and the per-test time budget with its list of slow tests.

The sleeps below are inputs to the plugin (a test that takes 0.6 s against a budget of 0.3 s),
not timing assertions on product code. The repository's own list, ``tests/slow_tests.txt``, is
read with the plugin's reader: every entry has a reason and names a test that exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiers import SlowListError, read_slow_list

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

#: The plugin, and no pytest-asyncio (its configure-time warning would meet this suite's
#: filterwarnings=error in the in-process run).
PLUGIN = ("-p", "tests.tiers", "-p", "no:asyncio", "-p", "no:cacheprovider")


def _source(text: str) -> str:
    """``text`` without its ``<>``s: the tokens the plugin looks for are written split here, so
    that it does not take this module itself for one that needs a prepared product."""
    return text.replace("<>", "")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(*PLUGIN, *args)


def _collected(pytester: pytest.Pytester, expression: str) -> set[str]:
    result = _run(pytester, "--collect-only", "-q", "-m", expression)
    return {line.split("::")[-1] for line in result.outlines if "::" in line}


# ---------------------------------------------------------------------------------------------
# tiers
# ---------------------------------------------------------------------------------------------

CONFTEST = """
import pytest

class binaries:  # stands for agentrl.devcluster.binaries: collection never calls it
    @staticmethod
    def prepared():
        raise AssertionError("not called at collection")

@pytest.fixture(scope="session")
def cluster():
    yield binaries.<>prepared()

@pytest.fixture
def namespace(cluster):
    return "ns"

@pytest.fixture
def scratch(tmp_path):
    return tmp_path
"""

TESTS = """
import pytest

sglang_env = None

def test_pure(scratch):
    assert scratch

def test_through_a_fixture_it_requests(namespace):
    pass

@pytest.mark.apiserver
def test_marked_apiserver():
    pass

@pytest.mark.e2e
def test_marked_e2e():
    pass

def test_its_own_code_probes_sglang():
    sglang_env.<>probe("describe")

class TestGroup:
    def test_in_a_class_that_uses_go_modules(self):
        assert "GOMOD<>CACHE"

    def test_beside_it_in_the_class(self):
        pass

@pytest.mark.parametrize("n", [1, 2])
def test_parametrized_pure(n):
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers\n"
        "markers =\n    apiserver: a\n    e2e: b\n    realnode: c\n"
    )
    pytester.makeconftest(_source(CONFTEST))
    pytester.makepyfile(test_mixed=_source(TESTS))
    return pytester


def test_the_fast_tier_is_the_tests_that_reach_no_prepared_product(suite: pytest.Pytester) -> None:
    assert _collected(suite, "not prepared") == {
        "test_pure",
        "test_parametrized_pure[1]",
        "test_parametrized_pure[2]",
    }
    assert _collected(suite, "prepared") == {
        "test_through_a_fixture_it_requests",
        "test_marked_apiserver",
        "test_marked_e2e",
        "test_its_own_code_probes_sglang",
        "test_in_a_class_that_uses_go_modules",
        "test_beside_it_in_the_class",
    }


def test_the_tests_of_the_cluster_and_of_its_node_run_in_one_stream_the_rest_in_the_other(
    suite: pytest.Pytester,
) -> None:
    node = suite.path / "tests" / "devcluster"
    node.mkdir(parents=True)
    (node / "test_a_node.py").write_text("def test_starts_a_node_itself():\n    pass\n")
    cluster = {
        "test_through_a_fixture_it_requests",
        "test_marked_apiserver",
        "test_marked_e2e",
        "test_starts_a_node_itself",
    }
    assert _collected(suite, "cluster_stream") == cluster
    local = _collected(suite, "not cluster_stream")
    assert local & cluster == set()
    # a prepared product alone (the SGLang environment, Go's cache) is no reason to wait
    assert {"test_pure", "test_its_own_code_probes_sglang", "test_beside_it_in_the_class"} <= local


def test_a_helper_outside_the_tests_that_reaches_a_product_marks_the_whole_module(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        test_helper=_source(
            """
        def _image():
            return builder.stamp<>_of("operator")

        def test_one():
            pass

        def test_two():
            pass
        """
        )
    )
    assert _collected(suite, "prepared") >= {"test_one", "test_two"}
    assert "test_one" not in _collected(suite, "not prepared")


def test_a_failure_that_names_prepare_in_an_unmarked_test_says_how_to_classify_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_needs_a_build():
            raise RuntimeError("the sandbox image is not built: run 'agentrl dev prepare'")

        def test_fails_otherwise():
            assert 1 == 2
        """
    )
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert text.count("test tier") == 1
    assert "is not marked `prepared`, so `make test-fast` runs it" in text


# ---------------------------------------------------------------------------------------------
# budget
# ---------------------------------------------------------------------------------------------

SLOW = """
import time
import pytest

@pytest.fixture
def slow_setup():
    time.sleep(0.6)

@pytest.fixture
def slow_teardown():
    yield
    time.sleep(0.6)

def test_over_budget():
    time.sleep(0.6)

def test_listed():
    time.sleep(0.6)

@pytest.mark.parametrize("n", [1, 2])
def test_listed_without_its_parameters(n):
    time.sleep(0.6)

def test_quick():
    pass

def test_own_setup_is_counted(slow_setup):
    pass

def test_own_teardown_is_counted(slow_teardown):
    pass

def test_failing_stays_a_plain_failure():
    time.sleep(0.6)
    assert False, "its own reason"
"""

#: Alone in its module, so the module fixture's teardown falls in this test's teardown.
SHARED = """
import time
import pytest

@pytest.fixture(scope="module")
def shared():
    time.sleep(0.6)
    yield
    time.sleep(0.6)

def test_shared_fixture_is_not_counted(shared):
    pass
"""


@pytest.fixture
def slow_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_slow=SLOW, test_shared=SHARED)
    (pytester.path / "slow.txt").write_text(
        "# tests allowed over the budget\n"
        "test_slow.py::test_listed  sleeps on purpose\n"
        "\n"
        "test_slow.py::test_listed_without_its_parameters every parameter sleeps\n"
    )
    pytester.makeini("[pytest]\ntest_budget = 0.3\nslow_tests = slow.txt\n")
    return pytester


def test_a_test_over_the_budget_fails_naming_the_budget_its_time_and_the_list(
    slow_suite: pytest.Pytester,
) -> None:
    result = _run(slow_suite, "-rA")
    outcomes = {
        line.split()[1].split("::")[1]: line.split()[0]
        for line in result.outlines
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "test_over_budget": "FAILED",
        "test_listed": "PASSED",
        "test_listed_without_its_parameters[1]": "PASSED",
        "test_listed_without_its_parameters[2]": "PASSED",
        "test_quick": "PASSED",
        "test_shared_fixture_is_not_counted": "PASSED",
        "test_own_setup_is_counted": "FAILED",
        "test_own_teardown_is_counted": "ERROR",  # its call passed; the teardown went over
        "test_failing_stays_a_plain_failure": "FAILED",
    }
    result.assert_outcomes(passed=6, failed=3, errors=1)
    text = result.stdout.str()
    # Once per test in its report section; the short summary repeats it, cut to the terminal's
    # width (which differs between a terminal and CI), so summary lines are not counted.
    sections = [line for line in result.outlines if not line.startswith(("FAILED ", "ERROR "))]
    assert sum("> 0.3 s (test_budget)" in line for line in sections) == 3
    assert "listed with its reason in slow.txt" in text
    assert "its own reason" in text
    summary = [line for line in result.outlines if line.startswith("FAILED test_slow.py::")]
    assert any("test_over_budget - over the time budget: " in line for line in summary)


def test_the_option_overrides_the_ini_and_zero_turns_the_budget_off(
    slow_suite: pytest.Pytester,
) -> None:
    _run(slow_suite, "--test-budget", "30").assert_outcomes(passed=8, failed=1)
    _run(slow_suite, "--test-budget", "0").assert_outcomes(passed=8, failed=1)


UNIT = """
import time
import pytest

def test_quick():
    pass

def test_unmarked_and_slow():
    time.sleep(0.6)

@pytest.mark.slow
def test_marked_slow():
    time.sleep(0.6)
"""


def test_the_fast_tiers_budget_fails_an_unmarked_test_over_it_and_names_the_slow_marker(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_unit=UNIT)
    pytester.makeini("[pytest]\nmarkers =\n    slow: takes long\n")
    result = _run(pytester, "-rA", "--unit-budget", "0.3")
    result.assert_outcomes(passed=2, failed=1)
    failed = [line for line in result.outlines if line.startswith("FAILED ")]
    assert len(failed) == 1 and "test_unmarked_and_slow" in failed[0], failed
    text = result.stdout.str()
    assert "> 0.3 s (--unit-budget)" in text
    assert "marked `pytest.mark.slow`, which `make test-fast` leaves out" in text
    # without the option (make test) nothing is judged by it
    _run(pytester).assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("test_slow.py::test_listed", "has no reason"),
        ("test_gone.py::test_listed reason", "no such test file"),
        ("test_slow.py::test_renamed reason", "no test test_renamed in test_slow.py"),
    ],
)
def test_a_list_entry_without_a_reason_or_a_test_is_refused_naming_the_line(
    slow_suite: pytest.Pytester, entry: str, problem: str
) -> None:
    (slow_suite.path / "slow.txt").write_text(f"# header\n{entry}\n")
    result = _run(slow_suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"slow.txt:2: {entry.split()[0]}" in result.stderr.str()
    assert problem in result.stderr.str()


def test_the_repositorys_list_has_a_reason_for_every_entry_and_names_real_tests() -> None:
    listed = read_slow_list(REPO / "tests" / "slow_tests.txt", REPO)
    assert listed, "tests/slow_tests.txt lists no test"
    assert all(len(reason.split()) >= 3 for reason in listed.values())
    assert (
        "e2e/test_cluster_run.py::test_the_cluster_path_trains_on_the_real_node_through_every_disruption"
        in listed
    )  # 7 min 30 s (README)


def test_a_missing_list_is_empty_and_a_bad_one_raises(tmp_path: Path) -> None:
    assert read_slow_list(tmp_path / "absent.txt", tmp_path) == {}
    bad = tmp_path / "list.txt"
    bad.write_text("test_x.py::test_y\n")
    with pytest.raises(SlowListError, match="has no reason"):
        read_slow_list(bad, tmp_path)

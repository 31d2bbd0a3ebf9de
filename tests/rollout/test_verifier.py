"""The verifier reads test logs per test and reward files, and tells a crash from a failure."""

from __future__ import annotations

import pytest

from agentrl.rollout.tasks.model import NamedTestsVerification
from agentrl.rollout.verifier import (
    VerifierError,
    parse_django_log,
    parse_pytest_log,
    parse_reward,
    score_tests,
)

PYTEST_LOG = """\
============================= test session starts ==============================
collected 3 items

tests/test_a.py .F.                                                      [100%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_three[x-1]
FAILED tests/test_a.py::test_two - AssertionError: expected 3, got 2
ERROR tests/test_b.py::test_setup - ImportError
"""

DJANGO_LOG = """\
test_add (arith.tests.AddTests) ... ok
test_sub (arith.tests.SubTests) ... FAIL
test_skip (arith.tests.SkipTests) ... skipped 'no db'
"""


def test_pytest_summary_lines_give_each_tests_status() -> None:
    assert parse_pytest_log(PYTEST_LOG) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_three[x-1]": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_b.py::test_setup": "ERROR",
    }


def test_django_verbose_lines_give_each_tests_status() -> None:
    assert parse_django_log(DJANGO_LOG) == {
        "test_add (arith.tests.AddTests)": "PASSED",
        "test_sub (arith.tests.SubTests)": "FAILED",
        "test_skip (arith.tests.SkipTests)": "SKIPPED",
    }


@pytest.mark.parametrize(
    ("f2p", "p2p", "reward", "failing"),
    [
        (["tests/test_a.py::test_one"], ["tests/test_a.py::test_three[x-1]"], 1.0, []),
        (["tests/test_a.py::test_two"], [], 0.0, ["tests/test_a.py::test_two"]),
        # A test the log never mentions did not pass.
        (["tests/test_a.py::test_one"], ["tests/test_c.py::gone"], 0.0, ["tests/test_c.py::gone"]),
    ],
)
def test_reward_is_one_only_when_every_required_test_passed(
    f2p: list[str], p2p: list[str], reward: float, failing: list[str]
) -> None:
    verification = NamedTestsVerification(fail_to_pass=f2p, pass_to_pass=p2p)
    assert score_tests(verification, parse_pytest_log(PYTEST_LOG)) == (reward, failing)


def test_reward_files_hold_a_number_or_a_reward_json() -> None:
    assert parse_reward("1\n", "/logs/verifier/reward.txt") == 1.0
    assert parse_reward('{"reward": 0.5, "x": 1}', "/logs/verifier/reward.json") == 0.5


@pytest.mark.parametrize(
    ("text", "path"),
    [("", "r.txt"), ("pass", "r.txt"), ("{", "r.json"), ('{"score": 1}', "r.json")],
)
def test_an_unreadable_reward_file_is_a_verifier_error(text: str, path: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward(text, path)

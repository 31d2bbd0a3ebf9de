"""Grade a SWE-bench or SWE-smith evaluation log the way their harnesses do.

An instance's evaluation is its eval script (SWE-bench 5.x rows carry one; the loader writes
SWE-smith's), run in the instance's image; its output is the log. Grading that log has three
steps, each equal to the harness's:

1. *Find the test output* (:func:`status_map`): for SWE-bench (``swebench.harness.grading``
   ``get_logs_eval``) the log is refused when it holds a harness failure marker or lacks the
   ``>>>>> Start/End Test Output`` markers; the text between them is parsed with the instance's
   log parser, the whole log when that finds nothing; a log with no statuses and no sign that a
   suite ran is refused, and so is one whose recorded test exit status is non-zero while no test
   failed (a patch printing its own ``PASSED`` lines). SWE-smith (``swesmith.harness.grading``)
   cuts the text between the ``set -x`` traces of the markers and parses only that.
2. *Report* (:func:`tests_report`): each FAIL_TO_PASS and PASS_TO_PASS test is a success or a
   failure (or, for a status no rule names, neither). SWE-bench 5.x: a skipped F2P test fails, a
   skipped P2P test is maintained, a truncated parametrised id matches by prefix when the matches
   agree; ``fail_only`` instances fail only tests the log shows ``FAILED``. SWE-smith: the older
   rules (missing/FAILED/ERROR fail, PASSED/XFAIL pass, exact ids).
3. *Resolve* (:func:`resolution`): FULL when every F2P and P2P test succeeded, PARTIAL when some
   F2P did and all P2P did, else NO. Resolved means FULL.

A refused log is not resolved; :func:`infra_signature` names the harness's environment faults
(out of memory, an unreachable network, ...) in it so the verifier can call such a run an
infra error instead of a reward.

``tests/rollout/test_harness_contract.py`` checks each step against the real ``swebench``.

Callers: :mod:`agentrl.rollout.verifier`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from agentrl.rollout import log_parsers
from agentrl.rollout.log_parsers import TestStatus

START_TEST_OUTPUT: Final = ">>>>> Start Test Output"
END_TEST_OUTPUT: Final = ">>>>> End Test Output"
#: Printed after the end marker with the test command's own exit status.
TEST_EXIT_CODE: Final = ">>>>> Test Exit Code"
TEST_EXIT_CODE_VAR: Final = "SWEBENCH_TEST_EXIT_CODE"
#: Markers the harness writes when it could not run the tests; a log holding one is refused.
HARNESS_FAILURES: Final = (
    ">>>>> Patch Apply Failed",
    ">>>>> Reset Failed",
    ">>>>> Tests Errored",
    ">>>>> Tests Timed Out",
)
#: The script header the harness puts on every eval script (and strips before re-adding it).
SCRIPT_HEADER: Final = ("#!/bin/bash", "set -uxo pipefail")

#: Evidence that a runner executed although nothing was parsed (each count non-zero).
_SUITE_RAN: Final = re.compile(
    "|".join(
        (
            r"Executed [1-9]\d* of \d+",
            r"TOTAL: [1-9]\d* (?:SUCCESS|FAILED)",
            r"[1-9]\d* passing",
            r"Tests:\s+[1-9]\d*",
            r"Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total",
            r"^# tests [1-9]\d*",
            r"[1-9]\d* specs?, \d+ failures?",
            r"': ok$",
        )
    ),
    re.MULTILINE,
)
_EXIT_CODE: Final = re.compile(rf"{re.escape(TEST_EXIT_CODE)}:\s*(-?\d+)")

#: The harness's infrastructure signatures (``swebench.harness.infra_failure``): reason, tier,
#: pattern; the first that matches wins. Only ``environment`` ones cannot come from a patch.
TIER_ENVIRONMENT: Final = "environment"
TIER_AMBIGUOUS: Final = "ambiguous"
_INFRA_SIGNATURES: Final = tuple(
    (reason, tier, re.compile(pattern, re.MULTILINE))
    for reason, tier, pattern in (
        (
            "browser_launch_failed",
            TIER_ENVIRONMENT,
            r"Failed to launch|Failed to connect to the bus",
        ),
        (
            "display_unavailable",
            TIER_ENVIRONMENT,
            r"cannot open display|Missing X server|unable to open X display",
        ),
        ("out_of_memory", TIER_ENVIRONMENT, r"Cannot allocate memory|OutOfMemoryError|^Killed$"),
        (
            "container_unavailable",
            TIER_ENVIRONMENT,
            r"Error response from daemon|Cannot connect to the Docker daemon",
        ),
        (
            "network_unreachable",
            TIER_ENVIRONMENT,
            r"Could not resolve host|Temporary failure in name resolution",
        ),
        (
            "missing_module",
            TIER_AMBIGUOUS,
            r"Cannot find module|MODULE_NOT_FOUND|ModuleNotFoundError",
        ),
        ("no_tests_collected", TIER_AMBIGUOUS, r"no tests ran|collected 0 items"),
        ("tests_timed_out", TIER_AMBIGUOUS, r"Timeout error: \d+ seconds exceeded"),
    )
)


class Harness(StrEnum):
    """Whose grading rules apply."""

    SWEBENCH = "swebench"
    SWESMITH = "swesmith"


class EvalType(StrEnum):
    """SWE-bench's ``eval_type``: how a test's absence from the log counts."""

    PASS_AND_FAIL = "pass_and_fail"
    FAIL_ONLY = "fail_only"


class Resolution(StrEnum):
    FULL = "RESOLVED_FULL"
    PARTIAL = "RESOLVED_PARTIAL"
    NO = "RESOLVED_NO"


class Outcomes(BaseModel):
    """Tests of one list that succeeded and failed."""

    model_config = ConfigDict(frozen=True)

    success: list[str] = Field(default_factory=list)
    failure: list[str] = Field(default_factory=list)


class TestsReport(BaseModel):
    """The harness's ``tests_status``: FAIL_TO_PASS and PASS_TO_PASS outcomes."""

    __test__ = False

    model_config = ConfigDict(frozen=True)

    fail_to_pass: Outcomes
    pass_to_pass: Outcomes


class Grade(BaseModel):
    """The verdict on one evaluation log."""

    model_config = ConfigDict(frozen=True)

    found: bool
    """The log holds a usable test run (the harness's ``patch_successfully_applied``)."""
    statuses: dict[str, str] = Field(default_factory=dict)
    report: TestsReport | None = None
    resolution: Resolution = Resolution.NO
    infra: tuple[str, str] | None = None
    """``(reason, tier)`` of the first infra signature in a refused log."""

    @property
    def resolved(self) -> bool:
        return self.resolution == Resolution.FULL


def harness_eval_script(eval_script: str) -> str:
    """The script the harness runs for an instance's ``eval_script`` (``make_test_spec``): the
    header lines dropped and put back on top, and the test command's exit status recorded just
    before the end marker and printed after it (scripts without an end marker are left as
    they are)."""
    lines = [line for line in eval_script.strip().split("\n") if line not in SCRIPT_HEADER]
    for index, line in enumerate(lines):
        if END_TEST_OUTPUT in line:
            lines[index : index + 1] = [
                f"{TEST_EXIT_CODE_VAR}=$?",
                line,
                f'echo "{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}"',
            ]
            break
    return "\n".join([*SCRIPT_HEADER, *lines]) + "\n"


def _swebench_status_map(log: str, log_parser: str) -> tuple[dict[str, str], bool]:
    if any(marker in log for marker in HARNESS_FAILURES):
        return {}, False
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return {}, False
    between = log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    statuses = log_parsers.parse(log_parser, between) or log_parsers.parse(log_parser, log)
    if not statuses and not _SUITE_RAN.search(log):
        return {}, False
    recorded = _EXIT_CODE.search(log)
    exit_code = int(recorded.group(1)) if recorded else None
    failures = {TestStatus.FAILED.value, TestStatus.ERROR.value}
    if exit_code not in (None, 0) and statuses and not failures & set(statuses.values()):
        return {}, False
    return statuses, True


def _swesmith_status_map(log: str, log_parser: str) -> tuple[dict[str, str], bool]:
    if HARNESS_FAILURES[0] in log or HARNESS_FAILURES[3] in log:
        return {}, False
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return {}, False
    start_trace, end_trace = f"+ : '{START_TEST_OUTPUT}'", f"+ : '{END_TEST_OUTPUT}'"
    start, end = log.find(start_trace), log.find(end_trace)
    if start > end:  # swesmith raises on this; no usable run either way
        return {}, False
    return log_parsers.parse(log_parser, log[start:end][len(start_trace) :]), True


def status_map(log: str, *, harness: Harness, log_parser: str) -> tuple[dict[str, str], bool]:
    """Per-test statuses of an evaluation log and whether the log is usable (step 1)."""
    if harness == Harness.SWESMITH:
        return _swesmith_status_map(log, log_parser)
    return _swebench_status_map(log, log_parser)


_PASSING: Final = frozenset({TestStatus.PASSED.value, TestStatus.XFAIL.value})


def _lookup(test: str, statuses: dict[str, str]) -> str | None:
    """The status-map key of ``test``; a parametrised id cut short (more ``[`` than ``]``)
    matches the first key it prefixes when all such keys agree on passing or not."""
    if test in statuses:
        return test
    if test.count("[") > test.count("]"):
        matches = [key for key in statuses if key.startswith(test)]
        if matches and len({statuses[key] in _PASSING for key in matches}) == 1:
            return matches[0]
    return None


def _outcome_swebench(test: str, statuses: dict[str, str], *, maintained: bool) -> bool | None:
    key = _lookup(test, statuses)
    status = statuses[key] if key is not None else None
    if status in _PASSING or (maintained and status == TestStatus.SKIPPED):
        return True
    failing = {TestStatus.FAILED.value, TestStatus.ERROR.value, TestStatus.SKIPPED.value}
    if status is None or status in failing:
        return False
    return None


def _outcome_fail_only(test: str, statuses: dict[str, str]) -> bool:
    return statuses.get(test) != TestStatus.FAILED


def _outcome_swesmith(test: str, statuses: dict[str, str]) -> bool | None:
    status = statuses.get(test)
    if status in _PASSING:
        return True
    if status is None or status in (TestStatus.FAILED, TestStatus.ERROR):
        return False
    return None


def _outcomes(tests: list[str], judge: Callable[[str], bool | None]) -> Outcomes:
    success: list[str] = []
    failure: list[str] = []
    for test in tests:
        verdict = judge(test)
        if verdict is True:
            success.append(test)
        elif verdict is False:
            failure.append(test)
    return Outcomes(success=success, failure=failure)


def tests_report(
    statuses: dict[str, str],
    *,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    harness: Harness = Harness.SWEBENCH,
    eval_type: EvalType = EvalType.PASS_AND_FAIL,
) -> TestsReport:
    """Each required test's outcome (step 2)."""
    if harness == Harness.SWESMITH:
        return TestsReport(
            fail_to_pass=_outcomes(fail_to_pass, lambda t: _outcome_swesmith(t, statuses)),
            pass_to_pass=_outcomes(pass_to_pass, lambda t: _outcome_swesmith(t, statuses)),
        )
    if eval_type == EvalType.FAIL_ONLY:
        return TestsReport(
            fail_to_pass=_outcomes(fail_to_pass, lambda t: _outcome_fail_only(t, statuses)),
            pass_to_pass=_outcomes(pass_to_pass, lambda t: _outcome_fail_only(t, statuses)),
        )
    return TestsReport(
        fail_to_pass=_outcomes(
            fail_to_pass, lambda t: _outcome_swebench(t, statuses, maintained=False)
        ),
        pass_to_pass=_outcomes(
            pass_to_pass, lambda t: _outcome_swebench(t, statuses, maintained=True)
        ),
    )


def _rate(outcomes: Outcomes) -> float:
    total = len(outcomes.success) + len(outcomes.failure)
    return 1.0 if total == 0 else len(outcomes.success) / total


def resolution(report: TestsReport) -> Resolution:
    """FULL, PARTIAL or NO (step 3)."""
    f2p, p2p = _rate(report.fail_to_pass), _rate(report.pass_to_pass)
    if f2p == 1 and p2p == 1:
        return Resolution.FULL
    if 0 < f2p < 1 and p2p == 1:
        return Resolution.PARTIAL
    return Resolution.NO


def infra_signature(log: str) -> tuple[str, str] | None:
    """``(reason, tier)`` of the first harness infra signature in ``log``."""
    for reason, tier, pattern in _INFRA_SIGNATURES:
        if log and pattern.search(log):
            return reason, tier
    return None


def grade(
    log: str,
    *,
    harness: Harness,
    log_parser: str,
    eval_type: EvalType,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
) -> Grade:
    """The harness's verdict on an evaluation log."""
    statuses, found = status_map(log, harness=harness, log_parser=log_parser)
    if not found:
        return Grade(found=False, infra=infra_signature(log))
    report = tests_report(
        statuses,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        harness=harness,
        eval_type=eval_type,
    )
    return Grade(found=True, statuses=statuses, report=report, resolution=resolution(report))

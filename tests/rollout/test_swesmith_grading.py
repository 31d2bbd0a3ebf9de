"""SWE-smith's grading of its Python profile's logs, with expectations written by hand (the
``swesmith`` package cannot be installed beside ``swebench`` 5: 0.0.9 imports constants 5.x
removed). Its rules differ from SWE-bench 5.x's: only the text between the ``set -x`` traces
of the markers is parsed, ids match exactly, and a skipped test is neither a success nor a
failure."""

from __future__ import annotations

from agentrl.rollout import grading, log_parsers

VERBOSE = """\
============================= test session starts ==============================
platform linux -- Python 3.10.16, pytest-8.3.4, pluggy-1.5.0 -- /opt/miniconda3/bin/python
collecting ... collected 5 items

tests/test_core.py::test_parse PASSED                                    [ 20%]
tests/test_core.py::test_format FAILED                                   [ 40%]
tests/test_core.py::test_network SKIPPED (needs network)                 [ 60%]
tests/test_core.py::test_legacy XFAIL (old behaviour)                    [ 80%]
tests/test_io.py::test_read ERROR                                        [100%]

=========================== short test summary info ============================
FAILED tests/test_core.py::test_format
ERROR tests/test_io.py::test_read - FileNotFoundError
============== 1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error in 0.20s ======
"""


def smith_log(output: str) -> str:
    return (
        "+ cd /testbed\n"
        "+ git checkout -- tests/test_core.py tests/test_io.py\n"
        "+ : '>>>>> Start Test Output'\n"
        "+ source /opt/miniconda3/bin/activate\n"
        "+ conda activate testbed\n"
        "+ pytest --disable-warnings --color=no --tb=no --verbose\n"
        f"{output}"
        "+ : '>>>>> End Test Output'\n"
    )


def test_the_python_profile_parser_reads_verbose_lines_only() -> None:
    assert log_parsers.parse("swesmith_python", VERBOSE) == {
        "tests/test_core.py::test_parse": "PASSED",
        "tests/test_core.py::test_format": "FAILED",
        "tests/test_core.py::test_network": "SKIPPED",
        "tests/test_core.py::test_legacy": "XFAIL",
        "tests/test_io.py::test_read": "ERROR",
    }


def _grade(log: str, f2p: list[str], p2p: list[str]) -> grading.Grade:
    return grading.grade(
        log,
        harness=grading.Harness.SWESMITH,
        log_parser="swesmith_python",
        eval_type=grading.EvalType.PASS_AND_FAIL,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
    )


def test_passing_and_xfail_tests_resolve_and_a_skipped_one_is_not_counted() -> None:
    verdict = _grade(
        smith_log(VERBOSE),
        ["tests/test_core.py::test_parse", "tests/test_core.py::test_network"],
        ["tests/test_core.py::test_legacy"],
    )
    assert verdict.found
    assert verdict.report == grading.TestsReport(
        fail_to_pass=grading.Outcomes(success=["tests/test_core.py::test_parse"]),
        pass_to_pass=grading.Outcomes(success=["tests/test_core.py::test_legacy"]),
    )
    # SWE-bench 5.x would fail the skipped F2P test; SWE-smith leaves it out: 1/1 resolved
    assert verdict.resolution == grading.Resolution.FULL


def test_failed_errored_and_missing_tests_fail() -> None:
    verdict = _grade(
        smith_log(VERBOSE),
        ["tests/test_core.py::test_parse", "tests/test_core.py::test_format"],
        ["tests/test_io.py::test_read", "tests/test_io.py::test_gone"],
    )
    assert verdict.report is not None
    assert verdict.report.fail_to_pass.failure == ["tests/test_core.py::test_format"]
    assert verdict.report.pass_to_pass.failure == [
        "tests/test_io.py::test_read",
        "tests/test_io.py::test_gone",
    ]
    assert verdict.resolution == grading.Resolution.NO


def test_only_the_text_between_the_marker_traces_is_read() -> None:
    outside = "tests/test_core.py::test_format PASSED\n"
    verdict = _grade(
        outside + smith_log(VERBOSE) + outside, ["tests/test_core.py::test_format"], []
    )
    assert verdict.statuses["tests/test_core.py::test_format"] == "FAILED"
    assert not verdict.resolved


def test_a_log_without_markers_is_not_graded() -> None:
    verdict = _grade(VERBOSE, ["tests/test_core.py::test_parse"], [])
    assert (verdict.found, verdict.resolved, verdict.report) == (False, False, None)

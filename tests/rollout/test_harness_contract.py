"""Contract with the real ``swebench`` harness (5.0.2, the ``test`` extra): our task from a 5.x
row runs the script the harness runs, and our grade of a log is the harness's grade of it.

Rows are built as the dataset holds them (``tests/rollout/swebench_rows.py``) and turned into
the harness's ``TestSpec`` by its own ``make_test_spec``. Each log is a realistic evaluation
output for one framework; for each we compare, against ``swebench.harness.grading``: the
parser's status map, the status map ``get_logs_eval`` takes from the whole log (and whether it
accepts the log), the F2P/P2P report, and ``resolved``. Each case also states by hand whether
the instance is resolved, so a parser that agreed with the harness on the wrong answer would
fail too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from swebench.harness import grading as harness_grading
from swebench.harness.constants import EvalType as HarnessEvalType
from swebench.harness.infra_failure import classify_text
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.utils import make_test_spec
from swebench.image_builder.image_spec import ImageSpec
from swebench.task.checks import expected_image

from agentrl.rollout import grading, log_parsers
from agentrl.rollout.tasks.model import HarnessVerification
from agentrl.rollout.tasks.swebench import swebench_image, task_from_instance
from tests.rollout.swebench_rows import log, row


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    repo: str
    log_parser: str
    test_command: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    output: str
    exit_code: int
    resolved: bool
    """Worked out by hand from the log."""
    eval_type: str = "pass_and_fail"
    test_file: str = "tests/test_m.py"


PYTEST_RESOLVED = """\
============================= test session starts ==============================
collected 4 items

tests/test_m.py ..s.                                                     [100%]

==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_m.py::test_new
PASSED tests/test_m.py::test_old
PASSED tests/test_m.py::test_param[a-1]
SKIPPED [1] tests/test_m.py:30: needs network
SKIPPED tests/test_m.py::test_network
========================= 3 passed, 1 skipped in 0.08s =========================
"""

PYTEST_UNRESOLVED = """\
============================= test session starts ==============================
collected 3 items

tests/test_m.py F..                                                      [100%]

=================================== FAILURES ===================================
___________________________________ test_new ___________________________________
    def test_new():
>       assert m.x == 2
E       assert 1 == 2
tests/test_m.py:5: AssertionError
=========================== short test summary info ============================
PASSED tests/test_m.py::test_old
PASSED tests/test_m.py::test_param[a-1]
FAILED tests/test_m.py::test_new - assert 1 == 2
========================= 1 failed, 2 passed in 0.11s ==========================
"""

PYTEST_OPTIONS = """\
============================= test session starts ==============================
collected 3 items

tests/test_functional.py ...                                             [100%]

=========================== short test summary info ============================
PASSED tests/test_functional.py::test_functional[/testbed/tests/functional/a/abstract.py]
PASSED tests/test_functional.py::test_functional[recursion_error_3152]
PASSED tests/test_functional.py::test_url[http://example.com/a/b]
============================== 3 passed in 1.92s ===============================
"""

ASTROPY_V2 = """\
============================= test session starts ==============================
collected 4 items

astropy/io/fits/tests/test_header.py::test_ogip[log(photon cm-2 s-1)] \x1b[32mPASSED\x1b[0m
astropy/io/fits/tests/test_header.py::test_card PASSED
\x1b[32mPASSED\x1b[0m astropy/io/fits/tests/test_header.py::test_keys[a b]
\x1b[31mFAILED\x1b[0m astropy/io/fits/tests/test_header.py::test_strip - AssertionError: x
========================= 1 failed, 3 passed in 0.51s ==========================
"""

DJANGO_RESOLVED = """\
Testing against Django installed in '/testbed/django'
Importing application queries
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: auth, contenttypes, messages, queries, sessions, staticfiles
  Apply all migrations: admin, sites
Running migrations:
  Applying admin.0001_initial... OK
  Applying sites.0001_initial... OK
System check identified no issues (1 silenced).
test_combine_and_both_empty (queries.test_q.QTests) ... ok
test_combine_not_q_object (queries.test_q.QTests) ... ok
test_deconstruct (queries.test_q.QTests) ... ok
test_noisy (queries.test_q.QTests) ... Internal Server Error: /admin/x/
ok
test_skipped_db (queries.test_q.QTests) ... skipped 'Database has feature(s) supports_x'

----------------------------------------------------------------------
Ran 5 tests in 0.004s

OK (skipped=1)
"""

DJANGO_UNRESOLVED = """\
Testing against Django installed in '/testbed/django'
Importing application queries
System check identified no issues (1 silenced).
test_combine_and_both_empty (queries.test_q.QTests) ... ok
test_deconstruct (queries.test_q.QTests) ... FAIL
test_reconstruct_negated (queries.test_q.QTests) ... ERROR

======================================================================
ERROR: test_reconstruct_negated (queries.test_q.QTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/queries/test_q.py", line 40, in test_reconstruct_negated
    q = ~Q(price__gt=F('discounted_price'))
TypeError: bad operand type for unary ~: 'Q'

======================================================================
FAIL: test_deconstruct (queries.test_q.QTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/queries/test_q.py", line 12, in test_deconstruct
    self.assertEqual(path, 'django.db.models.Q')
AssertionError: 'django.db.models.query_utils.Q' != 'django.db.models.Q'

----------------------------------------------------------------------
Ran 3 tests in 0.003s

FAILED (failures=1, errors=1)
"""

SYMPY_UNRESOLVED = """\
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
cache:              no
ground types:       python
numpy:              None
random seed:        49211046
hash randomization: on (PYTHONHASHSEED=2950131717)

sympy/core/tests/test_numbers.py[3]
test_seterr ok
test_mod F
test_divmod E                                                             [FAIL]

________________________________________________________________________________
_______________ sympy/core/tests/test_numbers.py:test_mod ________________
Traceback (most recent call last):
  File "/testbed/sympy/core/tests/test_numbers.py", line 120, in test_mod
    assert Float(.3) % 1 == Float(.3)
AssertionError
________________________________________________________________________________
______________ sympy/core/tests/test_numbers.py:test_divmod ______________
Traceback (most recent call last):
  File "/testbed/sympy/core/numbers.py", line 600, in __divmod__
    raise TypeError
TypeError

= tests finished: 1 passed, 1 failed, 1 exceptions, in 0.31 seconds =
DO *NOT* COMMIT!
"""

SYMPY_RESOLVED = """\
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
random seed:        49211046

sympy/core/tests/test_numbers.py[3]
test_seterr ok
test_mod ok
test_divmod ok                                                              [OK]

================== tests finished: 3 passed, in 0.28 seconds ===================
"""

SEABORN = """\
============================= test session starts ==============================
collected 3 items

tests/test_core.py::TestHueMapping::test_init_from_map PASSED            [ 33%]
tests/test_core.py::TestHueMapping::test_hue_map_null FAILED             [ 66%]
tests/test_core.py::TestSizeMapping::test_map PASSED                     [100%]

=========================== short test summary info ============================
PASSED tests/test_core.py::TestSizeMapping::test_map
FAILED tests/test_core.py::TestHueMapping::test_hue_map_null - ValueError: x
========================= 1 failed, 2 passed in 0.91s ==========================
"""

MATPLOTLIB = """\
============================= test session starts ==============================
collected 3 items

lib/matplotlib/tests/test_backend_bases.py ...                           [100%]

=========================== short test summary info ============================
PASSED lib/matplotlib/tests/test_backend_bases.py::test_zoom[MouseButton.LEFT-0.2]
PASSED lib/matplotlib/tests/test_backend_bases.py::test_zoom[MouseButton.RIGHT-0.2]
PASSED lib/matplotlib/tests/test_backend_bases.py::test_pick
============================== 3 passed in 2.01s ===============================
"""

CASES = [
    Case(
        "pytest-resolved",
        "pallets/flask",
        "parse_log_flask",
        "pytest -rA",
        ["tests/test_m.py::test_new"],
        ["tests/test_m.py::test_old", "tests/test_m.py::test_network"],
        PYTEST_RESOLVED,
        0,
        resolved=True,  # the skipped P2P test is maintained
    ),
    Case(
        "pytest-unresolved",
        "pytest-dev/pytest",
        "parse_log_pytest",
        "pytest -rA",
        ["tests/test_m.py::test_new"],
        ["tests/test_m.py::test_old", "tests/test_m.py::test_param[a-1]"],
        PYTEST_UNRESOLVED,
        1,
        resolved=False,
    ),
    Case(
        "pytest-skipped-f2p",
        "pydata/xarray",
        "parse_log_xarray",
        "pytest -rA",
        ["tests/test_m.py::test_new", "tests/test_m.py::test_network"],
        [],
        PYTEST_RESOLVED,
        0,
        resolved=False,  # a skipped F2P test is not a resolution
    ),
    Case(
        "pytest-prints-its-own-passes",
        "pytest-dev/pytest",
        "parse_log_pytest",
        "pytest -rA",
        ["tests/test_m.py::test_new"],
        [],
        PYTEST_RESOLVED,
        2,
        resolved=False,  # exit status 2 with no failure in the log: refused
    ),
    Case(
        "pytest-options",
        "pylint-dev/pylint",
        "parse_log_pylint",
        "pytest -rA",
        ["tests/test_functional.py::test_functional[/abstract.py]"],
        [
            "tests/test_functional.py::test_functional[recursion_error_3152]",
            "tests/test_functional.py::test_url[http://example.com/a/b]",
        ],
        PYTEST_OPTIONS,
        0,
        resolved=True,
        test_file="tests/test_functional.py",
    ),
    Case(
        "pytest-options-requests",
        "psf/requests",
        "parse_log_requests",
        "pytest -rA",
        ["tests/test_functional.py::test_functional[/testbed/tests/functional/a/abstract.py]"],
        [],
        PYTEST_OPTIONS,
        0,
        resolved=False,  # the parser shortened the id to [/abstract.py]
        test_file="tests/test_functional.py",
    ),
    Case(
        "pytest-v2-astropy",
        "astropy/astropy",
        "parse_log_astropy",
        "pytest -rA -vv -o console_output_style=classic --tb=no",
        [
            # truncated mid-parameter, as 676 Verified ids are
            "astropy/io/fits/tests/test_header.py::test_ogip[log(photon",
            "astropy/io/fits/tests/test_header.py::test_keys[a b]",
        ],
        ["astropy/io/fits/tests/test_header.py::test_card"],
        ASTROPY_V2,
        1,
        resolved=True,
        test_file="astropy/io/fits/tests/test_header.py",
    ),
    Case(
        "pytest-v2-scikit-unresolved",
        "scikit-learn/scikit-learn",
        "parse_log_scikit",
        "pytest -rA",
        ["astropy/io/fits/tests/test_header.py::test_strip"],
        ["astropy/io/fits/tests/test_header.py::test_card"],
        ASTROPY_V2,
        1,
        resolved=False,
    ),
    Case(
        "django-resolved",
        "django/django",
        "parse_log_django",
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
        ["test_deconstruct (queries.test_q.QTests)", "test_noisy (queries.test_q.QTests)"],
        [
            "test_combine_and_both_empty (queries.test_q.QTests)",
            "test_skipped_db (queries.test_q.QTests)",
        ],
        DJANGO_RESOLVED,
        0,
        resolved=True,
        test_file="tests/queries/test_q.py",
    ),
    Case(
        "django-unresolved",
        "django/django",
        "parse_log_django",
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
        ["test_deconstruct (queries.test_q.QTests)"],
        ["test_reconstruct_negated (queries.test_q.QTests)"],
        DJANGO_UNRESOLVED,
        1,
        resolved=False,
        test_file="tests/queries/test_q.py",
    ),
    Case(
        "sympy-unresolved",
        "sympy/sympy",
        "parse_log_sympy",
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
        ["test_mod", "test_divmod"],
        ["test_seterr"],
        SYMPY_UNRESOLVED,
        1,
        resolved=False,
        test_file="sympy/core/tests/test_numbers.py",
    ),
    Case(
        "sympy-resolved",
        "sympy/sympy",
        "parse_log_sympy",
        "bin/test -C --verbose",
        ["test_mod"],
        ["test_seterr"],
        SYMPY_RESOLVED,
        0,
        resolved=True,
        test_file="sympy/core/tests/test_numbers.py",
    ),
    Case(
        "sympy-last-test-of-a-file",
        "sympy/sympy",
        "parse_log_sympy",
        "bin/test -C --verbose",
        ["test_divmod"],
        [],
        SYMPY_RESOLVED,
        0,
        # its line ends in the file's "[OK]", which the parser does not read: the test is
        # missing from the map, so it fails (datasets graded by this parser never list it)
        resolved=False,
        test_file="sympy/core/tests/test_numbers.py",
    ),
    Case(
        "seaborn",
        "mwaskom/seaborn",
        "parse_log_seaborn",
        "pytest --no-header -rA",
        ["tests/test_core.py::TestHueMapping::test_init_from_map"],
        ["tests/test_core.py::TestSizeMapping::test_map"],
        SEABORN,
        1,
        resolved=True,
        test_file="tests/test_core.py",
    ),
    Case(
        "seaborn-unresolved",
        "mwaskom/seaborn",
        "parse_log_seaborn",
        "pytest --no-header -rA",
        ["tests/test_core.py::TestHueMapping::test_hue_map_null"],
        [],
        SEABORN,
        1,
        resolved=False,
        test_file="tests/test_core.py",
    ),
    Case(
        "matplotlib",
        "matplotlib/matplotlib",
        "parse_log_matplotlib",
        "pytest -rA",
        [
            "lib/matplotlib/tests/test_backend_bases.py::test_zoom[1-0.2]",
            "lib/matplotlib/tests/test_backend_bases.py::test_zoom[3-0.2]",
        ],
        ["lib/matplotlib/tests/test_backend_bases.py::test_pick"],
        MATPLOTLIB,
        0,
        resolved=True,
        test_file="lib/matplotlib/tests/test_backend_bases.py",
    ),
    Case(
        "fail-only",
        "pytest-dev/pytest",
        "parse_log_pytest",
        "pytest -rA",
        ["tests/test_m.py::test_absent", "tests/test_m.py::test_old"],
        [],
        PYTEST_UNRESOLVED,
        1,
        resolved=True,  # fail_only: only a FAILED line fails a test
        eval_type="fail_only",
    ),
    Case(
        "fail-only-failing",
        "pytest-dev/pytest",
        "parse_log_pytest",
        "pytest -rA",
        ["tests/test_m.py::test_new"],
        [],
        PYTEST_UNRESOLVED,
        1,
        resolved=False,
        eval_type="fail_only",
    ),
]


def _row(case: Case) -> dict[str, object]:
    return row(
        f"{case.repo.replace('/', '__')}-{case.name}",
        case.repo,
        fail_to_pass=case.fail_to_pass,
        pass_to_pass=case.pass_to_pass,
        log_parser=case.log_parser,
        test_command=case.test_command,
        test_file=case.test_file,
        eval_type=case.eval_type,
    )


def _log(case: Case) -> str:
    return log(f"{case.test_command} {case.test_file}", case.output, exit_code=case.exit_code)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_5x_row_becomes_the_harness_test_spec(case: Case) -> None:
    record = _row(case)
    spec = make_test_spec(record)
    task = task_from_instance(record)
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    assert task.image == spec.image
    assert verification.eval_script == spec.eval_script
    assert verification.log_parser == spec.log_parser
    assert verification.eval_type == spec.eval_type
    assert verification.fail_to_pass == spec.FAIL_TO_PASS
    assert verification.pass_to_pass == spec.PASS_TO_PASS
    assert task.workdir == "/testbed"


def test_the_eval_script_records_the_test_exit_status_as_the_harness_does() -> None:
    record = _row(CASES[0])
    script = task_from_instance(record).verification.eval_script  # type: ignore[union-attr]
    lines = script.split("\n")
    assert lines[:2] == ["#!/bin/bash", "set -uxo pipefail"]
    end = lines.index(": '>>>>> End Test Output'")
    assert lines[end - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert lines[end + 1] == 'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"'
    assert lines[end - 2] == "pytest -rA tests/test_m.py"


@pytest.mark.parametrize(
    "instance_id",
    ["astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590", "psf__requests-2317"],
)
def test_an_instance_without_image_gets_the_harness_image_name(instance_id: str) -> None:
    spec = ImageSpec(instance_id=instance_id, dockerfile="FROM x", namespace="swebench")
    assert swebench_image(instance_id) == spec.name == expected_image(instance_id)
    record = {**_row(CASES[0]), "instance_id": instance_id}
    del record["image"]
    assert task_from_instance(record).image == spec.name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_parser_reads_a_log_as_the_harness_parser_does(case: Case) -> None:
    spec = make_test_spec(_row(case))
    text = _log(case)
    theirs = PARSER_REGISTRY[case.log_parser](text, spec)
    assert log_parsers.parse(case.log_parser, text) == theirs
    assert theirs, "each case's log must give the parser something to read"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_our_grade_is_the_harness_grade(case: Case, tmp_path: Path) -> None:
    record = _row(case)
    spec = make_test_spec(record)
    text = _log(case)
    path = tmp_path / "test_output.txt"
    path.write_text(text)

    their_map, their_found = harness_grading.get_logs_eval(spec, str(path))
    ours = grading.grade(
        text,
        harness=grading.Harness.SWEBENCH,
        log_parser=case.log_parser,
        eval_type=grading.EvalType(case.eval_type),
        fail_to_pass=spec.FAIL_TO_PASS,
        pass_to_pass=spec.PASS_TO_PASS,
    )
    assert (ours.statuses, ours.found) == (their_map, their_found)

    report = harness_grading.get_eval_report(
        spec,
        {"instance_id": spec.instance_id, "model_patch": "diff", "model_name_or_path": "m"},
        str(path),
        include_tests_status=True,
    )[spec.instance_id]
    assert ours.resolved == report["resolved"] == case.resolved
    if their_found:
        their_tests = harness_grading.get_eval_tests_report(
            their_map,
            {"FAIL_TO_PASS": spec.FAIL_TO_PASS, "PASS_TO_PASS": spec.PASS_TO_PASS},
            eval_type=HarnessEvalType(spec.eval_type),
        )
        assert ours.report is not None
        for ours_list, key in (
            (ours.report.fail_to_pass, "FAIL_TO_PASS"),
            (ours.report.pass_to_pass, "PASS_TO_PASS"),
        ):
            assert ours_list.success == their_tests[key]["success"]
            assert ours_list.failure == their_tests[key]["failure"]
        assert ours.resolution.value == harness_grading.get_resolution_status(their_tests)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("no markers", "collected 0 items\nno tests ran in 0.01s\n"),
        (
            "harness timeout marker",
            log("pytest", PYTEST_RESOLVED, exit_code=0) + "\n>>>>> Tests Timed Out\n",
        ),
        ("no statuses, suite ran", log("jest", "Tests:       3 passed, 3 total\n", exit_code=0)),
        ("no statuses, nothing ran", log("pytest", "ImportError: no module x\n", exit_code=4)),
        ("network", "Could not resolve host: github.com\n"),
    ],
)
def test_logs_the_harness_refuses_are_refused_here_too(
    name: str, text: str, tmp_path: Path
) -> None:
    record = _row(CASES[1])
    spec = make_test_spec(record)
    path = tmp_path / "test_output.txt"
    path.write_text(text)
    their_map, their_found = harness_grading.get_logs_eval(spec, str(path))
    ours, found = grading.status_map(
        text, harness=grading.Harness.SWEBENCH, log_parser="parse_log_pytest"
    )
    assert (ours, found) == (their_map, their_found)
    assert grading.infra_signature(text) == classify_text(text)


def test_every_python_parser_of_the_harness_is_supported() -> None:
    python_parsers = {
        name
        for name, parser in PARSER_REGISTRY.items()
        if parser.__module__ == "swebench.harness.log_parsers.python"
    }
    assert python_parsers <= set(log_parsers.PARSERS)


PYTHON_PARSERS = sorted(
    name
    for name, parser in PARSER_REGISTRY.items()
    if parser.__module__ == "swebench.harness.log_parsers.python"
)


@pytest.mark.parametrize("parser", PYTHON_PARSERS)
def test_every_python_parser_reads_every_log_as_the_harness_does(parser: str) -> None:
    spec = make_test_spec(_row(CASES[0]))
    for case in CASES:
        text = _log(case)
        assert log_parsers.parse(parser, text) == PARSER_REGISTRY[parser](text, spec), case.name


@pytest.mark.parametrize(
    "script",
    [
        # no end marker: left as it is (the harness cannot record the exit status)
        "#!/bin/bash\nset -uxo pipefail\ncd /testbed\npytest -rA\n",
        # header lines repeated and blank lines kept
        "set -uxo pipefail\n\ncd /testbed\n#!/bin/bash\n: '>>>>> Start Test Output'\n"
        "pytest -rA\n: '>>>>> End Test Output'\n\n",
    ],
)
def test_odd_eval_scripts_are_turned_into_the_same_script(script: str) -> None:
    record = {**_row(CASES[0]), "eval_script": script}
    assert grading.harness_eval_script(script) == make_test_spec(record).eval_script

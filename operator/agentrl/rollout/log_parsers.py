"""Per-test statuses from a test run's log, one parser per test framework, named the way
SWE-bench 5.x instances name them (the ``log_parser`` column).

Each parser maps a log to ``{test id: status}``, with statuses from :class:`TestStatus`. They
reproduce, line for line, what ``swebench.harness.log_parsers`` reads from the same log, quirks
included (a pytest ``FAILED`` line's `` - message`` is dropped, Django's ``FAIL:`` headers record
the bare method name, sympy's failure banners are found anywhere in the log), because the
reward must equal the harness's verdict on the same run. ``tests/rollout/test_harness_contract.py``
checks that against the real ``swebench`` package for every parser here.

Supported: the Python parsers of SWE-bench (``parse_log_pytest`` and its aliases,
``parse_log_pytest_options``, ``parse_log_pytest_v2``, ``parse_log_django``,
``parse_log_seaborn``, ``parse_log_sympy``, ``parse_log_matplotlib``) and SWE-smith's Python
profile parser (``swesmith_python``: ``pytest --verbose`` lines, ``test STATUS``). Instances
naming another parser (JavaScript, Go, Java, ...) are refused when the dataset is read.

Callers: :mod:`agentrl.rollout.grading`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Final


class TestStatus(StrEnum):
    """A test's outcome, spelled as in the logs (and in the harness's status maps)."""

    __test__ = False  # not a pytest test class

    FAILED = "FAILED"
    PASSED = "PASSED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


LogParser = Callable[[str], dict[str, str]]

#: In the order the harness tries them (a line starting with ``PASSEDX`` counts as PASSED's).
_STATUS_WORDS: Final = tuple(status.value for status in TestStatus)
#: pytest's ``SKIPPED [2] tests/x.py:10: reason`` summary: ``[2]`` counts tests, it is none.
_SKIP_COUNT: Final = re.compile(r"^\[\d+\]$")
#: ``[32m``-style colour codes (the ESC byte itself goes with the other control characters).
_COLOUR: Final = re.compile(r"\[(\d+)m")
_CONTROL_CHARS: Final = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))


def _starts_with_status(line: str) -> bool:
    return line.startswith(_STATUS_WORDS)


def _summary_id_and_status(line: str) -> tuple[str, str] | None:
    """``STATUS test-id`` of a ``pytest -rA`` summary line, None for other lines."""
    if not _starts_with_status(line):
        return None
    if line.startswith(TestStatus.FAILED):
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) < 2:
        return None
    if words[0] == TestStatus.SKIPPED and _SKIP_COUNT.match(words[1]):
        return None
    return words[1], words[0]


def parse_pytest(log: str) -> dict[str, str]:
    """``pytest -rA`` summary lines: ``PASSED tests/t.py::test_a``."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        found = _summary_id_and_status(line)
        if found is not None:
            statuses[found[0]] = found[1]
    return statuses


def _shorten_option(test_id: str) -> str:
    """``test[/abs/path/to/file]`` becomes ``test[/file]`` (parameter ids holding paths differ
    between machines); everything after the last ``]`` goes."""
    opening = test_id.find("[")
    closing = test_id.rfind("]")
    if opening < 0 or closing <= opening:
        return test_id
    main, option = test_id[:opening], test_id[opening + 1 : closing]
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.rsplit("/", 1)[-1]
    return f"{main}[{option}]"


def parse_pytest_options(log: str) -> dict[str, str]:
    """``pytest -rA`` summary lines, with path-valued parameter ids cut to the file name."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        found = _summary_id_and_status(line)
        if found is not None:
            statuses[_shorten_option(found[0])] = found[1]
    return statuses


def parse_matplotlib(log: str) -> dict[str, str]:
    """``pytest -rA`` summary lines, with ``MouseButton.LEFT``/``RIGHT`` spelled 1 and 3 as in
    the dataset's test ids."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        line = line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
        found = _summary_id_and_status(line)
        if found is not None:
            statuses[found[0]] = found[1]
    return statuses


def parse_pytest_v2(log: str) -> dict[str, str]:
    """Later pytest versions: colour codes and control characters removed; ``STATUS id with
    spaces`` summary lines, or older ``id ... STATUS`` lines."""
    statuses: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _COLOUR.sub("", raw).translate(_CONTROL_CHARS)
        if _starts_with_status(line):
            if line.startswith(TestStatus.FAILED):
                line = line.split(" - ", 1)[0]
            words = line.split()
            if len(words) >= 2 and not (
                words[0] == TestStatus.SKIPPED and _SKIP_COUNT.match(words[1])
            ):
                statuses[" ".join(words[1:])] = words[0]
        elif line.endswith(_STATUS_WORDS):
            words = line.split()
            if len(words) >= 2:
                statuses[" ".join(words[:-1])] = words[-1]
    return statuses


_DJANGO_OK_SUFFIXES: Final = (" ... ok", " ... OK", " ...  OK")
#: Output Django's logger sometimes prints between a test's ``...`` and its ``ok``.
_DJANGO_INTERRUPTED: Final = tuple(
    re.compile(pattern, re.MULTILINE)
    for pattern in (
        r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
        r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
        r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
    )
)
_DJANGO_SITES_MIGRATION: Final = "Applying sites.0002_alter_domain_unique...test_no_migrations"
_DJANGO_VERSION_TEST: Final = "--version is equivalent to version"


def _django_ok(line: str, statuses: dict[str, str]) -> str:
    """Record a ``... ok`` line; returns the line as the later checks see it."""
    for suffix in _DJANGO_OK_SUFFIXES:
        if line.endswith(suffix):
            if line.startswith(_DJANGO_SITES_MIGRATION):
                # a migration message printed on the test's own line
                line = line.split("...", 1)[-1].strip()
            statuses[line.rsplit(suffix, 1)[0]] = TestStatus.PASSED
            break
    return line


def _django_failures(line: str, statuses: dict[str, str]) -> None:
    """Record ``... skipped``, ``... FAIL``/``ERROR`` lines and ``FAIL:``/``ERROR:`` headers
    (a header records only the method name, the word after the colon)."""
    if " ... skipped" in line:
        statuses[line.split(" ... skipped")[0]] = TestStatus.SKIPPED
    if line.endswith(" ... FAIL"):
        statuses[line.split(" ... FAIL")[0]] = TestStatus.FAILED
    if line.startswith("FAIL:") and len(line.split()) > 1:
        statuses[line.split()[1]] = TestStatus.FAILED
    if line.endswith(" ... ERROR"):
        statuses[line.split(" ... ERROR")[0]] = TestStatus.ERROR
    if line.startswith("ERROR:") and len(line.split()) > 1:
        statuses[line.split()[1]] = TestStatus.ERROR


def parse_django(log: str) -> dict[str, str]:
    """Django's runner at ``--verbosity 2``: ``test_x (app.tests.T) ... ok``, ``FAIL:`` and
    ``ERROR:`` headers, and an ``ok`` on a later line after interleaved output."""
    statuses: dict[str, str] = {}
    previous: str | None = None
    for raw in log.split("\n"):
        line = raw.strip()
        if _DJANGO_VERSION_TEST in line:
            statuses[_DJANGO_VERSION_TEST] = TestStatus.PASSED
        if " ... " in line:
            previous = line.split(" ... ")[0]
        line = _django_ok(line, statuses)
        _django_failures(line, statuses)
        if line.startswith("ok") and previous is not None:
            statuses[previous] = TestStatus.PASSED
    for pattern in _DJANGO_INTERRUPTED:
        for match in pattern.finditer(log):
            statuses[match.group(1)] = TestStatus.PASSED
    return statuses


def parse_seaborn(log: str) -> dict[str, str]:
    """seaborn's pytest runs: ``FAILED id``, ``id PASSED ...`` or ``PASSED id``."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith(TestStatus.FAILED):
            statuses[words[1]] = TestStatus.FAILED
        elif " PASSED " in line:
            if words[1] == TestStatus.PASSED:
                statuses[words[0]] = TestStatus.PASSED
        elif line.startswith(TestStatus.PASSED):
            statuses[words[1]] = TestStatus.PASSED
    return statuses


#: sympy's ``bin/test`` failure banner: ``____ sympy/core/tests/test_x.py:test_y ____``.
_SYMPY_BANNER: Final = re.compile(r"(_*) (.*)\.py:(.*) (_*)")
_SYMPY_ENDINGS: Final = (
    (" E", TestStatus.ERROR),
    (" F", TestStatus.FAILED),
    (" ok", TestStatus.PASSED),
)


def parse_sympy(log: str) -> dict[str, str]:
    """sympy's ``bin/test --verbose``: ``test_name ok``/``F``/``E`` lines and failure banners."""
    statuses: dict[str, str] = {
        f"{match[1]}.py:{match[2]}": TestStatus.FAILED for match in _SYMPY_BANNER.findall(log)
    }
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        for ending, status in _SYMPY_ENDINGS:
            if line.endswith(ending):
                statuses[line.split()[0]] = status
    return statuses


_SWESMITH_VERBOSE: Final = tuple(
    (status.value, re.compile(rf"^(\S+)(\s+){status.value}")) for status in TestStatus
)


def parse_swesmith_python(log: str) -> dict[str, str]:
    """SWE-smith's Python profile (``pytest --verbose``): ``tests/t.py::test_a PASSED [ 50%]``."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        for status, pattern in _SWESMITH_VERBOSE:
            match = pattern.match(line)
            if match:
                statuses[match.group(1)] = status
    return statuses


#: SWE-smith instances carry no ``log_parser``; the loader names this one for Python repos.
SWESMITH_PYTHON: Final = "swesmith_python"

#: Parser names as instances spell them.
PARSERS: Final[dict[str, LogParser]] = {
    "parse_log_pytest": parse_pytest,
    "parse_log_pytest_options": parse_pytest_options,
    "parse_log_pytest_v2": parse_pytest_v2,
    "parse_log_django": parse_django,
    "parse_log_seaborn": parse_seaborn,
    "parse_log_sympy": parse_sympy,
    "parse_log_matplotlib": parse_matplotlib,
    # the harness's per-repository aliases
    "parse_log_astroid": parse_pytest,
    "parse_log_flask": parse_pytest,
    "parse_log_marshmallow": parse_pytest,
    "parse_log_pvlib": parse_pytest,
    "parse_log_pyvista": parse_pytest,
    "parse_log_sqlfluff": parse_pytest,
    "parse_log_xarray": parse_pytest,
    "parse_log_pydicom": parse_pytest_options,
    "parse_log_requests": parse_pytest_options,
    "parse_log_pylint": parse_pytest_options,
    "parse_log_astropy": parse_pytest_v2,
    "parse_log_scikit": parse_pytest_v2,
    "parse_log_sphinx": parse_pytest_v2,
    SWESMITH_PYTHON: parse_swesmith_python,
}


def parse(log_parser: str, log: str) -> dict[str, str]:
    """Statuses of ``log`` read by the parser named ``log_parser`` (KeyError if unknown; the
    loader refuses such instances first)."""
    return {test: str(status) for test, status in PARSERS[log_parser](log).items()}

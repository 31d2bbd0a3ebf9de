"""GPU and engine fault signatures in SGLang/ROCm logs: a pure line classifier.

Called by the watchdog sidecar (``agentrl.engine.watchdog``), which tails the engine log and
restarts the engine when a line matches, and by ``agentrl engine watchdog classify`` (one
``LINE_NUMBER SIGNATURE_NAME`` per recognised line).

Each signature has a stable name (alerts, the ``signature`` label of
``agentrl_watchdog_faults_total`` and Events match on it) and the exact wording ROCm, PyTorch
and SGLang print, taken from the reference notes (``sglang-rocm-megatron.md`` §2, "Real fault
signatures"). The patterns are case-sensitive and anchored on whole phrases, so ordinary lines —
graph capture progress (``Capture cuda graph begin``), warnings, batch statistics, access logs —
never match.

One trap is handled on purpose: request logs. With ``--log-requests`` SGLang prints the prompt
and output text of every request, and an SWE agent working on GPU code may well quote
``hipErrorIllegalAddress`` in its prompt. Lines that are request or access logs are therefore
never classified, whatever text they carry.

Kernel-side faults (``amdgpu: [mmhub0] retry page fault``) are not here: a non-privileged
sidecar cannot read the kernel log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class FaultSignature:
    """One recognisable fault."""

    name: str
    """Stable SCREAMING_SNAKE name (metric label, Event message, ``classify`` output)."""
    pattern: re.Pattern[str]
    """Case-sensitive regular expression searched in each log line."""
    description: str
    """What the fault is, for people reading ``docs/engine.md`` and Events."""


@dataclass(frozen=True)
class FaultMatch:
    """A log line that matched a signature."""

    line_number: int
    """1-based line number in the input."""
    signature: FaultSignature
    """The signature it matched (the first in :data:`SIGNATURES` order)."""
    line: str
    """The line, without its trailing newline."""


def _sig(name: str, pattern: str, description: str) -> FaultSignature:
    return FaultSignature(name=name, pattern=re.compile(pattern), description=description)


#: Every signature, most specific first: a line is attributed to the first one it matches.
SIGNATURES: Final[tuple[FaultSignature, ...]] = (
    _sig(
        "ILLEGAL_MEMORY_ACCESS",
        r"(HIP|CUDA) error: an illegal memory access was encountered|hipErrorIllegalAddress",
        "A kernel read or wrote an illegal address (hipErrorIllegalAddress); PyTorch-ROCm may "
        "word it as a CUDA error.",
    ),
    _sig(
        "LAUNCH_FAILURE",
        r"HIP error: unspecified launch failure|hipErrorLaunchFailure",
        "A kernel launch failed (hipErrorLaunchFailure).",
    ),
    _sig(
        "GPU_MEMORY_ACCESS_FAULT",
        r"Memory access fault by GPU node-\d+",
        "The ROCm runtime caught a page fault on the GPU; the process aborts.",
    ),
    _sig(
        "GPU_HANG",
        r"HW Exception by GPU node-\d+ .*reason :GPU Hang",
        "The GPU stopped responding (HW exception, GPU Hang).",
    ),
    _sig(
        "HSA_HARDWARE_EXCEPTION",
        r"HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception",
        "A queue aborted with a hardware exception (seen on first decode graph replay).",
    ),
    _sig(
        "HSA_APERTURE_VIOLATION",
        r"HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION",
        "An access beyond the largest legal address.",
    ),
    _sig(
        "GRAPH_CAPTURE_FAILED",
        r"hipErrorStreamCaptureInvalidated"
        r"|operation not permitted on an event last recorded in a capturing stream"
        r"|Capture cuda graph failed",
        "HIP graph capture failed (ROCm <= 7.2.0 hipEventQuery bug, or a real fault during "
        "capture). Graphs stay on: use an image on ROCm >= 7.2.2.",
    ),
    _sig(
        "SCHEDULER_WATCHDOG_TIMEOUT",
        r"Scheduler watchdog timeout",
        "A forward batch took longer than --watchdog-timeout; SGLang exits.",
    ),
    _sig(
        "SCHEDULER_EXCEPTION",
        r"Scheduler hit an exception",
        "SGLang's scheduler process raised; the engine tears itself down.",
    ),
    _sig(
        "CHILD_PROCESS_FAILED",
        r"Received sigquit from a child process",
        "An SGLang child process failed and signalled the parent, which kills the tree.",
    ),
    _sig(
        "HEALTH_CHECK_FAILED",
        r"Health check failed\. Server couldn't get a response from detokenizer",
        "SGLang's own health check got no token in time and marked the server unhealthy.",
    ),
    _sig(
        "FATAL_ABORT",
        r"Fatal Python error: Aborted",
        "The Python process aborted (usually right after a HIP/HSA fault line).",
    ),
    _sig(
        "PROCESS_GROUP_WATCHDOG",
        r"Process group watchdog thread terminated with exception",
        "The collective-communication watchdog thread died (often a capture-time fault).",
    ),
)

#: Names of every signature, in :data:`SIGNATURES` order.
SIGNATURE_NAMES: Final[tuple[str, ...]] = tuple(s.name for s in SIGNATURES)

#: Lines that echo request or response text (``--log-requests``) or HTTP access logs. They can
#: quote anything a user or agent wrote, so they are never classified.
_REQUEST_LOG: Final = re.compile(
    r"\b(Receive|Finish): obj="  # SGLang --log-requests
    r"|\bGenerateReqInput\(|\bEmbeddingReqInput\("  # request objects printed whole
    r'|"(GET|POST|PUT|DELETE|PATCH|HEAD) /[^"]* HTTP/\d(\.\d)?"'  # uvicorn access log
)


def is_request_log(line: str) -> bool:
    """Whether ``line`` is a request/access log line (never a fault, whatever it quotes)."""
    return _REQUEST_LOG.search(line) is not None


def classify_line(line: str) -> FaultSignature | None:
    """The signature ``line`` shows, or None for an ordinary line."""
    if is_request_log(line):
        return None
    for signature in SIGNATURES:
        if signature.pattern.search(line):
            return signature
    return None


def classify_lines(lines: Iterable[str], first_line_number: int = 1) -> Iterator[FaultMatch]:
    """Every fault line of ``lines`` (numbered from ``first_line_number``), in order."""
    for number, raw in enumerate(lines, start=first_line_number):
        line = raw.rstrip("\r\n")
        signature = classify_line(line)
        if signature is not None:
            yield FaultMatch(line_number=number, signature=signature, line=line)


def signature_by_name(name: str) -> FaultSignature:
    """The signature called ``name``.

    Raises:
        KeyError: listing the known names.
    """
    for signature in SIGNATURES:
        if signature.name == name:
            return signature
    raise KeyError(f"unknown fault signature {name!r}; known: {', '.join(SIGNATURE_NAMES)}")

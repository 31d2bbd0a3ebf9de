"""The fault classifier: every reference signature is recognised, ordinary lines never are."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from agentrl.engine import faults
from agentrl.engine.cli import engine

#: Real-looking fault lines (wording from the reference notes' signature list) and the name each
#: must get.
FAULT_LINES = [
    (
        "torch.AcceleratorError: HIP error: an illegal memory access was encountered",
        "ILLEGAL_MEMORY_ACCESS",
    ),
    ("Search for `hipErrorIllegalAddress' in https://rocm.docs.amd.com", "ILLEGAL_MEMORY_ACCESS"),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "ILLEGAL_MEMORY_ACCESS",
    ),
    ("RuntimeError: HIP error: unspecified launch failure", "LAUNCH_FAILURE"),
    ("Search for `hipErrorLaunchFailure' in https://rocm.docs.amd.com", "LAUNCH_FAILURE"),
    (
        "Memory access fault by GPU node-2 (Agent handle: 0x55d6c5a3c3f0) on address "
        "0x7f2a1c000000. Reason: Page not present or supervisor privilege.",
        "GPU_MEMORY_ACCESS_FAULT",
    ),
    (
        "Memory access fault by GPU node-9 (Agent handle: 0x1) on address 0x2. "
        "Reason: Write access to a read-only page.",
        "GPU_MEMORY_ACCESS_FAULT",
    ),
    (
        "HW Exception by GPU node-3 (Agent handle: 0x5581e0d4a1b0) reason :GPU Hang",
        "GPU_HANG",
    ),
    (
        ":0:rocdevice.cpp            :3020: 2383741117 us: Callback: Queue 0x7f1b3c200000 "
        "aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a "
        "hardware exception. code: 0x1016",
        "HSA_HARDWARE_EXCEPTION",
    ),
    (
        ":0:rocdevice.cpp            :2881: 0 us: Callback: Queue 0x7f aborting with error : "
        "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory "
        "beyond the largest legal address. code: 0x29",
        "HSA_APERTURE_VIOLATION",
    ),
    (
        "Exception: Capture cuda graph failed: HIP error: operation failed due to a previous "
        "error during capture",
        "GRAPH_CAPTURE_FAILED",
    ),
    ("Search for `hipErrorStreamCaptureInvalidated' in the docs", "GRAPH_CAPTURE_FAILED"),
    (
        "RuntimeError: HIP error: operation not permitted on an event last recorded in a "
        "capturing stream",
        "GRAPH_CAPTURE_FAILED",
    ),
    (
        "[2026-10-01 12:00:00] Scheduler watchdog timeout (self.watchdog_timeout=300, "
        "self.soft=False)",
        "SCHEDULER_WATCHDOG_TIMEOUT",
    ),
    ("[2026-10-01 12:00:00 TP0] Scheduler hit an exception: Traceback", "SCHEDULER_EXCEPTION"),
    (
        "[2026-10-01 12:00:01] Received sigquit from a child process. It usually means the "
        "child failed.",
        "CHILD_PROCESS_FAILED",
    ),
    (
        "[2026-10-01 12:00:02] Health check failed. Server couldn't get a response from "
        "detokenizer for last 20 seconds. tic start time: 12:00:00. last_heartbeat time: 11:59",
        "HEALTH_CHECK_FAILED",
    ),
    ("Fatal Python error: Aborted", "FATAL_ABORT"),
    (
        "[rank0]:[E1001 12:00:00 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 0] Process group "
        "watchdog thread terminated with exception: HIP error",
        "PROCESS_GROUP_WATCHDOG",
    ),
]

#: Ordinary lines of a healthy SGLang engine on ROCm: none may trip the classifier.
BENIGN_LINES = [
    "[2026-10-01 11:58:00 TP0] Capture cuda graph begin. This can take up to several minutes. "
    "avail mem=21.5 GB",
    "Capturing batches (bs=512 avail_mem=21.37 GB): 100%|██████████| 52/52 "
    "[00:31<00:00,  1.67it/s]",
    "[2026-10-01 11:58:31 TP0] Capture cuda graph end. Time elapsed: 31.2 s. mem usage=1.2 GB.",
    "[2026-10-01 11:57:00] Warning: User-specified context_length (65536) is greater than the "
    "derived context_length (40960). This may lead to incorrect model outputs or HIP errors.",
    "[2026-10-01 12:00:00 TP0] Decode batch. #running-req: 48, #token: 310211, token usage: "
    "0.27, cuda graph: True, gen throughput (token/s): 1432.55, #queue-req: 0",
    "[2026-10-01 12:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: "
    "51200, token usage: 0.28, #running-req: 47, #queue-req: 0",
    'INFO:     10.0.3.7:51234 - "POST /generate HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:40000 - "GET /health_generate HTTP/1.1" 200 OK',
    "/usr/lib/python3/dist-packages/torch/cuda/__init__.py:63: UserWarning: HIP graphs are "
    "experimental on this platform",
    "[2026-10-01 12:00:03] The server is fired up and ready to roll!",
    "[aiter] start build [module_aiter_enum] under /sgl-workspace/aiter/aiter/jit/build",
    "Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=120.3 GB",
    "[2026-10-01 12:00:04] Health check passed.",
    # Request logs quote whatever an agent wrote; a fault name inside one is not a fault.
    "[2026-10-01 12:00:05] Receive: obj=GenerateReqInput(text='why does my kernel raise "
    "hipErrorIllegalAddress and Memory access fault by GPU node-0 ?', sampling_params={})",
    "[2026-10-01 12:00:06] Finish: obj=GenerateReqInput(rid='a1'), out={'text': 'Fatal Python "
    "error: Aborted is printed when ...'}",
    'INFO:     10.0.0.1:1 - "GET /search?q=Scheduler%20hit%20an%20exception HTTP/1.1" 404',
]


@pytest.mark.parametrize(("line", "name"), FAULT_LINES)
def test_each_reference_fault_line_gets_its_signature(line: str, name: str) -> None:
    signature = faults.classify_line(line)
    assert signature is not None
    assert signature.name == name


@pytest.mark.parametrize("line", BENIGN_LINES)
def test_ordinary_engine_lines_are_not_faults(line: str) -> None:
    assert faults.classify_line(line) is None


def test_every_signature_is_exercised_by_the_fault_corpus() -> None:
    assert {name for _, name in FAULT_LINES} == set(faults.SIGNATURE_NAMES)


def test_classify_lines_numbers_fault_lines_from_one_and_skips_the_rest() -> None:
    log = [
        "Capture cuda graph begin.",  # 1
        "Memory access fault by GPU node-1 (Agent handle: 0x1) on address 0x2. Reason: Unknown.",
        "Aborted (core dumped)",  # 3: not a signature by itself
        "Fatal Python error: Aborted",  # 4
    ]
    found = [(m.line_number, m.signature.name) for m in faults.classify_lines(log)]
    assert found == [(2, "GPU_MEMORY_ACCESS_FAULT"), (4, "FATAL_ABORT")]


def test_classify_command_prints_line_number_and_signature_for_a_file(tmp_path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "\n".join(
            [
                BENIGN_LINES[0],
                BENIGN_LINES[1],
                "HW Exception by GPU node-0 (Agent handle: 0x2) reason :GPU Hang",
                BENIGN_LINES[4],
                "Scheduler hit an exception: boom",
            ]
        )
        + "\n"
    )
    result = CliRunner().invoke(engine, ["watchdog", "classify", str(log)])
    assert result.exit_code == 0, result.output
    assert result.output == "3 GPU_HANG\n5 SCHEDULER_EXCEPTION\n"


def test_classify_command_reads_stdin_and_prints_nothing_for_a_healthy_log() -> None:
    healthy = "\n".join(BENIGN_LINES) + "\n"
    result = CliRunner().invoke(engine, ["watchdog", "classify"], input=healthy)
    assert result.exit_code == 0
    assert result.output == ""
    faulty = io.StringIO("ok\nFatal Python error: Aborted\n").read()
    result = CliRunner().invoke(engine, ["watchdog", "classify"], input=faulty)
    assert result.output == "2 FATAL_ABORT\n"


def test_unknown_signature_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match="GPU_HANG"):
        faults.signature_by_name("NOPE")

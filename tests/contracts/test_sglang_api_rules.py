"""The apply-time ``extraArgs`` rules (:mod:`agentrl.api.engine`, enforced by the API server's
CEL and ``agentrl validate`` with the same words) against the pinned SGLang's own parser: every
spelling argparse would accept for a flag the spec sets or a way to turn graphs off is refused,
and no spelling of any other SGLang flag is.

"Every spelling" is each option string and each abbreviation argparse expands to exactly one
option (prefixes shared by two options make argparse exit; refusing those is harmless, so they
are not counted either way).
"""

from __future__ import annotations

from typing import Any

from tests.contracts.test_sglang_flags import GRAPH_OFF, OWNED_DESTS

from agentrl.api.engine import (
    disables_graphs,
    managed_flag,
    sets_config_file,
    turns_decode_graphs_off,
)

#: Destinations refused besides the owned ones and ``GRAPH_OFF``: a ``--config`` file and a
#: JSON graph configuration (either could carry anything out of sight), and graph padding
#: (``--disable-cuda-graph-padding`` is refused with the graph flags).
ALSO_REFUSED = {"config", "cuda_graph_config", "disable_cuda_graph_padding"}


def _refused(token: str) -> bool:
    # a backend flag is refused with the value that turns graphs off
    return (
        managed_flag(token) is not None
        or disables_graphs(token)
        or sets_config_file(token)
        or turns_decode_graphs_off(token, [token, "disabled"])
    )


def _spellings(sglang: dict[str, Any]) -> dict[str, str]:
    """Every ``--`` spelling argparse maps to one destination: each option string, and each
    prefix (at least one character after ``--``) that exactly one option string starts with."""
    strings = {s: o["dest"] for o in sglang["options"] for s in o["strings"] if s.startswith("--")}
    out: dict[str, str] = {}
    for string in strings:
        for end in range(3, len(string) + 1):
            prefix = string[:end]
            starting = [s for s in strings if s.startswith(prefix)]
            if prefix in strings or len(starting) == 1:
                out[prefix] = strings[prefix if prefix in strings else starting[0]]
    return out


def test_every_spelling_of_a_flag_the_spec_sets_or_that_turns_graphs_off_is_refused(
    sglang: dict[str, Any],
) -> None:
    refused_dests = set(OWNED_DESTS) | set(GRAPH_OFF) | ALSO_REFUSED
    spellings = _spellings(sglang)
    assert len(spellings) > 1000  # every option, abbreviated
    missed = sorted(s for s, d in spellings.items() if d in refused_dests and not _refused(s))
    assert missed == []


def test_no_spelling_of_any_other_sglang_flag_is_refused(sglang: dict[str, Any]) -> None:
    refused_dests = set(OWNED_DESTS) | set(GRAPH_OFF) | ALSO_REFUSED
    spellings = _spellings(sglang)
    wrongly = sorted(s for s, d in spellings.items() if d not in refused_dests and _refused(s))
    assert wrongly == []

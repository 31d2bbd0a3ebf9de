"""Pin the wire contract's schema under its version: ``make wire-schema``.

Writes ``agentrl.api.wire.contract_schema()`` to ``tests/api/wire_schemas/WIRE_VERSION.json``,
which ``tests/api/test_wire_version.py`` compares the code with. A version's file is written
once: a change to the schema is a new version (bump ``WIRE_VERSION`` in
``operator/agentrl/api/wire_version.py`` and add its line to ``WIRE_HISTORY``), so this refuses
to overwrite a file that says something else. ``--amend`` overwrites it anyway, for a version
no release has shipped yet (two changes of one release that both touch the contract).

    python scripts/wire_schema.py [--amend]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrl.api.wire import WIRE_VERSION, contract_schema

SCHEMAS = Path(__file__).resolve().parent.parent / "tests" / "api" / "wire_schemas"


def render() -> str:
    """The current contract's schema file, as committed."""
    return json.dumps(contract_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--amend", action="store_true", help="overwrite the current version's file (unreleased)"
    )
    args = parser.parse_args()
    path = SCHEMAS / f"{WIRE_VERSION}.json"
    text = render()
    if path.exists() and path.read_text(encoding="utf-8") == text:
        print(f"{path.relative_to(Path.cwd())}: up to date")
        return 0
    if path.exists() and not args.amend:
        print(
            f"{path} pins wire contract {WIRE_VERSION} and the code's schema differs: bump "
            "WIRE_VERSION (operator/agentrl/api/wire_version.py) and add its WIRE_HISTORY line, "
            "then run this again; --amend only for a version no release has shipped",
            file=sys.stderr,
        )
        return 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

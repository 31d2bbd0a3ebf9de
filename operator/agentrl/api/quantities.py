"""Kubernetes resource quantities (``500m``, ``4Gi``): the pattern the API server accepts and a
parser used by the planner and validation to compare them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

#: The regular expression of resource.Quantity (k8s.io/apimachinery/pkg/api/resource).
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

Quantity = Annotated[
    str,
    Field(
        pattern=QUANTITY_PATTERN,
        max_length=64,
        examples=["500m", "2", "4Gi"],
    ),
]

_SUFFIX = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}

_RE = re.compile(r"^([+-]?[0-9.]+)(e[+-]?[0-9]+|[a-zA-Z]*)$")


def parse_quantity(value: str | int | float) -> float:
    """The numeric value of a quantity: ``parse_quantity("500m") == 0.5``, ``"1Ki" == 1024``."""
    if isinstance(value, int | float):
        return float(value)
    match = _RE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
    number, suffix = match.groups()
    if suffix.lower().startswith("e") and suffix[1:].lstrip("+-").isdigit():
        return float(number) * 10.0 ** int(suffix[1:])
    if suffix not in _SUFFIX:
        raise ValueError(f"{value!r} has an unknown suffix {suffix!r}")
    return float(number) * _SUFFIX[suffix]

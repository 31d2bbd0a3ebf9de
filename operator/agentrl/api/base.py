"""The base model every manifest type derives from.

Manifest fields are camelCase on the wire (``maxTurns``) and snake_case in Python
(``max_turns``); attribute docstrings become the field descriptions of the generated CRD and
of ``docs/manifest.md``, so the documentation lives on the model.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from agentrl.api.rules import Rule


class ManifestModel(BaseModel):
    """Base of every spec/status type: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        frozen=False,
    )

    cel_rules: ClassVar[tuple[Rule, ...]] = ()
    """Cross-field rules of this type (CEL for the API server, Python for validate)."""

    def to_manifest(self) -> dict[str, object]:
        """The object as it appears in YAML: camelCase keys, defaults included."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

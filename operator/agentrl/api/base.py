"""The base model every manifest type derives from.

Manifest fields are camelCase on the wire (``maxTurns``) and snake_case in Python
(``max_turns``); attribute docstrings become the field descriptions of the generated CRD and
of ``docs/manifest.md``, so the documentation lives on the model.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrl.api.rules import Rule

#: A short string list item (CEL cost estimation needs every string bounded).
ShortStr = Annotated[str, Field(min_length=1, max_length=256)]
#: A Kubernetes object name (DNS subdomain).
ObjectName = Annotated[str, Field(min_length=1, max_length=253)]
#: A label/annotation key or value, bounded.
LabelStr = Annotated[str, Field(max_length=317)]

#: A label key as Kubernetes accepts it: an optional DNS-subdomain prefix (at most 253
#: characters) and ``/``, then a name of at most 63 characters, alphanumeric at both ends.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: A label value: empty, or at most 63 characters, alphanumeric at both ends.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
#: A DNS-1123 subdomain (object names such as PVCs and StorageClasses).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


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

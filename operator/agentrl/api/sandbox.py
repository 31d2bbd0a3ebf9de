"""``spec.sandbox``: where episodes run their commands, how many at once, and how that number
moves."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agentrl.api.base import DNS_SUBDOMAIN_PATTERN, LabelStr, ManifestModel, ShortStr
from agentrl.api.engine import Toleration
from agentrl.api.quantities import Quantity
from agentrl.api.rules import Rule


class SandboxProvider(StrEnum):
    """Sandbox backends behind one async interface."""

    KUBERNETES = "kubernetes"
    E2B = "e2b"
    LOCAL = "local"


class AutoscaleTargets(ManifestModel):
    """Engine headroom the built-in autoscaler steers towards."""

    kv_cache_usage: float = Field(default=0.7, gt=0.0, le=1.0)
    """Scale up while engines' ``sglang:token_usage`` stays below this share."""
    queue_depth_per_engine: int = Field(default=4, ge=0, le=10_000)
    """Scale down when more requests than this wait per engine (``sglang:num_queue_reqs``)."""
    running_requests_share: float = Field(default=0.9, gt=0.0, le=1.0)
    """Scale up while running requests per engine are below this share of
    ``inference.maxRunningRequests``."""


class AutoscaleSpec(ManifestModel):
    """The built-in concurrency autoscaler. With it disabled, ``/scale`` belongs to a person,
    an HPA or KEDA."""

    enabled: bool = False
    """Let the operator move ``concurrency`` within [min, max]."""
    min: int = Field(default=1, ge=0, le=100_000)
    """Lowest concurrency the autoscaler sets."""
    max: int = Field(default=1024, ge=1, le=100_000)
    """Highest concurrency the autoscaler sets."""
    max_step_up: int = Field(default=64, ge=1, le=100_000)
    """Largest increase in one move."""
    max_step_down: int = Field(default=32, ge=1, le=100_000)
    """Largest decrease in one move."""
    cooldown_seconds: int = Field(default=60, ge=0, le=86_400)
    """Minimum time between two moves."""
    targets: AutoscaleTargets = Field(default_factory=AutoscaleTargets)
    """Engine headroom targets."""

    cel_rules = (
        Rule(
            cel="self.min <= self.max",
            message_expression="'min (%d) must not exceed max (%d)'.format([self.min, self.max])",
            field_path=".min",
            check=lambda a: a.min <= a.max,
            message=lambda a: f"min ({a.min}) must not exceed max ({a.max})",
        ),
    )


class SecretKeyRef(ManifestModel):
    """A key of a Secret in the job's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = Field(default="apiKey", min_length=1, max_length=253)
    """Key inside the Secret."""


class E2BSpec(ManifestModel):
    """E2B cloud microVM sandboxes."""

    api_key_secret_ref: SecretKeyRef
    """Secret holding the E2B API key."""
    template: str = Field(default="base", min_length=1, max_length=253)
    """E2B template used when a task names none (and its image has no entry in ``templates``)."""
    templates: dict[ShortStr, ShortStr] = Field(default_factory=dict, max_length=10_000)
    """E2B template of each task image (image → template, e.g. one built per SWE-bench image).
    With this provider a task whose image is not here is refused before the run, instead of
    running in ``template`` without its repository."""
    max_concurrent: int = Field(default=100, ge=1, le=100_000)
    """Your E2B plan's concurrent sandbox limit; caps effective concurrency."""
    max_creates_per_second: float = Field(default=5.0, gt=0.0, le=1000.0)
    """Your E2B plan's sandbox creation rate limit (creates/s)."""
    timeout_seconds: int = Field(default=3600, ge=60, le=86_400)
    """Sandbox lifetime E2B enforces (seconds)."""
    domain: str | None = Field(default=None, max_length=253)
    """Self-hosted E2B domain; unset uses E2B's cloud."""


class PrePullSpec(ManifestModel):
    """Pull the dataset's task images onto sandbox nodes ahead of episodes."""

    enabled: bool = False
    """Run the pre-pull DaemonSet."""
    images: list[ShortStr] = Field(default_factory=list, max_length=10_000)
    """Images to pull besides those the dataset names."""
    max_pulls_per_hour: int = Field(default=100, ge=1, le=100_000)
    """Registry pull budget shared by all nodes (Docker Hub: 100/h authenticated)."""


class SandboxSpec(ManifestModel):
    """``spec.sandbox``: the sandbox pool. ``concurrency`` is the ``/scale`` field."""

    provider: SandboxProvider = SandboxProvider.KUBERNETES
    """``kubernetes`` (a pod per episode), ``e2b`` (cloud microVMs) or ``local`` (Linux
    namespaces on one machine; what ``agentrl run`` uses)."""
    concurrency: int = Field(default=16, ge=0, le=100_000)
    """Episodes (and so sandboxes) in flight at once. ``kubectl scale``, an HPA, KEDA and the
    built-in autoscaler all write this field."""
    image: str = Field(default="python:3.11-slim", min_length=1, max_length=512)
    """Sandbox image for tasks that name none."""
    cpu: Quantity = "2"
    """CPU request and limit per sandbox."""
    memory: Quantity = "4Gi"
    """Memory request and limit per sandbox."""
    ephemeral_storage: Quantity = "10Gi"
    """Ephemeral storage limit per sandbox."""
    runtime_class_name: str | None = Field(default=None, max_length=253)
    """RuntimeClass of sandbox pods (e.g. ``kata`` or ``gvisor``)."""
    node_selector: dict[LabelStr, LabelStr] = Field(default_factory=dict, max_length=32)
    """Node labels sandbox pods require (the Helm chart can set a cluster-wide default)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations of sandbox pods, for tainted sandbox node pools."""
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """PriorityClass of the sandbox pods. Unset: the operator's ``--sandbox-priority-class``
    (the Helm chart's ``priorityClasses``), else none. The class must exist: the API server
    refuses a pod naming a missing one (the episode then ends in an infra error). A
    ResourceQuota scoped to PriorityClasses counts sandboxes by this name."""
    allow_internet: bool = False
    """Let sandboxes reach public addresses (never cluster services, RFC1918 or metadata)."""
    startup_timeout_seconds: int = Field(default=300, ge=1, le=7200)
    """A sandbox not ready within this is an infra error (seconds)."""
    max_creates_per_second: float = Field(default=20.0, gt=0.0, le=10_000.0)
    """Sandbox creations per second across the job (protects the API server / provider)."""
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec)
    """The built-in concurrency autoscaler."""
    e2b: E2BSpec | None = Field(default=None, alias="e2b")
    """E2B settings; required when ``provider`` is ``e2b``."""
    pre_pull: PrePullSpec = Field(default_factory=PrePullSpec)
    """Image pre-pulling on sandbox nodes."""

    def provider_cap(self) -> tuple[int, str] | None:
        """The provider's own limit on live sandboxes and the field that sets it (E2B's plan:
        ``e2b.maxConcurrent``), or None when the provider has none. Applied once: by the
        operator into the figure in effect on a cluster, by ``agentrl run`` on one machine."""
        if self.provider == SandboxProvider.E2B and self.e2b is not None:
            return self.e2b.max_concurrent, "spec.sandbox.e2b.maxConcurrent"
        return None

    cel_rules = (
        Rule(
            cel="self.provider != 'e2b' || has(self.e2b)",
            message_expression="'e2b settings are required when provider is e2b: "
            "set spec.sandbox.e2b.apiKeySecretRef'",
            field_path=".e2b",
            check=lambda s: s.provider != SandboxProvider.E2B or s.e2b is not None,
            message=lambda s: (
                "e2b settings are required when provider is e2b: "
                "set spec.sandbox.e2b.apiKeySecretRef"
            ),
            reason="FieldValueRequired",
        ),
        Rule(
            cel="!self.autoscale.enabled || "
            "(self.autoscale.min <= self.concurrency && self.concurrency <= self.autoscale.max)",
            message_expression="'concurrency (%d) must lie within autoscale [min, max] = "
            "[%d, %d] while autoscale is enabled'"
            ".format([self.concurrency, self.autoscale.min, self.autoscale.max])",
            field_path=".concurrency",
            check=lambda s: (
                not s.autoscale.enabled or s.autoscale.min <= s.concurrency <= s.autoscale.max
            ),
            message=lambda s: (
                f"concurrency ({s.concurrency}) must lie within autoscale "
                f"[min, max] = [{s.autoscale.min}, {s.autoscale.max}] while autoscale is enabled"
            ),
        ),
    )

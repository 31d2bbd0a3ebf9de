"""The explicit inputs of every builder besides the job: where the job lives, its uid (for the
ownerReference) and the images the spec does not name.

The controller makes one :class:`BuildContext` per reconcile from the object it read
(:meth:`BuildContext.for_job`); ``agentrl render`` makes one from command-line options. Builders
never look anything up themselves, so the same inputs always give the same objects.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob

#: Namespace used when neither the manifest nor the caller names one (``agentrl render``).
DEFAULT_NAMESPACE = "default"
#: The uid ``agentrl render`` puts in ownerReferences before the API server has assigned one.
RENDER_UID = "00000000-0000-0000-0000-000000000000"


class Images(BaseModel):
    """Images of the containers whose image is not a spec field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollout: str | None = None
    """Rollout workers. They are Ray workers joining the trainer's Ray head, so by default they
    run the trainer image (Ray versions must match); None means ``spec.trainer.image``."""
    watchdog: str | None = None
    """The engine watchdog sidecar (``agentrl engine watchdog``). agentrl is installed in the
    engine image, so None means ``spec.inference.image``."""


class BuildContext(BaseModel):
    """Everything a builder needs that is not in the job's spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(min_length=1)
    """Namespace of the job and all its children."""
    uid: str = Field(min_length=1)
    """The job's metadata.uid, for ownerReferences."""
    images: Images = Field(default_factory=Images)
    """Images not named by the spec."""

    @classmethod
    def for_job(
        cls,
        job: AgentRLJob,
        *,
        images: Images | None = None,
        namespace: str | None = None,
        uid: str | None = None,
    ) -> BuildContext:
        """The context of a job read from the API server (its metadata carries ``uid`` and
        ``namespace``); explicit arguments win, then the job's metadata, then the render
        defaults."""
        extra = job.metadata.model_extra or {}
        return cls(
            namespace=namespace or job.metadata.namespace or DEFAULT_NAMESPACE,
            uid=uid or str(extra.get("uid") or RENDER_UID),
            images=images or Images(),
        )

    def rollout_image(self, job: AgentRLJob) -> str:
        """The rollout workers' image."""
        return self.images.rollout or job.spec.trainer.image

    def watchdog_image(self, job: AgentRLJob) -> str:
        """The watchdog sidecar's image."""
        return self.images.watchdog or job.spec.inference.image

"""The driver's list of task images for pre-pull: in the order the driver draws the tasks, each
once, within a ConfigMap's size, and named by the operator's environment."""

from __future__ import annotations

import itertools

from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.trainer import trainer_env
from agentrl.rollout.tasks import Task
from agentrl.trainer import task_images
from agentrl.trainer.config import TrainerEnv
from agentrl.trainer.loop import TaskOrder, TaskStream
from tests.factories import make_job


def _task(n: int, image: str | None) -> Task:
    return Task.model_validate(
        {
            "id": f"t{n}",
            "source": "swebench",
            "instruction": "fix it",
            "image": image,
            "verification": {"kind": "tests", "fail_to_pass": ["tests/test_a.py::test_a"]},
        }
    )


def test_the_images_come_in_the_order_the_stream_hands_out_their_tasks() -> None:
    tasks = [_task(n, f"img-{n % 4}:1" if n != 5 else None) for n in range(10)]
    held_out = [_task(10, "held:1"), _task(11, "img-0:1")]
    order = TaskOrder(tasks, seed=3)
    # a resumed run: positions 7 and 2 replay first, then the order from cursor 12
    stream = TaskStream(order, cursor=12, pending=[7, 2])
    drawn = [t.image for t in itertools.islice(stream, 2 + len(tasks))]
    expected = list(dict.fromkeys(i for i in [*drawn, "held:1", "img-0:1"] if i))
    got = task_images.images_in_draw_order(order, cursor=12, pending=[7, 2], held_out=held_out)
    assert got == expected
    assert sorted(got) == ["held:1", "img-0:1", "img-1:1", "img-2:1", "img-3:1"]


def test_the_listing_keeps_what_fits_in_a_configmap_and_counts_the_rest() -> None:
    images = [f"registry.example/swe/task-{n:04d}:latest" for n in range(3)]  # 36 bytes each
    assert task_images.listing([*images, images[0]]) == ("".join(i + "\n" for i in images), 0)
    # 37 bytes a line: two lines fit in 80 bytes, the third does not
    assert task_images.listing(images, max_bytes=80) == (f"{images[0]}\n{images[1]}\n", 1)


async def test_publishing_writes_the_listing_and_an_api_error_does_not_stop_training() -> None:
    sink = task_images.FakeTaskImagesSink()
    assert await task_images.publish(sink, ["a:1", "b:1", "a:1"]) == 0
    assert sink.published == ["a:1\nb:1\n"]

    class Refused:
        async def publish(self, listing: str) -> None:
            raise RuntimeError("forbidden")

    assert await task_images.publish(Refused(), ["a:1"]) == 0


def test_the_operator_names_the_configmap_only_when_pre_pull_is_on() -> None:
    on = make_job("swe").with_sandbox(prePull={"enabled": True}).obj()
    env = {e["name"]: e["value"] for e in trainer_env(on, BuildContext.for_job(on), attempt=0)
           if "value" in e}  # fmt: skip
    parsed = TrainerEnv.from_environ({**env, "POD_NAME": "swe-trainer-0-x", "POD_NAMESPACE": "t"})
    sink = task_images.sink_for(parsed)
    assert isinstance(sink, task_images.LightkubeTaskImagesSink)
    assert (sink.name, sink.namespace) == ("swe-task-images", "t")
    assert task_images.sink_for(TrainerEnv.from_environ({**env})) is None  # outside a pod

    off = make_job("swe").obj()
    env = {e["name"]: e["value"] for e in trainer_env(off, BuildContext.for_job(off), attempt=0)
           if "value" in e}  # fmt: skip
    parsed = TrainerEnv.from_environ({**env, "POD_NAME": "swe-trainer-0-x", "POD_NAMESPACE": "t"})
    assert task_images.sink_for(parsed) is None

"""A distributed push from a stream (the megatron backend's weights, announced first and then
sent tensor by tensor from other trainer ranks): what is announced, and that the stream is read
to the end whatever goes wrong — a trainer rank blocked in a send would hang the job."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from agentrl.trainer.weight_sync import _announced, _broadcast_all, _drain


@dataclass
class Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]


class Source:
    """A stream of three tensors that counts how many were taken from it."""

    def __init__(self, names: tuple[str, ...] = ("a", "b", "c")) -> None:
        self.specs = [
            Spec("a", "float32", (2,)),
            Spec("b", "bfloat16", (1, 3)),
            Spec("c", "int64", ()),
        ]
        self.taken = 0
        self._names = names

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, spec in zip(self._names, self.specs, strict=True):
            self.taken += 1
            yield name, torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype))

    @property
    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._tensors()


class Group:
    """A broadcast group that fails on the ``fail_at``-th broadcast (1-based; 0: never)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.sent: list[tuple[int, ...]] = []
        self.fail_at = fail_at

    def broadcast(self, tensor: torch.Tensor, *, src: int = 0) -> None:
        if len(self.sent) + 1 == self.fail_at:
            raise RuntimeError("peer went away")
        self.sent.append(tuple(tensor.shape))


def test_a_stream_is_announced_from_its_specs_before_any_tensor_is_taken() -> None:
    source = Source()
    names, dtypes, shapes, items = _announced(source)
    assert (names, dtypes, shapes) == (
        ["a", "b", "c"],
        ["float32", "bfloat16", "int64"],
        [[2], [1, 3], []],
    )
    assert source.taken == 0
    group = Group()
    _broadcast_all(group, names, items)  # type: ignore[arg-type]
    assert group.sent == [(2,), (1, 3), ()]
    assert source.taken == 3


def test_pairs_are_announced_from_the_tensors_themselves() -> None:
    names, dtypes, shapes, _ = _announced([("w", torch.ones(4, 5, dtype=torch.float16))])
    assert (names, dtypes, shapes) == (["w"], ["float16"], [[4, 5]])


def test_a_failed_broadcast_still_reads_the_stream_to_the_end() -> None:
    source = Source()
    names, _, _, items = _announced(source)
    group = Group(fail_at=2)
    with pytest.raises(RuntimeError, match="peer went away"):
        _broadcast_all(group, names, items)  # type: ignore[arg-type]
    assert group.sent == [(2,)]
    assert source.taken == 3


def test_a_tensor_other_than_the_announced_one_is_not_broadcast() -> None:
    source = Source(names=("a", "x", "c"))
    names, _, _, items = _announced(source)
    group = Group()
    with pytest.raises(RuntimeError, match=r"tensor 1 is x, but \['b'\] was announced"):
        _broadcast_all(group, names, items)  # type: ignore[arg-type]
    assert group.sent == [(2,)]
    assert source.taken == 3


def test_draining_an_unread_stream_takes_every_tensor() -> None:
    source = Source()
    _, _, _, items = _announced(source)
    _drain(items)
    assert source.taken == 3

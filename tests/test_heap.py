"""The collector's full passes kept off the request path (``mmserver/heap.py``), and what
that must not cost: an unloaded model is still freed, reference cycles and all."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from collections.abc import Iterator

import pytest
from conftest import InProcessServer

from mmserver import heap
from mmserver.config import Settings


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def cycle() -> weakref.ref:
    return weakref.ref(Node())


def walked(obj: object) -> bool:
    """Whether the collector's passes walk ``obj`` (a frozen object is not among them)."""
    return any(tracked is obj for tracked in gc.get_objects())


def test_settle_freezes_what_is_alive_and_still_collects_what_comes_after():
    alive = Node()
    assert walked(alive)
    heap.settle()
    assert gc.get_freeze_count() > 0 and not walked(alive)
    later = cycle()
    gc.collect()
    assert later() is None


def test_release_frees_a_frozen_cycle_that_a_plain_collection_keeps():
    node = Node()
    ref = weakref.ref(node)
    heap.settle()
    del node
    gc.collect()
    assert ref() is not None  # frozen: a full pass does not walk it
    heap.release()
    assert ref() is None
    assert gc.get_freeze_count() > 0  # what is still alive is frozen again


INFERENCE = '''
import weakref

import torch

import heap_probe


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2


def model_fn(model_dir):
    model = Doubler()
    model.cycle = [model]
    heap_probe.models.append(weakref.ref(model))
    return model
'''


@pytest.fixture
def probe() -> Iterator[types.ModuleType]:
    """A module the model's code imports, to hand the test a weak reference to its model."""
    module = types.ModuleType("heap_probe")
    module.models = []
    sys.modules["heap_probe"] = module
    try:
        yield module
    finally:
        del sys.modules["heap_probe"]


def test_a_loaded_model_is_frozen_and_freed_by_its_unload(tmp_path, probe):
    (tmp_path / "doubler" / "code").mkdir(parents=True)
    (tmp_path / "doubler" / "code" / "inference.py").write_text(INFERENCE)
    server = InProcessServer(Settings(model_roots=(tmp_path,)))
    try:
        assert server.load("doubler", "doubler")[0] == 200
        (model,) = probe.models
        assert server.invoke("doubler", [[1.0, 2.0]]) == (200, [[2.0, 4.0]])
        assert model() is not None and gc.get_freeze_count() > 0
        assert server.unload("doubler")[0] == 200
        assert model() is None
    finally:
        server.close()

"""The arenas that carry rows between an HTTP worker and the engine (``engine.shared``)."""

from __future__ import annotations

import os

import pytest
import torch

from mmserver.engine.shared import (
    ALIGN_BYTES,
    INLINE,
    INLINE_MAX_BYTES,
    SHARED,
    Arena,
    pack,
    unpack,
    unpack_copies,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create")

DTYPES = [torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]


@pytest.fixture
def arena():
    """An arena that holds every tensor, however small (the server's inlines small ones)."""
    arena = Arena.create("test", size=64 * 1024, inline_max_bytes=0)
    yield arena
    arena.close()


def _reader(arena: Arena) -> Arena:
    """The other process's view: the same memory through a second descriptor."""
    return Arena(os.dup(arena.fd))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_crosses_with_its_values_and_shape(arena, dtype):
    data = (torch.arange(24).reshape(2, 3, 4) % 7).to(dtype)
    descriptor, offset = pack(data, arena)
    assert descriptor[0] == SHARED and offset is not None
    reader = _reader(arena)
    try:
        out = unpack(descriptor, reader, copy=True)
        assert out.dtype == dtype and out.shape == (2, 3, 4) and torch.equal(out, data)
    finally:
        reader.close()


def test_nested_data_crosses_as_it_is_and_a_view_sees_the_writers_bytes(arena):
    data = {"ids": torch.tensor([[1, 2]]), "pair": (torch.ones(1, 3), [torch.zeros(1, 1)]),
            "note": "kept"}
    descriptor, offset = pack(data, arena)
    assert offset == 0
    out = unpack(descriptor, arena, copy=False)
    assert out["note"] == "kept" and isinstance(out["pair"], tuple) \
        and isinstance(out["pair"][1], list)
    assert torch.equal(out["ids"], data["ids"]) and torch.equal(out["pair"][0], torch.ones(1, 3))
    copied = unpack(descriptor, arena, copy=True)
    out["ids"][0, 0] = 9  # a view writes the shared bytes; a copy does not see it
    assert unpack(descriptor, arena, copy=False)["ids"][0, 0] == 9
    assert copied["ids"][0, 0] == 1


def test_a_non_contiguous_or_grad_tensor_crosses_as_its_values(arena):
    base = torch.arange(12.0).reshape(3, 4)
    for data in (base.t(), base.requires_grad_(True) * 2):
        descriptor, offset = pack(data, arena)
        assert torch.equal(unpack(descriptor, arena, copy=True), data.detach())
        arena.free(offset)


def test_regions_are_aligned_reused_once_freed_and_joined_with_their_neighbours(arena):
    offsets = [pack(torch.zeros(10, dtype=torch.uint8), arena)[1] for _ in range(3)]
    assert offsets == [0, ALIGN_BYTES, 2 * ALIGN_BYTES]
    arena.free(offsets[1])
    assert pack(torch.zeros(ALIGN_BYTES, dtype=torch.uint8), arena)[1] == ALIGN_BYTES
    arena.free(ALIGN_BYTES)
    arena.free(offsets[0])
    arena.free(offsets[2])
    assert arena.bytes_in_use == 0
    whole = torch.zeros(arena.size, dtype=torch.uint8)  # only a joined arena holds this
    assert pack(whole, arena)[1] == 0


def test_data_that_does_not_fit_travels_in_the_message(arena):
    big = torch.arange(arena.size // 8 + 1, dtype=torch.int64)
    descriptor, offset = pack(big, arena)
    assert descriptor[0] == INLINE and offset is None
    assert torch.equal(unpack(descriptor, None, copy=False), big)
    assert arena.bytes_in_use == 0
    plain, offset = pack([torch.ones(2)], None)  # no arena at all
    assert offset is None and torch.equal(unpack(plain, None, copy=False)[0], torch.ones(2))


def test_a_descriptor_outside_the_arena_is_refused(arena):
    with pytest.raises(ValueError, match="outside the arena"):
        unpack((SHARED, arena.size - 4, "torch.float32", (2,)), arena, copy=True)
    with pytest.raises(ValueError, match="without any"):
        unpack((SHARED, 0, "torch.float32", (2,)), None, copy=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_small_data_rides_in_the_message_and_large_data_in_the_arena(dtype):
    """A one-row request or answer costs less copied into the message than put, written and
    freed in the arena (``INLINE_MAX_BYTES``); a large one still crosses through shared memory."""
    arena = Arena.create("test", size=4 * INLINE_MAX_BYTES)
    try:
        small = (torch.arange(24).reshape(2, 3, 4) % 7).to(dtype)
        for data in (small, small.transpose(0, 2), {"x": small, "note": 1}):
            descriptor, offset = pack(data, arena)
            assert offset is None and arena.bytes_in_use == 0
            out = unpack(descriptor, None, copy=False)
            got, want = (out["x"], small) if isinstance(data, dict) else (out, data)
            assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want)
        large = torch.zeros(INLINE_MAX_BYTES + 1, dtype=torch.uint8)
        descriptor, offset = pack(large, arena)
        assert descriptor[0] == SHARED and offset == 0
    finally:
        arena.close()


def test_a_small_grad_or_bfloat16_tensor_rides_as_its_values():
    arena = Arena.create("test", size=4 * INLINE_MAX_BYTES)
    try:
        for data in (torch.ones(3, requires_grad=True) * 2, torch.arange(6.0).to(torch.bfloat16)):
            descriptor, offset = pack(data, arena)
            assert descriptor[0] == INLINE and offset is None
            assert torch.equal(unpack(descriptor, None, copy=True), data.detach())
    finally:
        arena.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_a_burst_of_inline_rows_is_copied_out_as_each_would_be(dtype):
    """One copy for a burst (``unpack_copies``): each request gets its own values and shape,
    owned by the engine (not the message's bytes), and writing one leaves the others as they
    were; a burst of mixed shapes or places is unpacked one by one, with the same values."""
    arena = Arena.create("test", size=64 * 1024, inline_max_bytes=64)
    try:
        rows = [(torch.arange(6).reshape(1, 6) + n).to(dtype) for n in range(5)]
        descriptors = [pack(row, arena)[0] for row in rows]
        assert {d[0] for d in descriptors} == {INLINE}
        out = unpack_copies(descriptors, None)
        assert [o.dtype for o in out] == [dtype] * 5 and [o.shape for o in out] == [(1, 6)] * 5
        assert all(torch.equal(o, row) for o, row in zip(out, rows))
        out[0].zero_()
        assert all(torch.equal(o, row) for o, row in zip(out[1:], rows[1:]))

        large = torch.arange(40).reshape(2, 20)  # 320 bytes: in the arena, not the message
        mixed = [rows[1], rows[2].reshape(2, 3), large]
        descriptors = [pack(data, arena)[0] for data in mixed]
        assert [d[0] for d in descriptors] == [INLINE, INLINE, SHARED]
        out = unpack_copies(descriptors, arena)
        assert [o.shape for o in out] == [(1, 6), (2, 3), (2, 20)]
        assert all(torch.equal(o, want) for o, want in zip(out, mixed))
    finally:
        arena.close()

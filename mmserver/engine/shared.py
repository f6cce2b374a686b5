"""Shared memory between an HTTP worker and its engine: large tensors cross without being pickled.

Each connection has two **arenas**, one per direction, made by the worker when it connects:
the worker writes the rows of its requests into one and the engine the answers' rows into
the other. A message then carries a small *descriptor* (where the tensors lie, their dtypes
and shapes), not their bytes. An arena is anonymous memory (``memfd_create``) whose file
descriptors pass to the engine over the connection's Unix socket (``SCM_RIGHTS``), so it
has no name: nothing appears in ``/dev/shm``, no other process can open it, and the kernel
frees it when both processes have closed it, however they end (a ``SIGKILL`` included).

Who frees what: the side that writes an arena allocates in it (:meth:`Arena.put`) and
frees (:meth:`Arena.free`) once the other side says it is done reading: the engine copies a
request's rows out as soon as the request arrives, so the worker frees them when the
request's reply comes; the worker reads an answer's rows where they lie, to encode them,
and tells the engine afterwards (a ``free`` message). A region is reused only then.

Small tensors travel inside the message (:data:`INLINE`): up to :data:`INLINE_MAX_BYTES`,
copying the bytes into the pickle costs less than a region's allocation, write and free (and
the ``free`` notice back), both ends together. So do tensors when an arena has no room (a
tensor larger than it, or many answers not yet read), and every tensor on a system without
``memfd_create``: slower for large tensors, never a failure.

Each arena is used from its process's event loop only (no lock). The copies go through
NumPy: on a small row its calls cost a fraction of torch's.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

#: Each direction's arena. Virtual: pages are backed only once written, and allocations are
#: first-fit by address, so a server of small requests touches only the arena's first pages.
ARENA_BYTES = 64 * 2**20
#: Every region starts at a multiple of this (a cache line), whatever the dtype.
ALIGN_BYTES = 64
#: Data of at most this many bytes rides in the message, not the arena. Measured on the
#: 2-core development machine with a 64-byte row and a 40-byte answer: a region's put and
#: free cost 7.9 µs, the bytes copied into the message 2.0 µs; ``bench/engine_cpu.py`` gave
#: 6-7 % less engine CPU per request at 32 users. 4 KiB (a page) keeps large rows, whose copy
#: into a pickle grows with their size, in shared memory.
INLINE_MAX_BYTES = 4096
#: Descriptor kinds: a tensor in the arena, a tensor's bytes in the message, a dict, a tuple
#: or list, and any other object as it is (pickled with the message).
SHARED, INLINE, MAPPING, SEQUENCE, OBJECT = "shared", "inline", "dict", "seq", "object"

#: The dtypes that cross as bytes, by name, with NumPy's equivalent (None for bfloat16,
#: which NumPy lacks: its bytes cross as int16's).
_DTYPES = {str(dtype): (dtype, None if dtype == torch.bfloat16 else torch.empty(
    0, dtype=dtype).numpy().dtype) for dtype in (
    torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}
#: Each of those dtypes' name, looked up by the dtype (``str(dtype)`` costs more on every answer).
_NAMES = {dtype: name for name, (dtype, _) in _DTYPES.items()}


def shared_memory_supported() -> bool:
    return hasattr(os, "memfd_create")


class Arena:
    """One direction's shared memory (see the module docstring)."""

    def __init__(self, fd: int, inline_max_bytes: int = INLINE_MAX_BYTES):
        size = os.fstat(fd).st_size
        self.fd = fd
        self.size = size
        #: The writer's side: data of at most this many bytes rides in the message.
        self.inline_max_bytes = inline_max_bytes
        self._map = mmap.mmap(fd, size)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        #: Free regions, the writer's side only: sorted offsets and their sizes.
        self._free_offsets = [0]
        self._free_sizes = [size]
        self._used: dict[int, int] = {}

    @classmethod
    def create(cls, name: str, size: int = ARENA_BYTES, inline_max_bytes: int = INLINE_MAX_BYTES
               ) -> Arena:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, inline_max_bytes)

    def close(self) -> None:
        """Unmap (once no tensor views it) and close the descriptor."""
        self._bytes = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive; the mapping goes with it
            pass
        os.close(self.fd)

    @property
    def bytes_in_use(self) -> int:
        return sum(self._used.values())

    # -- the writer's side ---------------------------------------------------------------

    def put(self, data: Any) -> tuple[Any, int | None]:
        """``data`` (a tensor, or a dict, tuple or list of them) as a descriptor, and the
        offset to :meth:`free` once the reader is done (None when nothing lies here)."""
        if type(data) is torch.Tensor:  # the common case, in as few calls as it takes
            name = _NAMES.get(data.dtype)
            if name is not None:
                size = data.nbytes
                offset = (self._allocate(-(-size // ALIGN_BYTES) * ALIGN_BYTES)
                          if size > self.inline_max_bytes else None)
                if offset is None:
                    return (INLINE, _raw(data), name, tuple(data.shape)), None
                self._bytes[offset:offset + size] = _as_bytes(data)
                return (SHARED, offset, name, tuple(data.shape)), offset
        tensors = _tensors(data)
        sizes = [t.nbytes for t in tensors]
        total = sum(_aligned(size) for size in sizes)
        base = self._allocate(total) if sum(sizes) > self.inline_max_bytes else None
        places: dict[int, int] = {}
        if base is not None:
            offset = base
            for tensor, size in zip(tensors, sizes):
                if size:
                    self._bytes[offset:offset + size] = _as_bytes(tensor)
                places[id(tensor)] = offset
                offset += _aligned(size)
        return _described(data, base is not None, places), base

    def free(self, offset: int) -> None:
        size = self._used.pop(offset)
        offsets, sizes = self._free_offsets, self._free_sizes
        index = bisect.bisect(offsets, offset)
        if index < len(offsets) and offset + size == offsets[index]:  # joins the next
            size += sizes.pop(index)
            offsets.pop(index)
        if index > 0 and offsets[index - 1] + sizes[index - 1] == offset:  # and the previous
            sizes[index - 1] += size
        else:
            offsets.insert(index, offset)
            sizes.insert(index, size)

    def _allocate(self, size: int) -> int | None:
        sizes = self._free_sizes
        for index, free in enumerate(sizes):
            if free >= size:
                offset = self._free_offsets[index]
                if free == size:
                    del sizes[index], self._free_offsets[index]
                else:
                    sizes[index] = free - size
                    self._free_offsets[index] = offset + size
                self._used[offset] = size
                return offset
        return None

    # -- the reader's side ---------------------------------------------------------------

    def _tensor(self, offset: int, name: str, shape: tuple[int, ...], copy: bool
                ) -> torch.Tensor:
        dtype, np_dtype = _DTYPES[name]
        if offset < 0 or offset + _count(shape) * dtype.itemsize > self.size:
            raise ValueError(f"a tensor at {offset} is outside the arena")
        array = np.ndarray(shape, np_dtype or np.int16, self._map, offset)
        tensor = torch.from_numpy(array.copy() if copy else array)
        return tensor if np_dtype is not None else tensor.view(dtype)


def pack(data: Any, arena: Arena | None) -> tuple[Any, int | None]:
    """``data`` as a descriptor, its tensors in ``arena`` when there is one and it has room
    (:meth:`Arena.put`), else in the descriptor."""
    if arena is None:
        return _described(data, False, {}), None
    return arena.put(data)


def unpack(descriptor: Any, arena: Arena | None, *, copy: bool) -> Any:
    """The data a descriptor describes. ``copy``: its tensors copied out of ``arena``; else
    they view it where they lie, valid until the writer frees them."""
    kind = descriptor[0]
    if kind == SHARED:
        if arena is None:
            raise ValueError("a tensor in shared memory, on a connection without any")
        _, offset, name, shape = descriptor
        return arena._tensor(offset, name, shape, copy)
    if kind == INLINE:
        _, raw, name, shape = descriptor
        return _inline_tensor(raw, name, shape)
    if kind == MAPPING:
        return {key: unpack(value, arena, copy=copy) for key, value in descriptor[1]}
    if kind == SEQUENCE:
        parts = [unpack(value, arena, copy=copy) for value in descriptor[2]]
        return tuple(parts) if descriptor[1] == "tuple" else parts
    return descriptor[1]


def unpack_copies(descriptors: list[Any], arena: Arena | None) -> list[Any]:
    """``unpack(descriptor, arena, copy=True)`` of each, in one copy when every one is a tensor
    inline of the same dtype and shape (a burst of one-row requests): their bytes joined, copied
    once, and each a view of its rows. Measured with 16 rows of 16 float32: 1.1 µs a row against
    2.7 µs for a copy each."""
    first = descriptors[0]
    if len(descriptors) > 1 and first[0] == INLINE:
        _, _, name, shape = first
        if all(d[0] == INLINE and d[2] == name and d[3] == shape for d in descriptors):
            joined = b"".join([d[1] for d in descriptors])
            return list(_inline_tensor(joined, name, (len(descriptors), *shape)).unbind(0))
    return [unpack(descriptor, arena, copy=True) for descriptor in descriptors]


def _inline_tensor(raw: bytes, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of dtype ``name`` and ``shape`` copied out of the bytes a message carried."""
    dtype, np_dtype = _DTYPES[name]
    tensor = torch.from_numpy(np.frombuffer(raw, np_dtype or np.int16).reshape(shape).copy())
    return tensor if np_dtype is not None else tensor.view(dtype)


def _as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes, as a flat uint8 array (a view where it can be)."""
    if tensor.requires_grad or tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().reshape(-1).view(np.uint8)


def _raw(tensor: torch.Tensor) -> bytes:
    """A tensor's bytes in C order, as the message carries them: NumPy's ``tobytes`` at once
    where ``numpy()`` takes the tensor as it is (a CPU tensor without grad, any strides), else
    through :func:`_as_bytes`."""
    try:
        return tensor.numpy().tobytes()
    except (TypeError, RuntimeError):  # bfloat16, another device, grad, a conjugate view
        return _as_bytes(tensor).tobytes()


def _tensors(data: Any) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data] if str(data.dtype) in _DTYPES else []
    if isinstance(data, Mapping):
        return [t for value in data.values() for t in _tensors(value)]
    if isinstance(data, (tuple, list)):
        return [t for value in data for t in _tensors(value)]
    return []


def _described(data: Any, shared: bool, places: dict[int, int]) -> Any:
    if isinstance(data, torch.Tensor) and str(data.dtype) in _DTYPES:
        if shared:
            return SHARED, places[id(data)], str(data.dtype), tuple(data.shape)
        return INLINE, _raw(data), str(data.dtype), tuple(data.shape)
    if isinstance(data, Mapping):
        return MAPPING, tuple((key, _described(value, shared, places))
                              for key, value in data.items())
    if isinstance(data, (tuple, list)):
        return SEQUENCE, "list" if isinstance(data, list) else "tuple", tuple(
            _described(value, shared, places) for value in data)
    return OBJECT, data


def _aligned(size: int) -> int:
    return -(-size // ALIGN_BYTES) * ALIGN_BYTES


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dimension in shape:
        count *= dimension
    return count

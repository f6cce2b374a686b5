"""The .npy decoder: the common header's fast path agrees with np.load; hostile bodies are 400."""

from __future__ import annotations

import io
import pickle
import warnings

import numpy as np
import pytest
import torch

from mmserver import codecs
from mmserver.errors import InvalidInput


def npy(array, **kwargs) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, **kwargs)
    return buffer.getvalue()


def with_header(header: dict, data: bytes, version: int = 1) -> bytes:
    text = repr(header).encode()
    prefix = 10 if version == 1 else 12
    text += b" " * (-(prefix + len(text) + 1) % 64) + b"\n"
    size = len(text).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


ARRAYS = [
    np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32),
    np.arange(6).reshape(2, 3),
    np.array([[1.5, -2.0]], dtype=np.float64),
    np.array([[1, 2]], dtype=np.float16),
    np.array([[True, False]]),
    np.arange(5, dtype=np.uint8).reshape(1, 5),
    np.arange(4, dtype=np.int8).reshape(2, 2),
    np.zeros((0, 3), dtype=np.float32),
    np.array([[1.0, 2.0]], dtype=">f4"),  # big-endian: the other path
    np.array([[1, 2]], dtype=np.uint16),  # widened to int64
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_decoded_like_np_load(array):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on arrays that are not writable
        tensor = codecs._decode_npy(npy(array))
        assert tensor.shape == array.shape
        np.testing.assert_array_equal(tensor.numpy(), array)
        if tensor.dtype.is_floating_point:
            tensor.add_(1)  # writable: a model may write into its input


def test_the_common_header_takes_the_fast_path_and_is_remembered():
    body = npy(np.zeros((1, 3, 32, 32), dtype=np.float32))
    codecs._common_npy_header.cache_clear()
    codecs._decode_npy(body)
    codecs._decode_npy(body)
    info = codecs._common_npy_header.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert codecs._common_npy_header(body[10:128]) == (np.dtype("<f4"), (1, 3, 32, 32))


def test_the_tensor_does_not_alias_the_body():
    body = npy(np.ones((1, 4), dtype=np.float32))
    tensor = codecs._decode_npy(body)
    tensor.zero_()
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), np.ones((1, 4)))


def test_version_2_headers_are_read():
    data = np.arange(4, dtype="<f4").tobytes()
    body = with_header({"descr": "<f4", "fortran_order": False, "shape": (2, 2)}, data, version=2)
    np.testing.assert_array_equal(codecs._decode_npy(body).numpy(), [[0, 1], [2, 3]])


@pytest.mark.parametrize("body, message", [
    (npy(np.zeros((1, 3), dtype=np.longdouble)), "float128"),
    (with_header({"descr": "<f4", "fortran_order": False, "shape": (10**11, 16)}, b"\0" * 64),
     "the header says shape"),
    (with_header({"descr": ">u4", "fortran_order": True, "shape": (10**11, 16)}, b"\0" * 64),
     "the header says shape"),
    (npy(np.zeros((4, 4), dtype=np.float32))[:-8], "the header says shape"),
    (npy(np.array([{"evil": 1}], dtype=object), allow_pickle=True), "pickle"),
    (pickle.dumps([[1.0, 2.0]]), "magic"),
    (npy(np.zeros((1, 2), dtype=complex)), "numeric"),
    (npy(np.array(["ab"])), "numeric"),
    (b"\x93NUMPY\x01", "preamble"),
    (b"\x93NUMPY\x09\x00\x10\x00" + b" " * 16, "version"),
    (b"\x93NUMPY\x02\x00" + (10**6).to_bytes(4, "little") + b" " * 20, "header"),
    (with_header({"descr": "<f4", "fortran_order": False, "shape": "(1,"}, b""), "valid"),
], ids=["float128", "huge shape", "huge shape, other header", "truncated", "object",
        "pickle", "complex", "strings", "preamble", "version", "long header", "bad shape"])
def test_hostile_bodies_are_invalid_input(body, message):
    with pytest.raises(InvalidInput, match=message):
        codecs.decode(body, codecs.NPY)

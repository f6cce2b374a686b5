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


# -- every decoder, every encoder, and the Accept table ----------------------------------

import json  # noqa: E402

import PIL.Image  # noqa: E402

from mmserver.errors import (  # noqa: E402
    NotAcceptable,
    OutputNotEncodable,
    PayloadTooLarge,
    UnsupportedContentType,
)
from mmserver.http.errors import status_for  # noqa: E402

JSON, NPY, CSV = codecs.JSON, codecs.NPY, codecs.CSV


@pytest.mark.parametrize("header, kind", [
    (None, JSON), ("", JSON), ("application/json; charset=utf-8", JSON),
    (" Text/CSV ", CSV), ("text/csv; header=absent; q=1", CSV), ("IMAGE/PNG", "image/png"),
])
def test_media_type(header, kind):
    assert codecs.media_type(header) == kind


@pytest.mark.parametrize("body, content_type, expected", [
    (b"[[1, 2], [3, 4.5]]", JSON, [[1.0, 2.0], [3.0, 4.5]]),
    (b"[[true, false]]", None, [[1.0, 0.0]]),
    ('[[1, 2]]'.encode("utf-16"), JSON, [[1.0, 2.0]]),
    (b"[1, 2, 3]", "application/json; charset=utf-8", [1.0, 2.0, 3.0]),
    (b"1,2,3\n4,5,6\n", CSV, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
    (b"1.5,-2", "text/csv; charset=utf-8", [[1.5, -2.0]]),
])
def test_json_and_csv_decode_to_float32_rows(body, content_type, expected):
    tensor = codecs.decode(body, content_type)
    assert tensor.dtype == torch.float32
    assert tensor.tolist() == expected


@pytest.mark.parametrize("body, content_type, message", [
    (b"[[1]]", "text/xml", "unsupported content type 'text/xml'; send one of application/json, "
                           "application/x-npy, text/csv, image/jpeg, image/png"),
    (b"", JSON, "the request body is empty"),
    (b"", CSV, "the request body is empty"),
    (b"3", JSON, "JSON input must be a list of rows (nested lists of numbers), got int"),
    (b'{"a": 1}', JSON, "JSON input must be a list of rows (nested lists of numbers), got dict"),
    (b"[]", JSON, "the input has no rows"),
    (npy(np.zeros((0, 3), dtype=np.float32)), NPY, "the input has no rows"),
    (npy(np.float32(2.0)), NPY, "the input needs a batch dimension: send a list of rows, "
                                "e.g. [[1, 2]]"),
    (b"[[1, NaN]]", JSON, "JSON input holds NaN; only finite numbers are allowed"),
    (b"[[-Infinity]]", JSON, "JSON input holds -Infinity; only finite numbers are allowed"),
    pytest.param(b"[[1e39]]", JSON, "JSON input holds a number too large for float32 or not "
                 "finite", marks=pytest.mark.filterwarnings("ignore:overflow")),
    (b'[["a", "b"]]', JSON, "JSON input must hold only numbers, in lists of equal length"),
    (b"[" * 100_000 + b"]" * 100_000, JSON, "JSON input is nested too deeply"),
    (b"nan,1\n", CSV, "CSV input holds non-finite numbers"),
])
def test_bodies_that_are_not_rows_of_numbers_are_refused(body, content_type, message):
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(body, content_type)
    assert str(refused.value) == message
    expected = UnsupportedContentType if content_type == "text/xml" else InvalidInput
    assert type(refused.value) is expected


@pytest.mark.parametrize("body, content_type, prefix", [
    (b"[[1, 2]", JSON, "malformed JSON: "),
    (b"\xff\xfe\xfd", JSON, "malformed JSON: "),
    (b"[[1, 2], [3]]", JSON, "JSON rows must all have the same shape: "),
    (b"a,b\n", CSV, "malformed CSV (numbers separated by commas, one row per line): "),
    (b"\xff,1\n", CSV, "malformed CSV (numbers separated by commas, one row per line): "),
    (b"1,2\n3\n", CSV, "malformed CSV (numbers separated by commas, one row per line): "),
    (b"not an image", "image/png", "the body is not a decodable JPEG or PNG image: "),
])
def test_malformed_bodies_say_why(body, content_type, prefix):
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(body, content_type)
    assert str(refused.value).startswith(prefix)
    assert len(str(refused.value)) > len(prefix)


def image(kind: str, width: int = 3, height: int = 2) -> bytes:
    pixels = PIL.Image.new("RGB", (width, height), (255, 0, 51))
    buffer = io.BytesIO()
    pixels.save(buffer, format=kind)
    return buffer.getvalue()


def test_png_and_jpeg_decode_to_one_rgb_row_in_0_1():
    png = codecs.decode(image("PNG"), "image/png")
    assert png.shape == (1, 3, 2, 3) and png.dtype == torch.float32
    assert torch.equal(png[0, :, 0, 0], torch.tensor([255, 0, 51]) / 255.0)
    jpeg = codecs.decode(image("JPEG", 8, 8), "image/jpeg")
    assert jpeg.shape == (1, 3, 8, 8)
    assert 0.9 < jpeg[0, 0].mean() <= 1.0 and 0.0 <= jpeg.min() and jpeg.max() <= 1.0
    gray = PIL.Image.new("L", (2, 2), 255)
    buffer = io.BytesIO()
    gray.save(buffer, format="PNG")
    assert codecs.decode(buffer.getvalue(), "image/png").shape == (1, 3, 2, 2)  # always RGB


def test_an_image_over_the_pixel_limit_is_too_large(monkeypatch):
    monkeypatch.setattr(codecs, "MAX_IMAGE_PIXELS", 6)
    assert codecs.decode(image("PNG", 3, 2), "image/png").shape == (1, 3, 2, 3)  # 6: at the limit
    with pytest.raises(PayloadTooLarge) as refused:
        codecs.decode(image("PNG", 7, 1), "image/png")
    assert str(refused.value) == "the image is 7x1 pixels; at most 6 pixels are decoded"


# The Accept header: (header, what is offered, the answer's type or None for 406).
ACCEPT_TABLE = [
    (None, None, JSON),
    ("", None, JSON),
    ("   ", None, JSON),
    ("*/*", None, JSON),
    ("*/*", (NPY,), JSON),  # */* alone always means the default, JSON
    ("application/json", None, JSON),
    ("application/x-npy", None, NPY),
    ("text/csv", None, CSV),
    ("TEXT/CSV", None, CSV),
    ("text/*", None, CSV),
    ("application/*", None, JSON),
    ("image/png, */*;q=0.1", None, JSON),
    ("text/csv;q=0.5, application/x-npy;q=0.9", None, NPY),
    ("text/csv;Q=0.9, application/x-npy;q=0.5", None, CSV),
    ("text/csv, application/x-npy", None, CSV),  # equal q: the first listed wins
    ("application/x-npy;q=0.5, text/csv;q=0.5", None, NPY),
    ("text/csv; charset=utf-8, application/json;q=0.2", None, CSV),
    ("text/csv;q=abc, application/json;q=0.1", None, JSON),  # a malformed q counts as 0
    ("text/csv;q=nan, application/json;q=0.1", None, JSON),
    ("text/csv;q=inf, application/json;q=0.1", None, JSON),
    ("text/csv;q=0, application/json;q=0.001", None, JSON),
    ("text/csv;q=-1, application/x-npy;q=0.001", None, NPY),
    ("application/json", (NPY, CSV), None),
    ("text/*", (JSON, NPY), None),
    ("application/*", (NPY,), None),
    ("*/*;q=0.5", (NPY,), None),
    ("image/png", None, None),
    ("text/csv;q=abc", None, None),
    ("text/csv;q=0", None, None),
]


@pytest.mark.parametrize("accept, offered, kind", ACCEPT_TABLE)
def test_accept_negotiation(accept, offered, kind):
    if kind is None:
        with pytest.raises(NotAcceptable) as refused:
            codecs.negotiate(accept, offered)
        allowed = ", ".join(offered or codecs.ENCODABLE)
        assert str(refused.value) == f"cannot answer with {accept!r}; acceptable: {allowed}"
        assert status_for(refused.value) == 406
    else:
        assert codecs.negotiate(accept, offered) == kind


@pytest.mark.parametrize("output, body", [
    (torch.tensor([[1.0, 2.5]]), b"[[1.0,2.5]]"),
    (torch.tensor([[1, 2]]), b"[[1,2]]"),
    (torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16), b"[[1.0,2.0]]"),
    ([torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([2.0, 3.0], dtype=torch.bfloat16)],
     b"[[1.0],[2.0,3.0]]"),
    ({"label": torch.tensor([3]), 7: (torch.tensor([0.5]), 2)}, b'{"label":[3],"7":[[0.5],2]}'),
    (np.array([[1, 2]], dtype=np.int32), b"[[1,2]]"),
    (np.float32(1.5), b"1.5"),
    (np.int64(4), b"4"),
    (3, b"3"),
    (0.25, b"0.25"),
    ("text", b'"text"'),
    ((1, [2.0, None]), b"[1,[2.0,null]]"),
])
def test_json_encodes_whatever_predict_fn_returns(output, body):
    assert codecs.encode(output, JSON) == (body, JSON)
    assert codecs.encode(output, None) == (body, JSON)
    assert json.loads(body) == json.loads(codecs.encode(output, "*/*")[0])


@pytest.mark.parametrize("output", [torch.tensor([[float("nan")]]), [float("inf")],
                                    {"a": np.array([np.nan])}])
def test_json_refuses_nan_and_infinity(output):
    with pytest.raises(OutputNotEncodable) as refused:
        codecs.encode(output, JSON)
    assert str(refused.value) == ("the model's output holds NaN or infinity, which JSON cannot "
                                  "carry; ask for application/x-npy")


def loaded(body: bytes) -> np.ndarray:
    return np.load(io.BytesIO(body), allow_pickle=False)


@pytest.mark.parametrize("output, expected, dtype", [
    (torch.tensor([[1.0, 2.5]]), [[1.0, 2.5]], np.float32),
    (torch.tensor([[1.0, 2.5]], dtype=torch.bfloat16), [[1.0, 2.5]], np.float32),
    ([torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([3.0, 4.0],
                                                                  dtype=torch.bfloat16)],
     [[1.0, 2.0], [3.0, 4.0]], np.float32),
    ((torch.tensor([1, 2]), torch.tensor([3, 4])), [[1, 2], [3, 4]], np.int64),
    (torch.tensor([7], dtype=torch.uint8), [7], np.uint8),
    (np.array([[0.1]], dtype=np.float32), [[np.float32(0.1)]], np.float32),
    ([[1, 2], [3, 4]], [[1, 2], [3, 4]], np.int64),
    (2.5, 2.5, np.float64),
    (np.bool_(True), True, np.bool_),
    (["a", "bc"], ["a", "bc"], np.dtype("<U2")),
])
def test_npy_encodes_one_array(output, expected, dtype):
    body, kind = codecs.encode(output, NPY)
    assert kind == NPY
    array = loaded(body)
    assert array.dtype == dtype
    assert array.tolist() == expected


@pytest.mark.parametrize("output, expected", [
    (torch.tensor([[1.0, 2.5], [3.0, 4.0]]), b"1.0,2.5\n3.0,4.0\n"),
    (torch.tensor([[0.1]]), b"0.10000000149011612\n"),  # the toolkit's tolist() precision
    (torch.tensor([[0.5]], dtype=torch.bfloat16), b"0.5\n"),
    (np.array([[0.1]], dtype=np.float32), b"0.1\n"),
    (torch.tensor([[1, 2], [3, 4]]), b"1,2\n3,4\n"),
    (torch.tensor([1, 2, 3]), b"1\n2\n3\n"),  # 1-D: a column
    (torch.tensor(5), b"5\n"),
    (7, b"7\n"),
    ([torch.tensor([1, 2]), torch.tensor([3, 4])], b"1,2\n3,4\n"),
    ([[True, False]], b"True,False\n"),
])
def test_csv_writes_one_line_per_row(output, expected):
    assert codecs.encode(output, CSV) == (expected, CSV)
    assert codecs.encode(output, "text/*")[0] == expected


@pytest.mark.parametrize("kind", [NPY, CSV])
@pytest.mark.parametrize("output, name", [
    ([torch.tensor([1.0]), torch.tensor([2.0, 3.0])], "list"),
    ([[1, 2], [3]], "list"),
    (({"a": 1}, {"a": 2}), "tuple"),
    ({"logits": torch.ones(1, 2)}, "dict"),
    ([1, None], "list"),
    (object(), "object"),
])
def test_what_is_not_one_array_is_not_acceptable_as_npy_or_csv(kind, output, name):
    with pytest.raises(NotAcceptable) as refused:
        codecs.encode(output, kind)
    assert str(refused.value) == (
        f"{kind} can carry a single array only; the model returned a {name} that is not one "
        "(a dict, or rows of unequal length): ask for application/json")
    assert status_for(refused.value) == 406  # the client asked for what cannot be had: not a 500


def test_csv_carries_at_most_two_dimensions():
    with pytest.raises(NotAcceptable) as refused:
        codecs.encode(torch.zeros(1, 2, 2), CSV)
    assert str(refused.value) == ("text/csv carries at most 2 dimensions; this output has shape "
                                  "(1, 2, 2): ask for application/json or application/x-npy")
    assert loaded(codecs.encode(torch.zeros(1, 2, 2), NPY)[0]).shape == (1, 2, 2)


def test_encoding_a_tensor_does_not_need_it_on_the_cpu_or_without_grad():
    x = torch.ones(1, 2, requires_grad=True) * 2
    assert codecs.encode(x, JSON)[0] == b"[[2.0,2.0]]"
    assert loaded(codecs.encode(x, NPY)[0]).tolist() == [[2.0, 2.0]]
    assert codecs.encode(x, CSV)[0] == b"2.0,2.0\n"


@pytest.mark.parametrize("array, dtype", [
    (np.array([[1.0, 2.0]], dtype=">f4"), torch.float32),  # the other path, made native
    (np.array([[1.0, 2.0]], dtype=">f8"), torch.float64),
    (np.asfortranarray(np.ones((2, 2), dtype=np.float32)), torch.float32),
    (np.array([[1, 2]], dtype=np.uint16), torch.int64),  # widened: torch has no uint16
    (np.array([[1, 2]], dtype=">u4"), torch.int64),
    (np.array([[1, 2]], dtype=np.uint64), torch.int64),
    (np.array([[1, 2]], dtype=">i2"), torch.int16),
    (np.array([[True]]), torch.bool),
    (np.array([[1, 2]], dtype=np.float16), torch.float16),
])
def test_npy_dtypes_are_kept_or_widened(array, dtype):
    tensor = codecs.decode(npy(array), NPY)
    assert tensor.dtype == dtype
    assert tensor.tolist() == array.tolist()


def test_a_version_2_header_of_the_other_kind_is_read():
    data = np.arange(4, dtype=">f4").tobytes()
    body = with_header({"descr": ">f4", "fortran_order": False, "shape": (2, 2)}, data, version=2)
    tensor = codecs.decode(body, NPY)
    assert tensor.dtype == torch.float32 and tensor.tolist() == [[0, 1], [2, 3]]


@pytest.mark.parametrize("body, message", [
    (npy(np.zeros((4, 4), dtype=">f4"))[:-8], "not a valid .npy array: the header says shape "
     "(4, 4) of >f4 (64 bytes) but the body holds 56 bytes of data"),
    (npy(np.zeros((4, 4), dtype=np.float32))[:-8], "not a valid .npy array: the header says "
     "shape (4, 4) of float32 (64 bytes) but the body holds 56 bytes of data"),
    (npy(np.array([{"evil": 1}], dtype=object), allow_pickle=True),
     "the .npy body holds pickled objects, which are refused"),
    (npy(np.zeros((1, 3), dtype=np.longdouble)), "the .npy array has dtype float128, which torch "
     "has no type for; send bool, integers up to 64 bits or float16, float32 or float64"),
    (npy(np.zeros((1, 2), dtype=complex)), "the .npy array must be numeric, got dtype complex128"),
    (b'[["\xed\xa0\x80"]]', "JSON input must hold only numbers, in lists of equal length"),
])
def test_refusals_say_exactly_why(body, message):
    kind = NPY if body.startswith(b"\x93NUMPY") else JSON
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(body, kind)
    assert str(refused.value) == message


def test_json_keys_that_json_cannot_carry_become_strings():
    assert codecs.encode({(1, 2): torch.tensor([3])}, JSON)[0] == b'{"(1, 2)":[3]}'


def npy_with_header_of(size: int, version: int = 2) -> bytes:
    """A float32 (1, 2) array whose header (padding and newline included) is ``size`` bytes."""
    text = repr({"descr": "<f4", "fortran_order": False, "shape": (1, 2)}).encode()
    text += b" " * (size - len(text) - 1) + b"\n"
    length = len(text).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + length + text + np.float32([1, 2]).tobytes()


@pytest.mark.parametrize("body, message", [
    (b"GARBAGE!!!!!", "not a valid .npy array: the body does not start with the .npy magic "
                      "string"),
    (b"\x93NUMPY\x01\x00\x10", "not a valid .npy array: the body ends inside its preamble"),
    (b"\x93NUMPY\x02\x00\x10\x00\x00", "not a valid .npy array: unsupported format version 2"),
    (b"\x93NUMPY\x04\x00" + b"\x10\x00\x00\x00" + b" " * 16,
     "not a valid .npy array: unsupported format version 4"),
    (b"\x93NUMPY\x01\x00\x64\x00{'descr'", "not a valid .npy array: the header is truncated or "
                                           "too long"),
    (npy_with_header_of(10_001), "not a valid .npy array: the header is truncated or too long"),
])
def test_npy_preambles_are_checked_before_anything_is_read(body, message):
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(body, NPY)
    assert str(refused.value) == message


@pytest.mark.parametrize("body", [b"\x93NUMPY\x01\x00\x00\x00", b"\x93NUMPY\x02\x00" + bytes(4)])
def test_a_complete_preamble_with_an_empty_header_goes_to_numpy(body):
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(body, NPY)
    message = str(refused.value)
    assert message.startswith("not a valid .npy array: ")
    assert "preamble" not in message and "unsupported format" not in message


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_common_header_is_found_in_every_format_version(version):
    body = with_header({"descr": "<f4", "fortran_order": False, "shape": (1, 2)},
                       np.float32([1, 2]).tobytes(), version=version)
    prefix = 10 if version == 1 else 12
    header = body[prefix:len(body) - 8]
    codecs._common_npy_header.cache_clear()
    assert codecs.decode(body, NPY).tolist() == [[1.0, 2.0]]
    codecs._common_npy_header(header)  # the decoder asked for exactly this header: a hit
    assert codecs._common_npy_header.cache_info().hits == 1


def test_a_header_of_exactly_the_largest_size_is_read():
    assert codecs.decode(npy_with_header_of(10_000), NPY).tolist() == [[1.0, 2.0]]


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` and which holds no pixels."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_too_large_before_it_is_decoded():
    with pytest.raises(PayloadTooLarge) as refused:
        codecs.decode(png_claiming(20_000, 20_000), "image/png")
    assert str(refused.value).startswith("the image has too many pixels: ")
    assert len(str(refused.value)) > len("the image has too many pixels: ")


def test_the_pixel_limit_counts_width_times_height(monkeypatch):
    monkeypatch.setattr(codecs, "MAX_IMAGE_PIXELS", 6)
    with pytest.raises(PayloadTooLarge) as refused:
        codecs.decode(image("PNG", 3, 3), "image/png")
    assert str(refused.value) == "the image is 3x3 pixels; at most 6 pixels are decoded"


def test_an_image_whose_pixels_cannot_be_decoded_is_invalid():
    truncated = image("PNG", 16, 16)[:60]  # the header reads, the pixel data is cut
    with pytest.raises(InvalidInput) as refused:
        codecs.decode(truncated, "image/png")
    prefix = "the body is not a decodable JPEG or PNG image: "
    assert str(refused.value).startswith(prefix) and len(str(refused.value)) > len(prefix)

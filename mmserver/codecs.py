"""Default decoders and encoders: request bytes to tensors and back.

These are the defaults of the SageMaker PyTorch convention, used when a model
has no ``input_fn`` / ``output_fn`` of its own:

* in: ``application/json`` (nested lists of numbers), ``application/x-npy``
  (``allow_pickle=False``: a pickled array is refused, never loaded),
  ``text/csv`` (one row per line), ``image/jpeg`` and ``image/png`` (decoded by
  torchvision to float RGB in [0, 1], one row of shape 3xHxW);
* out: ``application/json`` (the bare nested list, ``tensor.tolist()``),
  ``application/x-npy`` and ``text/csv``. Like the toolkit's encoders they take
  what a ``predict_fn`` returns: tensors, NumPy arrays and scalars, Python
  numbers, and lists, tuples and dicts of them (JSON any of these; ``.npy`` and
  CSV whatever is one array, a 1-D one as a column).

Dimension 0 of a decoded tensor counts the client's rows: ``[[1, 2, 3]]`` is
one row, ``[[1, 2, 3], [4, 5, 6]]`` two.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import PIL.Image
import torch
import torchvision.io

from mmserver.errors import (
    InvalidInput,
    NotAcceptable,
    OutputNotEncodable,
    PayloadTooLarge,
    UnsupportedContentType,
)

JSON = "application/json"
NPY = "application/x-npy"
CSV = "text/csv"
JPEG = "image/jpeg"
PNG = "image/png"

#: Largest image decoded (pixels): 25 MP is 300 MB as float32 RGB, far beyond any model input.
MAX_IMAGE_PIXELS = 25_000_000
#: What an absent Content-Type means to the default decoders, and an absent Accept to the
#: default encoders. User code gets the Content-Type as sent (None), as in the toolkit.
DEFAULT_TYPE = JSON


def media_type(header: str | None) -> str:
    """``'application/json; charset=utf-8'`` -> ``'application/json'``; no header: JSON."""
    if not header:
        return DEFAULT_TYPE
    return header.split(";", 1)[0].strip().lower()


def decode(body: bytes, content_type: str | None) -> torch.Tensor:
    """Decode a request body into a tensor whose dimension 0 counts rows."""
    kind = media_type(content_type)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise UnsupportedContentType(
            f"unsupported content type {kind!r}; send one of {', '.join(DECODABLE)}"
        )
    if not body:
        raise InvalidInput("the request body is empty")
    tensor = decoder(body)
    if tensor.dim() == 0:
        raise InvalidInput("the input needs a batch dimension: send a list of rows, e.g. [[1, 2]]")
    if tensor.shape[0] == 0:
        raise InvalidInput("the input has no rows")
    return tensor


def _reject_constant(name: str) -> float:
    raise InvalidInput(f"JSON input holds {name}; only finite numbers are allowed")


#: Built once: ``json.loads`` with any keyword builds a new decoder per call, and
#: ``json.dumps`` a new encoder (a few microseconds each, on every request).
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _decode_json(body: bytes) -> torch.Tensor:
    try:
        data = _JSON_DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidInput(f"malformed JSON: {error}") from None
    except RecursionError:
        raise InvalidInput("JSON input is nested too deeply") from None
    if not isinstance(data, list):
        raise InvalidInput(
            f"JSON input must be a list of rows (nested lists of numbers), got {type(data).__name__}"
        )
    try:
        array = np.asarray(data)
    except ValueError as error:
        raise InvalidInput(f"JSON rows must all have the same shape: {error}") from None
    if array.dtype.kind not in "biuf":
        raise InvalidInput("JSON input must hold only numbers, in lists of equal length")
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise InvalidInput("JSON input holds a number too large for float32 or not finite")
    return torch.from_numpy(array)


#: The dtypes a .npy body may hold: those torch has (uint16/32/64 are widened to int64).
_NPY_TORCH_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))
#: The header ``np.save`` writes for a little-endian C-order array of a dtype torch holds as is.
_NPY_COMMON_HEADER = re.compile(
    r"\{'descr': '(<f2|<f4|<f8|\|b1|\|u1|\|i1|<i2|<i4|<i8)', 'fortran_order': False, "
    r"'shape': \(((?:\d+, )*\d+,?|)\),? ?\} *\n?")
_NPY_MAGIC = b"\x93NUMPY"
#: numpy's own limit on the header of a file it loads safely.
_NPY_MAX_HEADER_BYTES = 10_000
_LITTLE_ENDIAN = sys.byteorder == "little"


@functools.lru_cache(maxsize=256)
def _common_npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of the header np.save writes for a plain little-endian array, else None.

    Parsed by one strict pattern instead of ``ast.literal_eval`` (a tenth of np.load's time),
    and remembered: a client sends the same header again and again.
    """
    match = _NPY_COMMON_HEADER.fullmatch(header.decode("latin1")) if _LITTLE_ENDIAN else None
    if match is None:
        return None
    descr, dims = match.groups()
    return np.dtype(descr), tuple(int(d) for d in dims.replace(",", " ").split())


def _decode_npy(body: bytes) -> torch.Tensor:
    """A .npy body to a tensor; never allocates more than the body holds.

    The common header (what ``np.save`` writes for a little-endian C-order array of
    bool, uint8, int8-int64 or float16-float64) is read by :func:`_common_npy_header`
    and the data copied once out of the body into a writable array: the body is
    immutable bytes, and torch warns about (and a model writing into its input
    would corrupt) an array that wraps it. The copy is a memcpy (under a microsecond
    for 12 KB). Any other header is checked by numpy's header reader and loaded by
    ``np.load(allow_pickle=False)``.
    """
    if not body.startswith(_NPY_MAGIC):
        raise InvalidInput("not a valid .npy array: the body does not start with the .npy "
                           "magic string")
    if len(body) < 10:
        raise InvalidInput("not a valid .npy array: the body ends inside its preamble")
    major = body[6]
    if major == 1:
        offset = 10 + int.from_bytes(body[8:10], "little")
    elif major in (2, 3) and len(body) >= 12:
        offset = 12 + int.from_bytes(body[8:12], "little")
    else:
        raise InvalidInput(f"not a valid .npy array: unsupported format version {major}")
    if offset > len(body) or offset > _NPY_MAX_HEADER_BYTES + 12:
        raise InvalidInput("not a valid .npy array: the header is truncated or too long")
    common = _common_npy_header(body[10 if major == 1 else 12:offset])
    if common is None:
        return _decode_npy_other(body)
    dtype, shape = common
    array = np.frombuffer(_npy_data(body, offset, dtype, shape), dtype=dtype).reshape(shape)
    return torch.from_numpy(array)


def _npy_data(body: bytes, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> bytearray:
    """The data the header announces, copied; 400 when the body holds less."""
    needed = math.prod(shape) * dtype.itemsize
    if len(body) - offset < needed:
        raise InvalidInput(f"not a valid .npy array: the header says shape {shape} of "
                           f"{dtype} ({needed} bytes) but the body holds {len(body) - offset} "
                           "bytes of data")
    return bytearray(memoryview(body)[offset:offset + needed])


def _check_npy_dtype(dtype: np.dtype) -> None:
    if dtype.hasobject:
        raise InvalidInput("the .npy body holds pickled objects, which are refused")
    if dtype.kind not in "biuf":
        raise InvalidInput(f"the .npy array must be numeric, got dtype {dtype}")
    if dtype.newbyteorder("=") not in _NPY_TORCH_DTYPES:
        raise InvalidInput(f"the .npy array has dtype {dtype}, which torch has no type for; "
                           "send bool, integers up to 64 bits or float16, float32 or float64")


def _decode_npy_other(body: bytes) -> torch.Tensor:
    """Any header but the common one: numpy reads and checks it, then np.load the array."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(stream, max_header_size=_NPY_MAX_HEADER_BYTES)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as error:
        raise InvalidInput(f"not a valid .npy array: {error}") from None
    _check_npy_dtype(dtype)
    needed = math.prod(shape) * dtype.itemsize
    if len(body) - stream.tell() < needed:  # checked before np.load allocates the claim
        raise InvalidInput(f"not a valid .npy array: the header says shape {shape} of "
                           f"{dtype} ({needed} bytes) but the body holds "
                           f"{len(body) - stream.tell()} bytes of data")
    try:  # the dtype was checked above, so allow_pickle=False is a second lock, not the first
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError as error:
        raise InvalidInput(f"not a valid .npy array: {error}") from None
    except (OSError, EOFError) as error:
        raise InvalidInput(f"not a valid .npy array: {error}") from None
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype in (np.uint16, np.uint32, np.uint64):  # torch has no such dtypes
        array = array.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(array))


def _decode_csv(body: bytes) -> torch.Tensor:
    try:
        text = body.decode("utf-8")
        array = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.float32, ndmin=2)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidInput(f"malformed CSV (numbers separated by commas, one row per line): "
                           f"{error}") from None
    if not np.isfinite(array).all():
        raise InvalidInput("CSV input holds non-finite numbers")
    return torch.from_numpy(array)


def _decode_image(body: bytes) -> torch.Tensor:
    try:  # the header alone: a small PNG can hold gigabytes of pixels (a decompression bomb)
        with PIL.Image.open(io.BytesIO(body)) as header:
            width, height = header.size
    except PIL.Image.DecompressionBombError as error:
        raise PayloadTooLarge(f"the image has too many pixels: {error}") from None
    except (PIL.UnidentifiedImageError, OSError, ValueError) as error:
        raise InvalidInput(f"the body is not a decodable JPEG or PNG image: {error}") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise PayloadTooLarge(f"the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS} "
                              "pixels are decoded")
    encoded = torch.frombuffer(bytearray(body), dtype=torch.uint8)
    try:
        image = torchvision.io.decode_image(encoded, mode=torchvision.io.ImageReadMode.RGB)
    except (RuntimeError, ValueError) as error:
        raise InvalidInput(f"the body is not a decodable JPEG or PNG image: {error}") from None
    return (image.float() / 255.0).unsqueeze(0)


_DECODERS = {JSON: _decode_json, NPY: _decode_npy, CSV: _decode_csv, JPEG: _decode_image,
             PNG: _decode_image}
DECODABLE = tuple(_DECODERS)


@functools.lru_cache(maxsize=256)
def negotiate(accept: str | None, offered: tuple[str, ...] | None = None) -> str:
    """Pick the offered type the Accept header prefers most (RFC 9110 q-values).

    An absent or empty header, or ``*/*``, gets JSON. Raises NotAcceptable when
    nothing offered is allowed. Remembered per header: clients repeat theirs, and
    it is asked twice per request (admission, encoding).
    """
    if not accept or accept == "*/*" or not accept.strip():
        return DEFAULT_TYPE
    offered = offered or ENCODABLE
    best, best_q = None, 0.0
    for part in accept.split(","):
        pieces = [p.strip() for p in part.split(";")]
        kind = pieces[0].lower()
        q = 1.0
        for param in pieces[1:]:
            if param.lower().startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        if q <= 0 or not math.isfinite(q):
            continue
        if kind in ("*/*", "application/*") and DEFAULT_TYPE in offered:
            candidate = DEFAULT_TYPE
        elif kind == "text/*" and CSV in offered:
            candidate = CSV
        elif kind in offered:
            candidate = kind
        else:
            continue
        if q > best_q:
            best, best_q = candidate, q
    if best is None:
        raise NotAcceptable(f"cannot answer with {accept!r}; acceptable: {', '.join(offered)}")
    return best


def encode(output: Any, accept: str | None) -> tuple[bytes, str]:
    """Encode this request's output rows for the negotiated type."""
    kind = negotiate(accept)
    return _ENCODERS[kind](output), kind


def _encode_json(output: Any) -> bytes:
    try:
        return _JSON_ENCODER.encode(_to_python(output)).encode()
    except ValueError:
        raise OutputNotEncodable(f"the model's output holds NaN or infinity, which JSON cannot "
                                 f"carry; ask for {NPY}") from None


#: Array kinds .npy (without pickles) and CSV can carry: booleans, numbers and strings.
_ONE_ARRAY_KINDS = frozenset("biufcUS")


def _one_array(output: Any, kind: str) -> np.ndarray:
    """The output as one NumPy array, or NotAcceptable when it is not one (a dict, ragged rows).

    The toolkit's encoders take any array-like (``np.save``/``np.savetxt`` call
    ``np.asarray``), so a NumPy scalar, a Python number or a list of rows is one array too.
    """
    if isinstance(output, torch.Tensor):
        return _tensor_array(output)
    if not isinstance(output, Mapping):
        try:
            array = np.asarray(_host_arrays(output))
        except (ValueError, TypeError):
            array = None
        if array is not None and array.dtype.kind in _ONE_ARRAY_KINDS:
            return array
    raise NotAcceptable(f"{kind} can carry a single array only; the model returned a "
                        f"{type(output).__name__} that is not one (a dict, or rows of unequal "
                        f"length): ask for {JSON}")


def _tensor_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor on the host as NumPy (bfloat16, which NumPy lacks, as float32)."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _host_arrays(output: Any) -> Any:
    """Tensors inside lists and tuples as NumPy arrays, so ``np.asarray`` can stack them."""
    if isinstance(output, torch.Tensor):
        return _tensor_array(output)
    if isinstance(output, (tuple, list)):
        return [_host_arrays(v) for v in output]
    return output


def _encode_npy(output: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, _one_array(output, NPY), allow_pickle=False)
    return buffer.getvalue()


def _encode_csv(output: Any) -> bytes:
    """One line per row, each value as ``str()`` writes it: ``1.0,2.0,3.0`` and ``1,2,3``.

    That is the toolkit's CSV: its default ``output_fn`` turns a tensor into Python
    numbers (``tolist()``, so float32 values are written at float64 precision) and its
    encoder writes ``np.savetxt(..., fmt="%s")``. NumPy arrays keep their dtype, so a
    float32 array writes ``0.1`` where a float32 tensor writes ``0.10000000149011612``.
    """
    if isinstance(output, torch.Tensor) and output.is_floating_point():
        output = output.detach().cpu().double()
    array = _one_array(output, CSV)
    if array.ndim > 2:
        raise NotAcceptable(f"{CSV} carries at most 2 dimensions; this output has shape "
                            f"{tuple(array.shape)}: ask for {JSON} or {NPY}")
    buffer = io.StringIO()
    np.savetxt(buffer, array.reshape(1, 1) if array.ndim == 0 else array, delimiter=",",
               fmt="%s")
    return buffer.getvalue().encode()


def _to_python(output: Any) -> Any:
    """Lists, dicts and Python numbers: anything with ``tolist`` (tensors, NumPy arrays and
    scalars) becomes its ``tolist()``, as the toolkit's JSON encoder does."""
    if isinstance(output, torch.Tensor):
        return output.detach().cpu().tolist()
    if isinstance(output, Mapping):
        return {str(k): _to_python(v) for k, v in output.items()}
    if isinstance(output, (tuple, list)):
        return [_to_python(v) for v in output]
    tolist = getattr(output, "tolist", None)
    return tolist() if callable(tolist) else output


_ENCODERS = {JSON: _encode_json, NPY: _encode_npy, CSV: _encode_csv}
ENCODABLE = tuple(_ENCODERS)

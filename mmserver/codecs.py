"""Default decoders and encoders: request bytes to tensors and back.

These are the defaults of the SageMaker PyTorch convention, used when a model
has no ``input_fn`` / ``output_fn`` of its own:

* in: ``application/json`` (nested lists of numbers), ``application/x-npy``
  (``allow_pickle=False``: a pickled array is refused, never loaded),
  ``text/csv`` (one row per line), ``image/jpeg`` and ``image/png`` (decoded by
  torchvision to float RGB in [0, 1], one row of shape 3xHxW);
* out: ``application/json`` (the bare nested list, ``tensor.tolist()``),
  ``application/x-npy`` and ``text/csv``.

Dimension 0 of a decoded tensor counts the client's rows: ``[[1, 2, 3]]`` is
one row, ``[[1, 2, 3], [4, 5, 6]]`` two.
"""

from __future__ import annotations

import io
import json
import math
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

DECODABLE = (JSON, NPY, CSV, JPEG, PNG)
ENCODABLE = (JSON, NPY, CSV)
#: Largest image decoded (pixels): 25 MP is 300 MB as float32 RGB, far beyond any model input.
MAX_IMAGE_PIXELS = 25_000_000
#: What an absent Content-Type or Accept header means (the SageMaker PyTorch toolkit's default).
DEFAULT_TYPE = JSON


def media_type(header: str | None) -> str:
    """``'application/json; charset=utf-8'`` -> ``'application/json'``."""
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


def _decode_json(body: bytes) -> torch.Tensor:
    try:
        data = json.loads(body, parse_constant=_reject_constant)
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


def _decode_npy(body: bytes) -> torch.Tensor:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError as error:
        if "pickle" in str(error).lower():
            raise InvalidInput("the .npy body holds pickled objects, which are refused") from None
        raise InvalidInput(f"not a valid .npy array: {error}") from None
    except (OSError, EOFError) as error:
        raise InvalidInput(f"not a valid .npy array: {error}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise InvalidInput(f"the .npy array must be numeric, got dtype {array.dtype}")
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


def negotiate(accept: str | None, offered: tuple[str, ...] = ENCODABLE) -> str:
    """Pick the offered type the Accept header prefers most (RFC 9110 q-values).

    An absent or empty header, or ``*/*``, gets JSON. Raises NotAcceptable when
    nothing offered is allowed.
    """
    if not accept or accept == "*/*" or not accept.strip():
        return DEFAULT_TYPE
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
    if kind == JSON:
        try:
            text = json.dumps(_to_python(output), separators=(",", ":"), allow_nan=False)
        except ValueError:
            raise OutputNotEncodable(f"the model's output holds NaN or infinity, which JSON cannot "
                             f"carry; ask for {NPY}") from None
        return text.encode(), JSON
    if not isinstance(output, torch.Tensor):
        raise NotAcceptable(f"{kind} can carry a single tensor only; this model returns "
                            f"{type(output).__name__}: ask for {JSON}")
    array = output.numpy()
    if kind == NPY:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue(), NPY
    if array.ndim > 2:
        raise NotAcceptable(f"{CSV} carries at most 2 dimensions; this output has shape "
                            f"{tuple(array.shape)}: ask for {JSON} or {NPY}")
    buffer = io.StringIO()
    np.savetxt(buffer, array.reshape(array.shape[0], -1), delimiter=",", fmt="%.9g")
    return buffer.getvalue().encode(), CSV


def _to_python(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.tolist()
    if isinstance(output, Mapping):
        return {str(k): _to_python(v) for k, v in output.items()}
    if isinstance(output, (tuple, list)):
        return [_to_python(v) for v in output]
    return output

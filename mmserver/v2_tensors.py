"""Tensors of the Open Inference Protocol (KServe v2), as JSON and as Triton's binary data.

Pure: bytes and JSON objects in, ``torch.Tensor`` out, and back; nothing here
knows HTTP, models or the answer's keys (``http.v2`` shapes those). What it
owns, so that every check lives in one place:

* the datatype table, the protocol's names (``FP32``, ``INT64``, ``BOOL``...)
  against torch dtypes; ``BYTES`` (strings, for a text model) has no torch dtype
  and is decoded to a NumPy array of ``bytes`` objects (:func:`strings_from_json`,
  :func:`strings_from_bytes`: in binary, each element is a 4-byte little-endian
  length and then its bytes, as Triton's clients send it);
* an infer request's body, parsed: the JSON header (the whole body, or its
  first ``Inference-Header-Content-Length`` bytes when binary tensors follow),
  each input's ``data`` (flat in row-major order, or nested) or its
  ``parameters.binary_data_size`` bytes of the binary part, in the order the
  inputs are listed; element counts against shapes, values against the
  datatype, and the binary sizes against the bytes that are there;
* an output tensor as JSON data (flat, row-major) or as raw bytes.

Binary tensors are little-endian and row-major, as the extension says; ``BOOL``
is one byte per element. A JSON number that does not fit its datatype (300 for
``UINT8``, 1e39 for ``FP32``), a float for an integer datatype, and NaN or
infinity in JSON are refused: JSON cannot carry them faithfully.

Every refusal is an :class:`~mmserver.errors.InvalidRequest` (the request's
structure) or :class:`~mmserver.errors.InvalidInput` (a tensor's content),
whose message names the tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmserver.errors import InvalidInput, InvalidRequest, OutputNotEncodable

DATATYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
    "BF16": torch.bfloat16,
}
DATATYPE_OF: dict[torch.dtype, str] = {dtype: name for name, dtype in DATATYPES.items()}
#: Datatypes of the protocol that mmserver refuses, and why.
REFUSED_DATATYPES: dict[str, str] = {}
#: Strings: a text model's input, decoded to a NumPy array of ``bytes`` (no torch dtype).
BYTES = "BYTES"
#: Each element of a binary BYTES tensor starts with its length, this many bytes, little-endian.
_BYTES_LENGTH_SIZE = 4
#: The most dimensions a tensor may declare; torch itself stops at 64.
MAX_DIMENSIONS = 32
#: What a JSON array's NumPy kind must be for each family of datatypes ('b' bool,
#: 'i'/'u' integers, 'f' floats); an empty array passes whatever its kind.
_JSON_KINDS = {"bool": "b", "int": "iu", "float": "iuf"}

_DECODER = json.JSONDecoder()
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class RequestedOutput:
    """One entry of the request's ``outputs``: a name, and binary or JSON for its data."""

    name: str
    #: True/False from its ``parameters.binary_data``; None: the request's default.
    binary: bool | None = None


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """An infer request's body, parsed and checked (tensors on the CPU)."""

    id: str | None
    #: The inputs by name, in the order the request lists them (BYTES: a NumPy array of bytes).
    inputs: dict[str, torch.Tensor | np.ndarray]
    #: The outputs asked for, in order; None: every output the model returns.
    outputs: tuple[RequestedOutput, ...] | None
    #: The request-level ``parameters.binary_data_output``: outputs as binary by default.
    binary_output: bool = False

    def binary(self, output: RequestedOutput | None) -> bool:
        """Whether an output's data goes in the binary part of the answer."""
        if output is not None and output.binary is not None:
            return output.binary
        return self.binary_output


def datatype_dtype(datatype: object, tensor_name: str) -> torch.dtype:
    """The torch dtype of a datatype name; a clear refusal for BYTES or an unknown name."""
    if isinstance(datatype, str):
        if datatype in DATATYPES:
            return DATATYPES[datatype]
        if datatype in REFUSED_DATATYPES:
            raise InvalidInput(f"input {tensor_name!r}: {REFUSED_DATATYPES[datatype]}")
    raise InvalidInput(f"input {tensor_name!r}: unknown datatype {datatype!r}; "
                       f"known: {', '.join(DATATYPES)}")


def datatype_name(dtype: torch.dtype) -> str | None:
    """The protocol's name of a torch dtype, or None for one it has no name for (complex)."""
    return DATATYPE_OF.get(dtype)


def element_count(shape: object, tensor_name: str) -> int:
    """How many elements ``shape`` (a list of integers >= 0) holds."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMENSIONS or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidInput(f"input {tensor_name!r}: shape must be a list of at most "
                           f"{MAX_DIMENSIONS} integers >= 0, got {_short(shape)}")
    return math.prod(shape)


# -- the request ------------------------------------------------------------------


def parse_infer_request(body: bytes, header_length: int | None) -> InferRequest:
    """An infer request: ``body`` is all JSON, or ``header_length`` bytes of JSON and then
    the binary tensors (``Inference-Header-Content-Length``)."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidRequest(f"Inference-Header-Content-Length is {header_length}, but the "
                             f"body has {len(body)} bytes")
    header_bytes = body if header_length is None else body[:header_length]
    binary = memoryview(body)[len(header_bytes):]
    header = _json_object(header_bytes, binary_expected=header_length is not None)
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequest('the request needs "inputs": a non-empty list of tensors')
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    for position, entry in enumerate(inputs):
        name, tensor, used = _input(entry, position, binary[offset:], header_length is not None)
        if name in tensors:
            raise InvalidRequest(f"input {name!r} is given twice")
        tensors[name] = tensor
        offset += used
    if offset != len(binary):
        raise InvalidRequest(
            f"the body has {len(binary)} bytes after its {len(header_bytes)}-byte JSON header, "
            f"but the inputs' binary_data_size add up to {offset}")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f'"id" must be a string, got {_short(request_id)}')
    parameters = _parameters(header, "the request")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidRequest(f"parameters.binary_data_output must be true or false, "
                             f"got {_short(binary_output)}")
    return InferRequest(id=request_id, inputs=tensors, outputs=_outputs(header),
                        binary_output=binary_output)


def _json_object(raw: bytes, *, binary_expected: bool) -> dict:
    hint = "" if binary_expected else (
        " (a body with binary tensors after its JSON needs an Inference-Header-Content-Length "
        "header)")
    try:
        header = _DECODER.decode(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InvalidRequest(f"the request's JSON is not UTF-8: {error}{hint}") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"the request is not valid JSON: {error}{hint}") from None
    except RecursionError:
        raise InvalidRequest("the request's JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise InvalidRequest(f"the request must be a JSON object, got {type(header).__name__}")
    return header


def _input(entry: object, position: int, binary: memoryview,
           has_binary_part: bool) -> tuple[str, torch.Tensor | np.ndarray, int]:
    """(name, tensor, bytes of the binary part it used) of one entry of ``inputs``."""
    if not isinstance(entry, dict):
        raise InvalidRequest(f"inputs[{position}] must be an object with name, shape, datatype "
                             f"and data, got {_short(entry)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f'inputs[{position}] needs "name": a non-empty string')
    for key in ("shape", "datatype"):
        if key not in entry:
            raise InvalidRequest(f'input {name!r} needs "{key}"')
    dtype = None if entry["datatype"] == BYTES else datatype_dtype(entry["datatype"], name)
    count = element_count(entry["shape"], name)
    shape = entry["shape"]
    size = _parameters(entry, f"input {name!r}").get("binary_data_size")
    if size is None:
        if "data" not in entry:
            raise InvalidRequest(f'input {name!r} needs "data", or parameters.binary_data_size '
                                 "for binary data after the JSON header")
        if dtype is None:
            return name, strings_from_json(entry["data"], shape, count, name), 0
        return name, tensor_from_json(entry["data"], dtype, shape, count, name), 0
    if "data" in entry:
        raise InvalidRequest(f'input {name!r} has both "data" and parameters.binary_data_size')
    if not has_binary_part:
        raise InvalidRequest(f"input {name!r} has parameters.binary_data_size, but the request "
                             "has no Inference-Header-Content-Length header to say where the "
                             "binary data starts")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidRequest(f"input {name!r}: binary_data_size must be an integer >= 0, "
                             f"got {_short(size)}")
    if size > len(binary):
        raise InvalidRequest(f"input {name!r}: binary_data_size is {size}, but only "
                             f"{len(binary)} bytes of binary data are left in the body")
    if dtype is None:
        return name, strings_from_bytes(binary[:size], shape, count, name), size
    return name, tensor_from_bytes(binary[:size], dtype, shape, count, name), size


def _parameters(entry: dict, what: str) -> Mapping[str, Any]:
    parameters = entry.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{what}: parameters must be an object, got {_short(parameters)}")
    return parameters


def _outputs(header: dict) -> tuple[RequestedOutput, ...] | None:
    if "outputs" not in header:
        return None
    entries = header["outputs"]
    if not isinstance(entries, list):
        raise InvalidRequest(f'"outputs" must be a list of objects with a name, '
                             f"got {_short(entries)}")
    requested: list[RequestedOutput] = []
    for position, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f'outputs[{position}] needs "name": a non-empty string')
        parameters = _parameters(entry, f"output {name!r}")
        if parameters.get("classification"):
            raise InvalidRequest(f"output {name!r}: the classification extension is not "
                                 "supported; ask for the tensor and rank it yourself")
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidRequest(f"output {name!r}: binary_data must be true or false, "
                                 f"got {_short(binary)}")
        if any(r.name == name for r in requested):
            raise InvalidRequest(f"output {name!r} is asked for twice")
        requested.append(RequestedOutput(name, binary))
    return tuple(requested)


# -- one tensor in ------------------------------------------------------------------


def tensor_from_json(data: object, dtype: torch.dtype, shape: list[int], count: int,
                     name: str) -> torch.Tensor:
    """JSON ``data`` (flat or nested, row-major) as a tensor of ``shape``."""
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: data must be a list, got {_short(data)}")
    try:
        array = np.array(data)
    except (ValueError, OverflowError):
        raise InvalidInput(f"input {name!r}: data must be numbers, or lists of numbers "
                           "nested evenly") from None
    if array.size != count:
        raise InvalidInput(f"input {name!r}: shape {shape} holds {count} elements, "
                           f"but data has {array.size}")
    family = "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "int"
    # NumPy reads integers past int64 (UINT64's top half) as floats or Python objects.
    if family == "int" and array.dtype.kind in "fO" and _all_of(data, (int,)):
        array = np.array(data, dtype=object)
    elif family == "float" and array.dtype.kind == "O" and _all_of(data, (int, float)):
        array = np.array(data, dtype=np.float64)
    elif array.size and array.dtype.kind not in _JSON_KINDS[family]:
        wanted = {"bool": "true or false", "int": "integers", "float": "numbers"}[family]
        raise InvalidInput(f"input {name!r}: {DATATYPE_OF[dtype]} data must be {wanted}, "
                           f"got {_kind_name(array)}")
    if family == "int" and array.size:
        array = _integers(data, array, dtype, name)
    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(dtype).reshape(shape)
    if family == "float" and not bool(torch.isfinite(tensor).all()):
        raise InvalidInput(f"input {name!r}: data holds a number too large for "
                           f"{DATATYPE_OF[dtype]}, or NaN or infinity (which JSON cannot carry; "
                           "send such values as binary data)")
    return tensor


def _all_of(data: list, kinds: tuple[type, ...]) -> bool:
    return all(isinstance(v, kinds) and not isinstance(v, bool)
               for v in np.array(data, dtype=object).flat)


def _integers(data: list, array: np.ndarray, dtype: torch.dtype, name: str) -> np.ndarray:
    """Integer data as the datatype's NumPy array; a value that does not fit is refused."""
    info = torch.iinfo(dtype)
    low, high = int(array.min()), int(array.max())
    if low < info.min or high > info.max:
        raise InvalidInput(f"input {name!r}: {low if low < info.min else high} does not "
                           f"fit {DATATYPE_OF[dtype]}")
    return np.array(data, dtype=torch.empty(0, dtype=dtype).numpy().dtype)


def tensor_from_bytes(raw: memoryview, dtype: torch.dtype, shape: list[int], count: int,
                      name: str) -> torch.Tensor:
    """Little-endian row-major bytes as a tensor of ``shape`` (copied: the model may write)."""
    item_bytes = torch.empty((), dtype=dtype).element_size()
    if len(raw) != count * item_bytes:
        raise InvalidInput(f"input {name!r}: shape {shape} of {DATATYPE_OF[dtype]} needs "
                           f"{count * item_bytes} bytes, binary_data_size is {len(raw)}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).ne(0).reshape(shape)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def strings_from_json(data: object, shape: list[int], count: int, name: str) -> np.ndarray:
    """JSON ``data`` of a BYTES tensor (strings, flat or nested) as an array of UTF-8 bytes."""
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: data must be a list, got {_short(data)}")
    flat = np.array(data, dtype=object).reshape(-1) if data else np.empty(0, dtype=object)
    if flat.size != count:
        raise InvalidInput(f"input {name!r}: shape {shape} holds {count} elements, "
                           f"but data has {flat.size}")
    if not all(isinstance(value, str) for value in flat):
        raise InvalidInput(f"input {name!r}: BYTES data must be strings")
    return _object_array([value.encode("utf-8") for value in flat], shape)


def strings_from_bytes(raw: memoryview, shape: list[int], count: int, name: str) -> np.ndarray:
    """A binary BYTES tensor: ``count`` elements, each a 4-byte little-endian length and then
    that many bytes, filling ``raw`` exactly."""
    values, offset = [], 0
    for _ in range(count):
        if offset + _BYTES_LENGTH_SIZE > len(raw):
            break
        length = int.from_bytes(raw[offset:offset + _BYTES_LENGTH_SIZE], "little")
        offset += _BYTES_LENGTH_SIZE
        if offset + length > len(raw):
            break
        values.append(bytes(raw[offset:offset + length]))
        offset += length
    if len(values) != count or offset != len(raw):
        raise InvalidInput(f"input {name!r}: binary_data_size is {len(raw)} bytes, which do not "
                           f"hold exactly {count} BYTES elements (each a 4-byte little-endian "
                           "length, then its bytes)")
    return _object_array(values, shape)


def _object_array(values: list[bytes], shape: list[int]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


# -- one tensor out -----------------------------------------------------------------


def tensor_data(tensor: torch.Tensor, name: str) -> list:
    """An output's JSON data: flat, row-major; NaN and infinity are refused (JSON has none)."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise OutputNotEncodable(f"output {name!r} holds NaN or infinity, which JSON cannot "
                                 "carry; ask for it as binary data (binary_data: true)")
    return tensor.reshape(-1).tolist()


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """An output's raw bytes: row-major, little-endian, BOOL as one byte per element."""
    return tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def joined_body(header: dict, binaries: list[bytes]) -> tuple[bytes, int | None]:
    """The answer's body: the JSON header, then the binary outputs in order; and the header's
    length when binary data follows it (for ``Inference-Header-Content-Length``)."""
    encoded = _ENCODER.encode(header).encode()
    if not binaries:
        return encoded, None
    return b"".join([encoded, *binaries]), len(encoded)


def _kind_name(array: np.ndarray) -> str:
    return {"b": "true/false", "i": "integers", "u": "integers", "f": "floats",
            "U": "strings"}.get(array.dtype.kind, "values that are not numbers")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

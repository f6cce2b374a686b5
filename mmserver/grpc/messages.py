"""gRPC's v2 messages as the bodies the HTTP v2 operations read, and their answers back.

A ``ModelInferRequest`` becomes exactly the body ``tritonclient.http`` sends with binary
tensors: a JSON header naming each input with its ``binary_data_size``, then the tensors'
bytes. ``raw_input_contents`` are already those bytes (little-endian, row-major; a BYTES
element is a 4-byte little-endian length and its bytes, in both protocols), so they pass
through untouched; typed ``contents`` are written in the same form first. Every output is
asked for as binary data and comes back as ``raw_output_contents``, as Triton answers.
So gRPC needs no decoder of its own: the v2 wire (``mmserver.wires``, ``v2_tensors``)
checks and decodes one body format, wherever it is decoded (this process, or an HTTP
worker), and gRPC and HTTP requests share the model's queue.

The message classes come from ``tritonclient.grpc.service_pb2`` (Triton's
``grpc_service.proto``, package ``inference``), imported nowhere else. Only one set of
``inference.*`` messages can live in one process: protobuf's default pool refuses a second
file defining the same names (kserve/kserve#3099: KServe's and Triton's stubs collide), so
mmserver imports no other package's v2 stubs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from mmserver import errors

#: Where each datatype's elements are in ``InferTensorContents``, and their little-endian type.
TYPED_CONTENTS = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype("<i1")),
    "INT16": ("int_contents", np.dtype("<i2")),
    "INT32": ("int_contents", np.dtype("<i4")),
    "INT64": ("int64_contents", np.dtype("<i8")),
    "UINT8": ("uint_contents", np.dtype("<u1")),
    "UINT16": ("uint_contents", np.dtype("<u2")),
    "UINT32": ("uint_contents", np.dtype("<u4")),
    "UINT64": ("uint64_contents", np.dtype("<u8")),
    "FP32": ("fp32_contents", np.dtype("<f4")),
    "FP64": ("fp64_contents", np.dtype("<f8")),
}
_LENGTH = struct.Struct("<I")


def infer_body(request: pb.ModelInferRequest) -> tuple[bytes, int]:
    """The v2 body of ``request`` and its JSON header's length
    (``Inference-Header-Content-Length``)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise errors.InvalidRequest(
            f"the request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents; "
            "send every input's data raw, or every input's in contents")
    inputs, parts = [], []
    for position, tensor in enumerate(request.inputs):
        data = raw[position] if raw else typed_bytes(tensor)
        inputs.append({"name": tensor.name, "datatype": tensor.datatype,
                       "shape": list(tensor.shape),
                       "parameters": {"binary_data_size": len(data)}})
        parts.append(data)
    header: dict[str, object] = {"inputs": inputs,
                                 "parameters": {"binary_data_output": True}}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        header["outputs"] = [{"name": output.name,
                              "parameters": {"binary_data": True,
                                             **_plain(output.parameters)}}
                             for output in request.outputs]
    encoded = json.dumps(header).encode()
    return b"".join([encoded, *parts]), len(encoded)


def typed_bytes(tensor: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """An input's typed ``contents`` in the binary form of ``raw_input_contents``."""
    contents = tensor.contents
    if tensor.datatype == "BYTES":
        return b"".join(_LENGTH.pack(len(item)) + item for item in contents.bytes_contents)
    typed = TYPED_CONTENTS.get(tensor.datatype)
    if typed is None:
        raise errors.InvalidInput(
            f"input {tensor.name!r}: {tensor.datatype} has no typed contents in the protocol; "
            "send it in raw_input_contents")
    field, dtype = typed
    values = np.asarray(getattr(contents, field))
    array = values.astype(dtype)
    if values.size and not np.array_equal(array, values):
        raise errors.InvalidInput(f"input {tensor.name!r}: a value of {field} does not fit "
                                  f"{tensor.datatype}")
    return array.tobytes()


def _plain(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    """gRPC's typed parameters as the JSON values the v2 body carries."""
    plain = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is not None and choice != "bytes_param":
            plain[key] = getattr(parameter, choice)
    return plain


def infer_response(body: bytes, header_length: int | None) -> pb.ModelInferResponse:
    """An infer answer (JSON, then every output's bytes) as a ``ModelInferResponse`` with
    ``raw_output_contents``."""
    header = json.loads(body if header_length is None else body[:header_length])
    response = pb.ModelInferResponse(model_name=header["model_name"],
                                     model_version=header["model_version"],
                                     id=header.get("id", ""))
    offset = header_length or 0
    for output in header["outputs"]:
        response.outputs.add(name=output["name"], datatype=output["datatype"],
                             shape=output["shape"])
        size = output["parameters"]["binary_data_size"]
        response.raw_output_contents.append(body[offset:offset + size])
        offset += size
    return response


def load_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> dict:
    """A repository load's or unload's parameters as the v2 body's ``parameters`` (a
    ``file:`` parameter's bytes are not read: such loads are refused by name)."""
    return {"parameters": {key: (None if parameter.WhichOneof("parameter_choice") == "bytes_param"
                                 else getattr(parameter, parameter.WhichOneof("parameter_choice")
                                              or "string_param"))
                           for key, parameter in parameters.items()}}


def parsed(value: object, message):
    """A v2 JSON answer (protobuf's JSON mapping of Triton's messages) as ``message``."""
    return json_format.ParseDict(value, message, ignore_unknown_fields=True)

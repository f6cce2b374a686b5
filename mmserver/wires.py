"""The two wires: how a request's body becomes the runner's input and its output an answer.

The pipeline (:mod:`mmserver.pipeline`) runs one invocation the same way for every
protocol; a :class:`~mmserver.pipeline.Wire` is the part that differs:

* :class:`ToolkitWire`, SageMaker's invocations: the model's ``input_fn``/``output_fn``,
  or the default codecs, as SageMaker's PyTorch inference toolkit calls them;
* :class:`V2Wire`, the Open Inference Protocol's ``infer``: the request's tensors are the
  runner's rows directly, one tensor for one input, a dict name → tensor for several
  (``input_fn``/``output_fn`` are not called: the protocol decodes and encodes); a
  ``transform_fn`` model takes whole bodies and answers 400 here.

A wire is built from the few headers it reads and the model's codecs: :class:`ToolkitHeaders`
and :class:`V2Headers` are those headers as plain, picklable data, so an HTTP host reads
them and the process that decodes makes the wire: where the model is (this process, or a
Ray model host), with its handler, or an HTTP worker over the engine, with the row-wise
model's :class:`~mmserver.handler.folder.RowCodecs`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmserver import codecs, errors, v2_tensors
from mmserver.batching.rows import leaves, rows_of
from mmserver.handler.folder import ModelHandler, RowCodecs
from mmserver.handler.toolkit import RequestContext
from mmserver.pipeline import ENCODE_IN_THREAD_VALUES, Answer, Wire
from mmserver.signatures import Signature

#: What a wire decodes and encodes with: the model's handler where the model is, or, in an HTTP
#: worker, the plain-data codecs of a row-wise model (``RowCodecs``).
Codecs = ModelHandler | RowCodecs
#: The v2 protocol: Triton's binary tensor data extension's header, the answers' media types,
#: and the one version every model has.
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
VERSION = "1"


# -- SageMaker's toolkit ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolkitHeaders:
    """What a SageMaker invocation's wire reads of the request, as the client sent it."""

    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None

    def wire(self, name: str, handler: Codecs, default_accept: str) -> ToolkitWire:
        return ToolkitWire(handler, RequestContext.from_headers(
            name, self.content_type, self.accept, self.custom_attributes, default_accept))


class ToolkitWire(Wire):
    """SageMaker's invocations: the model's ``input_fn``/``output_fn``, or the default codecs."""

    def __init__(self, handler: Codecs, context: RequestContext):
        self.handler = handler
        self.context = context
        self.user_code = handler.user_codecs

    def admit(self) -> None:
        if self.handler.default_encoders:
            codecs.negotiate(self.context.accept)

    def decode(self, body: bytes) -> Any:
        return self.handler.decode(body, self.context)

    def encode(self, rows: Any) -> Answer:
        payload, content_type = self.handler.encode(rows, self.context)
        return Answer(payload, content_type.split(";")[0])

    def heavy_body(self, body: bytes, decode_in_thread_bytes: int) -> bool:
        """Large bodies, images and a text model's (tokenizing) decode in a thread."""
        return len(body) >= decode_in_thread_bytes or self.handler.text is not None or \
            codecs.media_type(self.context.content_type).startswith("image/")


# -- the Open Inference Protocol -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class V2Headers:
    """What an infer request's wire reads of the request: the binary header's length (the
    ``Content-Type`` is never read: Triton's clients send none, or a wrong one)."""

    header_length: int | None = None
    content_type: str | None = None

    @classmethod
    def parse(cls, header_length: str | None, content_type: str | None) -> V2Headers:
        if header_length is None:
            return cls(None, content_type)
        try:
            return cls(int(header_length), content_type)
        except ValueError:
            raise errors.InvalidRequest(f"{HEADER_LENGTH} must be a number of bytes, "
                                        f"got {header_length[:40]!r}") from None

    def wire(self, name: str, handler: Codecs, default_accept: str) -> V2Wire:
        return V2Wire(name, handler, self.header_length, self.content_type)


class V2Wire(Wire):
    """An infer request's tensors as the runner's rows, and the output as a v2 answer."""

    def __init__(self, name: str, handler: Codecs, header_length: int | None,
                 content_type: str | None):
        if not handler.takes_tensors:
            raise errors.InvalidRequest(
                f"model {name!r} is not available over v2: its code defines "
                "transform_fn, which takes the request body itself, not tensors; invoke it "
                f"with POST /models/{name}/invoke")
        self.model_name = name
        self.handler = handler
        self.signature: Signature = handler.signature
        self.header_length = header_length
        self.context = RequestContext(name, content_type, JSON_TYPE)
        self.request: v2_tensors.InferRequest | None = None

    def decode(self, body: bytes) -> Any:
        request = v2_tensors.parse_infer_request(body, self.header_length)
        inputs = self.signature.matched_inputs(request.inputs)
        if request.outputs is not None:
            self.signature.check_requested_outputs([output.name for output in request.outputs])
        if self.handler.text is None and any(isinstance(t, np.ndarray) for t in inputs.values()):
            raise errors.InvalidInput(f"model {self.model_name!r} takes numeric tensors; BYTES "
                                      "(strings) are for text models (mmserver.json's text)")
        data = next(iter(inputs.values())) if len(inputs) == 1 else inputs
        data = self.handler.from_tensors(data, self.context)
        if self.handler.row_wise:
            _check_rows(data)
        self.request = request
        return data

    def encode(self, rows: Any) -> Answer:
        request = self.request
        produced = _named_outputs(rows, self.signature)
        if request.outputs is None:
            chosen = [(name, tensor, None) for name, tensor in produced.items()]
        else:
            missing = [o.name for o in request.outputs if o.name not in produced]
            if missing:
                raise errors.InvalidRequest(f"the model returned no output {missing[0]!r}; "
                                            f"it returned {list(produced)}")
            chosen = [(o.name, produced[o.name], o) for o in request.outputs]
        outputs, binaries = [], []
        for name, tensor, asked in chosen:
            entry: dict[str, object] = {"name": name, "datatype": _datatype(tensor, name),
                                        "shape": list(tensor.shape)}
            if request.binary(asked):
                raw = v2_tensors.tensor_bytes(tensor)
                entry["parameters"] = {"binary_data_size": len(raw)}
                binaries.append(raw)
            else:
                entry["data"] = v2_tensors.tensor_data(tensor, name)
            outputs.append(entry)
        header: dict[str, object] = {"model_name": self.model_name, "model_version": VERSION}
        if request.id is not None:
            header["id"] = request.id
        header["outputs"] = outputs
        body, header_length = v2_tensors.joined_body(header, binaries)
        if header_length is None:
            return Answer(body, JSON_TYPE)
        return Answer(body, BINARY_TYPE, {HEADER_LENGTH: str(header_length)})

    def heavy_body(self, body: bytes, decode_in_thread_bytes: int) -> bool:
        """Large bodies and a text model's (tokenizing) decode in a thread."""
        return len(body) >= decode_in_thread_bytes or self.handler.text is not None

    def heavy_output(self, rows: Any) -> bool:
        try:
            return sum(leaf.numel() for leaf in leaves(rows)) >= ENCODE_IN_THREAD_VALUES
        except TypeError:
            return False


def _check_rows(data: Any) -> None:
    """A batched model's inputs share dimension 0, the rows, of which there is at least one."""
    try:
        rows = rows_of(data)
    except (TypeError, ValueError) as error:
        raise errors.InvalidInput(f"this model batches requests along dimension 0, so every "
                                  f"input needs it, with the same size: {error}") from None
    if rows == 0:
        raise errors.InvalidInput("the inputs hold no rows (dimension 0 is 0)")


def _named_outputs(rows: Any, signature: Signature) -> dict[str, torch.Tensor]:
    """The model's output as named tensors: a dict by its keys, else by position."""
    if isinstance(rows, Mapping):
        return {str(name): _as_tensor(value, str(name)) for name, value in rows.items()}
    if isinstance(rows, (tuple, list)) and rows and all(
            isinstance(value, (torch.Tensor, np.ndarray)) for value in rows):
        names = signature.output_names(len(rows))
        return {name: _as_tensor(value, name) for name, value in zip(names, rows)}
    name = signature.output_names(1)[0]
    return {name: _as_tensor(rows, name)}


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        tensor = torch.as_tensor(np.ascontiguousarray(value) if isinstance(value, np.ndarray)
                                 else value)
    except (TypeError, ValueError, RuntimeError):
        raise errors.ModelError(f"output {name!r} is {type(value).__name__}, which the v2 "
                                "protocol cannot carry as a numeric tensor") from None
    return tensor


def _datatype(tensor: torch.Tensor, name: str) -> str:
    datatype = v2_tensors.datatype_name(tensor.dtype)
    if datatype is None:
        raise errors.ModelError(f"output {name!r} is {tensor.dtype}, which has no datatype "
                                "in the v2 protocol")
    return datatype

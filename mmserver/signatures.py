"""A model's inputs and outputs as named, typed tensors, and requests checked against them.

Where a model's signature comes from, in order:

1. ``"inputs"`` and ``"outputs"`` in the folder's ``mmserver.json``, each a list of
   ``{"name": "x", "datatype": "FP32", "shape": [-1, 3]}`` in the order the model
   takes them (``forward``'s parameters) and returns them (its tuple); -1 is a
   dimension of any size, the batch dimension included. Checked at load (400 when
   malformed). Either may be given alone.
2. For ``model.pt2``, the exported program's own signature: its parameter names,
   dtypes and shapes (a dynamic dimension is -1); outputs are ``OUTPUT__0``,
   ``OUTPUT__1``... as exported programs do not name them.
3. Otherwise unknown: one ``INPUT__0`` and one ``OUTPUT__0``, FP32 of shape [-1],
   as placeholders. A request may then name its tensors as it likes.

A known signature is enforced on every v2 request (:func:`matched_inputs`): every
input named, each with its datatype and rank, fixed dimensions equal. SageMaker's
invocations are checked too where the server decodes the body itself (no ``input_fn``)
and the model takes one input (:meth:`Signature.check_rows`): the shape only, since
JSON and CSV always decode to FP32. Either way a client's mistake is a 400 that says
what the model expects, not the model's own error (a 500) from deep inside it. Nothing
here knows HTTP; the datatype names are those of :mod:`mmserver.v2_tensors`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from mmserver.errors import InvalidInput, InvalidModelArtifact, InvalidRequest, ModelError
from mmserver.v2_tensors import BYTES, DATATYPES, MAX_DIMENSIONS, datatype_name

INPUTS_KEY = "inputs"
OUTPUTS_KEY = "outputs"
_SPEC_KEYS = {"name", "datatype", "shape"}
#: Dimension of any size.
ANY_SIZE = -1


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    #: The Open Inference Protocol's datatype name (FP32, INT64, BOOL...).
    datatype: str
    #: -1 (:data:`ANY_SIZE`) for a dimension of any size.
    shape: tuple[int, ...]

    def accepts(self, tensor: torch.Tensor | np.ndarray) -> str | None:
        """Why ``tensor`` does not fit this spec, or None when it does (a NumPy array of
        ``bytes`` is a BYTES tensor)."""
        datatype = BYTES if isinstance(tensor, np.ndarray) else datatype_name(tensor.dtype)
        if datatype != self.datatype:
            return f"input {self.name!r} is {self.datatype}, got {datatype}"
        shape = tuple(tensor.shape)
        if len(shape) != len(self.shape) or any(
                want not in (ANY_SIZE, got) for want, got in zip(self.shape, shape)):
            return f"input {self.name!r} has shape {list(self.shape)}, got {list(shape)}"
        return None


    def rows_mismatch(self, tensor: torch.Tensor) -> str | None:
        """Why ``tensor``'s rows do not fit this spec's shape, in words a person reads
        (dimension 0 counts rows), or None when they fit; the datatype is not checked."""
        shape = tuple(tensor.shape)
        if len(shape) == len(self.shape) and all(
                want in (ANY_SIZE, got) for want, got in zip(self.shape[1:], shape[1:])):
            return None
        got = f"rows of {_row_words(shape[1:])}" if shape else "a single number"
        return (f"expected rows of {_row_words(self.shape[1:])}, got {got} (input "
                f"{self.name!r} has shape {list(self.shape)}, -1 for any size; the body's "
                f"is {list(shape)})")


def _row_words(row_shape: tuple[int, ...]) -> str:
    """One row's shape in words: "16 values", "any number of values", "shape [3, 224, 224]"."""
    if not row_shape:
        return "one value"
    if len(row_shape) == 1:
        return "any number of values" if row_shape[0] == ANY_SIZE else f"{row_shape[0]} values"
    return "shape [" + ", ".join("any" if d == ANY_SIZE else str(d) for d in row_shape) + "]"


PLACEHOLDER_INPUT = TensorSpec("INPUT__0", "FP32", (ANY_SIZE,))
PLACEHOLDER_OUTPUT = TensorSpec("OUTPUT__0", "FP32", (ANY_SIZE,))


@dataclasses.dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...] = (PLACEHOLDER_INPUT,)
    outputs: tuple[TensorSpec, ...] = (PLACEHOLDER_OUTPUT,)
    #: False: the specs are placeholders; requests are not checked against them.
    inputs_known: bool = False
    outputs_known: bool = False

    def output_names(self, count: int) -> list[str]:
        """Names of a model's ``count`` positional outputs (a tensor, or a tuple of them)."""
        if self.outputs_known:
            if count != len(self.outputs):
                raise ModelError(f"the model returned {count} outputs, but its signature "
                                 f"declares {len(self.outputs)}")
            return [spec.name for spec in self.outputs]
        return [f"OUTPUT__{i}" for i in range(count)]

    def check_requested_outputs(self, names: list[str]) -> None:
        """Refuse, before the model runs, outputs a known signature does not have."""
        if not self.outputs_known:
            return
        known = [spec.name for spec in self.outputs]
        for name in names:
            if name not in known:
                raise InvalidRequest(f"the model has no output {name!r}; its outputs: {known}")

    def check_rows(self, data: Any) -> None:
        """Refuse a decoded body whose rows cannot fit the model's one known input (400)."""
        if self.inputs_known and len(self.inputs) == 1 and isinstance(data, torch.Tensor):
            reason = self.inputs[0].rows_mismatch(data)
            if reason is not None:
                raise InvalidInput(reason)

    def matched_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The request's inputs checked against a known signature, in the model's order."""
        if not self.inputs_known:
            return inputs
        known = [spec.name for spec in self.inputs]
        unknown = [name for name in inputs if name not in known]
        if unknown:
            raise InvalidInput(f"the model has no input {unknown[0]!r}; its inputs: {known}")
        missing = [name for name in known if name not in inputs]
        if missing:
            raise InvalidInput(f"input {missing[0]!r} is missing; the model's inputs: {known}")
        for spec in self.inputs:
            reason = spec.accepts(inputs[spec.name])
            if reason is not None:
                raise InvalidInput(reason)
        return {spec.name: inputs[spec.name] for spec in self.inputs}


def declared_specs(entries: object, where: str) -> tuple[TensorSpec, ...] | None:
    """The ``inputs`` or ``outputs`` a folder's settings declare (``where`` names the key), or
    None when they declare none. Malformed: :class:`InvalidModelArtifact`."""
    if entries is None:
        return None
    if not isinstance(entries, list) or not entries:
        raise InvalidModelArtifact(f"{where} must be a non-empty list of "
                                   '{"name", "datatype", "shape"} objects')
    specs: list[TensorSpec] = []
    for position, entry in enumerate(entries):
        at = f"{where}[{position}]"
        if not isinstance(entry, dict) or set(entry) != _SPEC_KEYS:
            raise InvalidModelArtifact(f'{at} must be an object with exactly "name", '
                                       f'"datatype" and "shape", got {entry!r}')
        name, datatype, shape = entry["name"], entry["datatype"], entry["shape"]
        if not isinstance(name, str) or not name:
            raise InvalidModelArtifact(f"{at}: name must be a non-empty string, got {name!r}")
        if any(spec.name == name for spec in specs):
            raise InvalidModelArtifact(f"{at}: the name {name!r} is used twice")
        if datatype not in DATATYPES and datatype != BYTES:
            raise InvalidModelArtifact(f"{at}: datatype must be one of "
                                       f"{', '.join([*DATATYPES, BYTES])}, got {datatype!r}")
        if not isinstance(shape, list) or len(shape) > MAX_DIMENSIONS or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= ANY_SIZE
                for d in shape):
            raise InvalidModelArtifact(f"{at}: shape must be a list of integers >= 0, "
                                       f"or -1 for any size, got {shape!r}")
        specs.append(TensorSpec(name, datatype, tuple(shape)))
    return tuple(specs)


def of_exported_program(program: Any) -> tuple[tuple[TensorSpec, ...] | None,
                                                tuple[TensorSpec, ...] | None]:
    """What a ``torch.export`` program says of its inputs and outputs; None for a side
    that is not a flat list of tensors of known datatypes (nested inputs, say)."""
    try:
        in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
        args_spec, kwargs_spec = in_spec.children_specs
        names = list(program.graph_signature.user_inputs)
        placeholders = {node.name: node for node in program.graph.nodes
                        if node.op == "placeholder"}
        output_node = next(node for node in program.graph.nodes if node.op == "output")
    except (AttributeError, ValueError, StopIteration, TypeError):
        return None, None
    inputs = None
    if kwargs_spec.num_leaves == 0 and all(child.is_leaf() for child in args_spec.children_specs) \
            and len(names) == args_spec.num_leaves:
        inputs = _from_values([(name, placeholders[name].meta.get("val")) for name in names])
    outputs = None
    if out_spec.is_leaf() or (out_spec.type in (tuple, list)
                              and all(child.is_leaf() for child in out_spec.children_specs)):
        produced = {node.name: node for node in output_node.args[0]
                    if isinstance(node, torch.fx.Node)}
        user_outputs = list(program.graph_signature.user_outputs)
        if all(name in produced for name in user_outputs):
            outputs = _from_values([(f"OUTPUT__{i}", produced[name].meta.get("val"))
                                    for i, name in enumerate(user_outputs)])
    return inputs, outputs


def _from_values(named: list[tuple[str, Any]]) -> tuple[TensorSpec, ...] | None:
    specs = []
    for name, value in named:
        if not isinstance(value, torch.Tensor) or datatype_name(value.dtype) is None:
            return None
        shape = tuple(d if isinstance(d, int) else ANY_SIZE for d in value.shape)
        specs.append(TensorSpec(name, datatype_name(value.dtype), shape))
    return tuple(specs) or None


def combined(declared_inputs: tuple[TensorSpec, ...] | None,
             declared_outputs: tuple[TensorSpec, ...] | None,
             file_inputs: tuple[TensorSpec, ...] | None = None,
             file_outputs: tuple[TensorSpec, ...] | None = None) -> Signature:
    """A declaration wins over the model file; what neither knows stays a placeholder."""
    inputs = declared_inputs or file_inputs
    outputs = declared_outputs or file_outputs
    return Signature(inputs=inputs or (PLACEHOLDER_INPUT,),
                     outputs=outputs or (PLACEHOLDER_OUTPUT,),
                     inputs_known=inputs is not None, outputs_known=outputs is not None)

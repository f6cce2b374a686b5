"""Requests as rows: what can be concatenated along dimension 0, and how it is cut back.

A request's input is a tensor whose dimension 0 counts the client's rows, or a
dict, tuple or list of such tensors sharing dimension 0 (what a tokenizer
returns: ``input_ids`` and ``attention_mask``). Two inputs can share a batch
when their *batch keys* are equal: same structure, and for every tensor the
same shape beyond dimension 0, dtype and device. The model's output is cut
back the same way, one piece of rows per request.

Token sequences (``sequences.Sequences``, a text model's rows) are rows of
different lengths: they all share one batch key, and concatenating them is
collation, which pads them to the batch's longest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmserver.batching.sequences import Sequences, collate
from mmserver.errors import ModelError


def leaves(data: Any) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, Mapping):
        return [leaf for value in data.values() for leaf in leaves(value)]
    if isinstance(data, (tuple, list)) and data:
        return [leaf for value in data for leaf in leaves(value)]
    raise TypeError(f"a request must be a torch.Tensor (or a dict, tuple or list of tensors), "
                    f"got {type(data).__name__}")


def rows_of(data: Any) -> int:
    """Dimension 0, which every tensor of the input must share."""
    if isinstance(data, torch.Tensor) and data.dim() > 0:  # the common case, checked cheaply
        return data.shape[0]
    if isinstance(data, Sequences):
        return len(data)
    sizes = set()
    for leaf in leaves(data):
        if leaf.dim() == 0:
            raise ValueError("a request must have a batch dimension (dimension 0 counts rows)")
        sizes.add(int(leaf.shape[0]))
    if len(sizes) != 1:
        raise ValueError(f"the tensors of one request must share dimension 0, got {sorted(sizes)}")
    return sizes.pop()


def batch_key(data: Any) -> Any:
    """Inputs with equal keys can be concatenated along dimension 0."""
    if isinstance(data, torch.Tensor):
        return (tuple(data.shape[1:]), data.dtype, data.device)
    if isinstance(data, Sequences):
        return ("sequences", data.pad_id)
    if isinstance(data, Mapping):
        return ("dict", tuple((k, batch_key(v)) for k, v in data.items()))
    return (type(data).__name__, tuple(batch_key(v) for v in data))


def concatenate(inputs: list[Any]) -> Any:
    """The batch of ``inputs`` (one request's input as it is, unless it must be collated)."""
    first = inputs[0]
    if isinstance(first, Sequences):
        return collate(inputs)
    if len(inputs) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(inputs, dim=0)
    if isinstance(first, Mapping):
        return {k: concatenate([x[k] for x in inputs]) for k in first}
    return type(first)(concatenate([x[i] for x in inputs]) for i in range(len(first)))


def moved(data: Any, device: torch.device | None, *, to_cpu: bool = False) -> Any:
    if isinstance(data, torch.Tensor):
        return data.detach().cpu() if to_cpu else data.to(device, non_blocking=True)
    if isinstance(data, Mapping):
        return {k: moved(v, device, to_cpu=to_cpu) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(moved(v, device, to_cpu=to_cpu) for v in data)
    return data


def split_rows(output: Any, sizes: Sequence[int]) -> list[Any]:
    """Cut a batched output back into per-request pieces along dimension 0."""
    if isinstance(output, torch.Tensor):
        if output.dim() == 0 or output.shape[0] != sum(sizes):
            raise ModelError(
                f"the model returned shape {tuple(output.shape)} for a batch of "
                f"{sum(sizes)} rows; its output must have one row per input row"
            )
        return list(torch.split(output, list(sizes)))
    if isinstance(output, Mapping):
        parts = {k: split_rows(v, sizes) for k, v in output.items()}
        return [{k: parts[k][i] for k in parts} for i in range(len(sizes))]
    if isinstance(output, (tuple, list)):
        parts = [split_rows(v, sizes) for v in output]
        return [type(output)(p[i] for p in parts) for i in range(len(sizes))]
    raise ModelError(
        f"the model returned {type(output).__name__}; expected a tensor "
        "(or a tuple, list or dict of tensors) with one row per input row"
    )


def parameters_device(model: Any) -> torch.device | None:
    """Where a module's parameters are (where its batches go); None for a plain function."""
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        try:
            return next(iter(parameters())).device
        except (StopIteration, TypeError, RuntimeError):
            pass
    return None

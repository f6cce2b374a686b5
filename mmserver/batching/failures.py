"""What a failed model call means for its requests: out of memory, or a model error.

An out-of-memory batch is worth retrying smaller; any other failure is the
request's own answer, with the one line of the error that says what went wrong.
"""

from __future__ import annotations

import torch

from mmserver.errors import ModelError, ModelOutOfMemory, summarize_error
from mmserver.workers import UserCodeExit


def is_out_of_memory(error: BaseException) -> bool:
    """Host or device memory ran out (``MemoryError``, ``torch.OutOfMemoryError``)."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError))


def as_model_error(error: BaseException, name: str) -> ModelError:
    if isinstance(error, ModelError):
        return error
    kind = ModelOutOfMemory if is_out_of_memory(error) else ModelError
    cause = error.__cause__ if isinstance(error, UserCodeExit) else error
    wrapped = kind(
        f"model {name!r} failed: {cause.__class__.__name__}: {summarize_error(cause)}")
    wrapped.__cause__ = error
    return wrapped

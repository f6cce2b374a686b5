"""What each request calls, chosen once at load by :meth:`ModelHandler._resolve
<mmserver.handler.folder.ModelHandler>`: the decode, predict and encode steps built from
the script's functions or the defaults.

A row-wise model's requests reach the runner as rows (batched with others); any other
script's as a :class:`OneRequest`, its input and its context together, one call each.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from mmserver import codecs, signatures
from mmserver.batching.rows import rows_of
from mmserver.errors import (
    InvalidInput,
    MMServerError,
    ModelError,
    NotAcceptable,
    UnsupportedContentType,
)
from mmserver.handler.toolkit import (
    RequestContext,
    UserFunction,
    body_for_user_code,
    describe_error,
    response_from,
)


@dataclasses.dataclass(frozen=True)
class OneRequest:
    """A request that is not batched with others: its input (or body) and its context."""

    data: Any
    context: RequestContext


def transform_body(body: bytes, context: RequestContext) -> OneRequest:
    return OneRequest(body_for_user_code(body, context.content_type), context)


def checked_default_input(signature: signatures.Signature):
    def read(body: bytes, context: RequestContext) -> Any:
        data = codecs.decode(body, context.content_type)
        signature.check_rows(data)
        return data
    return read


def user_input(input_fn: UserFunction):
    def read(body: bytes, context: RequestContext) -> Any:
        payload = body_for_user_code(body, context.content_type)
        return input_fn.call_or_raise(_input_error, request_body=payload,
                                      request_content_type=context.content_type, context=context)
    return read


def _input_error(error: BaseException) -> MMServerError:
    if isinstance(error, ValueError) and str(error).lower().startswith("unsupported content type"):
        return UnsupportedContentType(str(error))
    return InvalidInput(f"input_fn rejected the body: {describe_error(error)}")


def row_wise_input(read):
    def decode(body: bytes, context: RequestContext) -> Any:
        data = read(body, context)
        try:
            rows_of(data)
        except (TypeError, ValueError) as error:
            raise ModelError(
                f"input_fn returned {type(data).__name__}, but a row-wise model needs a tensor "
                f"(or a dict, tuple or list of tensors) whose dimension 0 counts rows: {error}"
            ) from error
        return data
    return decode


def one_request_input(read):
    def decode(body: bytes, context: RequestContext) -> OneRequest:
        return OneRequest(read(body, context), context)
    return decode


def default_call(model: Any) -> Callable[[Any], Any]:
    """The default predict_fn's call: ``model(batch)``, or ``model(*batch.values())`` when
    ``forward`` takes several tensors and the batch is a dict of them (in the model's order)."""
    if _positional_parameters(model) < 2:
        return model

    def call(batch: Any) -> Any:
        return model(*batch.values()) if isinstance(batch, Mapping) else model(batch)
    return call


def _positional_parameters(model: Any) -> int:
    """How many tensors ``model`` takes by position (2 for ``*args``; 1 when unknown)."""
    schema = getattr(getattr(model, "forward", None), "schema", None)
    if schema is not None:  # TorchScript: the first argument is self
        return len(schema.arguments) - 1
    try:
        parameters = inspect.signature(getattr(model, "forward", model)).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(1 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def default_output(rows: Any, context: RequestContext) -> tuple[bytes, str]:
    try:
        return codecs.encode(rows, context.accept)
    except MMServerError:
        raise
    except Exception as error:
        raise ModelError(f"the default output_fn cannot encode the prediction "
                         f"({type(rows).__name__}): {describe_error(error)}") from error


def user_output(output_fn: UserFunction):
    def encode(rows: Any, context: RequestContext) -> tuple[bytes, str]:
        result = output_fn.call_or_raise(_output_error, prediction=rows, accept=context.accept,
                                         context=context)
        return response_from(result, context.accept, "output_fn")
    return encode


def _output_error(error: BaseException) -> MMServerError:
    if isinstance(error, ValueError) and str(error).lower().startswith("unsupported accept type"):
        return NotAcceptable(str(error))
    return ModelError(f"output_fn raised {describe_error(error)}")

"""SageMaker's inference toolkit calling convention: how each handler function is called.

Read from the toolkit's ``Transformer`` (behaviour only; docs/design.md section 6):
every handler function gets its arguments by position, plus the context by position
when it takes exactly one parameter more; JSON and CSV bodies arrive as ``str``;
``output_fn`` and ``transform_fn`` answer a body or ``(body, content_type)``.
``handler.folder`` decides *when* each function runs; this module only says *how*.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from mmserver import codecs
from mmserver.errors import (
    InvalidInput,
    InvalidModelArtifact,
    MMServerError,
    ModelError,
    summarize_error,
)

#: Bodies of exactly these Content-Types reach input_fn and transform_fn as str.
TEXT_TYPES = ("application/json", "text/csv")
#: Each handler function and the arguments the toolkit passes it (the context comes after).
HANDLER_PARAMETERS = {
    "pre_model_fn": ("model_dir",),
    "model_fn": ("model_dir",),
    "model_warmup_fn": ("model_dir", "model"),
    "input_fn": ("request_body", "request_content_type"),
    "predict_fn": ("data", "model"),
    "output_fn": ("prediction", "accept"),
    "transform_fn": ("model", "request_body", "content_type", "accept"),
}


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """What a handler may want to know about the request besides its body."""

    model_name: str
    #: The header as the client sent it, None when absent: user code sees what the toolkit
    #: passes (AWS's own resnet18 ``transform_fn`` accepts a missing type). The default
    #: decoders read a missing type as JSON (``codecs.media_type``).
    content_type: str | None
    accept: str
    custom_attributes: str | None = None

    @classmethod
    def from_headers(cls, model_name: str, content_type: str | None, accept: str | None,
                     custom_attributes: str | None, default_accept: str) -> RequestContext:
        """The toolkit's Accept default: a missing or ``*/*`` Accept becomes
        ``default_accept`` (``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``). The
        Content-Type is passed on as sent."""
        if not accept or not accept.strip() or accept.strip() == "*/*":
            accept = default_accept
        return cls(model_name, content_type, accept, custom_attributes)


@dataclasses.dataclass(frozen=True)
class LoadContext:
    """The context handed to load-time functions; ``system_properties`` as TorchServe names them."""

    model_dir: str
    system_properties: Mapping[str, Any]


class UserFunction:
    """A function of the script, called as the toolkit calls it: with the context when it takes one more parameter."""

    def __init__(self, name: str, function: Callable):
        self.name = name
        self.function = function
        self._context_keyword: str | None = None
        self._takes_context = False
        expected = len(HANDLER_PARAMETERS[name])
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: call it plainly
            return
        if len(parameters) == expected + 1:
            self._takes_context = True
            last = parameters[-1]
            if last.kind is inspect.Parameter.KEYWORD_ONLY:
                self._context_keyword = last.name
            elif last.kind is inspect.Parameter.VAR_KEYWORD:
                self._context_keyword = "context"
        elif len(parameters) != expected:
            raise InvalidModelArtifact(
                f"{name} takes {len(parameters)} parameters; it is called with {expected} "
                f"({', '.join(HANDLER_PARAMETERS[name])}), or {expected + 1} with the context")

    def __call__(self, *, context: Any, **arguments: Any) -> Any:
        """Call it with ``arguments`` named as in :data:`HANDLER_PARAMETERS`, in that order."""
        names = HANDLER_PARAMETERS[self.name]
        if arguments.keys() != set(names):
            raise TypeError(f"{self.name} is called with {', '.join(names)}, "
                            f"not {', '.join(arguments)}")
        args = [arguments[name] for name in names]
        if not self._takes_context:
            return self.function(*args)
        if self._context_keyword is not None:
            return self.function(*args, **{self._context_keyword: context})
        return self.function(*args, context)

    def call_or_raise(self, fail: Callable[[BaseException], MMServerError], *, context: Any,
                      **arguments: Any) -> Any:
        """Call it; anything it raises but our own errors becomes ``fail(error)``.

        ``BaseException`` too: a script's ``sys.exit()`` fails its call, never the server.
        """
        try:
            return self(context=context, **arguments)
        except MMServerError:
            raise
        except BaseException as error:
            raise fail(error) from error


def describe_error(error: BaseException) -> str:
    """``Kind: the line that says what went wrong``; a script's exit says what probably caused it."""
    if isinstance(error, SystemExit):
        return (f"SystemExit (code {error.code!r}): the script exited, by sys.exit() or by "
                "argparse parsing the server's command line; guard it with "
                "if __name__ == '__main__'")
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt"
    return f"{error.__class__.__name__}: {summarize_error(error)}"


def body_for_user_code(body: bytes, content_type: str | None) -> str | bytes:
    """JSON and CSV bodies as text, others as bytes, as the toolkit hands them over."""
    if content_type not in TEXT_TYPES:
        return body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidInput(f"the {content_type} body is not UTF-8: {error}") from None


def response_from(result: Any, accept: str, source: str) -> tuple[bytes, str]:
    """``body`` or ``(body, content_type)``; a bare body is labelled with the Accept type."""
    if isinstance(result, tuple) and len(result) == 2:
        body, content_type = result
    else:
        body, content_type = result, accept.split(",")[0].strip()
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ModelError(f"{source} must return bytes or str, optionally as (body, content_type); "
                         f"got {type(body).__name__}")
    if not isinstance(content_type, str) or not content_type or "*" in content_type:
        content_type = codecs.JSON
    return bytes(body), content_type

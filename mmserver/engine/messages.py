"""The messages between an HTTP worker and its engine: one dataclass per kind, and the
operations a worker may ask, derived from the :class:`~mmserver.http.service.ModelService`.

Why typed: each end reads a message by its kind, never by guessing from its shape, so a
kind one end does not know is a :class:`ProtocolError` (the connection is closed, and the
log says why), never taken for something else. Why derived: a method added to
``ModelService`` is an operation a worker may ask, with no second list in the engine or
the client to forget (:data:`OPERATIONS`).

On the wire a message is a tuple, its kind's number first and then its fields in order,
pickled (``channel``): no class names cross, so a message of a few small fields stays a
few dozen bytes, and decoding it is a lookup and a call. A tensor rides in a message as a
descriptor: where it lies in shared memory, or, when small (``shared.INLINE_MAX_BYTES``), its
bytes (``shared``).

``request_id`` numbers one worker's requests on its connection; each :class:`Ask` and
each invocation of a :class:`Rows` is answered exactly once, by a :class:`Result`, an
answer in a :class:`RowsResult` or a :class:`Failed`, out of order. The kinds of the hot
path (rows and their answers) and the notices are *gathered*: what one turn of a loop makes
leaves as one message of the kind, whose field is a tuple of items.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from mmserver.errors import MMServerError, QueueFull
from mmserver.http.service import ModelService


class ProtocolError(Exception):
    """A message no kind describes (an unknown kind number, the wrong number of fields,
    not a tuple), or a kind this end never receives: the peer does not speak this version
    of the protocol, so nothing it sends can be trusted to mean what it says."""


# -- a worker to its engine ----------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Ask:
    """A call of the operation ``method`` (one of :data:`OPERATIONS`) with its positional
    ``arguments``, as plain data (an invocation's body as bytes, not a request)."""

    request_id: int
    method: str
    arguments: tuple


@dataclasses.dataclass(slots=True)
class Rows:
    """Invocations the worker decoded (those of one turn of its loop: ``Channel.gather``):
    each ``(request_id, model name, generation, descriptor)``, its rows at ``descriptor``
    (``shared.pack``: in the requests' arena, or inline), decoded with the codecs of the
    model's load ``generation``. One message for a burst: the engine reads and dispatches
    it once, not once per request."""

    invocations: tuple[tuple[int, str, int, Any], ...]


@dataclasses.dataclass(slots=True)
class Cancel:
    """The request's client went away: the engine stops its work (a queued invocation
    leaves the queue uncomputed), and still answers it."""

    request_id: int


@dataclasses.dataclass(slots=True)
class Free:
    """The worker has read the answer rows at these offsets of the answers' arena (those
    of one turn of its loop: ``Channel.gather``)."""

    offsets: tuple[int, ...]


@dataclasses.dataclass(slots=True)
class Count:
    """Invocations the worker answered, for the engine's one set of metrics (those of one
    turn of its loop: ``Channel.gather``)."""

    #: Each ``(model name, status, seconds, a 503's reason or None)``.
    invocations: tuple[tuple[str, int, float, str | None], ...]


@dataclasses.dataclass(slots=True)
class Refused:
    """The worker answered 503 for model ``name``'s full queue (counted as rejected)."""

    name: str


@dataclasses.dataclass(slots=True)
class Stages:
    """Answers the worker encoded, each ``(model name, success, queue, compute_input,
    compute_infer, compute_output)`` in seconds (``batching.stats.STAGES``), into the
    models' statistics (those of one turn of its loop: ``Channel.gather``)."""

    answers: tuple[tuple[str, float, float, float, float, float], ...]


# -- the engine to a worker -----------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Result:
    """An :class:`Ask`'s answer: what the operation returned, as plain data."""

    request_id: int
    value: Any


@dataclasses.dataclass(slots=True)
class RowsResult:
    """Answers to :class:`Rows` (those of one turn of the engine's loop: ``Channel.gather``),
    each ``(request_id, descriptor, region, queue_seconds, infer_seconds)``: the answer's
    rows at ``descriptor`` in the answers' arena, to be freed (:class:`Free`) at ``region``
    once read (None: nothing lies there), and the request's seconds in the queue and in its
    model call (Triton's queue and compute_infer), which the worker adds to the stages it
    timed itself."""

    answers: tuple[tuple[int, Any, int | None, float, float], ...]


@dataclasses.dataclass(slots=True)
class Failed:
    """An :class:`Ask`'s or a :class:`Rows` invocation's failure: the domain error the worker
    raises (the same status and body as one process), or None: the worker answers 500, and
    the cause is in the engine's log."""

    request_id: int
    error: MMServerError | None


@dataclasses.dataclass(slots=True)
class Changed:
    """Model ``name`` was loaded or unloaded: workers forget its codecs."""

    name: str


@dataclasses.dataclass(slots=True)
class Admission:
    """Model ``name``'s runner refuses (``refusal``) or admits again (None): workers
    refuse before reading a body, as the runner would."""

    name: str
    refusal: QueueFull | None


def dispatch(handlers: dict[type, Callable[[Any], None]], messages: list, side: str,
             sender: str) -> None:
    """Hand each of ``messages`` (from ``sender``) to the handler of its kind; a kind ``side``
    does not take is a protocol error, never taken for another."""
    for message in messages:
        handler = handlers.get(type(message))
        if handler is None:
            raise ProtocolError(f"{side} takes no {type(message).__name__} message from {sender}")
        handler(message)


#: Every kind, its number its place here: append new kinds, never reorder.
KINDS: tuple[type, ...] = (Ask, Rows, Cancel, Free, Count, Refused,
                           Result, RowsResult, Failed, Changed, Admission, Stages)


def _encoder(number: int, kind: type) -> Callable[[Any], tuple]:
    """``lambda m: (number, m.field1, m.field2, ...)``, written out as ``dataclasses`` writes
    ``__init__``: half the time of a generic getter, on every message of the hot path."""
    fields = "".join(f" m.{field.name}," for field in dataclasses.fields(kind))
    return eval(f"lambda m: ({number},{fields})")  # noqa: S307 - our own field names


_ENCODERS: dict[type, Callable[[Any], tuple]] = {
    kind: _encoder(number, kind) for number, kind in enumerate(KINDS)}
_DECODERS: dict[int, type] = dict(enumerate(KINDS))


def encode(message: Any) -> tuple:
    """``message`` as the tuple that crosses: its kind's number, then its fields."""
    try:
        return _ENCODERS[type(message)](message)
    except KeyError:
        raise ProtocolError(f"{type(message).__name__} is not a message") from None


def decode(value: Any) -> Any:
    """The message a received tuple is; :class:`ProtocolError` when it is none."""
    try:
        if type(value) is tuple:
            return _DECODERS[value[0]](*value[1:])
    except (KeyError, IndexError, TypeError):
        pass
    raise ProtocolError(f"not a message of this protocol: {_quoted(value)}")


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the operations ---------------------------------------------------------------------------


def service_methods(protocol: type = ModelService) -> tuple[str, ...]:
    """The protocol's operations: its public coroutine methods, in the order it declares
    them. Each takes positional arguments only, which is how an :class:`Ask` carries them."""
    names = []
    for name, member in vars(protocol).items():
        if name.startswith("_") or not inspect.iscoroutinefunction(member):
            continue
        kinds = {p.kind for p in inspect.signature(member).parameters.values()}
        if kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}:
            raise TypeError(f"{protocol.__name__}.{name}: an operation takes positional "
                            "arguments only (they cross to the engine as a tuple)")
        names.append(name)
    return tuple(names)


#: What only a worker asks of its engine, beside the service's operations: a model's
#: row codecs, so that the worker decodes its requests itself (``client``).
ENGINE_OPERATIONS = ("row_codecs",)
#: Every operation an :class:`Ask` may name; nothing else of the engine is reachable.
OPERATIONS: tuple[str, ...] = service_methods() + ENGINE_OPERATIONS

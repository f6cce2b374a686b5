"""The invocation pipeline: one request's body to its encoded answer, every wait bounded.

The steps are the same for both protocols; what differs is the *wire*
(:class:`Wire`): how a body becomes the runner's input and its output an
answer. The two wires live beside this module, in :mod:`mmserver.wires`:
SageMaker's toolkit wire (the model's ``input_fn``/``output_fn`` or the default
codecs) and the v2 protocol's tensors. Either way a request takes a slot in
the same runner queue, under the same admission, payload limit and deadline,
and counts as an invocation of the model, so unloading it waits for both kinds
alike.

The steps, in order, and what each answers when it fails (the HTTP layer turns
the errors into status codes):

1. **Admission, before the body is read.** A full queue (503), a stuck model
   (503) or a body whose ``Content-Length`` is over the payload limit (413)
   is refused before the handler reads a byte of the body: the server parses
   only the request's head, and after answering reads and drops what of the
   body is still arriving (for at most ``http.app.LINGERING_SECONDS``, so the
   client can read the answer), little beside decoding and computing it. The wire checks its headers too
   (:meth:`Wire.admit`: the ``Accept`` header, 406, when the default encoders answer).
2. **The body**, read within ``body_timeout_seconds`` (408). A slow or
   incomplete body holds *no* queue slot: the slot is taken only once the
   body has arrived, so a thousand trickling sockets cannot fill a queue.
3. **A slot**, then **decoding.** Small bodies for the default decoders are
   decoded on the event loop (a thread handoff would cost more than the
   work); large bodies and images in the server's decode threads; a model's
   own ``input_fn`` in that model's threads, so a slow one stalls nobody else.
4. **The model**, through the model's ``ModelRunner``.
5. **Encoding**, by the defaults (on the loop for small outputs, in the decode
   threads for large ones) or by the model's ``output_fn`` in its threads.

A thread frees the event loop only while the work in it releases the GIL: numpy and
torch mostly do, but ``json.loads`` of a large body holds it for the whole parse, so
large inputs are best sent as ``.npy`` (notebook 12 measures both).

Steps 3 to 5 together are bounded by ``model_server_timeout_seconds`` (504). They are
:meth:`InvocationPipeline.answer` in every process: only step 4 differs, the runner here
or, in an HTTP worker, the rows sent to the engine that holds the model (``engine.client``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import torch

from mmserver.batching.pending import QueuedRequest
from mmserver.batching.reservation import Reservation
from mmserver.config import Settings
from mmserver.errors import BodyTimeout, InvocationTimeout, MMServerError, PayloadTooLarge
from mmserver.workers import WorkerPool

#: Outputs with at least this many numbers are encoded in a worker thread: writing 100,000
#: numbers as JSON takes a few hundred milliseconds that the event loop must not lose.
ENCODE_IN_THREAD_VALUES = 16_384


@dataclasses.dataclass(frozen=True)
class Answer:
    body: bytes
    content_type: str
    #: Headers the protocol adds to the answer (v2's Inference-Header-Content-Length).
    headers: Mapping[str, str] | None = None


class Wire:
    """One protocol's half of an invocation: its body to the runner's input, the output back.

    :meth:`decode` and :meth:`encode` may run in a worker thread, one after the other,
    so a wire may keep what it learnt from the body for the answer (one wire per request).
    """

    #: decode/encode run the model's own code: in that model's threads, whatever the size.
    user_code = False

    def admit(self) -> None:
        """Refuse, before the body is read, what the headers alone rule out."""

    def decode(self, body: bytes) -> Any:
        raise NotImplementedError

    def encode(self, rows: Any) -> Answer:
        raise NotImplementedError

    def heavy_body(self, body: bytes, decode_in_thread_bytes: int) -> bool:
        """Decoding costs more than a thread handoff."""
        return len(body) >= decode_in_thread_bytes

    def heavy_output(self, rows: Any) -> bool:
        """Encoding costs more than a thread handoff."""
        return (isinstance(rows, torch.Tensor) and rows.numel() >= ENCODE_IN_THREAD_VALUES
                or isinstance(rows, np.ndarray) and rows.size >= ENCODE_IN_THREAD_VALUES)


@dataclasses.dataclass(frozen=True)
class Invocation:
    """One invoke request as the pipeline sees it: its wire and a way to read the body."""

    wire: Wire
    content_length: int | None
    #: Reads the whole body, raising PayloadTooLarge past the given number of bytes.
    read_body: Callable[[int], Awaitable[bytes]]
    #: The whole body is already buffered (the common small request): no timeout needed.
    body_arrived: bool = False


def check_payload_size(size: int, limit: int) -> None:
    """The payload limit, for a ``Content-Length`` before reading and for a chunked body while
    it arrives."""
    if size > limit:
        raise PayloadTooLarge(f"the body is {size} bytes or more; the limit is {limit} "
                              "(SAGEMAKER_MAX_PAYLOAD_IN_MB)")


async def read_chunks_within(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """A body of unannounced length, joined from ``chunks``; past ``limit`` bytes it is 413 as
    it arrives, without reading the rest."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        check_payload_size(size, limit)
        parts.append(chunk)
    return b"".join(parts)


class InvocationPipeline:
    """Runs invocations against loaded models under one server's settings. ``model``: a
    :class:`~mmserver.loaded_model.LoadedModel` (its runner, codec threads, invocation count),
    which runs its invocations here."""

    def __init__(self, settings: Settings, decode_pool: WorkerPool | None = None):
        self.settings = settings
        self.decode_pool = decode_pool or WorkerPool("decode", workers=2)

    def close(self) -> None:
        self.decode_pool.close()

    async def run(self, model: Any, invocation: Invocation) -> Answer:
        settings, wire = self.settings, invocation.wire
        runner = model.runner
        if invocation.content_length is not None:
            check_payload_size(invocation.content_length, settings.max_payload_bytes)
        runner.check_admission()
        wire.admit()
        body = await read_whole_body(invocation.read_body, invocation.body_arrived, settings)
        with model.invocation(), runner.reserve() as slot:
            return await self.answer(model.name, wire, body,
                                     functools.partial(_through_runner, slot, runner.stats),
                                     model.codec_pool)

    async def answer(self, name: str, wire: Wire, body: bytes, model_step: ModelStep,
                     codec_pool: WorkerPool | None = None) -> Answer:
        """Steps 3 to 5, the one path from a read body to its answer in every process:
        decode, ``model_step`` (this process's runner, or an HTTP worker's engine), encode,
        all within one deadline (504 past it), and the request's seconds per stage to
        whoever keeps the model's statistics."""
        # One deadline for the rest, checked by the runner's own timer and by the awaits on
        # worker threads: cheaper per request than a timeout context around it all.
        received = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + self.settings.model_server_timeout_seconds
        try:
            data = await run_on(self.decoding_pool(wire, body, codec_pool), deadline,
                                wire.decode, body)
            decoded = time.perf_counter()
            called = await model_step(data, deadline)
            answered = time.perf_counter()
            try:
                answer = await run_on(self.encoding_pool(wire, called.rows, codec_pool),
                                      deadline, wire.encode, called.rows)
            except BaseException:
                called.settled(None)
                raise
            called.settled(stage_seconds(called.queue_seconds, called.infer_seconds, received,
                                         decoded, answered, time.perf_counter()))
            return answer
        except InvocationTimeout:
            raise self.timed_out(name) from None

    def decoding_pool(self, wire: Wire, body: bytes, codec_pool: WorkerPool | None = None
                      ) -> WorkerPool | None:
        """Where ``wire`` decodes ``body`` (step 3): the model's threads for its own code, the
        decode threads for a large body or an image, else (None) on the event loop, where a
        small body costs less than a thread handoff."""
        if wire.user_code:
            return codec_pool
        if wire.heavy_body(body, self.settings.decode_in_thread_bytes):
            return self.decode_pool
        return None

    def encoding_pool(self, wire: Wire, rows: Any, codec_pool: WorkerPool | None = None
                      ) -> WorkerPool | None:
        """Where ``wire`` encodes ``rows`` (step 5), by the same rule."""
        if wire.user_code:
            return codec_pool
        return self.decode_pool if wire.heavy_output(rows) else None

    def submit_rows(self, model: Any, inputs: list[Any],
                    answered: Callable[[int, QueuedRequest], None]
                    ) -> tuple[list[QueuedRequest], MMServerError | None]:
        """Requests another process decoded (an HTTP worker's message to the engine), queued
        now: steps 4 on, without a coroutine, so that the engine takes a burst of them with
        one admission check and answers each from one callback. The deadline and
        ``model.invocation()`` are :meth:`run`'s; admission is the runner's
        (``ModelRunner.submit_many``). ``answered(position, request)`` is called once each
        queued request's future is done (its rows, or the error, a timeout as
        :meth:`timed_out`'s once the caller asks); a caller that gives up cancels the future.
        Returns the queued requests and the refusal of those that were not (the last ones)."""
        deadline = asyncio.get_running_loop().time() + self.settings.model_server_timeout_seconds
        invocation = model.invocation()

        def ended(position: int, request: QueuedRequest) -> None:
            invocation.ended()
            answered(position, request)
        requests, refusal = model.runner.submit_many(inputs, deadline=deadline, answered=ended)
        if requests:  # before any can end: their futures' callbacks run in a later turn
            invocation.enter(len(requests))
        return requests, refusal

    def timed_out(self, name: str) -> InvocationTimeout:
        """What an invocation of model ``name`` past ``model_server_timeout_seconds`` answers
        (504)."""
        return InvocationTimeout(
            f"model {name!r} did not answer within "
            f"{self.settings.model_server_timeout_seconds:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT)")


@dataclasses.dataclass(frozen=True, slots=True)
class Called:
    """What the model step of one request gave: its answer's rows, the seconds it waited in
    the runner's queue and its batch's call took, and ``settled``, called once the answer is
    encoded with its seconds per stage (:func:`stage_seconds`), or with None if encoding
    failed: the step's owner records them and frees what the rows lie in."""

    rows: Any
    queue_seconds: float
    infer_seconds: float
    settled: Callable[[tuple[float, ...] | None], None]


#: Step 4 of :meth:`InvocationPipeline.answer`: decoded rows and the deadline (the loop's
#: clock) to what the model gave.
ModelStep = Callable[[Any, float], Awaitable[Called]]


async def _through_runner(slot: Reservation, stats: Any, data: Any, deadline: float) -> Called:
    """Step 4 in this process: the rows through the model's runner, on the slot taken for them."""
    rows = await slot.submit(data, deadline=deadline)
    request = slot.queued

    def settled(stages: tuple[float, ...] | None) -> None:
        if stages is not None:
            stats.stages.add(*stages)

    return Called(rows, request.started - request.arrival, request.ended - request.started,
                  settled)


def stage_seconds(queue_seconds: float, infer_seconds: float, received: float,
                  decoded: float, answered: float, encoded: float) -> tuple[float, ...]:
    """One request answered with a result, as Triton's stages (``batching.stats.STAGES``):
    from its body's arrival (``received``) to its answer's end (``encoded``), decoding
    (compute_input), its queue and call times from the runner (queue, compute_infer) and
    encoding (compute_output); the rest of ``success`` is the loop's hand-offs
    (perf_analyzer's "overhead")."""
    return (encoded - received, queue_seconds, decoded - received, infer_seconds,
            encoded - answered)


def read_whole_body(read_body: Callable[[int], Awaitable[bytes]], body_arrived: bool,
                    settings: Settings) -> Awaitable[bytes]:
    """A body read within the payload limit (413) and, unless it has already arrived (the
    common small request, no timeout needed), within the body timeout (408). Not a
    coroutine itself, so a buffered body costs no extra frame on the hot path."""
    reading = read_body(settings.max_payload_bytes)
    return reading if body_arrived else read_within(reading, settings.body_timeout_seconds)


async def read_within(reading: Awaitable[bytes], timeout: float) -> bytes:
    """A body read within ``timeout`` seconds, else :class:`BodyTimeout` (408)."""
    try:
        async with asyncio.timeout(timeout):
            return await reading
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {timeout:g} s "
                          "(MMSERVER_BODY_TIMEOUT)") from None


async def run_on(pool: WorkerPool | None, deadline: float, function: Callable[[Any], Any],
                 argument: Any) -> Any:
    """``function(argument)`` on ``pool``'s threads, or InvocationTimeout at ``deadline`` (the
    loop's clock); with no pool, here on the event loop, where a small body or answer costs less
    than a thread handoff (``decoding_pool`` and ``encoding_pool`` choose)."""
    if pool is None:
        return function(argument)
    try:
        return await asyncio.wait_for(pool.run(function, argument),
                                      deadline - asyncio.get_running_loop().time())
    except TimeoutError:
        raise InvocationTimeout("the deadline passed") from None

"""Domain errors: one family, each class saying what went wrong in words a caller can act on.

Every error the package raises on purpose derives from :class:`MMServerError`,
and ``str(error)`` is the message sent to the client. Only ``app`` knows HTTP:
it looks a status code up by walking the error's class hierarchy
(``http.errors.STATUS_BY_ERROR``), so a subclass inherits its parent's status unless
it has its own and the order of the table cannot matter.

This module imports nothing, so ``batching`` (which notebooks run on its own)
can share the family without pulling in the rest of the package.
"""

from __future__ import annotations

import enum


class Unavailable(enum.StrEnum):
    """Why a request was answered 503: each reason is an error class of its own below, the
    ``reason`` label of ``mmserver_requests_unavailable_total``, a word in the log line, and
    a row of its own in the load tests' counts (only a full queue is shed load)."""

    #: The model's queue holds ``max_queue_size`` requests: load shed on purpose.
    QUEUE_FULL = "queue_full"
    #: A call into the model is stuck past the invocation timeout.
    UNHEALTHY = "unhealthy"
    #: The model's process died and a new one is loading it again.
    LOADING = "loading"
    #: With ``--http-workers``: the engine that holds the models is gone or restarting.
    ENGINE_UNAVAILABLE = "engine_unavailable"
    #: On a Ray cluster: the replica given the request died before it answered, twice.
    REPLICA_UNAVAILABLE = "replica_unavailable"
    #: SIGTERM: the server is draining its models and will not serve this request.
    SHUTTING_DOWN = "shutting_down"


class MMServerError(Exception):
    """Base class; ``str(error)`` is the message sent to the client."""

    #: Why, for an error answered 503 (every such class sets it); None for the others.
    unavailable: Unavailable | None = None


# -- the request ------------------------------------------------------------------


class InvalidRequest(MMServerError):
    """The request itself is malformed: wrong fields, bad name, bad query."""


class UrlOutsideModelRoots(InvalidRequest):
    """A model url, or a file a model folder uses, resolves outside every model root."""


class InvalidInput(MMServerError):
    """The request body could not be decoded into model input."""


class UnsupportedContentType(InvalidInput):
    """No decoder for the request's Content-Type."""


class NotAcceptable(MMServerError):
    """No encoder for any type the request's Accept header allows."""


class PayloadTooLarge(MMServerError):
    """The body is larger than SAGEMAKER_MAX_PAYLOAD_IN_MB (or an image has too many pixels)."""


class BodyTimeout(MMServerError):
    """The client did not send its whole body within the body-read timeout."""


class Unauthorized(MMServerError):
    """A management call without the bearer token that MMSERVER_MANAGEMENT_TOKEN requires."""


# -- loading and the set of models ------------------------------------------------


class InvalidModelArtifact(MMServerError):
    """The model directory exists but cannot become a model (its code or files are wrong)."""


class ModelUrlNotFound(MMServerError):
    """The model url names nothing on disk."""


class ModelNotFound(MMServerError):
    """No model of that name is loaded (or it is being unloaded)."""


class ModelAlreadyLoaded(MMServerError):
    """A model of that name is loaded or loading."""


class ModelLoading(MMServerError):
    """The model is still loading; it can be unloaded once it is ready."""


class InsufficientResources(MMServerError):
    """Not enough memory (or model slots) to load or run the model."""


class LoadTimeout(MMServerError):
    """Loading the model took longer than MMSERVER_LOAD_TIMEOUT."""


# -- running a model ----------------------------------------------------------------


class RetryLater(MMServerError):
    """Refused for now: the answer says when to try again (``Retry-After``)."""

    def __init__(self, message: str, retry_after_seconds: float = 1.0):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    def __reduce__(self):
        # Errors cross processes; the default pickles only the message.
        return type(self), (str(self), self.retry_after_seconds)


class QueueFull(RetryLater):
    """The model's queue holds ``max_queue_size`` requests; come back later."""

    unavailable = Unavailable.QUEUE_FULL


class RunnerClosed(MMServerError):
    """The model's runner is stopping or stopped and accepts no new requests."""


class ModelUnhealthy(MMServerError):
    """A call into the model has outlived the invocation timeout and still runs."""

    unavailable = Unavailable.UNHEALTHY


class ModelError(MMServerError):
    """User code (the model, ``predict_fn``, ``output_fn``...) raised on this request."""


class OutputNotEncodable(ModelError):
    """The model's output cannot be written in the negotiated type (NaN in JSON, say)."""


class ModelOutOfMemory(ModelError):
    """The model ran out of memory even on this request alone."""


class InvocationTimeout(MMServerError):
    """The invocation took longer than SAGEMAKER_MODEL_SERVER_TIMEOUT."""


class EngineUnavailable(RetryLater):
    """With ``--http-workers``: the engine process that holds the models is gone (it stopped,
    or died, and another is loading the models again), so this worker cannot serve the
    request now."""

    unavailable = Unavailable.ENGINE_UNAVAILABLE


class ModelStillLoading(EngineUnavailable):
    """A model with a process of its own (``isolation: process``) whose process died: a new
    one is loading it again, and answers once it has."""

    unavailable = Unavailable.LOADING


class ReplicaUnavailable(RetryLater):
    """On a Ray cluster: the replica given the request died, or could not be reached, before
    it answered; another replica can serve the model."""

    unavailable = Unavailable.REPLICA_UNAVAILABLE


#: Longest error message handed back to a client; the full one stays in the exception chain.
MAX_ERROR_MESSAGE_CHARS = 500


def summarize_error(error: BaseException) -> str:
    """The line of an error's message that says what went wrong, short enough for a client.

    TorchScript puts that line last, under a long trace with the server's file paths.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    last = lines[-1]
    prefix = f"{error.__class__.__name__}: "
    if last.startswith(prefix):
        last = last[len(prefix):]
    return last[:MAX_ERROR_MESSAGE_CHARS]


class ShuttingDown(RetryLater):
    """SIGTERM has begun to drain the models: a request that had not reached its model's
    queue by then is refused, not answered 404, since the model is still loaded on the
    instance that will replace this one (SageMaker and load balancers retry a 503 there)."""

    unavailable = Unavailable.SHUTTING_DOWN

"""Domain errors: what went wrong, in words a caller can act on.

The registry, handlers and codecs raise these; only ``app`` turns them into
HTTP status codes (see ``app.STATUS_BY_ERROR``), so the rest of the package
stays usable without a web framework.
"""

from __future__ import annotations


class MMServerError(Exception):
    """Base class; ``str(error)`` is the message sent to the client."""


class InvalidRequest(MMServerError):
    """The request itself is malformed: wrong fields, bad name, bad query."""


class UrlOutsideModelRoots(InvalidRequest):
    """A model url that resolves (after symlinks) outside every model root."""


class InvalidModelArtifact(MMServerError):
    """The model directory exists but cannot become a model."""


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


class InvalidInput(MMServerError):
    """The request body could not be decoded into model input."""


class UnsupportedContentType(InvalidInput):
    """No decoder for the request's Content-Type."""


class NotAcceptable(MMServerError):
    """No encoder for any type the request's Accept header allows."""


class PayloadTooLarge(MMServerError):
    """The body is larger than SAGEMAKER_MAX_PAYLOAD_IN_MB."""


class InvocationTimeout(MMServerError):
    """The invocation took longer than SAGEMAKER_MODEL_SERVER_TIMEOUT."""

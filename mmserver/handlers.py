"""Model artifacts: turn a SageMaker-style model directory into a handler.

A model directory holds one of ``model.pt`` (TorchScript), ``model.pt2``
(``torch.export``), or ``code/inference.py`` (the script name follows
``SAGEMAKER_PROGRAM``) with any of:

``model_fn(model_dir)``
    Build the model once, at load. Default: load ``model.pt`` or ``model.pt2``.
``input_fn(request_body, request_content_type)``
    Bytes to a tensor whose dimension 0 counts this request's rows.
    Default: :func:`mmserver.codecs.decode`.
``predict_fn(data, model)``
    Called with a *batch*: many requests' rows concatenated along
    dimension 0, under ``torch.inference_mode()`` in the model's worker
    thread. It must be row-wise: one output row per input row.
    Default: ``model(data)``.
``output_fn(prediction, accept)``
    This request's output rows to ``bytes`` (or ``(bytes, content_type)``).
    Default: :func:`mmserver.codecs.encode`.

``input_fn`` and ``output_fn`` may take a keyword ``context``: a
:class:`RequestContext` with the request's custom attributes
(``X-Amzn-SageMaker-Custom-Attributes``). Raise ``ValueError`` for bad input
(400); raise :class:`mmserver.errors.UnsupportedContentType` (415) or
:class:`mmserver.errors.NotAcceptable` (406) where they fit. An optional
``mmserver.json`` beside the model overrides the batching settings.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import logging
import sys
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmserver import codecs
from mmserver.batching import is_out_of_memory
from mmserver.errors import (
    InsufficientResources,
    InvalidInput,
    InvalidModelArtifact,
    MMServerError,
    ModelError,
    NotAcceptable,
    UnsupportedContentType,
    summarize_error,
)

log = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "model.pt"
EXPORT_FILE = "model.pt2"
SETTINGS_FILE = "mmserver.json"
#: Files whose size stands for the model's weights when we estimate its memory before loading.
WEIGHT_SUFFIXES = (".pt", ".pt2", ".pth", ".bin", ".safetensors", ".ckpt")
#: Loaded weights take about their size on disk; the margin covers buffers and the runtime.
MEMORY_ESTIMATE_FACTOR = 1.2


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """What a handler may want to know about the request besides its body."""

    model_name: str
    content_type: str
    accept: str
    custom_attributes: str | None = None


class ModelHandler:
    """One loaded model and the four functions that serve it."""

    def __init__(self, model_dir: Path, *, device: torch.device, program: str = "inference.py"):
        self.model_dir = model_dir
        self.device = device
        self.batch_overrides = _read_settings(model_dir)
        user = _load_user_code(model_dir, program)
        self.has_user_code = user is not None
        self._model_fn = getattr(user, "model_fn", None)
        self._input_fn = _accepting_context(getattr(user, "input_fn", None))
        self._predict_fn = getattr(user, "predict_fn", None)
        self._output_fn = _accepting_context(getattr(user, "output_fn", None))
        self.model = self._build_model()
        self.memory_bytes = measured_memory_bytes(self.model)

    def _build_model(self) -> Any:
        try:
            if self._model_fn is not None:
                return self._model_fn(str(self.model_dir))
            return load_default_model(self.model_dir, self.device)
        except MMServerError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure here means a bad artifact
            if is_out_of_memory(error):
                raise InsufficientResources(
                    f"out of memory while loading the model: {error}") from error
            where = "model_fn" if self._model_fn is not None else "loading the model file"
            summary = summarize_error(error)
            raise InvalidModelArtifact(
                f"{where} raised {error.__class__.__name__}: {summary}") from error

    @property
    def row_wise(self) -> bool:
        """Whether requests may be concatenated: always for the default functions."""
        return self._predict_fn is None and self._input_fn is None

    @property
    def has_user_codecs(self) -> bool:
        """User input_fn/output_fn run in the model's own threads, never on the event loop."""
        return self._input_fn is not None or self._output_fn is not None

    @property
    def checks_accept_itself(self) -> bool:
        return self._output_fn is not None

    def decode(self, body: bytes, context: RequestContext) -> torch.Tensor:
        if self._input_fn is None:
            return codecs.decode(body, context.content_type)
        try:
            data = self._input_fn(body, context.content_type, context=context)
        except MMServerError:
            raise
        except (ValueError, TypeError) as error:
            message = str(error)
            if message.lower().startswith("unsupported content type"):
                raise UnsupportedContentType(message) from error
            raise InvalidInput(f"input_fn rejected the body: {message}") from error
        if not isinstance(data, torch.Tensor) or data.dim() == 0:
            raise InvalidModelArtifact(
                "input_fn must return a tensor whose dimension 0 counts rows, "
                f"got {type(data).__name__}")
        return data

    def predict(self, batch: torch.Tensor) -> Any:
        if self._predict_fn is not None:
            return self._predict_fn(batch, self.model)
        return self.model(batch)

    def encode(self, rows: Any, context: RequestContext) -> tuple[bytes, str]:
        if self._output_fn is None:
            return codecs.encode(rows, context.accept)
        try:
            result = self._output_fn(rows, context.accept, context=context)
        except MMServerError:
            raise
        except ValueError as error:
            message = str(error)
            if message.lower().startswith("unsupported accept type"):
                raise NotAcceptable(message) from error
            raise
        if isinstance(result, tuple):
            body, content_type = result
        else:
            body, content_type = result, codecs.media_type(context.accept)
            if content_type in ("*/*", ""):
                content_type = codecs.JSON
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise ModelError(f"output_fn must return bytes or str (optionally with a content "
                             f"type), got {type(body).__name__}")
        return bytes(body), content_type

    def close(self) -> None:
        """Drop the reference to the model so its memory can be freed."""
        self.model = None


def load_default_model(model_dir: Path, device: torch.device) -> Any:
    script, exported = model_dir / TORCHSCRIPT_FILE, model_dir / EXPORT_FILE
    if script.is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated, not gone
            model = torch.jit.load(str(script), map_location=device)
        return model.eval()
    if exported.is_file():
        module = torch.export.load(str(exported)).module()
        return module.to(device)
    raise InvalidModelArtifact(
        f"no model file in the model directory: expected {TORCHSCRIPT_FILE} (TorchScript), "
        f"{EXPORT_FILE} (torch.export) or code/inference.py with model_fn")


def measured_memory_bytes(model: Any) -> int:
    """Bytes held by the model's parameters and buffers (0 when it has none we can see)."""
    total = 0
    for getter in ("parameters", "buffers"):
        method = getattr(model, getter, None)
        if not callable(method):
            continue
        try:
            total += sum(t.numel() * t.element_size() for t in method())
        except Exception:  # noqa: BLE001 - an opaque model simply reports 0
            return total
    return total


def estimated_memory_bytes(model_dir: Path) -> int:
    """Before loading: the weights' size on disk, with a margin."""
    size = sum(p.stat().st_size for p in model_dir.rglob("*")
               if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return int(size * MEMORY_ESTIMATE_FACTOR)


def _read_settings(model_dir: Path) -> dict:
    path = model_dir / SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        overrides = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidModelArtifact(f"{SETTINGS_FILE} is not valid JSON: {error}") from None
    if not isinstance(overrides, dict):
        raise InvalidModelArtifact(f"{SETTINGS_FILE} must hold a JSON object")
    return overrides


def _load_user_code(model_dir: Path, program: str) -> Any:
    script = model_dir / "code" / program
    if not script.is_file():
        return None
    module_name = f"mmserver_user_code_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(module_name, script)
    module = importlib.util.module_from_spec(spec)
    code_dir = str(script.parent)
    sys.path.insert(0, code_dir)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - user code can fail in any way
        raise InvalidModelArtifact(
            f"code/{program} failed to import: {error.__class__.__name__}: "
            f"{summarize_error(error)}") from error
    finally:
        if sys.path and sys.path[0] == code_dir:
            sys.path.pop(0)
    return module


def _accepting_context(function: Callable | None) -> Callable | None:
    """User code may leave out the ``context`` keyword; then it is not passed."""
    if function is None:
        return None
    try:
        if "context" in inspect.signature(function).parameters:
            return function
    except (TypeError, ValueError):
        pass
    return lambda *args, context: function(*args)

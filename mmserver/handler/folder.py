"""Model artifacts: a SageMaker-style model directory made servable, as the PyTorch toolkit would.

A model directory holds weights and, optionally, ``code/inference.py`` (the
name follows ``SAGEMAKER_PROGRAM``), written for SageMaker's PyTorch inference
toolkit. The script runs unchanged because it is called the way the toolkit
calls it (docs/design.md section 6 has the side-by-side table; how each
function is called lives in :mod:`mmserver.handler.toolkit`, how ``code/`` is imported
so that it stays the model's own in :mod:`mmserver.handler.user_code`, and
``code/requirements.txt``, installed before the handler is built, in
:mod:`mmserver.handler.requirements`):

``pre_model_fn(model_dir)``, ``model_fn(model_dir)``, ``model_warmup_fn(model_dir, model)``
    Once, at load, in this order. Without ``model_fn``: ``model.pt`` (TorchScript),
    ``model.pt2`` (``torch.export``), else the only ``*.pt``/``*.pth`` file of the
    folder, as TorchScript. A module returned by the user's ``model_fn`` is moved
    to the device and put in eval mode when the default ``predict_fn`` runs it
    (the toolkit does that on every call).
``input_fn(request_body, request_content_type)``
    The body is a ``str`` when the Content-Type is exactly ``application/json`` or
    ``text/csv``, else ``bytes``; the type is the header as sent (None when absent). Any exception here answers 400 (the body was
    rejected); a ``ValueError`` starting "unsupported content type" answers 415.
``predict_fn(data, model)``
    Under ``torch.inference_mode()`` in the model's own thread. Default: ``model(data)``.
``output_fn(prediction, accept)``
    Returns ``bytes``/``str`` or ``(body, content_type)``. A missing or ``*/*``
    Accept arrives as ``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT`` (default JSON).
``transform_fn(model, request_body, content_type, accept)``
    Replaces the three above; defining it together with any of them is refused
    at load (400), as the toolkit refuses it.

Any of them may take one more parameter, whatever its name: the context,
passed by position (by keyword when that parameter is keyword-only). At load it
is a :class:`LoadContext`; per request a :class:`RequestContext` with the
custom attributes. Any other exception at invoke answers 500 with the
exception's one-line summary; at load, 400 with it (``sys.exit()`` and
``argparse`` at import included: the server stays up).

**Cross-request batching must never change an answer**, so it is opt-in for
user code. A model is *row-wise* (many requests' rows are concatenated along
dimension 0 into one ``predict_fn`` call and the output is split back) when:

1. ``mmserver.json`` says ``"row_wise": true`` or ``false``; else
2. the script sets ``MMSERVER_ROW_WISE = True`` or ``False``; else
3. it defines neither ``input_fn`` nor ``predict_fn`` (the defaults are row-wise).

A row-wise ``input_fn`` returns a tensor (or a dict, tuple or list of tensors)
whose dimension 0 counts this request's rows, and ``predict_fn`` returns one
output row per input row. Every other script gets one ``predict_fn`` call per
request with ``input_fn``'s object as it is, and ``output_fn`` gets the whole
prediction back. ``transform_fn`` is never row-wise.

**Tensors that arrive already decoded** (the v2 protocol, ``http.v2``) skip
``input_fn`` and ``output_fn``: the protocol decodes and encodes them. They
reach :meth:`ModelHandler.from_tensors`, which hands a row-wise model the tensor
(or dict of tensors) as its rows and any other script's ``predict_fn`` the same
object as one request. A ``transform_fn`` takes the raw body, so such a model
cannot take tensors (:attr:`ModelHandler.takes_tensors` is False). A default
``predict_fn`` given a dict calls a model whose ``forward`` takes several
tensors with the dict's values, in order. The model's :attr:`~ModelHandler.signature`
(its tensors' names, datatypes and shapes) is ``mmserver.json``'s declaration,
else what a ``model.pt2`` says of itself (:mod:`mmserver.signatures`).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from mmserver import signatures
from mmserver.batching import is_out_of_memory
from mmserver.batching.rows import moved
from mmserver.errors import (
    InsufficientResources,
    InvalidModelArtifact,
    MMServerError,
    summarize_error,
)
from mmserver.handler import calls, user_code
from mmserver.handler.calls import OneRequest
from mmserver.handler.toolkit import (
    HANDLER_PARAMETERS,
    LoadContext,
    RequestContext,
    UserFunction,
    describe_error,
    response_from,
)
from mmserver.handler.settings import (
    ROW_WISE_ATTRIBUTE,
    ROW_WISE_KEY,
    SETTINGS_FILE,
    THREAD_SAFE_ATTRIBUTE,
    THREAD_SAFE_KEY,
    ModelSettings,
)
from mmserver.text import TextCodec

log = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "model.pt"
EXPORT_FILE = "model.pt2"
#: Any single file with one of these suffixes is the model when model.pt is absent (the toolkit's rule).
TOOLKIT_MODEL_SUFFIXES = (".pt", ".pth")
#: What :attr:`ModelHandler.kind` can be: user code, or which default model file was loaded.
SCRIPT, TORCHSCRIPT, EXPORTED = "script", "torchscript", "export"


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """A default model file, loaded: the model, its format, and what it says of its tensors."""

    model: Any
    kind: str
    inputs: tuple[signatures.TensorSpec, ...] | None = None
    outputs: tuple[signatures.TensorSpec, ...] | None = None


class RowCodecs:
    """A row-wise model's default codecs as plain data: what another process needs to decode
    its requests into rows and encode its answers exactly as its handler would.

    An HTTP worker over the engine (``engine.client``) gets this from the engine once per
    model, decodes and encodes there, and sends the engine only the rows. The Open
    Inference Protocol's requests always can (the protocol decodes; the folder's
    ``input_fn``/``output_fn`` are never called for them); SageMaker's only when the folder
    defines neither (:attr:`toolkit`). ``generation`` names the load it describes: after
    the model is loaded again, a worker's copy is refused and fetched anew.
    """

    row_wise = True
    takes_tensors = True
    user_codecs = False
    default_encoders = True

    def __init__(self, signature: signatures.Signature, toolkit: bool, generation: int,
                 text: TextCodec | None = None):
        self.signature = signature
        self.toolkit = toolkit
        self.generation = generation
        #: A text model's tokenizer: it decodes here, in the worker.
        self.text = text
        self.decode = calls.row_wise_input(
            text.decode if text is not None else calls.checked_default_input(signature))
        self.encode = calls.default_output

    def __reduce__(self):
        return RowCodecs, (self.signature, self.toolkit, self.generation, self.text)

    def from_tensors(self, data: Any, context: RequestContext) -> Any:
        return data if self.text is None else self.text.from_tensors(data, context)


class ModelHandler:
    """A model folder made servable (see the module docstring).

    At load the folder's functions, or the defaults, are resolved once into three
    fixed callables that every request then calls without asking again:
    :attr:`decode` (body to the runner's input), :attr:`predict` (the runner's
    model) and :attr:`encode` (output to body). ``row_wise`` and
    ``user_codecs`` are decided at load too.
    """

    def __init__(self, model_dir: Path, *, device: torch.device, program: str = "inference.py"):
        self.model_dir = model_dir
        self.device = device
        #: The folder's mmserver.json (its batching knobs are the loader's to apply).
        self.settings = ModelSettings.read(model_dir)
        #: A text model's tokenizer (``mmserver.json``'s ``text``), else None.
        self.text = TextCodec.declared(self.settings.text, model_dir)
        self._code = _import_user_code(model_dir, program)
        try:
            self._load(self.settings.row_wise)
            self.thread_safe = _declared(self.settings.thread_safe, self._code, THREAD_SAFE_KEY,
                                         THREAD_SAFE_ATTRIBUTE, default=self._code is None)
        except BaseException:
            self.close()
            raise

    def _load(self, declared_row_wise: Any) -> None:
        module = self._code.module if self._code is not None else None
        functions = {name: UserFunction(name, getattr(module, name))
                     for name in HANDLER_PARAMETERS if callable(getattr(module, name, None))}
        if "transform_fn" in functions and functions.keys() & {"input_fn", "predict_fn", "output_fn"}:
            raise InvalidModelArtifact(
                "code defines transform_fn together with input_fn, predict_fn and/or output_fn; "
                "define transform_fn alone, or the other three")
        context = LoadContext(str(self.model_dir), {
            "model_dir": str(self.model_dir),
            "gpu_id": self.device.index if self.device.type == "cuda" else None})
        model_dir = str(self.model_dir)
        if "pre_model_fn" in functions:
            _at_load(functions["pre_model_fn"], model_dir=model_dir, context=context)
        model_file = self._build_model(functions, context)
        self.model = model_file.model
        #: ``script`` (the folder has code), ``torchscript`` or ``export`` (its model file).
        self.kind = SCRIPT if self._code is not None else model_file.kind
        self.signature = signatures.combined(self.settings.inputs, self.settings.outputs,
                                             model_file.inputs, model_file.outputs)
        #: Requests may arrive as decoded tensors (the v2 protocol): not for transform_fn.
        self.takes_tensors = "transform_fn" not in functions
        if "model_warmup_fn" in functions:
            _at_load(functions["model_warmup_fn"], model_dir=model_dir, model=self.model,
                     context=context)
        self.row_wise = _decide_row_wise(declared_row_wise, self._code, functions)
        if self.text is not None and (not self.row_wise or "input_fn" in functions):
            raise InvalidModelArtifact(
                "a text model (mmserver.json's text) must be row-wise and leave decoding to the "
                "server: its tokenizer is the input_fn; drop input_fn, or the text entry")
        #: The model's own input_fn/output_fn run in its threads, never on the event loop.
        self.user_codecs = bool(functions.keys() & {"input_fn", "output_fn"})
        #: The default encoders answer, so the Accept header is checked before the body is read.
        self.default_encoders = not functions.keys() & {"output_fn", "transform_fn"}
        self._resolve(functions, context)

    def _build_model(self, functions: dict[str, UserFunction],
                     context: LoadContext) -> ModelFile:
        if "model_fn" not in functions:
            try:
                return load_default_model(self.model_dir, self.device)
            except MMServerError:
                raise
            except Exception as error:
                raise _load_error("loading the model file", error) from error
        model = _at_load(functions["model_fn"], model_dir=str(self.model_dir), context=context)
        if isinstance(model, torch.nn.Module) and not functions.keys() & {
                "predict_fn", "transform_fn"}:
            model = model.to(self.device).eval()
        return ModelFile(model, SCRIPT)

    def _resolve(self, functions: dict[str, UserFunction], load_context: LoadContext) -> None:
        """Fix :attr:`decode`, :attr:`predict` and :attr:`encode` for every request to come."""
        model, device = self.model, self.device
        self._default_codecs = False
        transform_fn = functions.get("transform_fn")
        if transform_fn is not None:
            self.decode = calls.transform_body
            self.predict = lambda one: transform_fn(
                model=model, request_body=one.data, content_type=one.context.content_type,
                accept=one.context.accept, context=one.context)
            self.encode = lambda result, context: response_from(result, context.accept,
                                                                "transform_fn")
            return
        input_fn = functions.get("input_fn")
        read = self.text.decode if self.text is not None else \
            calls.checked_default_input(self.signature) if input_fn is None \
            else calls.user_input(input_fn)
        self.decode = calls.row_wise_input(read) if self.row_wise else calls.one_request_input(read)
        predict_fn = functions.get("predict_fn")
        call = calls.default_call(model)
        if self.row_wise:
            self.predict = call if predict_fn is None else (
                lambda batch: predict_fn(data=batch, model=model, context=load_context))
        else:
            self.predict = (lambda one: call(moved(one.data, device))) if predict_fn is None \
                else (lambda one: predict_fn(data=moved(one.data, device), model=model,
                                             context=one.context))
        output_fn = functions.get("output_fn")
        self.encode = calls.default_output if output_fn is None else calls.user_output(output_fn)
        self._default_codecs = input_fn is None and output_fn is None

    def row_codecs(self, generation: int) -> RowCodecs | None:
        """This model's :class:`RowCodecs`, when it is row-wise (else None: another process
        sends its bodies here whole)."""
        if not self.row_wise:
            return None
        return RowCodecs(self.signature, self._default_codecs, generation, self.text)

    def from_tensors(self, data: Any, context: RequestContext) -> Any:
        """The runner's input for a request whose tensors the protocol already decoded."""
        if self.text is not None:
            return self.text.from_tensors(data, context)
        return data if self.row_wise else OneRequest(data, context)

    def close(self) -> None:
        """Drop the model and the modules its code imported, so their memory can be freed."""
        self.model = self.predict = None
        if self._code is not None:
            self._code.close()


# -- load ---------------------------------------------------------------------------


def _at_load(function: UserFunction, *, context: LoadContext, **arguments: Any) -> Any:
    return function.call_or_raise(lambda error: _load_error(function.name, error),
                                  context=context, **arguments)


def _load_error(what: str, error: BaseException) -> MMServerError:
    """What a failure at load answers: 507 when memory ran out, else 400 with the reason."""
    if is_out_of_memory(error):
        return InsufficientResources(f"out of memory ({what}): {summarize_error(error)}")
    return InvalidModelArtifact(f"{what} raised {describe_error(error)}")


def _declared(declared: Any, code: user_code.UserCode | None, key: str, attribute: str,
              default: bool | None) -> bool | None:
    """A yes/no a model declares: ``mmserver.json``'s ``key`` wins over the script's ``attribute``."""
    if declared is None and code is not None:
        declared = getattr(code.module, attribute, None)
    if declared is not None and not isinstance(declared, bool):
        raise InvalidModelArtifact(
            f"{key} ({SETTINGS_FILE}) or {attribute} (the script) must be true or false, "
            f"got {declared!r}")
    return default if declared is None else declared


def _decide_row_wise(declared: Any, code: user_code.UserCode | None,
                     functions: dict[str, UserFunction]) -> bool:
    declared = _declared(declared, code, ROW_WISE_KEY, ROW_WISE_ATTRIBUTE, default=None)
    if "transform_fn" in functions:
        if declared:
            raise InvalidModelArtifact(
                "transform_fn answers whole requests, so the model cannot be row-wise; "
                f"drop {ROW_WISE_KEY}/{ROW_WISE_ATTRIBUTE} or use input_fn/predict_fn/output_fn")
        return False
    if declared is not None:
        return declared
    return not functions.keys() & {"input_fn", "predict_fn"}


def load_default_model(model_dir: Path, device: torch.device) -> ModelFile:
    """The PyTorch toolkit's default model_fn, plus ``model.pt2``.

    ``model.pt``, else ``model.pt2``, else the folder's only ``*.pt``/``*.pth`` file.
    """
    script, exported = model_dir / TORCHSCRIPT_FILE, model_dir / EXPORT_FILE
    if exported.is_file() and not script.is_file():
        program = torch.export.load(str(exported))
        return ModelFile(program.module().to(device), EXPORTED,
                         *signatures.of_exported_program(program))
    if not script.is_file():
        candidates = sorted(p for p in model_dir.iterdir()
                            if p.is_file() and p.suffix in TOOLKIT_MODEL_SUFFIXES)
        if len(candidates) != 1:
            found = f" (found {', '.join(p.name for p in candidates)})" if candidates else ""
            raise InvalidModelArtifact(
                f"no model file to load: expected {TORCHSCRIPT_FILE} (TorchScript), "
                f"{EXPORT_FILE} (torch.export), exactly one .pt or .pth file{found}, "
                "or code/inference.py with model_fn")
        script = candidates[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated, not gone
            model = torch.jit.load(str(script), map_location=device)
    except RuntimeError as error:
        raise InvalidModelArtifact(
            f"{script.name} is not TorchScript ({summarize_error(error)}); a state_dict needs "
            "code/inference.py with a model_fn that builds the network and loads it") from error
    return ModelFile(model.eval(), TORCHSCRIPT)


def is_model_folder(path: Path, program: str = "inference.py") -> bool:
    """Whether a folder holds what a load looks for: a model file or the handler script."""
    try:
        return (path / "code" / program).is_file() or any(
            child.is_file() and (child.name == EXPORT_FILE
                                 or child.suffix in TOOLKIT_MODEL_SUFFIXES)
            for child in path.iterdir())
    except OSError:
        return False


def _import_user_code(model_dir: Path, program: str) -> user_code.UserCode | None:
    code_dir = model_dir / "code"
    if not (code_dir / program).is_file():
        return None
    try:
        code = user_code.import_program(code_dir, program)
    except BaseException as error:
        raise InvalidModelArtifact(
            f"code/{program} failed to import: {describe_error(error)}") from error
    return code

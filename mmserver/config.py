"""Settings: one object built from the environment, the command line or Ray's arguments.

SageMaker's own variables keep their meaning; mmserver's knobs use the
``MMSERVER_`` prefix. Every setting is one :class:`~mmserver.setting.Setting` line
in :data:`SETTINGS` (its variable, its flag, its Ray argument, its check), and the
batching knobs one line each in ``batching.KNOBS``: adding a setting is a field of
:class:`Settings` and its line. A bad value is refused with a message that names the
variable, the flag or the argument it came through, and the same value is refused
through each of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from mmserver.batching import KNOBS, BatchSettings
from mmserver.setting import (  # noqa: F401 - the readers are re-exported
    FOLDERS,
    Setting,
    boolean,
    integer,
    number,
    paths,
    text,
)

T = TypeVar("T")

DEFAULT_PORT = 8080
#: The v2 protocol's gRPC port: KServe's and MLServer's default (Triton's is 8001).
DEFAULT_GRPC_PORT = 8081
DEFAULT_MODEL_ROOT = "/opt/ml/models"
DEFAULT_SINGLE_MODEL_DIR = "/opt/ml/model"
#: SageMaker's documented default request payload limit.
DEFAULT_MAX_PAYLOAD_MB = 6
#: SageMaker's default for SAGEMAKER_MODEL_SERVER_TIMEOUT (seconds).
DEFAULT_MODEL_SERVER_TIMEOUT_SECONDS = 60.0
#: A 6 MB body arrives in well under a second on any network a model server sits on.
DEFAULT_BODY_TIMEOUT_SECONDS = 15.0
#: Loading reads weights and runs model_fn; a large model on a slow disk takes minutes.
DEFAULT_LOAD_TIMEOUT_SECONDS = 300.0
#: SageMaker sends SIGKILL 30 s after SIGTERM; leave 5 s for the process to exit.
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 25.0
#: Bodies at least this large are decoded in a worker thread: below it, a thread handoff
#: costs more than decoding on the event loop (notebook 04 measures both).
DEFAULT_DECODE_IN_THREAD_BYTES = 64 * 1024
#: The name SageMaker's toolkit gives the handler script under code/.
DEFAULT_PROGRAM = "inference.py"
#: A model's isolation: in the registry's process, or in a process of its own.
ISOLATIONS = ("none", "process")


# -- reading one variable -------------------------------------------------------------


def read_env(env: Mapping[str, str], key: str, parse: Callable[[str], T], default: T) -> T:
    """``env[key]`` parsed, or ``default`` when unset or empty; errors name ``key``."""
    raw = env.get(key)
    if raw is None or not raw.strip():
        return default
    try:
        return parse(raw.strip())
    except ValueError as error:
        raise ValueError(f"{key} {error}") from None


#: How an edge value of each knob type is read from text (a variable, a key=value argument).
EDGE_PARSERS = {int: integer, float: number, str: text}


def batch_settings_from_env(env: Mapping[str, str]) -> BatchSettings:
    """The batching knobs from their variables (``batching.KNOBS``); errors name the variable."""
    settings = BatchSettings()
    for knob in KNOBS:
        value = read_env(env, knob.env, EDGE_PARSERS[knob.kind], None)
        if value is None and knob.fallback_env:
            value = read_env(env, knob.fallback_env, EDGE_PARSERS[knob.kind], None)
        if value is not None:
            try:
                settings = settings.overridden({knob.key: value})
            except ValueError as error:
                raise ValueError(f"{knob.env}: {error}") from None
    return settings


# -- the settings object ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: ``inference.GRPCInferenceService`` (mmserver.grpc) listens here; 0: no gRPC.
    grpc_port: int = DEFAULT_GRPC_PORT
    multi_model: bool = True
    single_model_dir: Path = Path(DEFAULT_SINGLE_MODEL_DIR)
    model_roots: tuple[Path, ...] = (Path(DEFAULT_MODEL_ROOT),)
    preload: tuple[tuple[str, str], ...] = ()
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_MB * 1024 * 1024
    model_server_timeout_seconds: float = DEFAULT_MODEL_SERVER_TIMEOUT_SECONDS
    program: str = DEFAULT_PROGRAM
    batch: BatchSettings = BatchSettings()
    memory_budget_bytes: int | None = None
    max_models: int | None = None
    device: str | None = None
    access_log: bool = True
    #: Bodies at least this large are decoded in a worker thread, not on the event loop.
    decode_in_thread_bytes: int = DEFAULT_DECODE_IN_THREAD_BYTES
    #: A client that has not sent its whole body within this gets 408 and holds no slot.
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    #: A load (reading files, model_fn, warm-up) that takes longer answers 504.
    load_timeout_seconds: float = DEFAULT_LOAD_TIMEOUT_SECONDS
    #: SIGTERM: answer accepted requests, abandon stuck calls, exit within this.
    shutdown_timeout_seconds: float = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
    #: When set, POST /models and DELETE /models/{name} need "Authorization: Bearer <token>".
    management_token: str | None = None
    #: The toolkit's SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT: what a missing or */* Accept means.
    default_accept: str = "application/json"
    #: Fix glibc's malloc thresholds at start-up (``mmserver.allocator``).
    tune_malloc: bool = True
    #: Serve on uvloop's event loop when it is installed.
    uvloop: bool = True
    #: pip-install a model's code/requirements.txt at load into a folder of its own.
    install_requirements: bool = True
    #: HTTP processes; past 1, they serve over one engine process that holds the models.
    http_workers: int = 1
    #: Where a model runs when its mmserver.json does not say: ``"none"``, in the process
    #: that holds the registry; ``"process"``, in a process of its own (``engine.isolated``).
    isolation: str = "none"

    def __post_init__(self) -> None:
        """A field given as is (not through an edge) meets its declaration's check too."""
        for setting in SETTINGS:
            value = getattr(self, setting.field)
            if setting.to_field is None and value is not None and setting.env:
                try:
                    setting.check(value)
                except ValueError as error:
                    raise ValueError(f"{setting.env} ({setting.flag_name or setting.key}) "
                                     f"{error}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Every declared variable (:data:`SETTINGS`) and the batching knobs; flags go on top
        in ``cli``, Ray's arguments in ``ray.settings``."""
        env = os.environ if environ is None else environ
        values = {}
        for setting in SETTINGS:
            raw = env.get(setting.env) if setting.env else None
            if raw is not None and raw.strip():
                try:
                    values[setting.field] = setting.read(raw)
                except ValueError as error:
                    raise ValueError(f"{setting.env} {error}") from None
        return cls(batch=batch_settings_from_env(env), **values)


def _mebibytes(megabytes: float) -> int:
    return int(megabytes * 1024 * 1024)


#: Every server setting but the batching knobs (``batching.KNOBS``) and ``preload`` (a flag
#: of ``mmserver serve`` only); the README's settings table lists each with its default.
SETTINGS = (
    Setting("host", "MMSERVER_HOST", str, "address to bind"),
    Setting("port", "SAGEMAKER_BIND_TO_PORT", int, "port", minimum=0,
            maximum=65535),
    Setting("grpc_port", "MMSERVER_GRPC_PORT", int,
            "the v2 protocol's gRPC port (inference.GRPCInferenceService); 0: no gRPC",
            minimum=0, maximum=65535),
    Setting("multi_model", "SAGEMAKER_MULTI_MODEL", bool,
            "false: serve the one model of MMSERVER_SINGLE_MODEL_DIR at /invocations"),
    Setting("single_model_dir", "MMSERVER_SINGLE_MODEL_DIR", str,
            "the model folder of single-model mode", to_field=Path),
    Setting("model_roots", "MMSERVER_MODEL_ROOTS", FOLDERS,
            "directories model urls must resolve inside; repeatable", flag="--model-root",
            ray=True, repeatable=True),
    Setting("max_payload_bytes", "SAGEMAKER_MAX_PAYLOAD_IN_MB", float, "largest request body",
            key="max_payload_mb", above=0, to_field=_mebibytes),
    Setting("model_server_timeout_seconds", "SAGEMAKER_MODEL_SERVER_TIMEOUT", float,
            "seconds an invocation may take", key="model_server_timeout", above=0),
    Setting("program", "SAGEMAKER_PROGRAM", str, "the handler script under code/"),
    Setting("memory_budget_bytes", "MMSERVER_MEMORY_BUDGET_MB", float,
            "memory loaded models may take, per process (per replica on Ray)",
            key="memory_budget_mb", ray=True, above=0, to_field=_mebibytes),
    Setting("max_models", "MMSERVER_MAX_MODELS", int,
            "models loaded at once, per process (per replica on Ray)", ray=True, minimum=1),
    Setting("device", "MMSERVER_DEVICE", str, "where models run"),
    Setting("access_log", "MMSERVER_ACCESS_LOG", bool, "a log line per request"),
    Setting("decode_in_thread_bytes", "MMSERVER_DECODE_IN_THREAD_BYTES", int,
            "bodies at least this large are decoded in a worker thread", minimum=0),
    Setting("body_timeout_seconds", "MMSERVER_BODY_TIMEOUT", float,
            "seconds a client has to send its whole body", key="body_timeout", above=0),
    Setting("load_timeout_seconds", "MMSERVER_LOAD_TIMEOUT", float,
            "seconds a load may take", key="load_timeout", above=0),
    Setting("shutdown_timeout_seconds", "MMSERVER_SHUTDOWN_TIMEOUT", float,
            "seconds SIGTERM may take to answer accepted requests and exit",
            key="shutdown_timeout", minimum=0),
    # No flag: a command line is readable by every user of the machine (ps).
    Setting("management_token", "MMSERVER_MANAGEMENT_TOKEN", str,
            "the bearer token loading and unloading need", flag=False),
    Setting("default_accept", "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", str,
            "what a missing or */* Accept means"),
    Setting("tune_malloc", "MMSERVER_TUNE_MALLOC", bool, "fix glibc's malloc thresholds"),
    Setting("uvloop", "MMSERVER_UVLOOP", bool, "serve on uvloop's event loop"),
    Setting("install_requirements", "MMSERVER_INSTALL_REQUIREMENTS", bool,
            "pip-install a model's code/requirements.txt"),
    Setting("http_workers", "MMSERVER_HTTP_WORKERS", int,
            "HTTP processes over one engine process that holds the models; 1: one process",
            minimum=1),
    Setting("isolation", "MMSERVER_ISOLATION", str,
            "where a model runs when its mmserver.json does not say: 'process' gives each "
            "model a process of its own, so that a native crash costs only that model",
            choices=ISOLATIONS),
)
SETTINGS_BY_KEY = {setting.key: setting for setting in SETTINGS}

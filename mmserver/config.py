"""Settings: one object built from the environment and the command line.

SageMaker's own variables keep their meaning; mmserver's knobs use the
``MMSERVER_`` prefix. Command-line flags override the environment (``cli``).
Every variable is read through :func:`read_env` with its type and default,
so a bad value is refused with a message that names the variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from mmserver.batching import KNOBS, BatchSettings

T = TypeVar("T")

DEFAULT_PORT = 8080
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


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"must be an integer, got {raw!r}") from None


def number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"must be a number, got {raw!r}") from None


def boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {raw!r}")


def text(raw: str) -> str:
    return raw


def paths(raw: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in raw.split(os.pathsep) if p)


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
        if self.http_workers < 1:
            raise ValueError(f"MMSERVER_HTTP_WORKERS (--http-workers) must be at least 1, got "
                             f"{self.http_workers}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"MMSERVER_ISOLATION (--isolation) must be one of "
                             f"{', '.join(ISOLATIONS)}, got {self.isolation!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every variable of the settings table (flags go on top in ``cli``)."""
        env = os.environ if environ is None else environ
        budget_mb = read_env(env, "MMSERVER_MEMORY_BUDGET_MB", number, None)
        return cls(
            host=read_env(env, "MMSERVER_HOST", text, cls.host),
            port=read_env(env, "SAGEMAKER_BIND_TO_PORT", integer, DEFAULT_PORT),
            multi_model=read_env(env, "SAGEMAKER_MULTI_MODEL", boolean, True),
            single_model_dir=Path(read_env(env, "MMSERVER_SINGLE_MODEL_DIR", text,
                                           DEFAULT_SINGLE_MODEL_DIR)),
            model_roots=read_env(env, "MMSERVER_MODEL_ROOTS", paths,
                                 (Path(DEFAULT_MODEL_ROOT),)) or (Path(DEFAULT_MODEL_ROOT),),
            max_payload_bytes=int(read_env(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", number,
                                           DEFAULT_MAX_PAYLOAD_MB) * 1024 * 1024),
            model_server_timeout_seconds=read_env(env, "SAGEMAKER_MODEL_SERVER_TIMEOUT", number,
                                                  DEFAULT_MODEL_SERVER_TIMEOUT_SECONDS),
            program=read_env(env, "SAGEMAKER_PROGRAM", text, DEFAULT_PROGRAM),
            batch=batch_settings_from_env(env),
            memory_budget_bytes=None if budget_mb is None else int(budget_mb * 1024 * 1024),
            max_models=read_env(env, "MMSERVER_MAX_MODELS", integer, None),
            device=read_env(env, "MMSERVER_DEVICE", text, None),
            access_log=read_env(env, "MMSERVER_ACCESS_LOG", boolean, True),
            body_timeout_seconds=read_env(env, "MMSERVER_BODY_TIMEOUT", number,
                                          DEFAULT_BODY_TIMEOUT_SECONDS),
            load_timeout_seconds=read_env(env, "MMSERVER_LOAD_TIMEOUT", number,
                                          DEFAULT_LOAD_TIMEOUT_SECONDS),
            management_token=read_env(env, "MMSERVER_MANAGEMENT_TOKEN", text, None),
            default_accept=read_env(env, "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", text,
                                    "application/json"),
            decode_in_thread_bytes=read_env(env, "MMSERVER_DECODE_IN_THREAD_BYTES", integer,
                                            DEFAULT_DECODE_IN_THREAD_BYTES),
            shutdown_timeout_seconds=read_env(env, "MMSERVER_SHUTDOWN_TIMEOUT", number,
                                              DEFAULT_SHUTDOWN_TIMEOUT_SECONDS),
            tune_malloc=read_env(env, "MMSERVER_TUNE_MALLOC", boolean, True),
            uvloop=read_env(env, "MMSERVER_UVLOOP", boolean, True),
            install_requirements=read_env(env, "MMSERVER_INSTALL_REQUIREMENTS", boolean, True),
            http_workers=read_env(env, "MMSERVER_HTTP_WORKERS", integer, 1),
            isolation=read_env(env, "MMSERVER_ISOLATION", text, "none"),
        )

"""Settings: one object built from the environment and the command line.

SageMaker's own variables keep their meaning; mmserver's knobs use the
``MMSERVER_`` prefix. Command-line flags override the environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from mmserver.batching import POLICIES

DEFAULT_PORT = 8080
DEFAULT_MODEL_ROOT = "/opt/ml/models"
DEFAULT_SINGLE_MODEL_DIR = "/opt/ml/model"
#: SageMaker's documented default request payload limit.
DEFAULT_MAX_PAYLOAD_MB = 6
#: SageMaker's default for SAGEMAKER_MODEL_SERVER_TIMEOUT (seconds).
DEFAULT_MODEL_SERVER_TIMEOUT_SECONDS = 60.0
#: Share of the memory available at start-up that loaded models may use by default.
DEFAULT_MEMORY_BUDGET_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """The knobs of one ModelRunner (see ``mmserver.batching``)."""

    max_batch_size: int = 16
    max_wait_seconds: float = 0.005
    max_queue_size: int = 256
    policy: str = "greedy"

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not self.max_wait_seconds >= 0:
            raise ValueError(f"max_wait must be >= 0, got {self.max_wait_seconds}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")

    def overridden(self, overrides: Mapping[str, object]) -> BatchSettings:
        """Apply a model's ``mmserver.json`` (keys as the environment's, ``max_wait_ms``)."""
        known = {"max_batch_size", "max_wait_ms", "max_queue_size", "policy"}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown batching settings {sorted(unknown)}; known: {sorted(known)}")
        changes: dict[str, object] = {}
        for key in ("max_batch_size", "max_queue_size"):
            if key in overrides:
                value = overrides[key]
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
                changes[key] = value
        if "max_wait_ms" in overrides:
            value = overrides["max_wait_ms"]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"max_wait_ms must be a number, got {value!r}")
            changes["max_wait_seconds"] = float(value) / 1000.0
        if "policy" in overrides:
            changes["policy"] = overrides["policy"]
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        """The ``batching`` object of ``GET /models/{name}``."""
        return {
            "maxBatchSize": self.max_batch_size,
            "maxWaitMs": self.max_wait_seconds * 1000.0,
            "maxQueueSize": self.max_queue_size,
            "policy": self.policy,
        }


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
    program: str = "inference.py"
    batch: BatchSettings = BatchSettings()
    memory_budget_bytes: int | None = None
    max_models: int | None = None
    device: str | None = None
    access_log: bool = True
    #: Bodies at least this large are decoded in a worker thread, not on the event loop.
    decode_in_thread_bytes: int = 64 * 1024
    #: aiohttp's grace period for in-flight requests on SIGTERM; SageMaker kills at 30 s.
    shutdown_timeout_seconds: float = 25.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the variables of DESIGN.md section 7 (flags go on top in ``cli``)."""
        env = os.environ if environ is None else environ
        batch = BatchSettings(
            max_batch_size=_int(env, "MMSERVER_MAX_BATCH_SIZE", BatchSettings.max_batch_size),
            max_wait_seconds=_float(env, "MMSERVER_MAX_WAIT_MS",
                                    BatchSettings.max_wait_seconds * 1000) / 1000.0,
            max_queue_size=_int(env, "MMSERVER_MAX_QUEUE_SIZE", BatchSettings.max_queue_size),
            policy=env.get("MMSERVER_BATCH_POLICY", BatchSettings.policy),
        )
        roots = env.get("MMSERVER_MODEL_ROOTS")
        budget_mb = env.get("MMSERVER_MEMORY_BUDGET_MB")
        max_models = env.get("MMSERVER_MAX_MODELS")
        return cls(
            host=env.get("MMSERVER_HOST", cls.host),
            port=_int(env, "SAGEMAKER_BIND_TO_PORT", DEFAULT_PORT),
            multi_model=env.get("SAGEMAKER_MULTI_MODEL", "true").strip().lower()
            in ("1", "true", "yes"),
            single_model_dir=Path(env.get("MMSERVER_SINGLE_MODEL_DIR", DEFAULT_SINGLE_MODEL_DIR)),
            model_roots=tuple(Path(p) for p in roots.split(os.pathsep) if p)
            if roots else (Path(DEFAULT_MODEL_ROOT),),
            max_payload_bytes=int(_float(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB",
                                         DEFAULT_MAX_PAYLOAD_MB) * 1024 * 1024),
            model_server_timeout_seconds=_float(env, "SAGEMAKER_MODEL_SERVER_TIMEOUT",
                                                DEFAULT_MODEL_SERVER_TIMEOUT_SECONDS),
            program=env.get("SAGEMAKER_PROGRAM", "inference.py"),
            batch=batch,
            memory_budget_bytes=int(float(budget_mb) * 1024 * 1024) if budget_mb else None,
            max_models=int(max_models) if max_models else None,
            device=env.get("MMSERVER_DEVICE") or None,
            access_log=env.get("MMSERVER_ACCESS_LOG", "1").strip().lower()
            not in ("0", "false", "no"),
        )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return float(default)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None

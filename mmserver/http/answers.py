"""The JSON answers of the management routes, built from plain data.

The SageMaker contract and MMS spell keys in camelCase (``modelName``,
``nextPageToken``); the rest of the package speaks Python. This module is the
one place that turns :class:`~mmserver.loaded_model.ModelInfo` and
:class:`~mmserver.batching.BatchSettings` into those keys. A batching knob's
key is its ``mmserver.json`` key in camelCase (``max_wait_ms`` -> ``maxWaitMs``),
derived from :data:`mmserver.batching.KNOBS`, so a new knob needs no line here.
Both HTTP hosts (the aiohttp application and the Ray Serve ingress) answer with
these builders.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from mmserver.batching import KNOBS, BatchSettings
from mmserver.model_info import ModelInfo, ModelStatus


class Registered(Protocol):
    """A model as listings name it: a :class:`~mmserver.loaded_model.LoadedModel`, or a Ray
    cluster's registration (``mmserver.ray.registrations.Registration``)."""

    name: str
    url: str


class Replica(Protocol):
    """Which Ray Serve replica holds a model (``mmserver.ray.replicas.ReplicaRef``)."""

    replica_id: str
    pid: int
    node_id: str


def camel_case(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(word.capitalize() for word in rest)


def batching(settings: BatchSettings) -> dict[str, object]:
    """The ``batching`` object of a describe answer: each knob in the edges' unit."""
    return {camel_case(knob.key): knob.edge_value(settings) for knob in KNOBS}


#: The describe answer's key, and value, that say a model runs in a process of its own.
ISOLATION_KEY, ISOLATED = "isolation", "process"


def described(info: ModelInfo) -> dict[str, object]:
    """``GET /models/{name}``."""
    answer: dict[str, object] = {"modelName": info.name, "modelUrl": info.url,
                                 "status": info.status}
    if info.status == ModelStatus.UNHEALTHY:
        answer["health"] = (
            f"a call into the model has run for {info.stuck_seconds:.0f} s, past its "
            f"{info.call_timeout_seconds:g} s limit (SAGEMAKER_MODEL_SERVER_TIMEOUT); new "
            "requests get 503 until it returns; DELETE unloads it without waiting for it")
    if info.stats is None:
        return answer
    stats = info.stats
    answer.update({
        "device": str(info.device),
        "memoryBytes": info.memory_bytes,
        "batching": batching(info.batching),
        "stats": {
            "queueDepth": info.queue_depth,
            "requestsInFlight": stats.requests_in_flight,
            "requestsCompleted": stats.requests_completed,
            "requestsFailed": stats.requests_failed,
            "requestsRejected": stats.requests_rejected,
            "batches": stats.batches,
            "meanBatchSize": round(stats.mean_batch_size, 3),
            "instanceBusySeconds": [round(s, 6) for s in info.instance_busy_seconds],
        },
    })
    if info.notes:
        answer["notes"] = list(info.notes)
    if stats.padded_tokens_total:
        answer["stats"].update({
            "realTokens": stats.real_tokens_total, "paddedTokens": stats.padded_tokens_total,
            "paddingEfficiency": round(stats.padding_efficiency, 6)})
    if info.measured_batch_size is not None:
        answer["stats"]["measuredBatchSize"] = info.measured_batch_size
    return answer


def described_isolated(described_there: ModelInfo | dict[str, object], *,
                       health: str | None = None, restarts: int | None = None
                       ) -> dict[str, object]:
    """``GET /models/{name}`` of a model in a process of its own: its process's answer,
    or, while that process is gone (``health`` says why, ``restarts`` how many died),
    what the process that started it knows."""
    answer = dict(described_there) if isinstance(described_there, dict) else \
        described(described_there)
    answer[ISOLATION_KEY] = ISOLATED
    if health is not None:
        answer.update({"status": ModelStatus.LOADING, "health": health})
        answer = described_in_engine(answer, None, restarts)
    return answer


def described_in_engine(answer: dict[str, object], pid: int | None, restarts: int
                        ) -> dict[str, object]:
    """A describe ``answer`` from an engine process (``--http-workers``, or an isolated
    model's own), naming that engine unless the answer names one already (an isolated
    model's, from its own engine)."""
    return {"engine": {"pid": pid, "restarts": restarts}, **answer}


def described_failed(name: str, url: str, reason: str) -> dict[str, object]:
    """``GET /models/{name}`` of a model whose process died and that did not load again."""
    return {"modelName": name, "modelUrl": url, "status": ModelStatus.FAILED, "failure": reason}


def listed(models: Iterable[Registered], next_page_token: str | None) -> dict[str, object]:
    """``GET /models``: one page; ``nextPageToken`` only when a model follows."""
    answer: dict[str, object] = {"models": [{"modelName": m.name, "modelUrl": m.url}
                                            for m in models]}
    if next_page_token is not None:
        answer["nextPageToken"] = next_page_token
    return answer


def loaded(model: Registered) -> dict[str, object]:
    """``POST /models``: MMS's ``Model "NAME" registered`` (SageMaker names no message)."""
    return {"status": f'Model "{model.name}" registered', "modelName": model.name,
            "modelUrl": model.url}


def described_on_cluster(model: Registered, status: str,
                         holders: Iterable[tuple[Replica, ModelInfo]]) -> dict[str, object]:
    """``GET /models/{name}`` on a Ray cluster: the registration, and each replica holding it.

    ``status`` is the registration's (``loading``, ``unloading``) or, once loaded,
    ``ready`` while a replica holds the model and ``"not loaded"``
    (:data:`mmserver.loaded_model.NOT_LOADED`) while none does.
    Each replica's entry is :func:`described` of its copy, with the replica named.
    """
    replicas = []
    for replica, info in holders:
        entry: dict[str, object] = {"replicaId": replica.replica_id, "pid": replica.pid,
                                    "nodeId": replica.node_id}
        entry.update((key, value) for key, value in described(info).items()
                     if key not in ("modelName", "modelUrl"))
        replicas.append(entry)
    return {"modelName": model.name, "modelUrl": model.url, "status": status,
            "replicas": replicas}


def healthy() -> dict[str, object]:
    """``GET /ping``."""
    return {"status": "Healthy"}


def unloaded(name: str) -> dict[str, object]:
    """``DELETE /models/{name}``: ``Model "NAME" unregistered``, as MMS and TorchServe answer."""
    return {"status": f'Model "{name}" unregistered', "modelName": name}

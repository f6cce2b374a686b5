"""The cluster's models: the :class:`~mmserver.http.service.ModelService` of a Ray cluster.

The ingress (``ingress``) serves the same operations as ``mmserver serve`` over this
service, which reaches the cluster's registrations (``registrations``) and its model
hosts (``host``) through Serve's deployment handles. What a cluster changes
(docs/design.md section 11):

* ``load`` registers the name cluster-wide (409 while it is taken) and loads the model
  once on one replica, so that a model which fits nowhere answers 507 at once and a bad
  artifact 400; it answers once that replica holds it, and Serve's routers have had time
  to learn so (:data:`ROUTING_SETTLE_SECONDS`).
* ``invoke`` reads the body here, then sends it to a replica chosen by Serve's router
  (one that holds the model if any); the answer carries
  :data:`~mmserver.ray.replicas.REPLICA_HEADER` and :data:`~mmserver.ray.replicas.LOADED_HEADER`.
  A replica that dies before answering is replaced by another once; a second loss
  answers 503 with ``Retry-After``.
* ``describe`` lists every replica holding the model; ``unload`` unloads it on every
  replica (each answering its accepted requests first), then frees the name.
* The v2 reads of one model (metadata, Triton's configuration) are answered by a replica
  that holds it, as an invocation is; Triton's statistics are the sums over the
  replicas that hold the model; ``/v2/models/{name}/ready`` is the registration's state.
* ``/metrics`` is every model host's own exposition, each series labelled with the
  ``replica`` that reported it (:func:`labelled_by_replica`): not summed, so a slow or
  overloaded replica stays visible. Invocations are counted by the replica that ran them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from mmserver import errors
from mmserver.config import Settings
from mmserver.http import answers
from mmserver.http.triton import INFERENCE_DURATIONS
from mmserver.http.service import Call
from mmserver.loaded_model import ModelInfo, ModelStatus
from mmserver.metrics import merged_exposition
from mmserver.model_roots import ModelRoots
from mmserver.pipeline import Answer, check_payload_size
from mmserver.ray.host import Held, Invoked
from mmserver.ray.registrations import READY, Registration
from mmserver.ray.replicas import LOADED_HEADER, REPLICA_HEADER
from mmserver.ray.replies import unwrapped
from mmserver.registry import folder_index, validate_name
from mmserver.wires import ToolkitHeaders, V2Headers

log = logging.getLogger(__name__)

#: What a call to another deployment may take beyond the limit the callee keeps itself
#: (routing, a replica's start): past it the callee is taken for lost.
CALL_MARGIN_SECONDS = 10.0
#: Registrations answer from memory; a call slower than this means their replica is gone.
REGISTRY_CALL_SECONDS = 30.0
#: A load answers this long after the model is held: a replica reports the models it holds
#: to Serve's controller every 0.1 s, which passes them to the routers in its next loop, so
#: the next request finds the replica that loaded the model instead of loading it elsewhere.
ROUTING_SETTLE_SECONDS = 0.5
#: Times an invocation is sent again after its replica died before answering, and a
#: broadcast after Serve could not send it because a replica was just lost (by then the
#: router has heard of the loss and sends to the replicas still running).
REPLICA_LOSS_RETRIES = 1
#: The errors that mean the replica never answered (it died, or cannot be reached, or the
#: deployment has none running while Serve replaces them).
REPLICA_LOST = (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError)


class ClusterService:
    """The models of one Ray Serve application (module docstring)."""

    def __init__(self, settings: Settings, hosts: DeploymentHandle,
                 registrations: DeploymentHandle):
        self.settings = settings
        self.hosts = hosts
        self.registrations = registrations
        self.roots = ModelRoots(settings.model_roots)

    # -- SageMaker's model management ------------------------------------------------

    async def load(self, name: str, url: str) -> Registration:
        self.roots.resolve(url)  # 404 or 400 before the name is taken; each host checks again
        registration = await self._registry(self.registrations.claim.remote(name, url))
        try:
            await _call(self._host(name).warm.remote(name),
                        self.settings.load_timeout_seconds + CALL_MARGIN_SECONDS,
                        lambda: errors.LoadTimeout(
                            f"loading model {name!r} took longer than "
                            f"{self.settings.load_timeout_seconds:g} s (MMSERVER_LOAD_TIMEOUT)"))
            registration = await self._registry(
                self.registrations.confirm.remote(name, registration.token))
            await asyncio.sleep(ROUTING_SETTLE_SECONDS)
        except BaseException:
            await asyncio.shield(self._release(name, registration.token))
            raise
        return registration

    async def page(self, limit: int | None, next_page_token: str | None
                   ) -> tuple[list[Registration], str | None]:
        return await self._registry(self.registrations.page.remote(limit, next_page_token))

    async def describe(self, name: str) -> dict[str, object]:
        registration = await self._registry(self.registrations.get.remote(name))
        holders: list[Held] = [held for held in await self._broadcast("holding", name)
                               if isinstance(held, Held)]
        status = registration.state
        if status == READY and not holders:
            status = ModelStatus.NOT_LOADED
        return answers.described_on_cluster(
            registration, status, [(held.replica, held.info) for held in holders])

    async def unload(self, name: str) -> None:
        registration = await self._registry(self.registrations.begin_unload.remote(name))
        try:
            await self._broadcast("drop", name)
        finally:
            await asyncio.shield(self._release(name, registration.token))

    # -- invocation ---------------------------------------------------------------------

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        limit = self.settings.max_payload_bytes
        if call.content_length is not None:
            check_payload_size(call.content_length, limit)
        body = await call.read_body(limit)
        timeout = self.settings.model_server_timeout_seconds + CALL_MARGIN_SECONDS
        for attempt in range(REPLICA_LOSS_RETRIES + 1):
            try:
                invoked: Invoked = await _call(
                    self._host(name).invoke.remote(name, headers, body), timeout,
                    lambda: errors.InvocationTimeout(
                        f"model {name!r} did not answer within "
                        f"{self.settings.model_server_timeout_seconds:g} s "
                        "(SAGEMAKER_MODEL_SERVER_TIMEOUT)"))
                break
            except errors.ReplicaUnavailable as error:
                log.warning("model=%s: %s%s", name, error,
                            "; sending it to another" if attempt < REPLICA_LOSS_RETRIES else "")
        else:
            lost = errors.ReplicaUnavailable(
                f"the replicas given model {name!r}'s request died before answering; retry")
            # No host counts this one (none answered): the log line is its only record.
            log.warning("model=%s invoke answered 503 (%s): %s", name, lost.unavailable, lost)
            raise lost
        answer = invoked.answer
        return Answer(answer.body, answer.content_type, {
            **(answer.headers or {}), REPLICA_HEADER: invoked.replica.replica_id,
            LOADED_HEADER: "1" if invoked.loaded else "0"})

    # -- the Open Inference Protocol's reads and repository ---------------------------------

    async def status(self, name: str) -> ModelStatus:
        registration = await self._registry(self.registrations.get.remote(name))
        return registration.state

    async def model_metadata(self, name: str) -> dict[str, object]:
        return await self._read_on_host("metadata", name)

    async def model_config(self, name: str) -> dict[str, object]:
        return await self._read_on_host("config", name)

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        if name is not None:
            registration = await self._registry(self.registrations.get.remote(name))
            if registration.state != READY:
                raise errors.ModelNotFound(f"model {name!r} is not loaded")
        by_replica = await self._broadcast("statistics", name)
        if name is not None:
            ready = [name]
        else:
            ready = sorted(registration.name for registration in await self._registry(
                self.registrations.every.remote()) if registration.state == READY)
        return [summed_statistics(model, [stats for replica in by_replica
                                          for stats in replica if stats["name"] == model])
                for model in ready]

    async def index(self) -> list[ModelInfo]:
        entries = folder_index(self.roots, self.settings.program)
        registrations: list[Registration] = await self._registry(
            self.registrations.every.remote())
        entries.update((r.name, ModelInfo(r.name, r.url, r.state))
                       for r in registrations)
        return [entries[name] for name in sorted(entries)]

    async def load_folder(self, name: str) -> None:
        validate_name(name)
        registration = await self._registry(self.registrations.current.remote(name))
        if registration is not None and registration.state == READY and \
                registration.url == name:
            return
        await self.load(name, name)

    async def exposition(self) -> bytes:
        return labelled_by_replica(await self._broadcast("exposition"))

    # -- calls to the other deployments -------------------------------------------------

    def _host(self, name: str) -> DeploymentHandle:
        """The model hosts, routed to one that holds ``name`` if any (Serve's multiplexing)."""
        return self.hosts.options(multiplexed_model_id=name)

    async def _read_on_host(self, method: str, name: str) -> dict[str, object]:
        return await _call(getattr(self._host(name), method).remote(name),
                           self.settings.load_timeout_seconds + CALL_MARGIN_SECONDS,
                           lambda: errors.ReplicaUnavailable(
                               f"no replica answered {method} of model {name!r}; retry"))

    async def _registry(self, response: DeploymentResponse) -> Any:
        return await _call(response, REGISTRY_CALL_SECONDS, lambda: errors.ReplicaUnavailable(
            "the registrations did not answer; retry"))

    async def _release(self, name: str, token: int) -> None:
        await self._registry(self.registrations.release.remote(name, token))

    async def _broadcast(self, method: str, *arguments: Any) -> list[Any]:
        """``method(*arguments)``'s answers from every model host; a replica that failed (it
        died, say) is logged and left out. A broadcast that could not be sent because a
        replica was lost meanwhile is sent again (``REPLICA_LOSS_RETRIES``), then answers 503."""
        timeout = self.settings.model_server_timeout_seconds + CALL_MARGIN_SECONDS
        for attempt in range(REPLICA_LOSS_RETRIES + 1):
            try:
                results = await self.hosts.broadcast(method, *arguments).results_async(
                    timeout_s=timeout, return_exceptions=True)
                break
            except TimeoutError:
                raise errors.ReplicaUnavailable(
                    f"not every replica answered {method}{arguments!r} within {timeout:g} s; "
                    "retry") from None
            except REPLICA_LOST as error:
                log.warning("%s%r could not reach the replicas (%s: %s)%s", method, arguments,
                            type(error).__name__, error,
                            "; sending it again" if attempt < REPLICA_LOSS_RETRIES else "")
        else:
            raise errors.ReplicaUnavailable(
                f"the model hosts could not be reached for {method} while Serve replaces a "
                "lost replica; retry")
        replies = []
        for result in results:
            if isinstance(result, BaseException):  # the replica died, or its call was cancelled
                log.warning("a replica failed %s%r: %s: %s", method, arguments,
                            type(result).__name__, result)
                continue
            try:
                replies.append(unwrapped(result))
            except errors.MMServerError as error:  # one replica's refusal is not the answer
                log.warning("a replica refused %s%r: %s", method, arguments, error)
        return replies


async def _call(response: DeploymentResponse, timeout_seconds: float,
                timeout_error: Callable[[], errors.MMServerError]) -> Any:
    """The callee's result, or its domain error raised (``replies``); a callee that died
    before answering is :class:`~mmserver.errors.ReplicaUnavailable`."""
    try:
        async with asyncio.timeout(timeout_seconds):
            return unwrapped(await response)
    except TimeoutError:
        response.cancel()
        raise timeout_error() from None
    except REPLICA_LOST as error:
        raise errors.ReplicaUnavailable(
            f"the replica given the request died before answering ({type(error).__name__})"
        ) from None


def summed_statistics(name: str, per_replica: list[dict[str, Any]]) -> dict[str, Any]:
    """Triton's statistics of model ``name`` over the replicas that hold it: counts and
    durations summed (per batch size too), the last inference the latest of them."""
    total: dict[str, Any] = {"name": name, "version": "1", "last_inference": 0,
                             "inference_count": 0, "execution_count": 0,
                             "inference_stats": {}, "batch_stats": [], "memory_usage": []}
    batches: dict[int, dict[str, Any]] = {}
    for stats in per_replica:
        total["version"] = stats["version"]
        total["last_inference"] = max(total["last_inference"], stats["last_inference"])
        total["inference_count"] += stats["inference_count"]
        total["execution_count"] += stats["execution_count"]
        _add_durations(total["inference_stats"], stats["inference_stats"])
        for entry in stats["batch_stats"]:
            size = entry["batch_size"]
            summed = batches.setdefault(size, {"batch_size": size})
            _add_durations(summed, {k: v for k, v in entry.items() if k != "batch_size"})
    total["batch_stats"] = [batches[size] for size in sorted(batches)]
    if not per_replica:  # held by no replica now: every duration of Triton's, at zero
        _add_durations(total["inference_stats"], {key: {"count": 0, "ns": 0}
                                                  for key in INFERENCE_DURATIONS})
    return total


def _add_durations(into: dict[str, Any], durations: dict[str, dict[str, int]]) -> None:
    for key, duration in durations.items():
        summed = into.setdefault(key, {"count": 0, "ns": 0})
        summed["count"] += duration["count"]
        summed["ns"] += duration["ns"]


def labelled_by_replica(expositions: list[tuple[str, bytes]]) -> bytes:
    """Each ``(replica id, Prometheus text)``'s series with a ``replica`` label, as one text."""
    return merged_exposition(
        (text, lambda labels, replica=replica: {**labels, "replica": replica})
        for replica, text in expositions)

"""The v2 answers read off a loaded model: its metadata, Triton's configuration and statistics.

Tools built for Triton read a model's configuration before they send a request
(``perf_analyzer`` sizes its batches by ``max_batch_size`` and its tensors by
``input[].dims``) and read its statistics to report where time went. These two
functions answer with Triton's field names from what mmserver already knows, so
nothing is configured twice; nothing here knows HTTP, and each runs where the model
is (in ``mmserver serve``, or on the Ray model host that holds it).

**Metadata** (``GET /v2/models/{name}``): the platform of its kind of folder, and its
inputs and outputs (:mod:`mmserver.signatures`); every model has one version, ``"1"``.

**Configuration** (``GET /v2/models/{name}/config``), from the model's signature
(:mod:`mmserver.signatures`) and its batching settings:

* ``max_batch_size`` is the runner's, for a row-wise model (requests are concatenated
  along dimension 0, so ``dims`` leave that dimension out, as Triton's do); a model that
  takes whole requests (not row-wise) does not batch rows: 0, with the full shape;
* ``dynamic_batching.max_queue_delay_microseconds`` is ``max_wait``, and
  ``default_queue_policy.max_queue_size`` the queue bound (a full queue is rejected, 503,
  Triton's ``REJECT``); the policy, which Triton has no field for, is the parameter
  ``mmserver_policy`` (``greedy`` or ``timer``, docs/design.md section 3);
* ``instance_group`` has the model's instance count, on the CPU or its GPU;
  ``max_batch_tokens`` (a text model's token budget), which Triton has no field for
  either, is the parameter ``mmserver_max_batch_tokens`` when it is set.

As in Triton's own answer (protobuf's JSON mapping), 64-bit integers are strings.

Each function reads a :class:`~mmserver.loaded_model.LoadedModel` (its handler, runner and
``info()``), which answers its v2 reads through them: the model imports this module, so
this module names the model's type only in words.

**Statistics** (``GET /v2/models[/{name}]/stats``), from the runner's running totals
(:class:`~mmserver.batching.stats.RunnerStats`), durations in nanoseconds. Per request
answered with a result, counted once its answer is encoded, all five counts together
(:class:`~mmserver.batching.stats.RequestStages`, as Triton counts them):

* ``success``: from the body's arrival to the end of its encoding;
* ``compute_input``: decoding the body into rows (where it is decoded: this process, or
  the HTTP worker), ``queue``: from joining the queue to the start of its call,
  ``compute_infer``: its call's whole time (Triton counts a batch's time for every
  request in it), ``compute_output``: encoding the answer; what ``success`` holds beyond
  the four is the event loop's hand-offs (perf_analyzer's "overhead");
* ``fail``: requests a model call answered with an error, and their seconds from joining
  the queue to the end of that call (requests refused, expired or cancelled before a
  call are not here; ``/metrics`` counts them);
* ``inference_count`` counts rows (Triton counts every element of a batch),
  ``execution_count`` model calls; ``batch_stats`` one entry per call size, with its
  calls and their seconds (``compute_infer``; staging the rows happens inside the call,
  so ``compute_input``/``compute_output`` there count the calls with 0 ns);
* ``mmserver_padding`` (a text model's, after its first call; Triton has no such field):
  ``real_tokens`` and ``padded_tokens`` over its calls, and ``efficiency``, real / padded.

``/metrics`` exports the same per-request totals (``mmserver_request_stage_seconds``).
"""

from __future__ import annotations

from typing import Any

from mmserver.handler.folder import EXPORTED, SCRIPT, TORCHSCRIPT
from mmserver.signatures import TensorSpec
from mmserver.wires import VERSION

#: What the v2 metadata calls each kind of model folder.
PLATFORMS = {SCRIPT: "python", TORCHSCRIPT: "pytorch_torchscript", EXPORTED: "pytorch_export"}
#: What Triton names each kind of model folder's runtime.
BACKENDS = {SCRIPT: "python", TORCHSCRIPT: "pytorch", EXPORTED: "pytorch"}
_NS = 1e9
#: Triton's durations of a model's ``inference_stats``, in its order (the cache's are zero:
#: mmserver has no response cache).
INFERENCE_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer",
                       "compute_output", "cache_hit", "cache_miss")


def data_type(datatype: str) -> str:
    """A v2 datatype name as Triton's configuration spells it (``FP32`` → ``TYPE_FP32``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_metadata(model: Any) -> dict[str, Any]:
    """The v2 metadata of ``model`` (module docstring)."""
    handler = model.handler
    signature = handler.signature
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": PLATFORMS[handler.kind],
        "inputs": [_spec(spec) for spec in signature.inputs],
        "outputs": [_spec(spec) for spec in signature.outputs],
    }


def _spec(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def model_config(model: Any) -> dict[str, Any]:
    """Triton's model configuration of ``model`` (module docstring)."""
    handler, settings, device = model.handler, model.runner.settings, model.device
    row_wise = handler.row_wise
    max_batch_size = settings.max_batch_size if row_wise else 0
    group: dict[str, Any] = {"name": model.name, "count": settings.instances,
                             "kind": "KIND_GPU" if device is not None and device.type == "cuda"
                             else "KIND_CPU"}
    if group["kind"] == "KIND_GPU":
        group["gpus"] = [device.index or 0]
    return {
        "name": model.name,
        "platform": PLATFORMS[handler.kind],
        "backend": BACKENDS[handler.kind],
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": [_tensor(spec, row_wise) for spec in handler.signature.inputs],
        "output": [_tensor(spec, row_wise) for spec in handler.signature.outputs],
        "dynamic_batching": {
            "max_queue_delay_microseconds": str(round(settings.max_wait * 1e6)),
            "preserve_ordering": True,
            "default_queue_policy": {"timeout_action": "REJECT",
                                     "max_queue_size": settings.max_queue_size},
        },
        "instance_group": [group],
        "parameters": _parameters(settings),
    }


def _parameters(settings: Any) -> dict[str, Any]:
    parameters = {"mmserver_policy": {"string_value": settings.policy}}
    if settings.max_batch_tokens:
        parameters["mmserver_max_batch_tokens"] = {"string_value": str(settings.max_batch_tokens)}
    return parameters


def _tensor(spec: TensorSpec, row_wise: bool) -> dict[str, Any]:
    dims = spec.shape[1:] if row_wise else spec.shape
    return {"name": spec.name, "data_type": data_type(spec.datatype),
            "dims": [str(d) for d in dims]}


def model_stats(model: Any) -> dict[str, Any]:
    """Triton's statistics of ``model`` since it was loaded (module docstring)."""
    stats = model.runner.stats
    answered = stats.stages.count
    durations = {stage: _duration(answered, seconds)
                 for stage, seconds in stats.stages.by_stage().items()}
    durations["fail"] = _duration(stats.requests_failed_in_calls, stats.failed_seconds_total)
    return {
        "name": model.name,
        "version": VERSION,
        "last_inference": round(stats.last_batch_unix * 1000),
        "inference_count": stats.rows,
        "execution_count": stats.batches,
        "inference_stats": {key: durations.get(key, _duration(0, 0.0))
                            for key in INFERENCE_DURATIONS},
        "batch_stats": [
            {"batch_size": size, "compute_input": _duration(count, 0.0),
             "compute_infer": _duration(count, stats.batch_size_compute_seconds[size]),
             "compute_output": _duration(count, 0.0)}
            for size, count in sorted(stats.batch_size_counts.items()) if count],
        "memory_usage": [],
        **_padding(stats),
    }


def _padding(stats: Any) -> dict[str, Any]:
    """A text model's tokens (mmserver's own field; Triton has none): real and padded, and
    real / padded, over its calls; nothing before its first call or for other models."""
    if not stats.padded_tokens_total:
        return {}
    return {"mmserver_padding": {"real_tokens": str(stats.real_tokens_total),
                                 "padded_tokens": str(stats.padded_tokens_total),
                                 "efficiency": stats.padding_efficiency}}


def _duration(count: int, seconds: float) -> dict[str, int]:
    return {"count": count, "ns": round(seconds * _NS)}

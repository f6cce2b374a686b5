"""Prometheus metrics: per-model counts, latencies, batch sizes and queue depth.

Each app gets its own ``CollectorRegistry`` so several servers can live in one
process (tests, notebooks). The runner keeps plain statistics and calls a
listener after every batch; this module turns those into histograms.

Every series labelled with a model's name is removed when that model is
unloaded (counters and histograms included), so loading and unloading many
names does not make ``/metrics`` grow for ever. An answer that arrives after
its model was unloaded (a call that outlived the drain) is counted under
``model="(not loaded)"``, the label of invocations of unknown names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401 - re-exported for app
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import SummaryMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from mmserver.batching import BatchRecord, ModelRunner
from mmserver.batching.stats import STAGES, RequestStages
from mmserver.served import ServedModel

#: Latency buckets (seconds) from a fast CPU model to a slow batch on a busy queue.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Batch sizes in rows: powers of two up to the largest sensible max_batch_size.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: The ``model`` label of invocations of a name that is not loaded (unknown, or unloaded since).
NOT_LOADED_LABEL = "(not loaded)"


disable_created_metrics()  # the *_created series double the output and nobody scrapes them


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        #: Every metric labelled by model, with its label names: what an unload removes.
        self._per_model: list[tuple[object, tuple[str, ...]]] = []
        self.requests = self.per_model_metric(
            Counter, "mmserver_requests", "Invocations answered, by HTTP status.",
            ("model", "status"))
        self.unavailable = self.per_model_metric(
            Counter, "mmserver_requests_unavailable",
            "Invocations answered 503, by reason: queue_full (load shed), unhealthy, loading, "
            "engine_unavailable, replica_unavailable, shutting_down.", ("model", "reason"))
        self.latency = self.per_model_metric(
            Histogram, "mmserver_request_latency_seconds",
            "Invocation latency from request to response.", buckets=LATENCY_BUCKETS)
        self.queue_wait = self.per_model_metric(
            Histogram, "mmserver_queue_wait_seconds",
            "Time a request waited in the queue before its batch ran.", buckets=LATENCY_BUCKETS)
        self.compute = self.per_model_metric(
            Histogram, "mmserver_compute_seconds",
            "Time one batch spent in the model (worker thread).", buckets=LATENCY_BUCKETS)
        self.batch_size = self.per_model_metric(
            Histogram, "mmserver_batch_size_rows", "Rows per model call.",
            buckets=BATCH_SIZE_BUCKETS)
        self.real_tokens = self.per_model_metric(
            Counter, "mmserver_real_tokens",
            "A text model's tokens in its calls, each row's own (padding not counted).")
        self.padded_tokens = self.per_model_metric(
            Counter, "mmserver_padded_tokens",
            "A text model's tokens in its calls as padded: rows x longest row, per call.")
        self.padding_efficiency = self.per_model_metric(
            Gauge, "mmserver_padding_efficiency",
            "A text model's real tokens / padded tokens over its calls (1: no padding).")
        self.queue_depth = self.per_model_metric(
            Gauge, "mmserver_queue_depth", "Requests admitted and not yet in a batch.")
        self.instances = self.per_model_metric(
            Gauge, "mmserver_model_instances",
            "Batches of the model that may run at once (its instances).")
        self.instance_busy = self.per_model_metric(
            Gauge, "mmserver_instance_busy_seconds",
            "Seconds each instance of a model has spent running batches.", ("model", "instance"))
        self.model_memory = self.per_model_metric(
            Gauge, "mmserver_model_memory_bytes",
            "Bytes of parameters and buffers per loaded model.")
        self.model_restarts = self.per_model_metric(
            Counter, "mmserver_model_process_restarts",
            "Times the process of a model with isolation: process died and another loaded it.")
        self.models_loaded = Gauge("mmserver_models_loaded", "Models loaded now.",
                                   registry=self.registry)
        #: Per model, its requests' seconds per stage: read at each scrape, never copied.
        self._stages: dict[str, RequestStages] = {}
        self.registry.register(_StagesCollector(self._stages))
        self._request_counters: dict[tuple[str, int], object] = {}
        self._unavailable_counters: dict[tuple[str, str], object] = {}
        self._latencies: dict[str, object] = {}
        self._loaded: set[str] = set()

    def per_model_metric(self, kind, name: str, documentation: str,
                         labels: tuple[str, ...] = ("model",), **options):
        """Declare a metric whose first label is the model: its series go when the model does."""
        metric = kind(name, documentation, labels, registry=self.registry, **options)
        self._per_model.append((metric, labels))
        return metric

    def model_loaded(self, model: ServedModel) -> None:
        """A model's series: the request counts here, and what the model declares
        (:meth:`runner_loaded`; a model in a process of its own declares its restarts, and
        that process exports the rest, ``merged_exposition``)."""
        self._loaded.add(model.name)
        self.models_loaded.inc()
        model.export_metrics(self)

    def runner_loaded(self, name: str, memory_bytes: int, runner: ModelRunner) -> None:
        """The series of a model whose runner is in this process."""
        self._stages[name] = runner.stats.stages
        self.model_memory.labels(name).set(memory_bytes)
        self.queue_depth.labels(name).set_function(lambda: runner.queue_depth)
        executors = runner.instances.executors
        self.instances.labels(name).set(len(executors))
        for index, executor in enumerate(executors):
            self.instance_busy.labels(name, str(index)).set_function(
                lambda executor=executor: executor.busy_seconds)
        runner.add_listener(self._batch_observer(name))

    def model_unloaded(self, model: ServedModel) -> None:
        """Remove every series labelled with the model, found in what each metric exports."""
        name = model.name
        self._loaded.discard(name)
        self._stages.pop(name, None)
        self.models_loaded.dec()
        for metric, labels in self._per_model:
            series = {tuple(sample.labels[label] for label in labels)
                      for family in metric.collect() for sample in family.samples
                      if sample.labels.get("model") == name}
            for values in series:
                metric.remove(*values)
        for counters in (self._request_counters, self._unavailable_counters):
            for key in [key for key in counters if key[0] == name]:
                del counters[key]
        self._latencies.pop(name, None)

    def _batch_observer(self, name: str):
        batch_size = self.batch_size.labels(name)
        compute = self.compute.labels(name)
        waits = self.queue_wait.labels(name)
        totals = {"real": 0, "padded": 0}

        def observe(record: BatchRecord) -> None:
            batch_size.observe(record.rows)
            compute.observe(record.compute_seconds)
            for seconds in record.queue_wait_seconds:
                waits.observe(seconds)
            if record.padded_tokens:  # a text model's call: its series appear with it
                totals["real"] += record.real_tokens
                totals["padded"] += record.padded_tokens
                self.real_tokens.labels(name).inc(record.real_tokens)
                self.padded_tokens.labels(name).inc(record.padded_tokens)
                self.padding_efficiency.labels(name).set(totals["real"] / totals["padded"])

        return observe

    def request_done(self, name: str, status: int, seconds: float,
                     unavailable: str | None = None) -> None:
        """One invocation answered; ``unavailable``: why, when it was a 503
        (``errors.Unavailable``)."""
        if name not in self._loaded:  # unloaded while this request ran: its series are gone
            name = NOT_LOADED_LABEL
        counter = self._request_counters.get((name, status))
        if counter is None:  # labels() takes a lock and builds keys: look each child up once
            counter = self._request_counters[(name, status)] = self.requests.labels(
                name, str(status))
        counter.inc()
        if unavailable is not None:
            reason = self._unavailable_counters.get((name, unavailable))
            if reason is None:
                reason = self._unavailable_counters[(name, unavailable)] = \
                    self.unavailable.labels(name, str(unavailable))
            reason.inc()
        latency = self._latencies.get(name)
        if latency is None:
            latency = self._latencies[name] = self.latency.labels(name)
        latency.observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StagesCollector:
    """``mmserver_request_stage_seconds``: requests answered with a result and their seconds
    per stage (``stage`` as Triton's statistics name it), the very totals
    ``/v2/models/{name}/stats`` answers (``http.triton``), so the two always agree."""

    def __init__(self, stages: dict[str, RequestStages]):
        self.stages = stages

    def collect(self) -> list:
        family = SummaryMetricFamily(
            "mmserver_request_stage_seconds",
            "Requests answered with a result, and their seconds per stage (Triton's "
            "statistics: success, queue, compute_input, compute_infer, compute_output).",
            labels=("model", "stage"))
        for name, stages in list(self.stages.items()):
            for stage, seconds in zip(STAGES, stages.seconds):
                family.add_metric((name, stage), stages.count, seconds)
        return [family]

    def describe(self) -> list:
        return []


#: What :func:`merged_exposition` does to a series' labels: new labels, or None to drop it.
Relabel = Callable[[Mapping[str, str]], Mapping[str, str] | None]


def merged_exposition(parts: Iterable[tuple[bytes, Relabel]]) -> bytes:
    """Several processes' Prometheus texts as one: each series relabelled by its part's
    function (or dropped), series of one metric together under one header."""
    families: dict[str, object] = {}
    for text, relabel in parts:
        for family in text_string_to_metric_families(text.decode()):
            samples = []
            for sample in family.samples:
                labels = relabel(sample.labels)
                if labels is not None:
                    samples.append(Sample(sample.name, dict(labels), sample.value,
                                          sample.timestamp, sample.exemplar))
            merged = families.setdefault(family.name, family)
            if merged is family:
                family.samples = samples
            else:
                merged.samples.extend(samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """Parsed metric families, as a collector (what ``generate_latest`` writes out)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self) -> list:
        return self.families

"""Per-model series in ``/metrics``: an unload removes every one of them, whatever the metric."""

from __future__ import annotations

import asyncio
import types

import torch
from prometheus_client import Gauge

from mmserver.batching import ModelRunner
from mmserver.metrics import NOT_LOADED_LABEL, Metrics


def families_with(metrics: Metrics, name: str) -> set[str]:
    return {family.name for family in metrics.registry.collect()
            for sample in family.samples if sample.labels.get("model") == name}


def test_an_unload_removes_every_series_labelled_with_the_model_and_no_other():
    metrics = Metrics()

    async def serve(name: str):
        runner = ModelRunner(torch.nn.Identity(), name=name)
        model = types.SimpleNamespace(  # a served model declares its series (mmserver.served)
            name=name, export_metrics=lambda metrics: metrics.runner_loaded(name, 1024, runner))
        metrics.model_loaded(model)
        async with runner:
            await runner.submit(torch.ones(1, 2))
        metrics.request_done(name, 200, 0.002)
        metrics.request_done(name, 500, 0.003)
        metrics.request_done(name, 503, 0.001, "queue_full")
        return model

    async def main():
        return await serve("gone"), await serve("stays")

    gone, _ = asyncio.run(main())
    before = families_with(metrics, "gone")
    assert len(before) == 11, before  # every per-model metric of Metrics has a series
    metrics.model_unloaded(gone)
    assert families_with(metrics, "gone") == set()
    assert families_with(metrics, "stays") == before
    metrics.request_done("gone", 200, 0.001)  # an answer that outlived its model's unload
    assert families_with(metrics, "gone") == set()
    assert NOT_LOADED_LABEL in {s.labels.get("model") for f in metrics.registry.collect()
                                for s in f.samples}


def test_a_metric_declared_per_model_is_removed_without_a_line_of_its_own():
    metrics = Metrics()
    extra = metrics.per_model_metric(Gauge, "mmserver_new_gauge", "A metric added later.",
                                      ("model", "kind"))
    extra.labels("m", "a").set(1)
    extra.labels("m", "b").set(2)
    extra.labels("other", "a").set(3)
    metrics.model_unloaded(types.SimpleNamespace(name="m"))
    assert families_with(metrics, "m") == set() and families_with(metrics, "other") == {
        "mmserver_new_gauge"}

"""Assertions the test modules share, written once so every module means the same by them."""

from __future__ import annotations

import json
import time

import pytest
import torch

from mmserver.harness.testing import histogram, sample_value

#: "The same answer" (docs/design.md, section 3): ``torch.testing.assert_close``'s float32
#: tolerances, |batched - alone| <= ATOL + RTOL * |alone|.
SAME_ANSWER_RTOL = 1.3e-6
SAME_ANSWER_ATOL = 1e-5


def assert_error(answer, status: int, error_type: str | None = None) -> dict:
    """Assert that ``answer`` is mmserver's error answer ``status``, and return its body.

    ``answer`` is what a client call returns: ``(status, body)`` from ``json``, ``load``,
    ``unload`` or ``invoke``, or ``(status, headers, raw)`` from ``request`` (a raw body is
    decoded here). Every error is ``{"code": status, "type": "...", "message": "..."}``, the
    MMS/TorchServe shape clients parse, with a type and a message that say something.
    """
    got, *_, body = answer
    if isinstance(body, (bytes, str)):
        body = json.loads(body)
    assert got == status, (got, body)
    assert isinstance(body, dict) and set(body) == {"code", "type", "message"}, body
    assert body["code"] == status, body
    assert isinstance(body["type"], str) and body["type"], body
    if error_type is not None:
        assert body["type"] == error_type, body
    assert isinstance(body["message"], str) and body["message"], body
    return body


def assert_v2_error(answer, status: int) -> str:
    """Assert that ``answer`` is an error answer of the ``/v2`` routes, and return its message.

    ``answer`` as for :func:`assert_error`. The v2 protocol's shape is Triton's,
    ``{"error": "..."}``, which ``tritonclient`` parses, with a message that says something.
    """
    got, *_, body = answer
    if isinstance(body, (bytes, str)):
        body = json.loads(body)
    assert got == status, (got, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"], body
    return body["error"]


def assert_same_answer(batched, alone, *, exact: bool = False, decimals: int | None = None):
    """Assert that rows answered in a batch got the answer the same rows get alone.

    Batching never changes an answer (docs/design.md, section 3): equal within float32
    rounding, ``SAME_ANSWER_RTOL`` and ``SAME_ANSWER_ATOL``, as a batched kernel may add in
    another order; bitwise equal with ``exact=True``, for batch-invariant (elementwise)
    models. ``decimals``: the answer was rounded to that many places after the model ran,
    so two values within tolerance may round one unit of the last place apart. Either side
    is a tensor, an array, a number, or a list or dict of them (a decoded JSON answer).
    """
    if exact:
        torch.testing.assert_close(batched, alone, rtol=0, atol=0)
        return
    atol = SAME_ANSWER_ATOL + (10.0 ** -decimals if decimals is not None else 0.0)
    torch.testing.assert_close(batched, alone, rtol=SAME_ANSWER_RTOL, atol=atol)


def path_without(program: str, shadow_root) -> str:
    """``PATH`` as it is, but with ``program`` found nowhere on it.

    A folder of ``PATH`` that holds ``program`` (``/usr/bin`` for Debian's wrk) cannot simply
    be dropped, as everything else lives there too; it is replaced by a folder under
    ``shadow_root`` of links to all its entries but ``program``.
    """
    import os
    from pathlib import Path

    folders = []
    for index, folder in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if folder and (Path(folder) / program).exists():
            shadow = Path(shadow_root) / f"path-{index}"
            shadow.mkdir(parents=True, exist_ok=True)
            for entry in Path(folder).iterdir():
                if entry.name != program and not (shadow / entry.name).exists():
                    (shadow / entry.name).symlink_to(entry)
            folder = str(shadow)
        folders.append(folder)
    return os.pathsep.join(folders)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; whether it held.

    Tests wait on a condition the server reports (a model's status, its requests in
    flight), never on a fixed sleep that a slow machine outlasts.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def model_stats(server, name: str) -> dict:
    """The ``stats`` of ``GET /models/{name}`` (empty while the model has none)."""
    status, body = server.json("GET", f"/models/{name}")
    return body.get("stats", {}) if status == 200 else {}


def wait_for_in_flight(server, name: str, count: int, timeout: float = 30) -> None:
    """Wait until the server holds exactly ``count`` requests of ``name`` (queued or running)."""
    assert wait_until(lambda: model_stats(server, name).get("requestsInFlight") == count, timeout), (
        f"{name!r} never held {count} requests in flight: {model_stats(server, name)}")


def assert_statistics_match_metrics(stats: dict, families) -> None:
    """A model's Triton statistics hold the same totals as ``/metrics`` (no request of it
    failed): per request and stage, per call, per row."""
    name = stats["name"]
    inference = stats["inference_stats"]
    for stage in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        count = sample_value(families, "mmserver_request_stage_seconds_count", model=name,
                             stage=stage)
        seconds = sample_value(families, "mmserver_request_stage_seconds_sum", model=name,
                               stage=stage)
        assert (inference[stage]["count"], inference[stage]["ns"]) == pytest.approx(
            (count, seconds * 1e9), abs=1), stage
    _, queue_sum, queue_count = histogram(families, "mmserver_queue_wait_seconds", model=name)
    assert (inference["queue"]["count"], inference["queue"]["ns"]) == pytest.approx(
        (queue_count, queue_sum * 1e9), abs=1)
    _, compute_sum, calls = histogram(families, "mmserver_compute_seconds", model=name)
    assert stats["execution_count"] == calls
    assert sum(b["compute_infer"]["ns"] for b in stats["batch_stats"]) == pytest.approx(
        compute_sum * 1e9, abs=len(stats["batch_stats"]))
    _, rows, _ = histogram(families, "mmserver_batch_size_rows", model=name)
    assert stats["inference_count"] == rows

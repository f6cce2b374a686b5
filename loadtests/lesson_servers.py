"""Servers and model folders for the lesson's HTTP notebooks (notebook 04 first).

What a notebook would otherwise spell out before every experiment, kept here so that each of
its cells shows one step of the story:

* :data:`PINNED` and :func:`on_core`: every server on core 0, the notebook's kernel (the
  client) on core 1 while it drives load, every core again afterwards;
* :func:`mmserver` and :func:`start_book_server`: ``mmserver serve`` and the book's server
  (``notebooks/book_server.py``) on core 0, one intra-op thread each;
* :func:`write_traced` and :func:`write_sleeping`: a module traced to TorchScript as a served
  model folder (optionally with its ``mmserver.json``), or with a ``predict_fn`` that sleeps a
  fixed part per call and a part per row, the cost line of notebook 03's toy;
* the models the notebooks serve (:class:`SmallCNN`, :class:`NoOp`, :class:`SmallImageModel`)
  and their request bodies (:func:`npy_body`, :func:`post_json`).

Measuring is not done here: that is ``loadtests.instruments``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from mmserver.harness.testing import ServerProcess, free_port, taskset_prefix, wait_for_ping

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SERVER_CPUS, CLIENT_CPUS = "0", {1}
ALL_CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
#: Whether servers can sit on core 0 and the client on core 1 (else nothing is pinned).
PINNED = bool(taskset_prefix(SERVER_CPUS)) and CLIENT_CPUS <= ALL_CPUS
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
CLASSES = 10


@contextlib.contextmanager
def on_core(cpus=CLIENT_CPUS) -> Iterator[None]:
    """This process on ``cpus`` for a while (core 1 while it drives load); every core again
    afterwards, so that a server started later can still be pinned to core 0."""
    if PINNED:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        if PINNED:
            os.sched_setaffinity(0, ALL_CPUS)


def mmserver(workdir: Path, *args) -> ServerProcess:
    """``mmserver serve`` (not started) on core 0 with one intra-op thread, its models under
    ``workdir``, its log in ``workdir``."""
    workdir = Path(workdir)
    return ServerProcess(["--model-root", workdir, "--no-access-log", *args], cpus=SERVER_CPUS, cwd=workdir,
                         env=ONE_THREAD, log_path=workdir / f"mmserver-{free_port()}.log")


def start_book_server(model_dir: Path, max_batch_size: int = 1, track=lambda process: process) -> str:
    """Start the book's server on core 0 for ``model_dir``; its URL once it answers ``/ping``.
    ``track`` receives the process (``lesson.started``, so that ``lesson.stop_all`` stops it)."""
    port = free_port()
    process = track(subprocess.Popen(
        [*taskset_prefix(SERVER_CPUS), sys.executable, str(NOTEBOOKS / "book_server.py"), "--port", str(port),
         "--model-dir", str(model_dir), "--max-batch-size", str(max_batch_size)],
        cwd=NOTEBOOKS, env={**os.environ, **ONE_THREAD}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{port}"
    wait_for_ping(url, 120, process)
    return url


def write_traced(module: nn.Module, folder: Path, row_shape: Sequence[int],
                 max_batch_size: int | None = None) -> Path:
    """``module`` traced on one row of ``row_shape`` and saved as ``folder/model.pt``; with
    ``max_batch_size``, an ``mmserver.json`` that sets it (1: batching off)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # TorchScript's deprecation notice
        torch.jit.trace(module.eval(), torch.zeros(1, *row_shape)).save(str(folder / "model.pt"))
    if max_batch_size is not None:
        (folder / "mmserver.json").write_text(json.dumps({"max_batch_size": max_batch_size}))
    return folder


SLEEPING_SOURCE = '''\
import time

MMSERVER_ROW_WISE = True  # rows of many requests may share a call


def predict_fn(data, model):
    time.sleep({per_call} + {per_row} * data.shape[0])
    return model(data)
'''


def write_sleeping(module: nn.Module, folder: Path, row_shape: Sequence[int], per_call_s: float,
                   per_row_s: float) -> Path:
    """:func:`write_traced`, with a row-wise ``predict_fn`` whose call also sleeps
    ``per_call_s + per_row_s × rows``: a fixed part per call, as a GPU's call has (a sleep holds
    no core)."""
    write_traced(module, folder, row_shape)
    (Path(folder) / "code").mkdir(exist_ok=True)
    (Path(folder) / "code" / "inference.py").write_text(
        SLEEPING_SOURCE.format(per_call=per_call_s, per_row=per_row_s))
    return Path(folder)


def npy_body(shape: Sequence[int], seed: int = 0) -> bytes:
    """One request's body: an array of ``shape`` (rows first), random from ``seed``, as ``.npy``."""
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(seed).random(tuple(shape), dtype=np.float32))
    return buffer.getvalue()


def post_json(url: str, payload):
    """POST ``payload`` as JSON; the decoded JSON answer."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


class SmallCNN(nn.Module):
    """Notebook 01's small CNN: three conv layers (32, 64, 64 channels), a 10-way head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class NoOp(nn.Module):
    """No compute; an answer as large as the CNN's (10 numbers per row)."""

    def forward(self, x):
        return x.flatten(1)[:, :CLASSES]


class SmallImageModel(nn.Module):
    """One strided convolution (3 -> 8 channels), a global average, a 10-way head; any image size."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))

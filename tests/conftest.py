"""Shared fixtures: real model directories on disk, a real server process, an in-process app."""

from __future__ import annotations

import asyncio
import os
import textwrap
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from mmserver.http.app import WORKER_HEADER, create_app
from mmserver.config import Settings
from mmserver.ray.testing import RAY_ENVIRONMENT
from mmserver.harness.testing import ModelServerClient, ServerProcess, wait_for_http_workers

ROOT = Path(__file__).resolve().parents[1]

# A Ray cluster a test starts stays on 127.0.0.1 and reports nothing: Ray reads these once,
# when a test module first imports it.
for _key, _value in RAY_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)


# -- models written by the tests ----------------------------------------------------


class Affine(torch.nn.Module):
    """y = 2x + 1: every output row names its input row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def write_torchscript(model_dir: Path, module: torch.nn.Module | None = None,
                      example: torch.Tensor | None = None) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    module = module if module is not None else Affine()
    example = example if example is not None else torch.ones(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(module, example).save(str(model_dir / "model.pt"))
    return model_dir


def write_code(model_dir: Path, source: str, *, with_affine: bool = False) -> Path:
    (model_dir / "code").mkdir(parents=True, exist_ok=True)
    (model_dir / "code" / "inference.py").write_text(textwrap.dedent(source))
    if with_affine:
        write_torchscript(model_dir)
    return model_dir


#: A row-wise model that logs each batch's first column (a request's tag) to
#: ``batches.jsonl`` in its folder, 20 ms a call, so tests can see which requests shared a batch.
RECORDER_CODE = """
    import json, os, time, torch

    MMSERVER_ROW_WISE = True
    LOG = None

    def model_fn(model_dir):
        global LOG
        LOG = os.path.join(model_dir, "batches.jsonl")
        return torch.jit.load(os.path.join(model_dir, "model.pt"))

    def predict_fn(data, model):
        time.sleep(0.02)
        with open(LOG, "a") as log:
            log.write(json.dumps(data[:, 0].tolist()) + "\\n")
        return model(data)
"""

SLOW_CODE = """
    import time, torch

    MMSERVER_ROW_WISE = True  # predict_fn is row-wise: the server may batch requests

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        time.sleep(float(data[0, 0]) if data.shape[1] > 0 and data[0, 0] > 0 else 0.2)
        return data * 2 + 1
"""

FAILING_CODE = """
    import torch

    MMSERVER_ROW_WISE = True  # predict_fn is row-wise: the server may batch requests

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        if (data < 0).any():
            raise RuntimeError("negative input is not allowed")
        return data * 2 + 1
"""

OOM_CODE = """
    import torch

    MMSERVER_ROW_WISE = True  # predict_fn is row-wise: the server may batch requests

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        if data.shape[0] > 2 or (data > 1000).any():
            raise torch.OutOfMemoryError(f"pretend CUDA OOM at {data.shape[0]} rows")
        return data * 2 + 1
"""

ATTRIBUTES_CODE = """
    import json, torch

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept, context=None):
        body = {"rows": prediction.tolist(), "attributes": context.custom_attributes}
        return json.dumps(body).encode(), "application/json"
"""


SLOW_CUSTOM_OUTPUT_CODE = """
    import json, time

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        time.sleep(0.3)
        return data * 2 + 1

    def output_fn(prediction, accept):
        return json.dumps({"answer": prediction.tolist()}), "application/json"
"""


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    """A model root with every kind of artifact the tests need, good and bad."""
    root = tmp_path_factory.mktemp("models")
    write_torchscript(root / "affine")
    write_torchscript(root / "affine2")
    write_code(root / "slow", SLOW_CODE)
    write_code(root / "failing", FAILING_CODE)
    write_code(root / "oom", OOM_CODE)
    write_code(root / "attributes", ATTRIBUTES_CODE)
    write_code(root / "slow_custom_output", SLOW_CUSTOM_OUTPUT_CODE)
    write_code(root / "broken_code", "def model_fn(model_dir:\n    return 1\n")
    write_code(root / "raising_model_fn", """
        def model_fn(model_dir):
            raise FileNotFoundError("weights.bin is missing")
    """)
    write_code(root / "memory_error", """
        def model_fn(model_dir):
            raise MemoryError("cannot allocate 40 GiB")
    """)
    write_code(root / "slow_load", """
        import time

        def model_fn(model_dir):
            time.sleep(1.5)
            return lambda x: x * 2 + 1
    """)
    (root / "corrupt").mkdir()
    (root / "corrupt" / "model.pt").write_bytes(b"this is not a TorchScript archive")
    (root / "empty").mkdir()
    big = root / "big"
    big.mkdir()
    with open(big / "model.pt", "wb") as f:  # a sparse 64 MiB file: large on paper only
        f.truncate(64 * 2**20)
    for i in range(12):
        write_torchscript(root / f"m{i:02d}")
    return root


# -- a real server process on a free port --------------------------------------------


#: ``MMSERVER_TEST_HTTP_WORKERS=2 make test``: every server a test starts without saying how
#: many HTTP workers it wants runs with this many, over one engine (README, "HTTP workers").
TEST_HTTP_WORKERS = int(os.environ.get("MMSERVER_TEST_HTTP_WORKERS", "1"))


class Server(ServerProcess):
    """A started :class:`mmserver.harness.testing.ServerProcess`, run from the repository root."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        workers = TEST_HTTP_WORKERS if "--http-workers" not in args else 1
        if workers > 1:
            args = [*args, "--http-workers", str(workers)]
        super().__init__(args, env=env, cwd=ROOT)
        self.start(timeout=60)
        if workers > 1:  # /ping answers once the first worker listens
            wait_for_http_workers(self.url, workers, WORKER_HEADER)


def running_server(args: list[str], env: dict[str, str] | None = None) -> Server:
    """A started server for a ``with`` block, which stops it (SIGTERM) at the end."""
    return Server(args, env)


@pytest.fixture(scope="module")
def server(model_root) -> Iterator[Server]:
    """One server per test module, models under ``model_root``, quiet access log."""
    with running_server(["--model-root", str(model_root), "--no-access-log",
                         "--max-wait-ms", "2"]) as s:
        yield s


# -- the same application in this process ---------------------------------------------


class InProcessServer(ModelServerClient):
    """``create_app(settings)`` behind aiohttp's ``TestServer``, on an event loop of its own.

    Synchronous calls, as :class:`mmserver.harness.testing.ServerProcess` offers, so a test reads
    the same against either; no pytest plugin for asyncio is needed. The loop runs only
    while a request is in flight, so requests are sent one at a time.
    """

    def __init__(self, settings: Settings):
        self.loop = asyncio.new_event_loop()
        self.client: TestClient = self.loop.run_until_complete(self._start(settings))

    @staticmethod
    async def _start(settings: Settings) -> TestClient:
        client = TestClient(TestServer(create_app(settings)))
        await client.start_server()
        return client

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: Mapping[str, str] | None = None,
                timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        async def send():
            # No Content-Type unless the caller gives one, as http.client sends it.
            async with self.client.request(method, path, data=body, headers=dict(headers or {}),
                                           skip_auto_headers=("Content-Type",),
                                           timeout=timeout) as response:
                return response.status, dict(response.headers), await response.read()

        return self.loop.run_until_complete(send())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture
def loaded(server, root):
    """``loaded(folder, name=None)`` loads ``root / folder`` into the module's ``server``; every
    model it loaded is unloaded after the test."""
    names = []

    def load(folder, name=None):
        name = name or folder
        status, body = server.load(name, root / folder)
        assert status == 200, body
        names.append(name)
        return name

    yield load
    for name in names:
        server.request("DELETE", f"/models/{name}")

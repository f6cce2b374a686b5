"""What only the in-process app shows cheaply: settings a case chooses for itself.

The HTTP contract runs in process and in a subprocess alike (``test_server_contract.py``).
Here ``create_app`` gets settings of this test's own, such as a payload limit small enough
that 413 costs a few kilobytes; and the engine's end of a worker's channel, which only a test
in the engine's process reaches at a chosen moment. Models are real TorchScript files or
folders written by ``conftest``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest
import torch
from conftest import SLOW_CODE, InProcessServer, write_code, write_torchscript
from helpers import assert_error

from mmserver.config import Settings
from mmserver.engine.channel import Channel
from mmserver.engine.messages import Failed, Rows
from mmserver.engine.shared import pack
from mmserver.engine.workers import WorkerConnection
from mmserver.errors import ShuttingDown

#: The largest body this app accepts (a small limit makes 413 cheap to reach).
MAX_PAYLOAD_BYTES = 4096


@pytest.fixture
def app(tmp_path) -> Iterator[InProcessServer]:
    """An app with a ``MAX_PAYLOAD_BYTES`` limit, ``preloaded`` with ``y = 2x + 1``."""
    write_torchscript(tmp_path / "affine")
    server = InProcessServer(Settings(model_roots=(tmp_path,), max_payload_bytes=MAX_PAYLOAD_BYTES,
                                      preload=(("preloaded", str(tmp_path / "affine")),)))
    try:
        yield server
    finally:
        server.close()


def test_a_body_over_the_payload_limit_is_413(app):
    body = json.dumps([[1.0] * (MAX_PAYLOAD_BYTES // 4)]).encode()
    assert len(body) > MAX_PAYLOAD_BYTES
    assert_error(app.request("POST", "/models/preloaded/invoke", body,
                             {"Content-Type": "application/json"}), 413, "PayloadTooLarge")
    assert app.invoke("preloaded", [[1]]) == (200, [[3.0]])


def test_a_chunked_body_is_held_to_the_payload_limit_as_it_arrives(app):
    """Without a Content-Length the limit is checked on the bytes read so far: 413 past it,
    and a chunked body within it is answered as any other."""
    async def send(payload: bytes) -> tuple[int, bytes]:
        async def chunks():
            for start in range(0, len(payload), 1024):
                yield payload[start:start + 1024]

        async with app.client.post("/models/preloaded/invoke", data=chunks(),
                                   headers={"Content-Type": "application/json"}) as response:
            assert "Content-Length" not in response.request_info.headers
            return response.status, await response.read()

    too_big = json.dumps([[1.0] * (MAX_PAYLOAD_BYTES // 4)]).encode()
    assert len(too_big) > MAX_PAYLOAD_BYTES
    assert_error(app.loop.run_until_complete(send(too_big)), 413, "PayloadTooLarge")
    status, raw = app.loop.run_until_complete(send(b"[[1]]"))
    assert (status, json.loads(raw)) == (200, [[3.0]])


def test_openapi_lists_exactly_the_routes_the_app_serves():
    """``openapi.json`` is hand-written beside the route table: a route added to one and not
    the other is a contract that lies (schemathesis fuzzes only what the document lists)."""
    from importlib.resources import files

    from mmserver.http.table import ROUTES

    document = json.loads(files("mmserver.http").joinpath("openapi.json").read_text())
    documented = {(method.upper(), path) for path, item in document["paths"].items()
                  for method in item if method != "parameters"}
    assert documented == {(route.method, route.path) for route in ROUTES}


def test_once_shutdown_drains_the_models_an_invocation_is_503_not_404(app):
    """A request that reaches the server after SIGTERM began the drain finds its model gone:
    it is told to retry elsewhere (503 with Retry-After), not that the model does not exist,
    which a client would not retry. An unload asked for by a client stays 404."""
    from mmserver.http.app import SERVICE

    service = app.client.server.app[SERVICE]
    assert app.unload("preloaded")[0] == 200
    assert_error(app.request("POST", "/models/preloaded/invoke", b"[[1]]",
                             {"Content-Type": "application/json"}), 404, "ModelNotFound")
    assert app.load("again", service.settings.preload[0][1])[0] == 200
    app.loop.run_until_complete(service.registry.close(drain_timeout=5))
    answer = app.request("POST", "/models/again/invoke", b"[[1]]",
                         {"Content-Type": "application/json"})
    assert_error(answer, 503, "ShuttingDown")
    assert answer[1]["Retry-After"] == "1"
    assert app.request("POST", "/v2/models/again/infer", json.dumps({"inputs": [
        {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}))[0] == 503


def test_a_row_the_drain_cut_off_in_the_engine_is_503_not_404(app, tmp_path):
    """With ``--http-workers`` the engine answers its workers' rows itself: a request accepted
    into the queue and still unanswered when SIGTERM's drain timed out is told, as in one
    process, that the instance is going away (``ShuttingDown``), not that the runner closed
    (which a worker would answer 404). The engine's end of a real channel, on a real model
    whose call outlasts the drain."""
    from mmserver.http.app import SERVICE

    service = app.client.server.app[SERVICE]
    assert app.load("slow", write_code(tmp_path / "slow", SLOW_CODE))[0] == 200

    async def cut_off() -> list:
        loop = asyncio.get_running_loop()
        worker_end, engine_end = socket.socketpair()
        got: list = []
        _, worker = await loop.create_unix_connection(lambda: Channel(got.extend), sock=worker_end)
        _, engine = await loop.create_unix_connection(lambda: Channel(got.extend), sock=engine_end)
        engine.on_messages = WorkerConnection({}, service, engine).on_messages
        model = service.serving("slow")
        descriptor, _ = pack(torch.tensor([[3.0]]), None)   # SLOW_CODE sleeps 3 s on this row
        worker.send(Rows(((7, "slow", model.generation, descriptor),)))
        async with asyncio.timeout(10):
            while (await service.describe("slow"))["stats"].get("requestsInFlight") != 1:
                await asyncio.sleep(0.01)
            await service.registry.close(drain_timeout=0.2)
            while not got:
                await asyncio.sleep(0.01)
        worker.close()
        engine.close()
        return got

    got = app.loop.run_until_complete(cut_off())
    assert [type(message) for message in got] == [Failed] and got[0].request_id == 7, got
    assert type(got[0].error) is ShuttingDown, got[0].error

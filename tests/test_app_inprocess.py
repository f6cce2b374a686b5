"""What only the in-process app shows cheaply: settings a case chooses for itself.

The HTTP contract runs in process and in a subprocess alike (``test_server_contract.py``).
Here ``create_app`` gets settings of this test's own, such as a payload limit small enough
that 413 costs a few kilobytes. Models are real TorchScript files written by ``conftest``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import InProcessServer, write_torchscript
from helpers import assert_error

from mmserver.config import Settings

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

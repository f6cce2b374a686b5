"""The HTTP contract, in process: aiohttp's test server over ``create_app(settings)``.

The requests ``test_server_contract.py`` sends to a subprocess, sent to the application
object itself, so the contract is checked in seconds and a failure points at the route.
What needs a real process (the command line, SIGTERM, the container) stays in the
subprocess tests. Models are real TorchScript files written by ``conftest``.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import write_torchscript
from helpers import assert_error

from mmserver.app import create_app
from mmserver.config import Settings
from mmserver.testing import ModelServerClient

#: The largest body the in-process app accepts (a small limit makes 413 cheap to reach).
MAX_PAYLOAD_BYTES = 4096


class InProcessServer(ModelServerClient):
    """``create_app(settings)`` behind aiohttp's ``TestServer``, on an event loop of its own.

    Synchronous calls, as :class:`mmserver.testing.ServerProcess` offers, so the tests
    read the same; no pytest plugin for asyncio is needed.
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
            async with self.client.request(method, path, data=body, headers=dict(headers or {}),
                                           timeout=timeout) as response:
                return response.status, dict(response.headers), await response.read()

        return self.loop.run_until_complete(send())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inprocess-models")
    for name in ("affine", "affine2", "m0", "m1", "m2", "m3"):
        write_torchscript(root / name)
    (root / "corrupt").mkdir()
    (root / "corrupt" / "model.pt").write_bytes(b"this is not a TorchScript archive")
    return root


@pytest.fixture
def app(models) -> Iterator[InProcessServer]:
    """A fresh app per test, ``preloaded`` with ``affine``."""
    server = InProcessServer(Settings(model_roots=(models,), max_payload_bytes=MAX_PAYLOAD_BYTES,
                                      preload=(("preloaded", str(models / "affine")),)))
    try:
        yield server
    finally:
        server.close()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# -- load --------------------------------------------------------------------------------


def test_ping_and_preload(app):
    assert app.json("GET", "/ping") == (200, {"status": "Healthy"})
    assert app.invoke("preloaded", [[1, 2, 3]]) == (200, [[3.0, 5.0, 7.0]])


def test_load_is_200_with_name_and_url(app, models):
    status, body = app.load("a", models / "affine")
    assert status == 200
    assert body["modelName"] == "a" and body["modelUrl"] == str(models / "affine")


def test_a_relative_url_is_looked_up_under_the_model_roots(app):
    assert app.load("relative", "affine2")[0] == 200
    assert app.invoke("relative", [[0.5]]) == (200, [[2.0]])


def test_loading_a_loaded_name_is_409(app, models):
    assert_error(app.load("preloaded", models / "affine2"), 409, "ModelAlreadyLoaded")


@pytest.mark.parametrize("url, status, error_type", [
    ("does-not-exist", 404, "ModelUrlNotFound"),
    ("/etc", 400, "UrlOutsideModelRoots"),
    ("corrupt", 400, "InvalidModelArtifact"),
])
def test_load_errors(app, url, status, error_type):
    assert_error(app.load("bad", url), status, error_type)
    assert_error(app.json("GET", "/models/bad"), 404)


@pytest.mark.parametrize("payload", [{"url": "affine"}, {"model_name": "x"},
                                     {"model_name": "a/b", "url": "affine"}, [1, 2]])
def test_bad_load_bodies_are_400(app, payload):
    assert_error(app.json("POST", "/models", payload), 400)


def test_malformed_load_json_is_400(app):
    status, _, raw = app.request("POST", "/models", b'{"model_name": ',
                                 {"Content-Type": "application/json"})
    assert_error((status, raw), 400, "InvalidRequest")


# -- list and describe -------------------------------------------------------------------


def test_list_pages_with_limit_and_next_page_token(app, models):
    for name in ("m0", "m1", "m2", "m3"):
        assert app.load(name, models / name)[0] == 200
    everything = ["m0", "m1", "m2", "m3", "preloaded"]
    status, first = app.json("GET", "/models?limit=2")
    assert status == 200
    assert [m["modelName"] for m in first["models"]] == everything[:2]
    assert all(m["modelUrl"] == str(models / m["modelName"]) for m in first["models"])
    token = first["nextPageToken"]
    status, second = app.json("GET", f"/models?limit=2&next_page_token={token}")
    assert status == 200
    assert [m["modelName"] for m in second["models"]] == everything[2:4]
    status, last = app.json("GET", f"/models?limit=2&next_page_token={second['nextPageToken']}")
    assert [m["modelName"] for m in last["models"]] == everything[4:]
    assert "nextPageToken" not in last


@pytest.mark.parametrize("query", ["limit=0", "limit=abc", "next_page_token=%25%25"])
def test_bad_listing_queries_are_400(app, query):
    assert_error(app.json("GET", f"/models?{query}"), 400, "InvalidRequest")


def test_describe(app, models):
    status, body = app.json("GET", "/models/preloaded")
    assert status == 200
    assert body["modelName"] == "preloaded" and body["modelUrl"] == str(models / "affine")
    assert body["batching"]["policy"] == "greedy"
    assert_error(app.json("GET", "/models/nobody"), 404)


# -- invoke ------------------------------------------------------------------------------


def test_invoke_json(app):
    assert app.invoke("preloaded", [[1, 2, 3], [4, 5, 6]]) == (
        200, [[3.0, 5.0, 7.0], [9.0, 11.0, 13.0]])


def test_invoke_npy_in_and_out(app):
    status, headers, raw = app.request(
        "POST", "/models/preloaded/invoke", npy(np.array([[1, 2]], dtype=np.float32)),
        {"Content-Type": "application/x-npy", "Accept": "application/x-npy"})
    assert status == 200 and headers["Content-Type"].startswith("application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(raw)), [[3.0, 5.0]])


def test_invoke_csv_in_and_out(app):
    status, headers, raw = app.request("POST", "/models/preloaded/invoke", b"1,2\n3,4\n",
                                       {"Content-Type": "text/csv", "Accept": "text/csv"})
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = [[float(x) for x in line.split(",")] for line in raw.decode().split()]
    assert rows == [[3.0, 5.0], [7.0, 9.0]]


def test_invoking_an_unknown_model_is_404(app):
    assert_error(app.invoke("nobody", [[1]]), 404, "ModelNotFound")


def test_no_acceptable_output_type_is_406(app):
    status, _, raw = app.request("POST", "/models/preloaded/invoke", b"[[1]]",
                                 {"Content-Type": "application/json", "Accept": "image/png"})
    assert_error((status, raw), 406, "NotAcceptable")


def test_a_body_over_the_payload_limit_is_413(app):
    body = json.dumps([[1.0] * (MAX_PAYLOAD_BYTES // 4)]).encode()
    assert len(body) > MAX_PAYLOAD_BYTES
    status, _, raw = app.request("POST", "/models/preloaded/invoke", body,
                                 {"Content-Type": "application/json"})
    assert_error((status, raw), 413, "PayloadTooLarge")
    assert app.invoke("preloaded", [[1]]) == (200, [[3.0]])


@pytest.mark.parametrize("content_type", ["application/xml", "application/x-www-form-urlencoded"])
def test_an_unsupported_content_type_is_415(app, content_type):
    status, _, raw = app.request("POST", "/models/preloaded/invoke", b"[[1]]",
                                 {"Content-Type": content_type})
    assert_error((status, raw), 415)


def test_invocations_routes_by_the_target_model_header(app):
    assert app.json("POST", "/invocations", [[1]],
                    {"X-Amzn-SageMaker-Target-Model": "preloaded"}) == (200, [[3.0]])


# -- unload ------------------------------------------------------------------------------


def test_unload(app):
    status, body = app.unload("preloaded")
    assert status == 200 and body["modelName"] == "preloaded"
    assert_error(app.invoke("preloaded", [[1]]), 404, "ModelNotFound")
    assert_error(app.unload("preloaded"), 404)
    assert app.json("GET", "/models") == (200, {"models": []})


def test_metrics_count_answers_by_status(app):
    assert app.invoke("preloaded", [[1]])[0] == 200
    assert app.invoke("nobody", [[1]])[0] == 404
    assert app.metric("mmserver_requests_total", model="preloaded", status="200") == 1.0
    assert app.metric("mmserver_models_loaded") == 1.0

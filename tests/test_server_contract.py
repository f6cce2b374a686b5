"""docs/design.md section 4, route by route, against one server over two transports.

Every case runs twice: against ``create_app(settings)`` behind aiohttp's test server in
this process (fast, and a failure points at the route) and against ``python -m mmserver
serve`` in a subprocess over real sockets. Both are built from the same command-line
arguments and driven through ``mmserver.harness.testing.ModelServerClient``, so one set of cases
states the contract once. One server of each kind serves the whole module, and every case
starts from a server that holds ``preloaded`` and nothing else.

What only one of them can show lives elsewhere: signals, sockets and slow bodies against
a process (``test_reliability.py``, ``test_server_integration.py``), a configured payload
limit in process (``test_app_inprocess.py``).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import re

import numpy as np
import pytest
import torch
import torchvision.io
from conftest import InProcessServer, running_server, write_torchscript
from helpers import assert_error

from mmserver.cli import build_parser, settings_from_args

#: The model every case finds loaded, ``y = 2x + 1`` preloaded at start-up.
PRELOADED = "preloaded"


def server_args(model_root) -> list[str]:
    return ["--model-root", str(model_root), "--no-access-log", "--max-wait-ms", "2",
            "--preload", f"{PRELOADED}={model_root / 'affine'}"]


@pytest.fixture(scope="module", params=["in-process", "process"])
def server(request, model_root):
    """The same server, in this process or in a subprocess; one of each per module."""
    args = server_args(model_root)
    if request.param == "process":
        with running_server(args) as process:
            yield process
        return
    app = InProcessServer(settings_from_args(build_parser().parse_args(["serve", *args])))
    try:
        yield app
    finally:
        app.close()


@pytest.fixture(autouse=True)
def only_preloaded(server, model_root):
    """Each case starts from ``preloaded`` alone, whatever the case before it left."""
    status, body = server.json("GET", "/models")
    assert status == 200, body
    names = [m["modelName"] for m in body["models"]]
    for name in names:
        if name != PRELOADED:
            assert server.unload(name)[0] == 200, name
    if PRELOADED not in names:
        assert server.load(PRELOADED, model_root / "affine")[0] == 200


@pytest.fixture
def affine(server, model_root, request):
    name = "affine-" + re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60]
    assert server.load(name, model_root / "affine")[0] == 200
    yield name
    server.request("DELETE", f"/models/{name}")


def test_ping_and_preload(server):
    assert server.json("GET", "/ping") == (200, {"status": "Healthy"})
    assert server.invoke(PRELOADED, [[1, 2, 3]]) == (200, [[3.0, 5.0, 7.0]])


def test_describe(server, model_root):
    status, body = server.json("GET", f"/models/{PRELOADED}")
    assert status == 200
    assert body["modelName"] == PRELOADED and body["modelUrl"] == str(model_root / "affine")
    assert body["batching"]["policy"] == "greedy"
    assert_error(server.json("GET", "/models/nobody"), 404)


def test_load_describe_invoke_unload(server, model_root):
    status, body = server.load("lifecycle", model_root / "affine")
    assert status == 200
    assert body["modelName"] == "lifecycle" and body["modelUrl"] == str(model_root / "affine")
    status, body = server.json("GET", "/models/lifecycle")
    assert status == 200
    assert body["modelName"] == "lifecycle" and body["modelUrl"] == str(model_root / "affine")
    assert body["batching"]["policy"] == "greedy"
    assert server.invoke("lifecycle", [[1, 2, 3]]) == (200, [[3.0, 5.0, 7.0]])
    assert server.invoke("lifecycle", [[1, 2, 3], [4, 5, 6]]) == (
        200, [[3.0, 5.0, 7.0], [9.0, 11.0, 13.0]])
    status, body = server.json("DELETE", "/models/lifecycle")
    assert status == 200
    assert_error(server.invoke("lifecycle", [[1, 2, 3]]), 404, "ModelNotFound")
    assert_error(server.json("GET", "/models/lifecycle"), 404)
    assert_error(server.json("DELETE", "/models/lifecycle"), 404)
    assert server.load("lifecycle", model_root / "affine")[0] == 200
    assert server.invoke("lifecycle", [[0]])[0] == 200
    assert server.json("DELETE", "/models/lifecycle")[0] == 200


def test_a_relative_url_is_looked_up_under_the_model_roots(server):
    assert server.load("relative", "affine2")[0] == 200
    assert server.invoke("relative", [[0.5]]) == (200, [[2.0]])


def test_invoking_an_unknown_model_is_404(server):
    assert_error(server.invoke("nobody", [[1]]), 404, "ModelNotFound")


def test_unload(server):
    status, body = server.unload(PRELOADED)
    assert status == 200 and body["modelName"] == PRELOADED
    assert_error(server.invoke(PRELOADED, [[1]]), 404, "ModelNotFound")
    assert_error(server.unload(PRELOADED), 404)
    assert server.json("GET", "/models") == (200, {"models": []})


def test_load_twice_is_409(server, affine, model_root):
    assert_error(server.load(affine, model_root / "affine2"), 409, "ModelAlreadyLoaded")


@pytest.mark.parametrize("url, status, kind", [
    ("does-not-exist", 404, "ModelUrlNotFound"),
    ("{root}/does-not-exist", 404, "ModelUrlNotFound"),
    ("/etc", 400, "UrlOutsideModelRoots"),
    ("{root}/../../../../etc", 400, "UrlOutsideModelRoots"),
    ("corrupt", 400, "InvalidModelArtifact"),
    ("{root}/corrupt", 400, "InvalidModelArtifact"),
    ("{root}/empty", 400, "InvalidModelArtifact"),
    ("{root}/broken_code", 400, "InvalidModelArtifact"),
    ("{root}/raising_model_fn", 400, "InvalidModelArtifact"),
    ("{root}/memory_error", 507, "InsufficientResources"),
])
def test_load_errors(server, model_root, url, status, kind):
    """A relative URL is looked up under the model roots; ``{root}`` makes it absolute."""
    assert_error(server.load("bad-load", url.format(root=model_root)), status, kind)
    assert server.json("GET", "/ping")[0] == 200
    assert_error(server.json("GET", "/models/bad-load"), 404)


def test_load_error_messages_say_why(server, model_root):
    for folder, words in (("raising_model_fn", "weights.bin is missing"), ("empty", "model.pt"),
                          ("broken_code", "inference.py")):
        body = assert_error(server.load("x", model_root / folder), 400, "InvalidModelArtifact")
        assert words in body["message"], folder


def test_symlink_escaping_the_model_root_is_400(server, model_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.pt").write_bytes((model_root / "affine" / "model.pt").read_bytes())
    link = model_root / "escape-link"
    if not link.exists():
        os.symlink(outside, link)
    assert_error(server.load("escape", link), 400, "UrlOutsideModelRoots")


@pytest.mark.parametrize("payload", [
    {"url": "affine"},
    {"model_name": "x"},
    {"model_name": 3, "url": "affine"},
    {"model_name": "x", "url": ["affine"]},
    {"model_name": "a/b", "url": "affine"},
    {"model_name": "..", "url": "affine"},
    {"model_name": "a..b", "url": "affine"},
    {"model_name": "", "url": "affine"},
    [1, 2],
])
def test_bad_load_bodies_are_400(server, payload):
    assert_error(server.json("POST", "/models", payload), 400)
    assert server.json("GET", "/ping")[0] == 200


def test_malformed_load_json_is_400(server):
    status, _, raw = server.request("POST", "/models", b'{"model_name": ',
                                    {"Content-Type": "application/json"})
    assert_error((status, raw), 400, "InvalidRequest")


@pytest.mark.parametrize("body, content_type, status", [
    (b"[[1, 2", "application/json", 400),
    (b'{"rows": [1]}', "application/json", 400),
    (b'[[1, 2], [3]]', "application/json", 400),
    (b'[["a", "b"]]', "application/json", 400),
    (b"[[NaN]]", "application/json", 400),
    (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    (b"[[1, true, null]]", "application/json", 400),
    (b'[[1e999]]', "application/json", 400),
    (b"3", "application/json", 400),
    (b"[]", "application/json", 400),
    (b"", "application/json", 400),
    (b"1,2\n3", "text/csv", 400),
    (b"hello", "image/png", 400),
    (b"not an image at all", "image/jpeg", 400),
    (b"[[1]]", "application/xml", 415),
    (b"[[1]]", "application/x-www-form-urlencoded", 415),
])
def test_bad_invoke_bodies(server, affine, body, content_type, status):
    code, _, raw = server.request("POST", f"/models/{affine}/invoke", body,
                                  {"Content-Type": content_type})
    assert_error((code, raw), status)
    assert server.json("GET", "/ping")[0] == 200
    assert server.invoke(affine, [[1]]) == (200, [[3.0]])


def test_a_pickled_npy_is_refused(server, affine):
    array = np.array([{"evil": 1}], dtype=object)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    status, _, raw = server.request("POST", f"/models/{affine}/invoke", buffer.getvalue(),
                                    {"Content-Type": "application/x-npy"})
    body = json.loads(raw)
    assert_error((status, body), 400, "InvalidInput")
    assert "pickle" in body["message"]
    raw_pickle = pickle.dumps([[1.0, 2.0]])
    status, _, raw = server.request("POST", f"/models/{affine}/invoke", raw_pickle,
                                    {"Content-Type": "application/x-npy"})
    assert_error((status, raw), 400)


def test_big_endian_and_integer_npy_bodies_are_decoded(server, affine):
    for array in (np.array([[1.0, 2.0]], dtype=">f4"), np.array([[1, 2]], dtype=np.uint16)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        status, _, raw = server.request("POST", f"/models/{affine}/invoke", buffer.getvalue(),
                                        {"Content-Type": "application/x-npy"})
        assert status == 200, raw
        assert json.loads(raw) == [[3, 5]]


def test_content_types_in_and_out(server, affine):
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    expected = x * 2 + 1
    buffer = io.BytesIO()
    np.save(buffer, x)
    for body, content_type in ((json.dumps(x.tolist()).encode(), "application/json"),
                               (buffer.getvalue(), "application/x-npy"),
                               (b"1,2\n3,4\n", "text/csv"),
                               (b"[[1, 2], [3, 4]]", "application/json; charset=utf-8")):
        for accept, decode in (
                ("application/json", lambda raw: np.array(json.loads(raw))),
                ("application/x-npy", lambda raw: np.load(io.BytesIO(raw), allow_pickle=False)),
                ("text/csv", lambda raw: np.loadtxt(io.StringIO(raw.decode()), delimiter=",",
                                                    ndmin=2))):
            status, headers, raw = server.request(
                "POST", f"/models/{affine}/invoke", body,
                {"Content-Type": content_type, "Accept": accept})
            assert status == 200, raw
            assert headers["Content-Type"].startswith(accept)
            np.testing.assert_array_equal(decode(raw), expected)  # 2x + 1 is exact


def test_accept_negotiation(server, affine):
    def accept(header):
        return server.request("POST", f"/models/{affine}/invoke", b"[[1]]",
                              {"Content-Type": "application/json", "Accept": header})

    assert accept("*/*")[1]["Content-Type"].startswith("application/json")
    assert accept("text/csv;q=0.5, application/x-npy;q=0.9")[1]["Content-Type"].startswith(
        "application/x-npy")
    assert accept("text/html, text/csv")[1]["Content-Type"].startswith("text/csv")
    assert_error(accept("text/html"), 406, "NotAcceptable")
    assert_error(accept("image/png"), 406, "NotAcceptable")
    status, _, raw = accept("application/json;q=0")
    assert status == 406


def test_absent_content_type_means_json(server, affine):
    status, _, raw = server.request("POST", f"/models/{affine}/invoke", b"[[2]]")
    assert status == 200 and json.loads(raw) == [[5.0]]


def test_images_in(server, model_root):
    assert server.load("image-affine", model_root / "affine")[0] == 200
    try:
        image = torch.zeros(3, 4, 5, dtype=torch.uint8)
        image[0] = 255
        for encoded, content_type in ((torchvision.io.encode_png(image), "image/png"),
                                      (torchvision.io.encode_jpeg(image, quality=100),
                                       "image/jpeg")):
            status, _, raw = server.request("POST", "/models/image-affine/invoke",
                                            bytes(encoded.numpy()),
                                            {"Content-Type": content_type})
            assert status == 200, raw
            out = np.array(json.loads(raw))
            assert out.shape == (1, 3, 4, 5)
            np.testing.assert_allclose(out[0, 0], 3.0, atol=0.05)  # red: 2 * 1.0 + 1
            np.testing.assert_allclose(out[0, 1], 1.0, atol=0.05)
    finally:
        server.request("DELETE", "/models/image-affine")


def test_an_image_with_too_many_pixels_is_refused_before_decoding(server, affine):
    bomb = torchvision.io.encode_png(torch.zeros(1, 6000, 6000, dtype=torch.uint8))
    assert len(bomb) < 1024 * 1024  # small on the wire, 36 megapixels decoded
    status, _, raw = server.request("POST", f"/models/{affine}/invoke", bytes(bomb.numpy()),
                                    {"Content-Type": "image/png"})
    body = json.loads(raw)
    assert_error((status, body), 413, "PayloadTooLarge")
    assert "6000x6000" in body["message"]
    assert server.json("GET", "/ping")[0] == 200


def test_oversized_body_is_413_from_content_length(server, affine):
    too_big = 6 * 1024 * 1024 + 1
    status, _, raw = server.request("POST", f"/models/{affine}/invoke", b"[" * too_big,
                                    {"Content-Type": "application/json"})
    assert_error((status, raw), 413, "PayloadTooLarge")
    assert server.json("GET", "/ping")[0] == 200
    assert server.invoke(affine, [[1]]) == (200, [[3.0]])


def test_custom_attributes_reach_the_handler(server, model_root):
    assert server.load("attributes", model_root / "attributes")[0] == 200
    try:
        status, body = server.invoke("attributes", [[1, 2]], headers={
            "X-Amzn-SageMaker-Custom-Attributes": "trace=abc;tenant=7"})
        assert status == 200
        assert body == {"rows": [[1.0, 2.0]], "attributes": "trace=abc;tenant=7"}
    finally:
        server.request("DELETE", "/models/attributes")


def test_a_failing_request_is_500_and_the_model_keeps_serving(server, model_root):
    assert server.load("failing", model_root / "failing")[0] == 200
    try:
        status, body = server.invoke("failing", [[-1.0]])
        assert_error((status, body), 500, "ModelError")
        assert "negative input" in body["message"]
        assert server.invoke("failing", [[1.0]]) == (200, [[3.0]])
    finally:
        server.request("DELETE", "/models/failing")


def test_a_wrong_input_shape_fails_alone_with_a_short_message(server, model_root, tmp_path):
    conv_dir = model_root / "conv"
    if not conv_dir.exists():
        torch.manual_seed(0)
        write_torchscript(conv_dir, torch.nn.Conv2d(3, 2, 3), torch.ones(1, 3, 8, 8))
    assert server.load("conv", conv_dir)[0] == 200
    try:
        status, body = server.invoke("conv", [[1.0, 2.0, 3.0]])
        assert_error((status, body), 500, "ModelError")
        assert "input" in body["message"] and "[1, 3]" in body["message"]
        assert "\n" not in body["message"] and len(body["message"]) < 600
        assert "/" not in body["message"].split("failed:")[1]  # no server paths
        good = np.zeros((1, 3, 8, 8)).tolist()
        assert server.invoke("conv", good)[0] == 200
    finally:
        server.request("DELETE", "/models/conv")


def test_unknown_routes_and_methods_answer_json(server):
    assert_error(server.json("GET", "/nope"), 404)
    assert_error(server.json("PUT", "/models"), 405)


def test_target_model_header_routes_invocations(server, affine):
    status, body = server.json("POST", "/invocations", [[1]],
                               headers={"X-Amzn-SageMaker-Target-Model": affine})
    assert (status, body) == (200, [[3.0]])
    assert_error(server.json("POST", "/invocations", [[1]],
                              headers={"X-Amzn-SageMaker-Target-Model": "missing"}), 404)


def test_every_route_that_invokes_a_model_is_counted_with_its_status(server, affine):
    def count(status: str) -> float:
        return server.metric("mmserver_requests_total", model=affine, status=status)

    before = {status: count(status) for status in ("200", "400")}
    target = {"X-Amzn-SageMaker-Target-Model": affine}
    v2_body = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 1],
                                      "data": [1.0]}]})
    answers = [
        server.json("POST", f"/models/{affine}/invoke", [[1]])[0],
        server.json("POST", "/invocations", [[1]], headers=target)[0],
        server.request("POST", f"/v2/models/{affine}/infer", v2_body)[0],
        server.request("POST", f"/v2/models/{affine}/versions/1/infer", v2_body)[0],
        server.request("POST", f"/models/{affine}/invoke", b"[[1, ",
                       {"Content-Type": "application/json"})[0],
        server.request("POST", f"/v2/models/{affine}/infer", b"{")[0],
    ]
    assert answers == [200, 200, 200, 200, 400, 400]
    assert (count("200") - before["200"], count("400") - before["400"]) == (4, 2)


# -- listing ------------------------------------------------------------------------------


def test_listing_is_sorted_and_paginated_by_an_opaque_cursor(server, model_root):
    names = [f"m{i:02d}" for i in range(12)]
    for name in names:
        assert server.load(name, model_root / name)[0] == 200
    everything = sorted([*names, PRELOADED])
    urls = {PRELOADED: str(model_root / "affine"), **{n: str(model_root / n) for n in names}}
    for limit in (2, 5):
        pages, token = [], None
        while True:
            query = f"/models?limit={limit}" + (f"&next_page_token={token}" if token else "")
            status, body = server.json("GET", query)
            assert status == 200
            pages.append([m["modelName"] for m in body["models"]])
            assert all(m["modelUrl"] == urls[m["modelName"]] for m in body["models"])
            token = body.get("nextPageToken")
            if token is None:
                break
            assert not token.isdigit()  # a cursor, not an offset
        assert pages == [everything[i:i + limit] for i in range(0, len(everything), limit)]
    status, body = server.json("GET", "/models")
    assert [m["modelName"] for m in body["models"]] == everything
    assert "nextPageToken" not in body  # default limit 100 holds them all


@pytest.mark.parametrize("query", ["limit=0", "limit=-3", "limit=abc", "limit=100000",
                                   "next_page_token=garbage", "next_page_token=%25%25",
                                   "next_page_token=" +
                                   base64.urlsafe_b64encode(b"offset:3").decode()])
def test_bad_listing_queries_are_400(server, query):
    assert_error(server.json("GET", f"/models?{query}"), 400, "InvalidRequest")


def test_metrics_export_per_model_counts(server, affine):
    before = server.metric("mmserver_requests_total", model=affine, status="200")
    for _ in range(3):
        assert server.invoke(affine, [[1]])[0] == 200
    assert server.invoke("nobody", [[1]])[0] == 404
    assert server.metric("mmserver_requests_total", model=affine, status="200") == before + 3
    assert server.metric("mmserver_batch_size_rows_count", model=affine) >= 1
    assert server.metric("mmserver_models_loaded") == 2  # preloaded and this case's model
    _, headers, raw = server.request("GET", "/metrics")
    assert headers["Content-Type"].startswith("text/plain")
    text = raw.decode()
    for name in ("mmserver_request_latency_seconds_bucket", "mmserver_queue_wait_seconds_sum",
                 "mmserver_compute_seconds_count", "mmserver_queue_depth",
                 "mmserver_model_memory_bytes"):
        assert name in text

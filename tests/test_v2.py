"""The Open Inference Protocol (KServe v2) against a real server process, with Triton's clients.

Every ``/v2`` route is driven with ``tritonclient.http`` (sync) and
``tritonclient.http.aio``, JSON and binary tensors, single rows and batches; the
answers are compared with the model's own output, computed here from the same
TorchScript or ``torch.export`` file. One queue serves both protocols: batches
form under concurrency, a batch holds SageMaker invocations and v2 requests at
once, a model loaded by either protocol answers the other. Every client mistake
answers 400 ``{"error": ...}`` and the server stays healthy afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import io
import json
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import aiohttp
import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import (
    RECORDER_CODE,
    ROOT,
    SLOW_CODE,
    running_server,
    write_code,
    write_torchscript,
)
from helpers import assert_error, assert_statistics_match_metrics, wait_for_in_flight

from mmserver.harness.examples import write_examples

tritonclient_http = pytest.importorskip("tritonclient.http")
import tritonclient.http.aio as triton_aio  # noqa: E402
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

HEADER_LENGTH = "Inference-Header-Content-Length"
TOKEN = "s3cret"


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2 + y, x.sum(1)


def linear_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def write_settings(model_dir: Path, settings: dict) -> Path:
    (model_dir / "mmserver.json").write_text(json.dumps(settings))
    return model_dir


LINEAR_DECLARATION = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
}


ONE_REQUEST_CODE = """
    import json, torch

    def model_fn(model_dir):
        return None

    def input_fn(body, content_type):
        return torch.tensor(json.loads(body)) * 10

    def predict_fn(data, model):
        return {"total": data.sum(), "count": torch.tensor(data.shape[0])}
"""

TRANSFORM_CODE = """
    def model_fn(model_dir):
        return None

    def transform_fn(model, body, content_type, accept):
        return body, "application/json"
"""


@pytest.fixture(scope="module")
def v2_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("v2-models")
    write_torchscript(root / "affine")
    write_torchscript(root / "v2loaded")
    write_settings(write_torchscript(root / "linear", linear_module(), torch.ones(2, 3)),
                   LINEAR_DECLARATION)
    write_torchscript(root / "identity", Identity(), torch.ones(2, 3))
    write_settings(write_torchscript(root / "batched"), {"policy": "timer", "max_wait_ms": 50})
    (root / "exported").mkdir()
    batch = torch.export.Dim("batch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(TwoInputs(), (torch.ones(4, 3), torch.ones(4, 3)),
                                      dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    torch.export.save(program, str(root / "exported" / "model.pt2"))
    write_code(root / "recorder", RECORDER_CODE, with_affine=True)
    write_settings(root / "recorder", {"policy": "timer", "max_wait_ms": 200,
                                       "max_batch_size": 64})
    write_code(root / "one_request", ONE_REQUEST_CODE)
    write_code(root / "transform", TRANSFORM_CODE)
    write_settings(write_code(root / "slow", SLOW_CODE), {"max_queue_size": 1})
    write_settings(write_torchscript(root / "bad_declaration"),
                   {"inputs": [{"name": "x", "datatype": "FP8", "shape": [-1]}]})
    write_examples(root / "examples", names=["tabular"])  # the README's tritonclient example
    return root


PRELOADED = ("affine", "linear", "identity", "batched", "exported", "recorder", "one_request",
             "transform", "slow")


@pytest.fixture(scope="module")
def server(v2_root):
    args = ["--model-root", str(v2_root), "--no-access-log",
            "--preload", "tabular=examples/tabular/model"]
    for name in PRELOADED:
        args += ["--preload", f"{name}={name}"]
    with running_server(args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with tritonclient_http.InferenceServerClient(address(server)) as c:
        yield c


def address(server) -> str:
    return server.url[len("http://"):]


def infer_input(name: str, array: np.ndarray, binary: bool):
    tensor = tritonclient_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def requested(name: str, binary: bool):
    return tritonclient_http.InferRequestedOutput(name, binary_data=binary)


def affine(x: np.ndarray) -> np.ndarray:
    return x * 2 + 1


def post_v2(server, path: str, body: bytes | str | dict, headers: dict | None = None):
    """(status, headers, decoded JSON or raw bytes) of a POST to a v2 route."""
    if isinstance(body, dict):
        body = json.dumps(body)
    status, answer_headers, raw = server.request("POST", path, body, headers or {})
    try:
        return status, answer_headers, json.loads(raw) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return status, answer_headers, raw


def assert_healthy(server, client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    result = client.infer("affine", [infer_input("INPUT__0", x, True)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))
    assert server.invoke("affine", [[1.0, 2.0, 3.0]]) == (200, [[3.0, 5.0, 7.0]])


def json_tensor(name: str, datatype: str, shape: list, data) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


# -- health and metadata -----------------------------------------------------------


def test_health_and_server_metadata(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata() == {
        "name": "mmserver", "version": importlib.metadata.version("mmserver"),
        "extensions": ["binary_tensor_data", "model_repository", "model_configuration",
                       "statistics"]}
    status, _, raw = server.request("GET", "/v2/health/live")
    assert (status, raw) == (200, b"")


def test_model_metadata_from_each_source(client):
    assert client.get_model_metadata("affine") == {
        "name": "affine", "versions": ["1"], "platform": "pytorch_torchscript",
        "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1]}]}
    assert client.get_model_metadata("linear") == {
        "name": "linear", "versions": ["1"], "platform": "pytorch_torchscript",
        **LINEAR_DECLARATION}
    assert client.get_model_metadata("exported", "1") == {
        "name": "exported", "versions": ["1"], "platform": "pytorch_export",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 3]},
                    {"name": "OUTPUT__1", "datatype": "FP32", "shape": [-1]}]}
    assert client.get_model_metadata("recorder")["platform"] == "python"


# -- Triton's model configuration and statistics extensions ---------------------------


def test_model_configuration_as_triton_answers_it(server, client):
    config = client.get_model_config("linear")
    assert config == {
        "name": "linear", "platform": "pytorch_torchscript", "backend": "pytorch",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 16,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["3"]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["2"]}],
        "dynamic_batching": {"max_queue_delay_microseconds": "5000", "preserve_ordering": True,
                             "default_queue_policy": {"timeout_action": "REJECT",
                                                      "max_queue_size": 256}},
        "instance_group": [{"name": "linear", "count": 1, "kind": "KIND_CPU"}],
        "parameters": {"mmserver_policy": {"string_value": "greedy"}}}
    batched = client.get_model_config("batched", "1")  # mmserver.json: timer, 50 ms
    assert batched["dynamic_batching"]["max_queue_delay_microseconds"] == "50000"
    assert batched["parameters"] == {"mmserver_policy": {"string_value": "timer"}}
    exported = client.get_model_config("exported")
    assert [(t["name"], t["dims"]) for t in exported["input"] + exported["output"]] == [
        ("x", ["3"]), ("y", ["3"]), ("OUTPUT__0", ["3"]), ("OUTPUT__1", [])]
    not_row_wise = client.get_model_config("one_request")  # whole requests: no rows to batch
    assert (not_row_wise["max_batch_size"], not_row_wise["backend"]) == (0, "python")
    assert not_row_wise["input"] == [{"name": "INPUT__0", "data_type": "TYPE_FP32",
                                      "dims": ["-1"]}]
    with pytest.raises(InferenceServerException, match="no_such"):
        client.get_model_config("no_such")


CALL_SECONDS = 0.05


def test_statistics_count_rows_calls_and_time_as_triton_does(server, client, v2_root):
    write_code(v2_root / "counted", SLOW_CODE)  # each call sleeps its first value's seconds
    assert server.load("counted", "counted")[0] == 200
    started = time.perf_counter()
    for rows in (1, 2):  # one after the other: one call each, through either wire
        assert server.invoke("counted", [[CALL_SECONDS, 2.0, 3.0]] * rows)[0] == 200
    x = np.array([[CALL_SECONDS, 2.0, 3.0]] * 3, dtype=np.float32)
    client.infer("counted", [infer_input("INPUT__0", x, True)])
    wall_ns = (time.perf_counter() - started) * 1e9
    [stats] = client.get_inference_statistics("counted")["model_stats"]
    assert (stats["name"], stats["version"]) == ("counted", "1")
    assert (stats["inference_count"], stats["execution_count"]) == (6, 3)
    inference = stats["inference_stats"]
    # perf_analyzer refuses statistics whose per-request counts differ.
    assert {k: inference[k]["count"] for k in (
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output")} == {
        "success": 3, "fail": 0, "queue": 3, "compute_input": 3, "compute_infer": 3,
        "compute_output": 3}
    # Each request's call slept CALL_SECONDS; its time holds its call, decoding and encoding
    # took some time, and the three fit in the client's wall time (the loop's clock ticks in
    # whole milliseconds).
    tick_ns = 1e6
    assert inference["compute_infer"]["ns"] >= 3 * (CALL_SECONDS * 1e9 - tick_ns)
    assert inference["compute_input"]["ns"] > 0 and inference["compute_output"]["ns"] > 0
    parts = sum(inference[k]["ns"] for k in ("queue", "compute_input", "compute_infer",
                                              "compute_output"))
    # The queue and call times are on the loop's clock, a tick per reading at most.
    assert parts - 3 * 2 * tick_ns <= inference["success"]["ns"] <= wall_ns
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1), (2, 1), (3, 1)]
    assert all(b["compute_infer"]["ns"] >= CALL_SECONDS * 1e9 - tick_ns
               for b in stats["batch_stats"])
    # A request's call ends when it is answered, its batch's once the call's bookkeeping runs.
    assert sum(b["compute_infer"]["ns"] for b in stats["batch_stats"]) >= \
        inference["compute_infer"]["ns"] - 3 * tick_ns
    assert abs(stats["last_inference"] / 1000 - time.time()) < 60
    assert_statistics_match_metrics(stats, server.metrics())
    every = client.get_inference_statistics()["model_stats"]
    assert "counted" in [s["name"] for s in every] and "linear" in [s["name"] for s in every]
    assert server.unload("counted")[0] == 200
    with pytest.raises(InferenceServerException, match="counted"):
        client.get_inference_statistics("counted")
    shutil.rmtree(v2_root / "counted")  # the repository index test lists the folders exactly


def test_model_ready_and_versions(server, client):
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "1")
    assert not client.is_model_ready("affine", "2")
    assert not client.is_model_ready("no-such-model")
    status, _, body = server.request("GET", "/v2/models/affine/versions/2")
    assert (status, json.loads(body)) == (
        400, {"error": "model 'affine' has no version '2'; its versions: ['1']"})
    status, _, body = server.request("GET", "/v2/models/affine/versions/2/ready")
    assert status == 400 and json.loads(body)["error"].startswith("model 'affine' has no version")


# -- inference ------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_with_the_sync_client(client, rows, binary_in, binary_out):
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - 4.5
    result = client.infer("affine", [infer_input("INPUT__0", x, binary_in)],
                          outputs=[requested("OUTPUT__0", binary_out)], request_id=f"r{rows}",
                          model_version="1" if rows > 1 else "")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))
    response = result.get_response()
    assert response["id"] == f"r{rows}" and response["model_name"] == "affine"
    assert response["model_version"] == "1"
    (output,) = response["outputs"]
    assert output["datatype"] == "FP32" and output["shape"] == [rows, 3]
    assert ("parameters" in output) == binary_out and ("data" in output) == (not binary_out)


@pytest.mark.parametrize("binary", [True, False])
def test_infer_with_the_aio_client_on_a_float_model(server, v2_root, binary):
    model = torch.jit.load(str(v2_root / "linear" / "model.pt"))
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)

    async def go():
        async with triton_aio.InferenceServerClient(address(server)) as aio:
            assert await aio.is_server_live() and await aio.is_model_ready("linear")
            one = await aio.infer("linear", [infer_input("x", x[:1], binary)],
                                  outputs=[requested("y", binary)])
            many = await aio.infer("linear", [infer_input("x", x, binary)], model_version="1")
            return one.as_numpy("y"), many.as_numpy("y")

    one, many = asyncio.run(go())
    with torch.inference_mode():
        expected = model(torch.from_numpy(x))
    torch.testing.assert_close(torch.tensor(one), expected[:1])
    torch.testing.assert_close(torch.tensor(many), expected)


def test_infer_two_inputs_of_an_exported_program(client, v2_root):
    program = torch.export.load(str(v2_root / "exported" / "model.pt2")).module()
    x = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
    y = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)
    result = client.infer("exported", [infer_input("y", y, False), infer_input("x", x, True)])
    expected = program(torch.from_numpy(x), torch.from_numpy(y))
    torch.testing.assert_close(torch.tensor(result.as_numpy("OUTPUT__0")), expected[0])
    torch.testing.assert_close(torch.tensor(result.as_numpy("OUTPUT__1")), expected[1])
    only = client.infer("exported", [infer_input("x", x, True), infer_input("y", y, True)],
                        outputs=[requested("OUTPUT__1", False)])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["OUTPUT__1"]
    torch.testing.assert_close(torch.tensor(only.as_numpy("OUTPUT__1")), expected[1])


DATATYPE_ARRAYS = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767]], dtype=np.int16),
    "INT32": np.array([[-2**31, 0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-2**63, 0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[-65504.0, 0.5, 65504.0]], dtype=np.float16),
    "FP32": np.array([[-1.5e38, 0.1, 3.25]], dtype=np.float32),
    "FP64": np.array([[-1e300, 0.1, 3.25]], dtype=np.float64),
    "BF16": np.array([[-3.0e38, 0.5, 2.0]], dtype=ml_dtypes.bfloat16),
}


@pytest.mark.parametrize("datatype, binary", [
    (datatype, binary) for datatype in DATATYPE_ARRAYS for binary in (True, False)
    if binary or datatype != "BF16"])  # tritonclient sends BF16 as binary only (JSON: below)
def test_every_datatype_round_trips_exactly(client, datatype, binary):
    array = DATATYPE_ARRAYS[datatype]
    result = client.infer("identity", [infer_input("INPUT__0", array, binary)],
                          outputs=[requested("OUTPUT__0", binary)])
    assert result.get_output("OUTPUT__0")["datatype"] == datatype
    answer = result.as_numpy("OUTPUT__0")
    assert answer.dtype == array.dtype
    np.testing.assert_array_equal(answer.astype(np.float64) if datatype == "BF16" else answer,
                                  array.astype(np.float64) if datatype == "BF16" else array)


def test_bf16_as_json_and_nested_data(server):
    status, _, body = post_v2(server, "/v2/models/identity/infer", {"inputs": [
        json_tensor("INPUT__0", "BF16", [2, 2], [[1.5, -2.0], [0.25, 3.0]])]})
    assert status == 200, body
    assert body["outputs"] == [{"name": "OUTPUT__0", "datatype": "BF16", "shape": [2, 2],
                                "data": [1.5, -2.0, 0.25, 3.0]}]


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "text/plain",
                                          "application/json"])
def test_the_body_kind_is_decided_by_the_header_length_alone(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    request = {"inputs": [json_tensor("INPUT__0", "FP32", [1, 2], [1.0, 2.0])]}
    status, answer_headers, body = post_v2(server, "/v2/models/affine/infer", request, headers)
    assert status == 200, body
    assert answer_headers["Content-Type"].startswith("application/json")
    assert HEADER_LENGTH not in answer_headers
    assert body == {"model_name": "affine", "model_version": "1", "outputs": [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": [1, 2], "data": [3.0, 5.0]}]}
    header = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "INT32", "shape": [1, 2],
                                     "parameters": {"binary_data_size": 8}}],
                         "parameters": {"binary_data_output": True}}).encode()
    raw = np.array([[5, -6]], dtype=np.int32).tobytes()
    status, answer_headers, answer = server.request(
        "POST", "/v2/models/affine/infer", header + raw,
        {**headers, HEADER_LENGTH: str(len(header))})
    assert status == 200, answer
    assert answer_headers["Content-Type"] == "application/octet-stream"
    length = int(answer_headers[HEADER_LENGTH])
    assert json.loads(answer[:length]) == {"model_name": "affine", "model_version": "1",
                                           "outputs": [{"name": "OUTPUT__0", "datatype": "INT32",
                                                        "shape": [1, 2],
                                                        "parameters": {"binary_data_size": 8}}]}
    assert np.frombuffer(answer[length:], dtype=np.int32).tolist() == [11, -11]


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_requests_are_decompressed(client, compression):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for binary in (True, False):
        result = client.infer("affine", [infer_input("INPUT__0", x, binary)],
                              request_compression_algorithm=compression)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))


def test_a_script_that_is_not_row_wise_gets_the_tensor_in_predict_fn(client, server):
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    result = client.infer("one_request", [infer_input("anything", x, False)])
    assert result.as_numpy("total").tolist() == 10.0  # input_fn (x10) is SageMaker's only
    assert result.as_numpy("count").tolist() == 2
    assert result.get_output("count")["datatype"] == "INT64"
    status, body = server.invoke("one_request", [[1.0, 2.0], [3.0, 4.0]])
    assert (status, body) == (200, {"total": 100.0, "count": 2})


# -- one queue for both protocols ---------------------------------------------------


def describe(server, name: str) -> dict:
    status, body = server.json("GET", f"/models/{name}")
    assert status == 200, body
    return body


def test_concurrent_v2_requests_form_batches(server):
    rows = [np.full((1 + i % 3, 3), float(i), dtype=np.float32) for i in range(32)]

    async def go():
        async with triton_aio.InferenceServerClient(address(server)) as aio:
            return await asyncio.gather(*(
                aio.infer("batched", [infer_input("INPUT__0", x, i % 2 == 0)])
                for i, x in enumerate(rows)))

    results = asyncio.run(go())
    for x, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))
    stats = describe(server, "batched")["stats"]
    assert stats["requestsCompleted"] == 32
    assert stats["meanBatchSize"] > 1


def test_sagemaker_and_v2_requests_share_one_queue_and_its_batches(server, v2_root):
    log = v2_root / "recorder" / "batches.jsonl"
    log.unlink(missing_ok=True)
    sagemaker_rows = [[1000.0 + i, 0.5, -1.0] for i in range(16)]
    v2_rows = [np.array([[2000.0 + i, 0.25, 4.0]], dtype=np.float32) for i in range(16)]

    async def go():
        async with triton_aio.InferenceServerClient(address(server)) as aio, \
                aiohttp.ClientSession() as session:
            async def invoke(row):
                async with session.post(f"{server.url}/models/recorder/invoke",
                                        json=[row]) as response:
                    return response.status, await response.json()
            return await asyncio.gather(
                asyncio.gather(*(invoke(row) for row in sagemaker_rows)),
                asyncio.gather(*(aio.infer("recorder", [infer_input("INPUT__0", x, True)])
                                 for x in v2_rows)))

    invoked, inferred = asyncio.run(go())
    assert invoked == [(200, [[2 * a + 1, 2 * b + 1, 2 * c + 1]]) for a, b, c in sagemaker_rows]
    for x, result in zip(v2_rows, inferred):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))
    batches = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(v for batch in batches for v in batch) == sorted(
        [row[0] for row in sagemaker_rows] + [float(x[0, 0]) for x in v2_rows])
    assert any(any(v < 2000 for v in batch) and any(v >= 2000 for v in batch)
               for batch in batches), batches
    stats = describe(server, "recorder")["stats"]
    assert stats["requestsCompleted"] == 32 and stats["batches"] == len(batches)


def test_a_model_loaded_by_either_protocol_serves_both(server, client, v2_root):
    client.load_model("v2loaded")
    assert server.invoke("v2loaded", [[1.0, 2.0]]) == (200, [[3.0, 5.0]])
    assert describe(server, "v2loaded")["modelUrl"] == "v2loaded"
    client.load_model("v2loaded")  # already loaded from that folder: nothing to do
    client.unload_model("v2loaded")
    assert server.invoke("v2loaded", [[1.0]])[0] == 404
    assert not client.is_model_ready("v2loaded")

    assert server.load("sm-loaded", v2_root / "affine")[0] == 200
    try:
        x = np.array([[0.5, -0.5]], dtype=np.float32)
        result = client.infer("sm-loaded", [infer_input("INPUT__0", x, True)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), affine(x))
        assert client.get_model_metadata("sm-loaded")["platform"] == "pytorch_torchscript"
    finally:
        client.unload_model("sm-loaded")
    assert server.json("GET", "/models/sm-loaded")[0] == 404


def test_every_route_with_the_aio_client(server, client):
    x = np.array([[1.5, -2.0]], dtype=np.float32)

    async def go():
        async with triton_aio.InferenceServerClient(address(server)) as aio:
            assert await aio.is_server_live() and await aio.is_server_ready()
            assert (await aio.get_server_metadata())["extensions"] == [
                "binary_tensor_data", "model_repository", "model_configuration", "statistics"]
            assert await aio.get_model_metadata("affine", "1") == \
                await aio.get_model_metadata("affine")
            assert await aio.get_model_config("affine", "1") == \
                await aio.get_model_config("affine")
            assert (await aio.get_inference_statistics("affine"))["model_stats"][0]["name"] == \
                "affine"
            assert await aio.is_model_ready("affine", "1")
            await aio.load_model("v2loaded")
            ready = await aio.is_model_ready("v2loaded")
            index = {e["name"]: e["state"] for e in await aio.get_model_repository_index()}
            versioned = await aio.infer("v2loaded", [infer_input("INPUT__0", x, False)],
                                        model_version="1")
            await aio.unload_model("v2loaded")
            return ready, index, versioned.as_numpy("OUTPUT__0"), \
                await aio.is_model_ready("v2loaded")

    ready, index, answer, ready_after = asyncio.run(go())
    assert ready and index["v2loaded"] == "READY" and not ready_after
    np.testing.assert_array_equal(answer, affine(x))
    assert client.get_model_repository_index()[-1]["name"] == "v2loaded"
    assert {e["name"]: e["state"] for e in client.get_model_repository_index()}["v2loaded"] == \
        "UNAVAILABLE"


def test_the_repository_index_lists_the_model_roots_folders(server, client):
    folders = sorted(["affine", "v2loaded", "linear", "identity", "batched", "exported",
                      "recorder", "one_request", "transform", "slow", "bad_declaration",
                      "tabular"])  # tabular is loaded from examples/tabular/model
    index = client.get_model_repository_index()
    assert [entry["name"] for entry in index] == folders
    by_name = {entry["name"]: entry for entry in index}
    assert by_name["affine"] == {"name": "affine", "version": "1", "state": "READY",
                                 "reason": ""}
    assert by_name["bad_declaration"] == {"name": "bad_declaration", "state": "UNAVAILABLE",
                                          "reason": "not loaded"}
    status, _, ready = post_v2(server, "/v2/repository/index", {"ready": True})
    assert status == 200
    assert [entry["name"] for entry in ready] == sorted([*PRELOADED, "tabular"])


def test_unload_through_v2_lets_accepted_requests_finish(server, client, v2_root):
    assert server.load("draining", v2_root / "slow")[0] == 200
    request = {"inputs": [json_tensor("INPUT__0", "FP32", [1, 1], [0.25])]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(post_v2, server, "/v2/models/draining/infer", request)
        wait_for_in_flight(server, "draining", 1)
        client.unload_model("draining")
        status, _, body = pending.result(timeout=30)
    assert (status, body["outputs"][0]["data"]) == (200, [1.5])
    assert not client.is_model_ready("draining")


def test_a_full_queue_answers_503_over_v2(server, client):
    body = json.dumps({"inputs": [json_tensor("INPUT__0", "FP32", [1, 1], [0.5])]})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = pool.submit(server.request, "POST", "/v2/models/slow/infer", body)
        wait_for_in_flight(server, "slow", 1)
        others = [pool.submit(server.request, "POST", "/v2/models/slow/infer", body)
                  for _ in range(3)]
        results = [first.result(), *(f.result() for f in others)]
    statuses = [status for status, _, _ in results]
    assert statuses[0] == 200 and 503 in statuses and set(statuses) <= {200, 503}
    for status, headers, raw in results:
        if status == 503:
            assert set(json.loads(raw)) == {"error"}
            assert json.loads(raw)["error"].startswith("model 'slow' has 1 requests queued")
            assert int(headers["Retry-After"]) >= 1
    assert_healthy(server, client)


# -- errors ---------------------------------------------------------------------------


def binary_request(inputs: list[dict], blobs: bytes, extra: dict | None = None):
    header = json.dumps({"inputs": inputs, **(extra or {})}).encode()
    return header + blobs, {HEADER_LENGTH: str(len(header))}


FP32_2x3 = np.arange(6, dtype=np.float32).reshape(2, 3).tobytes()
GOOD_INPUT = json_tensor("INPUT__0", "FP32", [1, 2], [1.0, 2.0])

#: (case, path, body, headers, the exact error).
ERROR_CASES = [
    ("unknown model", "/v2/models/nope/infer", {"inputs": [GOOD_INPUT]}, None,
     "model 'nope' is not loaded"),
    ("unknown version", "/v2/models/affine/versions/7/infer", {"inputs": [GOOD_INPUT]}, None,
     "model 'affine' has no version '7'; its versions: ['1']"),
    ("malformed JSON", "/v2/models/affine/infer", '{"inputs": [', None,
     "the request is not valid JSON: Expecting value: line 1 column 13 (char 12) (a body with "
     "binary tensors after its JSON needs an Inference-Header-Content-Length header)"),
    ("not an object", "/v2/models/affine/infer", "[1, 2]", None,
     "the request must be a JSON object, got list"),
    ("no inputs", "/v2/models/affine/infer", {"outputs": []}, None,
     'the request needs "inputs": a non-empty list of tensors'),
    ("no datatype", "/v2/models/affine/infer",
     {"inputs": [{"name": "INPUT__0", "shape": [1], "data": [1.0]}]}, None,
     "input 'INPUT__0' needs \"datatype\""),
    ("no data", "/v2/models/affine/infer",
     {"inputs": [{"name": "INPUT__0", "shape": [1], "datatype": "FP32"}]}, None,
     "input 'INPUT__0' needs \"data\", or parameters.binary_data_size for binary data after "
     "the JSON header"),
    ("unknown datatype", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP8", [1], [1.0])]}, None,
     "input 'INPUT__0': unknown datatype 'FP8'; known: BOOL, UINT8, UINT16, UINT32, UINT64, "
     "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16"),
    ("BYTES", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "BYTES", [1], ["hello"])]}, None,
     "model 'affine' takes numeric tensors; BYTES (strings) are for text models "
     "(mmserver.json's text)"),
    ("element count", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [2, 3], [1, 2, 3, 4, 5])]}, None,
     "input 'INPUT__0': shape [2, 3] holds 6 elements, but data has 5"),
    ("ragged data", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [2, 2], [[1, 2], [3]])]}, None,
     "input 'INPUT__0': data must be numbers, or lists of numbers nested evenly"),
    ("float for an integer", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "INT32", [1, 2], [1, 2.5])]}, None,
     "input 'INPUT__0': INT32 data must be integers, got floats"),
    ("out of range", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "UINT8", [1, 2], [1, 300])]}, None,
     "input 'INPUT__0': 300 does not fit UINT8"),
    ("strings for FP32", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [1, 1], ["1.0"])]}, None,
     "input 'INPUT__0': FP32 data must be numbers, got strings"),
    ("too large for FP16", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP16", [1, 1], [1e6])]}, None,
     "input 'INPUT__0': data holds a number too large for FP16, or NaN or infinity (which "
     "JSON cannot carry; send such values as binary data)"),
    ("negative shape", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [-1, 2], [1.0, 2.0])]}, None,
     "input 'INPUT__0': shape must be a list of at most 32 integers >= 0, got [-1, 2]"),
    ("declared datatype", "/v2/models/linear/infer",
     {"inputs": [json_tensor("x", "INT32", [1, 3], [1, 2, 3])]}, None,
     "input 'x' is FP32, got INT32"),
    ("declared shape", "/v2/models/linear/infer",
     {"inputs": [json_tensor("x", "FP32", [1, 4], [1, 2, 3, 4])]}, None,
     "input 'x' has shape [-1, 3], got [1, 4]"),
    ("declared name", "/v2/models/linear/infer",
     {"inputs": [json_tensor("z", "FP32", [1, 3], [1, 2, 3])]}, None,
     "the model has no input 'z'; its inputs: ['x']"),
    ("missing input", "/v2/models/exported/infer",
     {"inputs": [json_tensor("x", "FP32", [1, 3], [1, 2, 3])]}, None,
     "input 'y' is missing; the model's inputs: ['x', 'y']"),
    ("rows differ", "/v2/models/exported/infer",
     {"inputs": [json_tensor("x", "FP32", [1, 3], [1, 2, 3]),
                 json_tensor("y", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])]}, None,
     "this model batches requests along dimension 0, so every input needs it, with the same "
     "size: the tensors of one request must share dimension 0, got [1, 2]"),
    ("no batch dimension", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [], [1.0])]}, None,
     "this model batches requests along dimension 0, so every input needs it, with the same "
     "size: a request must have a batch dimension (dimension 0 counts rows)"),
    ("no rows", "/v2/models/affine/infer",
     {"inputs": [json_tensor("INPUT__0", "FP32", [0, 3], [])]}, None,
     "the inputs hold no rows (dimension 0 is 0)"),
    ("unknown output", "/v2/models/linear/infer",
     {"inputs": [json_tensor("x", "FP32", [1, 3], [1, 2, 3])], "outputs": [{"name": "z"}]},
     None, "the model has no output 'z'; its outputs: ['y']"),
    ("output not returned", "/v2/models/affine/infer",
     {"inputs": [GOOD_INPUT], "outputs": [{"name": "OUTPUT__1"}]}, None,
     "the model returned no output 'OUTPUT__1'; it returned ['OUTPUT__0']"),
    ("classification", "/v2/models/affine/infer",
     {"inputs": [GOOD_INPUT],
      "outputs": [{"name": "OUTPUT__0", "parameters": {"classification": 3}}]}, None,
     "output 'OUTPUT__0': the classification extension is not supported; ask for the tensor "
     "and rank it yourself"),
    ("id not a string", "/v2/models/affine/infer", {"id": 7, "inputs": [GOOD_INPUT]}, None,
     '"id" must be a string, got 7'),
    ("transform_fn", "/v2/models/transform/infer", {"inputs": [GOOD_INPUT]}, None,
     "model 'transform' is not available over v2: its code defines transform_fn, which takes "
     "the request body itself, not tensors; invoke it with POST /models/transform/invoke"),
    ("binary sizes short", "/v2/models/affine/infer", *binary_request(
        [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 3],
          "parameters": {"binary_data_size": 24}}], FP32_2x3[:20]),
     "input 'INPUT__0': binary_data_size is 24, but only 20 bytes of binary data are left in "
     "the body"),
    ("binary bytes left over", "/v2/models/affine/infer", *binary_request(
        [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 3],
          "parameters": {"binary_data_size": 24}}], FP32_2x3 + b"\0\0\0\0"),
     "the body has 28 bytes after its 111-byte JSON header, but the inputs' binary_data_size "
     "add up to 24"),
    ("binary size against shape", "/v2/models/affine/infer", *binary_request(
        [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 3],
          "parameters": {"binary_data_size": 12}}], FP32_2x3[:12]),
     "input 'INPUT__0': shape [2, 3] of FP32 needs 24 bytes, binary_data_size is 12"),
    ("binary without the header", "/v2/models/affine/infer",
     {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [2, 3],
                  "parameters": {"binary_data_size": 24}}]}, None,
     "input 'INPUT__0' has parameters.binary_data_size, but the request has no "
     "Inference-Header-Content-Length header to say where the binary data starts"),
    ("header longer than the body", "/v2/models/affine/infer", {"inputs": [GOOD_INPUT]},
     {HEADER_LENGTH: "100000"},
     "Inference-Header-Content-Length is 100000, but the body has "
     f"{len(json.dumps({'inputs': [GOOD_INPUT]}))} bytes"),
    ("header length not a number", "/v2/models/affine/infer", {"inputs": [GOOD_INPUT]},
     {HEADER_LENGTH: "twelve"},
     "Inference-Header-Content-Length must be a number of bytes, got 'twelve'"),
    ("load an unknown folder", "/v2/repository/models/nothing-here/load", "", None,
     "url 'nothing-here' does not exist"),
    ("load a bad declaration", "/v2/repository/models/bad_declaration/load", "", None,
     "mmserver.json inputs[0]: datatype must be one of BOOL, UINT8, UINT16, UINT32, UINT64, "
     "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES, got 'FP8'"),
    ("load with a config", "/v2/repository/models/v2loaded/load",
     {"parameters": {"config": "{}"}}, None,
     "load parameters ['config'] are not supported: a model's files and settings "
     "(mmserver.json) come from its folder under the model roots"),
    ("unload an unknown model", "/v2/repository/models/nope/unload", "", None,
     "model 'nope' is not loaded"),
    ("index with a bad filter", "/v2/repository/index", {"ready": "yes"}, None,
     "\"ready\" must be true or false, got 'yes'"),
]


@pytest.mark.parametrize("case, path, body, headers, message", ERROR_CASES,
                         ids=[case[0] for case in ERROR_CASES])
def test_client_mistakes_answer_400_with_the_error_and_the_server_stays_healthy(
        server, client, case, path, body, headers, message):
    status, answer_headers, answer = post_v2(server, path, body, headers)
    assert (status, answer) == (400, {"error": message})
    assert answer_headers["Content-Type"].startswith("application/json")
    assert_healthy(server, client)


def test_a_name_loaded_from_another_folder_is_not_replaced(server, client, v2_root):
    assert server.load("affine-elsewhere", v2_root / "linear")[0] == 200
    (v2_root / "affine-elsewhere").symlink_to(v2_root / "affine")
    try:
        status, _, body = post_v2(server, "/v2/repository/models/affine-elsewhere/load", "")
        assert (status, body) == (400, {"error": "model 'affine-elsewhere' is already ready"})
        assert client.get_model_metadata("affine-elsewhere")["inputs"] == \
            LINEAR_DECLARATION["inputs"]
    finally:
        (v2_root / "affine-elsewhere").unlink()
        client.unload_model("affine-elsewhere")


def test_sagemaker_invocations_check_rows_against_the_known_signature(server, client):
    """A client's rows of the wrong width are its mistake (400), not the model's (500)."""
    body = assert_error(server.invoke("tabular", [[1, 2]]), 400, "InvalidInput")
    assert body["message"].startswith("expected rows of 16 values, got rows of 2 values (input ")
    body = assert_error(server.invoke("linear", [[1, 2], [3, 4]]), 400, "InvalidInput")
    assert body["message"] == ("expected rows of 3 values, got rows of 2 values (input 'x' has "
                               "shape [-1, 3], -1 for any size; the body's is [2, 2])")
    status, _, raw = server.request("POST", "/models/linear/invoke", b"1,2,3,4\n",
                                    {"Content-Type": "text/csv"})
    assert assert_error((status, raw), 400, "InvalidInput")["message"].startswith(
        "expected rows of 3 values, got rows of 4 values ")
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 3, 1), dtype=np.float32))
    status, _, raw = server.request("POST", "/models/linear/invoke", buffer.getvalue(),
                                    {"Content-Type": "application/x-npy"})
    assert assert_error((status, raw), 400, "InvalidInput")["message"].startswith(
        "expected rows of 3 values, got rows of shape [3, 1] ")
    status, answer = server.invoke("linear", [[1, 2, 3]])
    expected = linear_module()(torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    assert status == 200 and np.allclose(answer, expected)
    assert server.invoke("tabular", [[0.5] * 16])[0] == 200
    assert_healthy(server, client)


def test_the_same_errors_through_the_clients(server, client):
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("nope")
    assert (raised.value.status(), raised.value.message()) == ("400",
                                                               "model 'nope' is not loaded")
    with pytest.raises(InferenceServerException) as raised:
        client.infer("linear", [infer_input("x", np.ones((1, 4), dtype=np.float32), True)])
    assert raised.value.message() == "input 'x' has shape [-1, 3], got [1, 4]"

    async def go():
        async with triton_aio.InferenceServerClient(address(server)) as aio:
            with pytest.raises(InferenceServerException) as raised:
                await aio.infer("nope", [infer_input("x", np.ones((1, 3), np.float32), True)])
            return raised.value

    error = asyncio.run(go())
    assert (error.status(), error.message()) == ("400", "model 'nope' is not loaded")
    assert_healthy(server, client)


def test_unknown_paths_and_methods_under_v2_answer_in_the_v2_shape(server, client):
    status, _, body = server.request("GET", "/v2/no/such/route")
    assert (status, json.loads(body)) == (404, {"error": "Not Found"})
    status, headers, body = server.request("DELETE", "/v2/models/affine")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
    assert headers["Allow"] == "GET,HEAD"
    status, body = server.json("GET", "/models/nope")
    assert status == 404 and set(body) == {"code", "type", "message"}
    assert_healthy(server, client)


# -- limits, deadline and the management token -------------------------------------


@pytest.fixture(scope="module")
def strict_server(v2_root):
    slow = v2_root / "strict-slow"
    write_code(slow, """
        import time

        MMSERVER_ROW_WISE = True

        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            time.sleep(3)
            return data
    """)
    with running_server(["--model-root", str(v2_root), "--no-access-log",
                         "--preload", "affine=affine", "--preload", "strict-slow=strict-slow"],
                        {"MMSERVER_MANAGEMENT_TOKEN": TOKEN, "SAGEMAKER_MODEL_SERVER_TIMEOUT": "1",
                         "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"}) as s:
        yield s


def test_the_management_token_guards_v2_load_and_unload(strict_server):
    for action in ("load", "unload"):
        status, headers, body = post_v2(strict_server, f"/v2/repository/models/affine/{action}",
                                        "")
        assert (status, body) == (401, {"error": "loading and unloading models needs "
                                                 "'Authorization: Bearer "
                                                 "<MMSERVER_MANAGEMENT_TOKEN>'"})
        assert headers["WWW-Authenticate"] == "Bearer"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with tritonclient_http.InferenceServerClient(address(strict_server)) as guarded:
        guarded.unload_model("affine", headers=headers)
        assert not guarded.is_model_ready("affine")
        guarded.load_model("affine", headers=headers)
        assert guarded.is_model_ready("affine")
        assert guarded.get_model_repository_index()[0]["name"] == "affine"


def test_the_payload_limit_and_the_deadline_hold_for_v2(strict_server):
    big = json.dumps({"inputs": [json_tensor("INPUT__0", "FP32", [1, 300_000],
                                             [0.5] * 300_000)]})
    status, _, body = post_v2(strict_server, "/v2/models/affine/infer", big)
    assert (status, body) == (413, {"error": f"the body is {len(big)} bytes or more; the limit "
                                             "is 1048576 (SAGEMAKER_MAX_PAYLOAD_IN_MB)"})
    status, _, body = post_v2(strict_server, "/v2/models/strict-slow/infer",
                              {"inputs": [GOOD_INPUT]})
    assert (status, body) == (504, {"error": "model 'strict-slow' did not answer within 1 s "
                                             "(SAGEMAKER_MODEL_SERVER_TIMEOUT)"})
    status, _, body = post_v2(strict_server, "/v2/models/affine/infer", {"inputs": [GOOD_INPUT]})
    assert status == 200 and body["outputs"][0]["data"] == [3.0, 5.0]


def test_the_readmes_tritonclient_example_prints_what_its_comments_say(server):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The Open Inference Protocol (v2)"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    expected = [comment for line in example.splitlines() if line.startswith("print(")
                for comment in [line.split("#", 1)[1].strip()]]
    result = subprocess.run([sys.executable, "-c",
                             example.replace("localhost:8080", address(server))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected


def test_every_model_status_has_a_repository_state():
    """A status added to the enum and not here would answer 500 on /v2/repository/index."""
    from mmserver.http.v2 import STATES
    from mmserver.loaded_model import ModelStatus

    assert set(STATES) == set(ModelStatus)

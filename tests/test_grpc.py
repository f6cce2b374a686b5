"""The v2 protocol over gRPC (``inference.GRPCInferenceService``) with Triton's own client.

The cases ``tests/test_v2.py`` runs through ``tritonclient.http`` run here through
``tritonclient.grpc``, against one process and against two HTTP workers over one engine
(each worker serves gRPC on the shared port): metadata, configuration, statistics, infer
with FP32, INT64 and BYTES tensors (raw and typed contents), the errors and their status
codes, the repository extension, and an HTTP and a gRPC request sharing one model call.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch
from conftest import RECORDER_CODE, SLOW_CODE, running_server, write_code, write_torchscript
from helpers import assert_statistics_match_metrics, wait_for_in_flight

from mmserver.harness.testing import free_port, wait_for_http_workers
from mmserver.http.app import WORKER_HEADER

grpc = pytest.importorskip("grpc")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
import tritonclient.grpc.aio as grpc_aio  # noqa: E402
import tritonclient.http as tritonclient_http  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "s3cret"


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


@pytest.fixture(scope="module")
def grpc_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grpc-models")
    write_torchscript(root / "affine")
    write_torchscript(root / "spare")
    write_torchscript(root / "identity", Identity(), torch.ones(2, 3))
    write_code(root / "recorder", RECORDER_CODE, with_affine=True)
    (root / "recorder" / "mmserver.json").write_text(json.dumps(
        {"policy": "timer", "max_wait_ms": 200, "max_batch_size": 64}))
    write_code(root / "slow", SLOW_CODE)
    (root / "slow" / "mmserver.json").write_text(json.dumps({"max_queue_size": 1}))
    return root


class Servers:
    def __init__(self, server, grpc_port: int):
        self.server = server
        self.grpc_address = f"127.0.0.1:{grpc_port}"
        self.http_address = server.url[len("http://"):]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def served(request, grpc_root):
    port = free_port()
    args = ["--model-root", str(grpc_root), "--no-access-log", "--grpc-port", str(port),
            "--http-workers", str(request.param)]
    for name in ("affine", "identity", "recorder", "slow"):
        args += ["--preload", f"{name}={name}"]
    with running_server(args) as server:
        if request.param > 1:
            wait_for_http_workers(server.url, request.param, WORKER_HEADER)
        yield Servers(server, port)


@pytest.fixture(scope="module")
def client(served):
    with tritonclient_grpc.InferenceServerClient(served.grpc_address) as c:
        yield c


@pytest.fixture(scope="module")
def http_client(served):
    with tritonclient_http.InferenceServerClient(served.http_address) as c:
        yield c


def infer_input(name: str, array: np.ndarray, datatype: str | None = None):
    tensor = tritonclient_grpc.InferInput(name, list(array.shape), datatype or
                                          tritonclient_grpc.np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def stub(served):
    channel = grpc.insecure_channel(served.grpc_address)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_health_metadata_and_readiness_as_over_http(client, http_client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata(as_json=True) == http_client.get_server_metadata()
    metadata = client.get_model_metadata("affine", as_json=True)
    for tensor in metadata["inputs"] + metadata["outputs"]:  # int64 as protobuf's JSON writes it
        tensor["shape"] = [int(d) for d in tensor["shape"]]
    assert metadata == http_client.get_model_metadata("affine")
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "1")
    assert not client.is_model_ready("affine", "2")
    assert not client.is_model_ready("no-such-model")


def test_model_configuration_as_over_http(client, http_client):
    config = client.get_model_config("affine", as_json=True)["config"]
    expected = http_client.get_model_config("affine")
    for tensor in config["input"] + config["output"]:  # protobuf's JSON omits empty lists
        tensor.setdefault("dims", [])
    # ... and an enum at its default: REJECT is timeout_action's 0.
    config["dynamic_batching"]["default_queue_policy"].setdefault("timeout_action", "REJECT")
    for key in ("name", "platform", "backend", "max_batch_size", "input", "output",
                "dynamic_batching", "instance_group"):
        assert config[key] == expected[key], key


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_infer_fp32_and_int64(served, client, typed):
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    ints = np.array([[2**40, -7, 0]], dtype=np.int64)
    if not typed:
        result = client.infer("affine", [infer_input("INPUT__0", x)], request_id="r-1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2 + 1)
        assert result.get_response().id == "r-1"
        echoed = client.infer("identity", [infer_input("INPUT__0", ints)])
        np.testing.assert_array_equal(echoed.as_numpy("OUTPUT__0"), ints)
        assert echoed.as_numpy("OUTPUT__0").dtype == np.int64
        return
    channel, service = stub(served)
    with channel:
        request = pb.ModelInferRequest(model_name="affine")
        tensor = request.inputs.add(name="INPUT__0", datatype="FP32", shape=[2, 3])
        tensor.contents.fp32_contents.extend(x.reshape(-1).tolist())
        answer = service.ModelInfer(request)
        assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
            ("OUTPUT__0", "FP32", [2, 3])]
        np.testing.assert_array_equal(
            np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(2, 3), x * 2 + 1)
        request = pb.ModelInferRequest(model_name="identity")
        tensor = request.inputs.add(name="INPUT__0", datatype="INT64", shape=[1, 3])
        tensor.contents.int64_contents.extend(ints.reshape(-1).tolist())
        answer = service.ModelInfer(request)
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<i8"),
                                      ints.reshape(-1))


def test_bytes_tensors_answer_as_over_http(client, http_client):
    """BYTES travels in both gRPC forms; the model's answer (a result or the refusal) is the
    one the HTTP route gives for the same tensor."""
    strings = np.array([b"hello", b"world"], dtype=np.object_)
    http_input = tritonclient_http.InferInput("INPUT__0", [2], "BYTES")
    http_input.set_data_from_numpy(strings, binary_data=True)
    try:
        expected = ("ok", http_client.infer("identity", [http_input]).as_numpy("OUTPUT__0"))
    except InferenceServerException as error:
        expected = ("error", error.message())
    try:
        got = ("ok", client.infer("identity", [infer_input("INPUT__0", strings, "BYTES")])
               .as_numpy("OUTPUT__0"))
    except InferenceServerException as error:
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        got = ("error", error.message())
    assert got[0] == expected[0]
    if got[0] == "ok":
        np.testing.assert_array_equal(got[1], expected[1])
    else:
        assert got[1] == expected[1] and "BYTES" in got[1]


def test_statistics_count_per_request_and_match_metrics(served, client, grpc_root):
    name = "counted"
    write_code(grpc_root / name, SLOW_CODE)
    client.load_model(name)
    try:
        x = np.array([[0.02, 2.0, 3.0]], dtype=np.float32)
        for _ in range(3):
            client.infer(name, [infer_input("INPUT__0", x)])
        [stats] = client.get_inference_statistics(name, as_json=True)["model_stats"]
        inference = stats["inference_stats"]
        counts = {k: int(inference[k].get("count", 0)) for k in (
            "success", "queue", "compute_input", "compute_infer", "compute_output")}
        assert counts == dict.fromkeys(counts, 3)
        assert int(stats["inference_count"]) == 3 and int(stats["execution_count"]) == 3
        assert int(inference["compute_infer"]["ns"]) >= 3 * 19e6
        assert int(inference["compute_input"]["ns"]) > 0
        assert int(inference["compute_output"]["ns"]) > 0
        as_http = {"name": name, "inference_count": int(stats["inference_count"]),
                   "execution_count": int(stats["execution_count"]),
                   "inference_stats": {k: {"count": int(v.get("count", 0)),
                                           "ns": int(v.get("ns", 0))}
                                       for k, v in inference.items()},
                   "batch_stats": [{"compute_infer": {"ns": int(b["compute_infer"]["ns"])}}
                                   for b in stats["batch_stats"]]}
        assert_statistics_match_metrics(as_http, served.server.metrics())
    finally:
        client.unload_model(name)
        (grpc_root / name / "code" / "inference.py").unlink()


def test_errors_answer_triton_s_codes(served, client):
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("no-such-model", [infer_input("INPUT__0", x)])
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    assert "no-such-model" in unknown.value.message()
    with pytest.raises(InferenceServerException) as wrong:
        client.infer("affine", [infer_input("INPUT__0", x)], model_version="2")
    assert wrong.value.status() == "StatusCode.INVALID_ARGUMENT"
    request = pb.ModelInferRequest(model_name="affine")
    request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(b"\0" * 8)  # 3 floats need 12 bytes
    channel, service = stub(served)
    with channel:
        with pytest.raises(grpc.RpcError) as short:
            service.ModelInfer(request)
        assert short.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs 12 bytes" in short.value.details()
        # A full queue: UNAVAILABLE, with the retry hint in the trailers.
        slow = pb.ModelInferRequest(model_name="slow")
        slow.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 1])
        slow.raw_input_contents.append(np.array([0.5], "<f4").tobytes())
        first = service.ModelInfer.future(slow)
        wait_for_in_flight(served.server, "slow", 1)
        others = [service.ModelInfer.future(slow) for _ in range(3)]
        outcomes = []
        for call in [first, *others]:
            try:
                call.result(timeout=30)
                outcomes.append("ok")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                assert error.details().startswith("model 'slow' has 1 requests queued")
                assert int(dict(error.trailing_metadata())["retry-after"]) >= 1
                outcomes.append("refused")
        assert outcomes[0] == "ok" and "refused" in outcomes
        # The client's deadline.
        with pytest.raises(grpc.RpcError) as late:
            service.ModelInfer(slow, timeout=0.1)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert client.infer("affine", [infer_input("INPUT__0", x)]).as_numpy("OUTPUT__0") \
        .tolist() == [[3.0, 5.0, 7.0]]


def test_the_repository_extension(client, http_client):
    index = {entry["name"]: entry for entry in
             client.get_model_repository_index(as_json=True)["models"]}
    assert index["affine"]["state"] == "READY" and index["spare"]["state"] == "UNAVAILABLE"
    assert index["spare"]["reason"] == "not loaded"
    client.load_model("spare")
    assert client.is_model_ready("spare") and http_client.is_model_ready("spare")
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    with pytest.raises(InferenceServerException) as missing:
        client.load_model("no-such-folder")
    assert missing.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("spare", config='{"max_batch_size": 4}')
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_http_and_a_grpc_request_share_one_model_call(served, grpc_root):
    log = grpc_root / "recorder" / "batches.jsonl"
    log.unlink(missing_ok=True)
    http_rows = [[1000.0 + i, 0.5, -1.0] for i in range(8)]
    grpc_rows = [np.array([[2000.0 + i, 0.25, 4.0]], dtype=np.float32) for i in range(8)]

    async def go():
        async with grpc_aio.InferenceServerClient(served.grpc_address) as aio, \
                aiohttp.ClientSession() as session:
            async def invoke(row):
                async with session.post(f"{served.server.url}/models/recorder/invoke",
                                        json=[row]) as response:
                    return response.status, await response.json()
            return await asyncio.gather(
                asyncio.gather(*(invoke(row) for row in http_rows)),
                asyncio.gather(*(aio.infer("recorder", [infer_input("INPUT__0", x)])
                                 for x in grpc_rows)))

    invoked, inferred = asyncio.run(go())
    assert invoked == [(200, [[2 * a + 1, 2 * b + 1, 2 * c + 1]]) for a, b, c in http_rows]
    for x, result in zip(grpc_rows, inferred):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2 + 1)
    batches = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(any(v < 2000 for v in batch) and any(v >= 2000 for v in batch)
               for batch in batches), batches


@pytest.fixture(scope="module")
def strict(grpc_root):
    port = free_port()
    with running_server(["--model-root", str(grpc_root), "--no-access-log",
                         "--grpc-port", str(port), "--preload", "affine=affine"],
                        {"MMSERVER_MANAGEMENT_TOKEN": TOKEN,
                         "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"}):
        yield f"127.0.0.1:{port}"


def test_the_token_and_the_payload_limit(strict):
    with tritonclient_grpc.InferenceServerClient(strict) as guarded:
        for action in (guarded.load_model, guarded.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                action("affine")
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
            assert "MMSERVER_MANAGEMENT_TOKEN" in refused.value.message()
        headers = {"authorization": f"Bearer {TOKEN}"}
        guarded.unload_model("affine", headers=headers)
        assert not guarded.is_model_ready("affine")
        guarded.load_model("affine", headers=headers)
        assert guarded.is_model_ready("affine")
        big = np.zeros((1, 300_000), dtype=np.float32)  # 1.2 MB, over the 1 MB limit
        with pytest.raises(InferenceServerException) as over:
            guarded.infer("affine", [infer_input("INPUT__0", big)])
        assert over.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        started = time.monotonic()
        assert guarded.is_server_live() and time.monotonic() - started < 5


def test_the_grpc_port_setting():
    from mmserver.cli import build_parser, settings_from_args
    from mmserver.config import Settings

    assert Settings.from_env({}).grpc_port == 8081
    assert Settings.from_env({"MMSERVER_GRPC_PORT": "0"}).grpc_port == 0
    with pytest.raises(ValueError, match="MMSERVER_GRPC_PORT"):
        Settings.from_env({"MMSERVER_GRPC_PORT": "70000"})
    args = build_parser().parse_args(["serve", "--grpc-port", "9001"])
    assert settings_from_args(args).grpc_port == 9001

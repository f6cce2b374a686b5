"""Property-based fuzzing of the HTTP API from its own OpenAPI description.

schemathesis turns ``mmserver/http/openapi.json`` into request strategies for every
operation; hypothesis draws requests from them and sends them to a real server
process. Whatever arrives, the server must answer with a status the description
documents for that operation, never a 5xx (the target models, ``y = 2x + 1``
for SageMaker's routes and the identity for the ``/v2`` routes, accept any numeric
tensor, so no model error is expected), and every error as JSON: ``{"code",
"type", "message"}`` on SageMaker's routes, ``{"error"}`` on ``/v2``. Afterwards
``/ping`` answers and both known models still answer exactly.

Quick by default (``MMSERVER_QUICK=1``: a few dozen examples per operation);
``MMSERVER_FUZZ_EXAMPLES=2000`` fuzzes each operation that many times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
import torch  # noqa: E402
from conftest import running_server, write_torchscript  # noqa: E402
from helpers import assert_error, assert_v2_error  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = schemathesis.openapi.from_path(str(ROOT / "mmserver" / "http" / "openapi.json"))
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
QUICK = os.environ.get("MMSERVER_QUICK") == "1"
EXAMPLES = int(os.environ.get("MMSERVER_FUZZ_EXAMPLES") or (20 if QUICK else 60))
KNOWN_MODEL = "fuzz-affine"
#: The identity serves the v2 routes: any datatype in, the same tensor out, never a NaN in JSON.
KNOWN_V2_MODEL = "fuzz-identity"
#: Operations that name a model: half the examples aim at the loaded one instead of a random name.
AIMED = {"GET /models/{name}", "POST /models/{name}/invoke", "POST /invocations"}
AIMED_V2 = {"GET /v2/models/{name}", "GET /v2/models/{name}/versions/{version}",
            "GET /v2/models/{name}/ready", "GET /v2/models/{name}/versions/{version}/ready",
            "POST /v2/models/{name}/infer", "POST /v2/models/{name}/versions/{version}/infer",
            "GET /v2/models/{name}/config", "GET /v2/models/{name}/versions/{version}/config",
            "GET /v2/models/{name}/stats", "GET /v2/models/{name}/versions/{version}/stats"}
V2_INFER = {"inputs": [{"name": "INPUT__0", "datatype": "INT16", "shape": [1, 2],
                        "data": [7, -3]}]}


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-models")
    write_torchscript(root / "affine")
    write_torchscript(root / "identity", Identity(), torch.ones(2, 3))
    with running_server(["--model-root", str(root), "--no-access-log"],
                        {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"}) as server:
        assert server.load(KNOWN_MODEL, "affine")[0] == 200
        assert server.load(KNOWN_V2_MODEL, "identity")[0] == 200
        yield server
        # The server survived everything: healthy, and the known models still exact.
        assert server.request("GET", "/ping", timeout=10)[0] == 200
        assert server.invoke(KNOWN_MODEL, [[1.0, 2.0]], timeout=10) == (200, [[3.0, 5.0]])
        status, answer = server.json("POST", f"/v2/models/{KNOWN_V2_MODEL}/infer", V2_INFER,
                                     timeout=10)
        assert status == 200 and answer["outputs"] == [
            {"name": "OUTPUT__0", "datatype": "INT16", "shape": [1, 2], "data": [7, -3]}]


def check_response(operation, response) -> None:
    status = response.status_code
    where = f"{operation.label} answered {status}: {response.text[:300]!r}"
    assert status < 500, where
    documented = operation.definition.raw["responses"]
    assert str(status) in documented, where
    if status >= 400:
        content_type = (response.headers.get("content-type") or [""])[0]
        assert content_type.startswith("application/json"), where
        if operation.label.split(" ", 1)[1].startswith("/v2"):
            assert_v2_error((status, response.content), status)
        else:
            assert_error((status, response.content), status)


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_fuzz_operation(fuzz_server, operation):
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(), aimed=st.booleans())
    def fuzz(case, aimed):
        if aimed and operation.label in AIMED:
            if operation.label == "POST /invocations":
                case.headers = {**(case.headers or {}),
                                "X-Amzn-SageMaker-Target-Model": KNOWN_MODEL}
            else:
                case.path_parameters = {**case.path_parameters, "name": KNOWN_MODEL}
        if aimed and operation.label in AIMED_V2:
            case.path_parameters = {**case.path_parameters, "name": KNOWN_V2_MODEL}
            if "version" in case.path_parameters:
                case.path_parameters["version"] = "1"
        response = case.call(base_url=fuzz_server.url, timeout=30)
        check_response(operation, response)

    fuzz()
    assert fuzz_server.request("GET", "/ping", timeout=10)[0] == 200

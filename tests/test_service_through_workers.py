"""Every ``ModelService`` method answers through ``--http-workers 2`` as in one process.

The test enumerates the protocol's methods, so a method added to it fails here until a
call of it is written below; each call is made over HTTP, through the routes that use the
method, to a one-process server and to a server of two HTTP workers over one engine, from
the same state, and the answers must be the same (status, content type, body). A method the
engine's dispatch lacks answers 500 through the workers, and fails here.

Answers differ between the two only where the process differs, and those parts are left
out of the comparison: the describe answer's ``engine`` (the engine's pid and restarts,
only with workers) and durations (Triton's ``ns``, busy seconds).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable

import pytest

from conftest import running_server, write_code, write_torchscript
from helpers import wait_until

from mmserver.harness.testing import wait_for_http_workers
from mmserver.http.app import WORKER_HEADER
from mmserver.http.service import ModelService

pytestmark = pytest.mark.slow

JSON = {"Content-Type": "application/json"}
#: A script's own decoding and encoding: its invocations run whole in the engine.
SCRIPTED_CODE = """
    import json, torch

    def model_fn(model_dir):
        return None

    def input_fn(body, content_type):
        return torch.tensor(json.loads(body)) * 10

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept):
        return json.dumps({"scaled": prediction.tolist()})
"""
#: Keys whose values are the process's or the clock's, not the service's answer.
PROCESS_KEYS = {"engine"}
TIME_KEYS = {"ns", "instanceBusySeconds", "last_inference"}


def _protocol_methods() -> list[str]:
    return [name for name, member in vars(ModelService).items()
            if inspect.iscoroutinefunction(member) and not name.startswith("_")]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("service-models")
    write_torchscript(root / "affine")
    write_torchscript(root / "folder")  # loaded by its folder's name (v2's repository)
    write_code(root / "scripted", SCRIPTED_CODE)
    return root


@pytest.fixture(scope="module")
def servers(root):
    """A one-process server and one of two HTTP workers over one engine."""
    common = ["--model-root", str(root), "--no-access-log", "--max-wait-ms", "2"]
    with running_server([*common, "--http-workers", "1"]) as alone, \
            running_server([*common, "--http-workers", "2"]) as workers:
        wait_for_http_workers(workers.url, 2, WORKER_HEADER)
        yield alone, workers


def _answer(server, method: str, path: str, body=None, headers=None):
    """(status, content type, body): JSON decoded, durations and process details left out."""
    if body is not None and not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    status, answer_headers, raw = server.request(method, path, body, headers or JSON)
    content_type = answer_headers.get("Content-Type", "").split(";")[0]
    if content_type == "application/json" and raw:
        return status, content_type, _scrubbed(json.loads(raw))
    return status, content_type, raw


def _scrubbed(value):
    if isinstance(value, dict):
        return {key: "(time)" if key in TIME_KEYS else _scrubbed(item)
                for key, item in value.items() if key not in PROCESS_KEYS}
    if isinstance(value, list):
        return [_scrubbed(item) for item in value]
    return value


def _loaded(server, name: str, url: str = "affine") -> None:
    status, body = server.load(name, url)
    assert status == 200, body


# -- a call of each method: the routes that use it, with good and bad arguments -----------


def _load(server):
    answers = [_answer(server, "POST", "/models", {"model_name": "m-load", "url": "affine"}),
               _answer(server, "POST", "/models", {"model_name": "m-load", "url": "affine"}),
               _answer(server, "POST", "/models", {"model_name": "m-none", "url": "nowhere"})]
    server.unload("m-load")
    return answers


def _page(server):
    for name in ("m-page-a", "m-page-b", "m-page-c"):
        _loaded(server, name)
    first = _answer(server, "GET", "/models?limit=2")
    token = first[2].get("nextPageToken")
    answers = [first, _answer(server, "GET", f"/models?limit=2&next_page_token={token}"),
               _answer(server, "GET", "/models"),
               _answer(server, "GET", "/models?limit=0")]
    for name in ("m-page-a", "m-page-b", "m-page-c"):
        server.unload(name)
    return answers


def _describe(server):
    _loaded(server, "m-describe")
    answers = [_answer(server, "GET", "/models/m-describe"),
               _answer(server, "GET", "/models/m-nothing")]
    server.unload("m-describe")
    return answers


def _unload(server):
    _loaded(server, "m-unload")
    return [_answer(server, "DELETE", "/models/m-unload"),
            _answer(server, "DELETE", "/models/m-unload"),
            _answer(server, "GET", "/models/m-unload"),
            _answer(server, "POST", "/v2/repository/models/m-unload/unload")]


def _invoke(server):
    _loaded(server, "m-invoke")
    _loaded(server, "m-scripted", "scripted")
    v2_body = {"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32",
                           "data": [1.0, 2.0, 3.0]}]}
    answers = [
        _answer(server, "POST", "/models/m-invoke/invoke", [[1.0, 2.0, 3.0]]),
        _answer(server, "POST", "/invocations", [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]],
                {**JSON, "X-Amzn-SageMaker-Target-Model": "m-invoke"}),
        _answer(server, "POST", "/models/m-invoke/invoke", "[[1.0, 2.0", JSON),
        _answer(server, "POST", "/models/m-invoke/invoke", "1,2,3\n", {"Content-Type": "text/csv"}),
        _answer(server, "POST", "/v2/models/m-invoke/infer", v2_body),
        _answer(server, "POST", "/v2/models/m-invoke/versions/1/infer", {"inputs": []}),
        _answer(server, "POST", "/models/m-scripted/invoke", [[1.0, 2.0]]),
        _answer(server, "POST", "/models/m-nothing/invoke", [[1.0]]),
    ]
    server.unload("m-invoke")
    server.unload("m-scripted")
    return answers


def _status(server):
    _loaded(server, "m-status")
    answers = [_answer(server, "GET", "/v2/models/m-status/ready"),
               _answer(server, "GET", "/v2/models/m-status/versions/1/ready"),
               _answer(server, "GET", "/v2/models/m-nothing/ready")]
    server.unload("m-status")
    return answers


def _model_metadata(server):
    _loaded(server, "m-metadata")
    answers = [_answer(server, "GET", "/v2/models/m-metadata"),
               _answer(server, "GET", "/v2/models/m-metadata/versions/2"),
               _answer(server, "GET", "/v2/models/m-nothing")]
    server.unload("m-metadata")
    return answers


def _model_config(server):
    _loaded(server, "m-config")
    answers = [_answer(server, "GET", "/v2/models/m-config/config"),
               _answer(server, "GET", "/v2/models/m-nothing/config")]
    server.unload("m-config")
    return answers


def _model_statistics(server):
    _loaded(server, "m-stats")
    for _ in range(3):
        assert server.invoke("m-stats", [[1.0, 2.0, 3.0]])[0] == 200
    answers = [_answer(server, "GET", "/v2/models/m-stats/stats"),
               _answer(server, "GET", "/v2/models/stats"),
               _answer(server, "GET", "/v2/models/m-nothing/stats")]
    server.unload("m-stats")
    return answers


def _index(server):
    _loaded(server, "m-index")
    answers = [_answer(server, "POST", "/v2/repository/index", {}),
               _answer(server, "POST", "/v2/repository/index", {"ready": True}),
               _answer(server, "POST", "/v2/repository/index", {"ready": "yes"})]
    server.unload("m-index")
    return answers


def _load_folder(server):
    answers = [_answer(server, "POST", "/v2/repository/models/folder/load", {}),
               _answer(server, "POST", "/v2/repository/models/folder/load", {}),
               _answer(server, "GET", "/v2/models/folder/ready"),
               _answer(server, "POST", "/v2/repository/models/nowhere/load", {})]
    server.unload("folder")
    return answers


def _exposition(server):
    """The service's counts for a model, once every worker's count has reached the engine."""
    _loaded(server, "m-metrics")
    for rows in ([[1.0, 2.0, 3.0]], [[1.0]], "not json"):
        server.request("POST", "/models/m-metrics/invoke",
                       rows if isinstance(rows, str) else json.dumps(rows), JSON)
    counted = re.compile(r'^mmserver_requests_total\{model="m-metrics",status="(\d+)"\} (\S+)$',
                         re.M)

    def counts() -> dict[str, float]:
        status, _, raw = server.request("GET", "/metrics")
        assert status == 200
        return dict(counted.findall(raw.decode()))

    assert wait_until(lambda: sum(map(float, counts().values())) == 3.0, 10), counts()
    status, headers, _ = server.request("GET", "/metrics")
    answer = (status, headers.get("Content-Type"), counts())
    server.unload("m-metrics")
    return [answer]


#: The call of each ``ModelService`` method (the module docstring).
CALLS: dict[str, Callable] = {
    "load": _load, "page": _page, "describe": _describe, "unload": _unload,
    "invoke": _invoke, "status": _status, "model_metadata": _model_metadata,
    "model_config": _model_config, "model_statistics": _model_statistics,
    "index": _index, "load_folder": _load_folder, "exposition": _exposition,
}


@pytest.mark.parametrize("method", _protocol_methods())
def test_each_service_method_answers_through_workers_as_in_one_process(servers, method):
    assert method in CALLS, (f"ModelService.{method} has no call in this test: write one "
                             "that reaches it through its routes")
    alone, workers = servers
    expected = CALLS[method](alone)
    assert all(status != 500 for status, _, _ in expected), expected
    assert CALLS[method](workers) == expected


def test_every_call_is_of_a_protocol_method():
    assert set(CALLS) == set(_protocol_methods())

"""Scripts written for SageMaker's PyTorch toolkit, served unchanged by a real server process.

Each model folder here is written the way toolkit users write them (a state_dict and
``code/model.py``, ``transform_fn`` alone, the context under another name...). Every
answer is checked exactly against what the test computes itself, with no Accept, with
``*/*`` and with an explicit type, and under 16 concurrent requests.
"""

from __future__ import annotations

import concurrent.futures
import json
import textwrap
import threading

import pytest
import torch
from conftest import running_server, write_code, write_torchscript
from helpers import SAME_ANSWER_ATOL, SAME_ANSWER_RTOL, assert_error, assert_same_answer

CONCURRENCY = 16
NO_ACCEPT, ANY_ACCEPT, JSON = None, "*/*", "application/json"


class Net(torch.nn.Module):
    """The network of ``code/model.py`` in the classic layout (the same source, below)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x)


NET_SOURCE = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x)
"""

#: Integer weights and inputs keep float32 arithmetic exact, so answers compare with ==.
NET_WEIGHT = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]])
NET_BIAS = torch.tensor([0.5, -2.0])


def net_output(row: list[float]) -> list[float]:
    return (NET_WEIGHT @ torch.tensor(row) + NET_BIAS).tolist()


CLASSIC_INFERENCE = """
    import json
    import os

    import torch
    from model import Net

    def model_fn(model_dir):
        net = Net()
        net.load_state_dict(torch.load(os.path.join(model_dir, "model.pth")))
        return net

    def input_fn(request_body, request_content_type):
        assert request_content_type == "application/json"
        assert isinstance(request_body, str)
        return torch.tensor(json.loads(request_body)["inputs"], dtype=torch.float32)

    def predict_fn(data, model):
        with torch.no_grad():
            return model(data.unsqueeze(0))[0]

    def output_fn(prediction, accept):
        assert accept == "application/json", accept
        return json.dumps({"outputs": prediction.tolist()})
"""

TWIN_MODEL = "SCALE = {scale}\n"
TWIN_INFERENCE = """
    import torch
    from model import SCALE

    MMSERVER_ROW_WISE = True

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        import model as late_import
        return data * SCALE + late_import.SCALE
"""

MODULES_PROBE = """
    import json, sys, torch

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept):
        names = sorted(n.rsplit(".", 1)[1] for n in sys.modules
                       if n.startswith("mmserver_models.") and n.endswith(".model"))
        return json.dumps(names), "application/json"
"""

TRANSFORM_ONLY = """
    import json

    def model_fn(model_dir):
        return 100

    def transform_fn(model, request_body, content_type, accept):
        if content_type == "text/csv":
            rows = [[float(v) for v in line.split(",")] for line in request_body.splitlines()]
        elif content_type == "application/json":
            rows = json.loads(request_body)
        else:
            return json.dumps({"type": type(request_body).__name__}), "application/json"
        assert isinstance(request_body, str)
        sums = [sum(row) + model for row in rows]
        if accept == "text/csv":
            return "\\n".join(f"{s:g}" for s in sums) + "\\n", "text/csv"
        return json.dumps({"sums": sums, "accept": accept})
"""

TRANSFORM_MIXED = """
    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        return request_body

    def input_fn(request_body, request_content_type):
        return request_body
"""

CONTEXT_BY_POSITION = """
    import json
    import torch

    def model_fn(model_dir, load_info):
        return {"from": load_info.system_properties["model_dir"] == model_dir}

    def input_fn(request_body, request_content_type, ctx):
        assert isinstance(request_body, str), type(request_body)
        rows = [[float(v) for v in line.split(",")] for line in request_body.splitlines()]
        return torch.tensor(rows)

    def predict_fn(data, model, whatever):
        return {"doubled": data * 2, "model_dir_seen": model["from"],
                "attributes": whatever.custom_attributes}

    def output_fn(prediction, accept, request_info):
        return json.dumps({"doubled": prediction["doubled"].tolist(),
                           "model_dir_seen": prediction["model_dir_seen"],
                           "attributes": prediction["attributes"],
                           "accept": accept,
                           "context_accept": request_info.accept})
"""

DICT_INPUTS = """
    import json, time, torch

    MMSERVER_ROW_WISE = True

    def model_fn(model_dir):
        return None

    def input_fn(request_body, request_content_type):
        body = json.loads(request_body)
        return {"a": torch.tensor(body["a"]), "b": torch.tensor(body["b"])}

    def predict_fn(data, model):
        time.sleep(0.05)
        return data["a"] + 10 * data["b"]

    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""

WARM_UP = """
    import json, torch

    CALLS = []

    def pre_model_fn(model_dir):
        CALLS.append("pre_model_fn")

    def model_fn(model_dir):
        CALLS.append("model_fn")
        return lambda x: x + 1

    def model_warmup_fn(model_dir, model):
        CALLS.append(f"model_warmup_fn({model(torch.zeros(1)).item():g})")

    def output_fn(prediction, accept):
        return json.dumps({"calls": CALLS, "prediction": prediction.tolist()})
"""

EXITS_AT_IMPORT = """
    import sys
    sys.exit(3)
"""

ARGPARSE_AT_IMPORT = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    def model_fn(model_dir):
        return None
"""

EXITS_IN_MODEL_FN = """
    import sys

    def model_fn(model_dir):
        sys.exit("no GPU, giving up")
"""

OUTPUT_FN_RAISES = """
    import torch

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept):
        raise RuntimeError("cannot format a prediction of shape " + str(tuple(prediction.shape)))
"""

DEFAULTS_WITH_MODEL_FN = """
    import os
    import torch
    from model import Net

    def model_fn(model_dir):
        net = Net()
        net.load_state_dict(torch.load(os.path.join(model_dir, "model.pth")))
        return torch.nn.Sequential(net, torch.nn.Dropout(0.5)).train()
"""


def write_model(folder, files: dict[str, str]):
    for relative, source in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return folder


def save_net(folder):
    folder.mkdir(parents=True, exist_ok=True)
    net = Net()
    with torch.no_grad():
        net.linear.weight.copy_(NET_WEIGHT)
        net.linear.bias.copy_(NET_BIAS)
    torch.save(net.state_dict(), folder / "model.pth")
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("toolkit-models")
    write_model(save_net(root / "classic"), {"code/model.py": NET_SOURCE,
                                             "code/inference.py": CLASSIC_INFERENCE})
    write_model(save_net(root / "defaults"), {"code/model.py": NET_SOURCE,
                                              "code/inference.py": DEFAULTS_WITH_MODEL_FN})
    for name, scale in (("twin_a", 2), ("twin_b", 3)):
        write_model(root / name, {"code/model.py": TWIN_MODEL.format(scale=scale),
                                  "code/inference.py": TWIN_INFERENCE})
    for name, source in (("probe", MODULES_PROBE), ("transform_only", TRANSFORM_ONLY),
                         ("transform_mixed", TRANSFORM_MIXED),
                         ("context_by_position", CONTEXT_BY_POSITION),
                         ("dict_inputs", DICT_INPUTS), ("exits_at_import", EXITS_AT_IMPORT),
                         ("argparse_at_import", ARGPARSE_AT_IMPORT),
                         ("exits_in_model_fn", EXITS_IN_MODEL_FN),
                         ("output_fn_raises", OUTPUT_FN_RAISES)):
        write_code(root / name, source)
    write_code(root / "warm_up", WARM_UP)
    write_torchscript(root / "other_name")
    (root / "other_name" / "model.pt").rename(root / "other_name" / "weights.pth")
    save_net(root / "state_dict_without_code")
    write_torchscript(root / "two_files")
    (root / "two_files" / "model.pt").rename(root / "two_files" / "a.pt")
    write_torchscript(root / "two_files" / "b")
    (root / "two_files" / "b" / "model.pt").rename(root / "two_files" / "b.pth")
    return root


@pytest.fixture(scope="module")
def server(root):
    with running_server(["--model-root", str(root), "--no-access-log",
                         "--max-wait-ms", "2"]) as s:
        yield s


def post(server, name, body, content_type="application/json", accept=None, headers=None):
    all_headers = {"Content-Type": content_type, **(headers or {})}
    if accept is not None:
        all_headers["Accept"] = accept
    status, response_headers, raw = server.request(
        "POST", f"/models/{name}/invoke", body if isinstance(body, bytes) else body.encode(),
        all_headers)
    return status, response_headers.get("Content-Type", "").split(";")[0], raw


def concurrently(calls):
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(lambda call: call(), calls))


def stats(server, name):
    return server.json("GET", f"/models/{name}")[1]["stats"]


# -- the classic layout ------------------------------------------------------------------


def test_the_classic_layout_answers_each_item_with_any_accept(server, loaded):
    name = loaded("classic")
    rows = [[float(i), float(i % 3), 1.0 - i] for i in range(CONCURRENCY)]
    accepts = [NO_ACCEPT, ANY_ACCEPT, JSON]
    results = concurrently([
        lambda row=row, accept=accepts[i % 3]: post(
            server, name, json.dumps({"inputs": row}), accept=accept)
        for i, row in enumerate(rows)])
    for row, (status, content_type, raw) in zip(rows, results):
        assert status == 200, raw
        assert content_type == "application/json"
        assert json.loads(raw) == {"outputs": net_output(row)}
    assert stats(server, name)["meanBatchSize"] == 1.0  # never concatenated: not row-wise


def test_input_fn_raising_is_400_with_its_summary(server, loaded):
    name = loaded("classic")
    body = assert_error(post(server, name, json.dumps({"values": [1, 2, 3]})), 400, "InvalidInput")
    assert body["message"] == "input_fn rejected the body: KeyError: 'inputs'"


def test_an_output_fn_assertion_is_500_with_its_summary(server, loaded):
    name = loaded("classic")
    body = assert_error(post(server, name, json.dumps({"inputs": [1, 2, 3]}), accept="text/csv"),
                        500, "ModelError")
    assert body["message"] == "output_fn raised AssertionError: text/csv"


def test_output_fn_raising_is_500_and_the_model_keeps_serving(server, loaded):
    name = loaded("output_fn_raises")
    for _ in range(2):
        body = assert_error(post(server, name, b"[[1, 2]]"), 500, "ModelError")
        assert body["message"] == (
            "output_fn raised RuntimeError: cannot format a prediction of shape (1, 2)")
    assert server.json("GET", "/ping")[0] == 200


def test_model_fn_alone_gets_the_default_handlers_in_eval_mode_and_batches(server, loaded):
    name = loaded("defaults")
    rows = [[float(i), 2.0, -1.0] for i in range(CONCURRENCY)]
    results = concurrently([
        lambda row=row, accept=[NO_ACCEPT, ANY_ACCEPT, JSON][i % 3]: post(
            server, name, json.dumps([row]), accept=accept)
        for i, row in enumerate(rows)])
    for row, (status, content_type, raw) in zip(rows, results):
        assert (status, content_type) == (200, "application/json"), raw
        assert json.loads(raw) == [net_output(row)]
    status, content_type, raw = post(server, name, b"1,2,3\n4,5,6\n", "text/csv", "text/csv")
    assert (status, content_type) == (200, "text/csv")
    assert raw == b"14.5,9.0\n32.5,18.0\n"  # the toolkit's CSV: floats as str() writes them


# -- each model's code is its own ------------------------------------------------------------


def test_same_named_modules_loaded_at_the_same_moment_stay_apart(server, root, loaded):
    names = ["twin_a", "twin_b"]
    barrier = threading.Barrier(len(names))

    def load(name):
        barrier.wait()
        return server.load(name, root / name)

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        assert [s for s, _ in pool.map(load, names)] == [200, 200]
    try:
        probe = loaded("probe")
        assert json.loads(post(server, probe, b"[[0]]")[2]) == ["model", "model"]
        calls = [lambda name=name, x=float(i): (name, x, post(server, name, json.dumps([[x]])))
                 for i in range(CONCURRENCY) for name in names]
        for name, x, (status, _, raw) in concurrently(calls):
            scale = 2 if name == "twin_a" else 3
            assert status == 200, raw
            assert json.loads(raw) == [[x * scale + scale]]
        assert server.unload("twin_a")[0] == 200
        assert json.loads(post(server, probe, b"[[0]]")[2]) == ["model"]
        assert json.loads(post(server, "twin_b", b"[[1]]")[2]) == [[6.0]]
    finally:
        for name in names:
            server.request("DELETE", f"/models/{name}")
    assert json.loads(post(server, probe, b"[[0]]")[2]) == []


# -- transform_fn, the context, text bodies ------------------------------------------------


def test_transform_fn_alone_gets_text_bodies_and_may_answer_a_tuple(server, loaded):
    name = loaded("transform_only")
    rows = [[float(i), 1.0, 2.0] for i in range(CONCURRENCY)]
    calls = []
    for i, row in enumerate(rows):
        csv = ",".join(f"{v:g}" for v in row) + "\n"
        calls.append(lambda csv=csv: post(server, name, csv, "text/csv", "text/csv"))
        calls.append(lambda row=row, accept=[NO_ACCEPT, ANY_ACCEPT, JSON][i % 3]:
                     post(server, name, json.dumps([row]), accept=accept))
    results = concurrently(calls)
    for i, row in enumerate(rows):
        expected = sum(row) + 100
        assert results[2 * i] == (200, "text/csv", f"{expected:g}\n".encode())
        status, content_type, raw = results[2 * i + 1]
        assert (status, content_type) == (200, "application/json"), raw
        assert json.loads(raw) == {"sums": [expected], "accept": "application/json"}
    status, _, raw = post(server, name, b"\x00\x01", "application/octet-stream")
    assert (status, json.loads(raw)) == (200, {"type": "bytes"})


def test_transform_fn_mixed_with_input_fn_is_refused_at_load(server, root):
    body = assert_error(server.load("mixed", root / "transform_mixed"), 400, "InvalidModelArtifact")
    assert "transform_fn together with input_fn" in body["message"]


def test_the_context_is_passed_by_position_whatever_its_name(server, loaded):
    name = loaded("context_by_position")
    rows = [[float(i), -float(i)] for i in range(CONCURRENCY)]
    results = concurrently([
        lambda i=i, row=row: post(server, name, f"{row[0]:g},{row[1]:g}\n", "text/csv",
                                  [NO_ACCEPT, ANY_ACCEPT, JSON][i % 3],
                                  {"X-Amzn-SageMaker-Custom-Attributes": f"request={i}"})
        for i, row in enumerate(rows)])
    for i, (row, (status, _, raw)) in enumerate(zip(rows, results)):
        assert status == 200, raw
        assert json.loads(raw) == {"doubled": [[2 * row[0], 2 * row[1]]], "model_dir_seen": True,
                                   "attributes": f"request={i}", "accept": "application/json",
                                   "context_accept": "application/json"}


# -- batching user code safely ----------------------------------------------------------------


def test_a_row_wise_script_batches_dicts_of_tensors(server, loaded):
    name = loaded("dict_inputs")
    requests = [{"a": [[i, i + 1]] * (1 + i % 2), "b": [[1, -i]] * (1 + i % 2)}
                for i in range(CONCURRENCY)]
    results = concurrently([lambda r=r, accept=[NO_ACCEPT, ANY_ACCEPT, JSON][i % 3]:
                            post(server, name, json.dumps(r), accept=accept)
                            for i, r in enumerate(requests)])
    for request, (status, _, raw) in zip(requests, results):
        assert status == 200, raw
        expected = (torch.tensor(request["a"]) + 10 * torch.tensor(request["b"])).tolist()
        assert json.loads(raw) == expected
    assert stats(server, name)["meanBatchSize"] > 2  # requests shared calls (1.5 rows each)


def test_load_hooks_run_in_the_toolkits_order(server, loaded):
    name = loaded("warm_up")
    for accept in (NO_ACCEPT, ANY_ACCEPT, JSON):
        status, _, raw = post(server, name, b"[[1, 2, 3]]", accept=accept)
        assert status == 200, raw
        assert json.loads(raw) == {"calls": ["pre_model_fn", "model_fn", "model_warmup_fn(1)"],
                                   "prediction": [[2.0, 3.0, 4.0]]}


# -- load errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("folder, words", [
    ("exits_at_import", "code/inference.py failed to import: SystemExit (code 3)"),
    ("argparse_at_import", "code/inference.py failed to import: SystemExit (code 2)"),
    ("exits_in_model_fn", "model_fn raised SystemExit (code 'no GPU, giving up')"),
    ("state_dict_without_code", "model.pth is not TorchScript"),
    ("two_files", "exactly one .pt or .pth file (found a.pt, b.pth)"),
])
def test_scripts_that_exit_or_files_that_cannot_load_are_400(server, root, folder, words):
    body = assert_error(server.load("bad", root / folder), 400, "InvalidModelArtifact")
    assert words in body["message"]
    assert server.json("GET", "/ping")[0] == 200


def test_the_only_pth_file_is_the_model(server, loaded):
    name = loaded("other_name")
    for accept in (NO_ACCEPT, ANY_ACCEPT, JSON):
        status, _, raw = post(server, name, b"[[1, 2, 3]]", accept=accept)
        assert (status, json.loads(raw)) == (200, [[3.0, 5.0, 7.0]])


# -- the digits example ----------------------------------------------------------------------

#: The digits example rounds its probabilities to this many places.
DIGITS_DECIMALS = 4


def assert_same_digits_answer(batched: dict, alone: dict) -> None:
    """The same answer for one row of the digits example, batched or alone.

    Probabilities within float32 rounding, then rounded (see ``assert_same_answer``). The
    label is their argmax: it may differ only between classes whose probabilities tie
    within that tolerance, each side off by at most the tolerance and by its rounding.
    """
    assert_same_answer(batched["probabilities"], alone["probabilities"], decimals=DIGITS_DECIMALS)
    probabilities = alone["probabilities"]
    tie = 2 * (SAME_ANSWER_ATOL + SAME_ANSWER_RTOL) + 10.0 ** -DIGITS_DECIMALS
    assert batched["label"] == alone["label"] or (
        probabilities[batched["label"]] >= max(probabilities) - tie), (batched, alone)


def test_digits_refuses_an_image_bomb_from_its_header_and_still_batches(tmp_path):
    import torchvision

    from mmserver.harness.examples import write_examples

    folder = write_examples(tmp_path, names=["digits"])["digits"]
    with running_server(["--model-root", str(tmp_path), "--no-access-log"]) as server:
        assert server.load("digits", folder)[0] == 200
        bomb = torchvision.io.encode_png(torch.zeros(1, 6000, 6000, dtype=torch.uint8))
        body = assert_error(post(server, "digits", bytes(bomb.numpy()), "image/png"), 413,
                            "PayloadTooLarge")
        assert body["message"] == "the image is 6000x6000 pixels; at most 25000000 are decoded"
        rows = [[[float((i + j) % 17)] * 8] * 8 for j in range(2) for i in range(CONCURRENCY)]
        alone = [json.loads(post(server, "digits", json.dumps([row]))[2])[0] for row in rows]
        batches_before = stats(server, "digits")["batches"]
        together = concurrently([lambda row=row: post(server, "digits", json.dumps([row]))
                                 for row in rows])
        for (status, _, raw), lone in zip(together, alone):
            assert status == 200, raw
            assert_same_digits_answer(json.loads(raw)[0], lone)
        assert stats(server, "digits")["batches"] - batches_before < len(rows)  # calls were shared

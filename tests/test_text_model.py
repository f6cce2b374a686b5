"""The minilm example over a real server: strings in, SentenceTransformer's vectors out, batches
bounded by padded tokens, padding counted.

One server (two HTTP workers over the engine, so tokenizing happens in the workers) serves the
example folder twice: ``minilm`` as written, and ``counted``, the same folder with a small token
budget, a timer that lets requests gather, and a ``predict_fn`` that logs every call's
``attention_mask`` (rows, longest, real tokens) to a file: the token budget and the padding are
checked against what the model was actually called with.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import running_server
from sentence_transformers import SentenceTransformer

from mmserver.harness.examples import write_examples

#: Served vectors against SentenceTransformer's, element by element. Both run the same float32
#: arithmetic on the same weights; rows padded to a different longest row differ by rounding only
#: (measured: at most 3e-7 on these unit vectors, alone or padded to 252 tokens).
TOLERANCE = 1e-5
BUDGET_TOKENS = 64
CALLS_LOG = "calls.log"
COUNTING = f'''

import pathlib as _pathlib

_LOG = _pathlib.Path(__file__).resolve().parents[1] / "{CALLS_LOG}"
_embed = predict_fn


def predict_fn(data, model):
    mask = data["attention_mask"]
    with open(_LOG, "a") as log:
        log.write(f"{{mask.shape[0]}} {{mask.shape[1]}} {{int(mask.sum())}}\\n")
    return _embed(data, model)
'''

SENTENCES = [
    "Hi.",
    "The cat sat on the mat.",
    "Batching sentences of different lengths pads each call to its longest sentence.",
    "A short one.",
    "Dynamic batching trades a little latency for throughput, and padding eats into the "
    "throughput it buys when one long text shares a call with many short ones.",
    "Ok",
    "Tokens, not rows, are what a transformer's call costs.",
    "café, naïve, 東京: text that is not ASCII tokenizes too.",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    served = write_examples(root, names=["minilm"])["minilm"]
    counted = root / "counted" / "model"
    shutil.copytree(served, counted)
    script = counted / "code" / "inference.py"
    script.write_text(script.read_text() + COUNTING)
    settings = json.loads((counted / "mmserver.json").read_text())
    settings.update(max_batch_tokens=BUDGET_TOKENS, max_batch_size=64, policy="timer",
                    max_wait_ms=150)
    (counted / "mmserver.json").write_text(json.dumps(settings))
    return {"minilm": served, "counted": counted}


@pytest.fixture(scope="module")
def server(folders):
    args = ["--http-workers", "2", "--model-root", str(folders["minilm"].parents[1])]
    for name, folder in folders.items():
        args += ["--preload", f"{name}={folder}"]
    with running_server(args, env={"HF_HUB_OFFLINE": "1"}) as running:
        yield running


@pytest.fixture(scope="module")
def oracle(folders) -> SentenceTransformer:
    return SentenceTransformer(str(folders["minilm"]), device="cpu")


def calls(folder: Path) -> list[tuple[int, int, int]]:
    """(rows, longest, real tokens) of each model call so far."""
    log = folder / CALLS_LOG
    if not log.exists():
        return []
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]


def invoke_all(server, name: str, bodies: list) -> list[tuple[int, object]]:
    """Send every body at once (one thread each), so the server may batch them."""
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: server.invoke(name, body), bodies))


def test_vectors_equal_sentence_transformers_alone_and_batched(server, oracle, folders):
    want = oracle.encode(SENTENCES, convert_to_numpy=True)
    alone = [server.invoke("minilm", [text]) for text in SENTENCES]
    assert all(status == 200 for status, _ in alone)
    got_alone = np.array([vectors[0] for _, vectors in alone], dtype=np.float32)
    assert got_alone.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(got_alone, want, atol=TOLERANCE, rtol=0)

    before = len(calls(folders["counted"]))
    answers = invoke_all(server, "counted", [[text] for text in SENTENCES])
    assert all(status == 200 for status, _ in answers)
    got_batched = np.array([vectors[0] for _, vectors in answers], dtype=np.float32)
    np.testing.assert_allclose(got_batched, want, atol=TOLERANCE, rtol=0)
    made = calls(folders["counted"])[before:]
    assert any(rows > 1 and real < rows * longest for rows, longest, real in made), made

    status, both = server.invoke("minilm", {"inputs": SENTENCES[:3]})
    assert status == 200
    np.testing.assert_allclose(np.array(both, dtype=np.float32), want[:3], atol=TOLERANCE,
                               rtol=0)


def test_the_token_budget_bounds_every_call_and_a_longer_request_runs_alone(server, folders):
    before = len(calls(folders["counted"]))
    # 82 and 10 word pieces ("tokens" is two, with [CLS] and [SEP]): 2 x 82 > 64.
    long_request = ["tokens " * 40, "and a second text of the same request"]
    bodies = [[text] for text in SENTENCES] + [long_request] + [SENTENCES[:2], SENTENCES[5:]]
    answers = invoke_all(server, "counted", bodies)
    assert [status for status, _ in answers] == [200] * len(bodies)
    assert [len(vectors) for _, vectors in answers] == [len(body) for body in bodies]
    made = calls(folders["counted"])[before:]
    assert sum(rows for rows, _, _ in made) == sum(len(body) for body in bodies)
    over = [call for call in made if call[0] * call[1] > BUDGET_TOKENS]
    assert over == [(2, 82, 92)], made


def test_padding_efficiency_reported_is_real_over_padded_tokens_of_the_calls(server, folders):
    invoke_all(server, "counted", [[text] for text in SENTENCES])
    made = calls(folders["counted"])
    real = sum(r for _, _, r in made)
    padded = sum(rows * longest for rows, longest, _ in made)
    assert real < padded

    status, described = server.json("GET", "/models/counted")
    assert status == 200
    stats = described["stats"]
    assert (stats["realTokens"], stats["paddedTokens"]) == (real, padded)
    assert stats["paddingEfficiency"] == pytest.approx(real / padded, abs=1e-6)
    assert described["batching"]["maxBatchTokens"] == BUDGET_TOKENS

    assert server.metric("mmserver_real_tokens_total", model="counted") == real
    assert server.metric("mmserver_padded_tokens_total", model="counted") == padded
    assert server.metric("mmserver_padding_efficiency", model="counted") == \
        pytest.approx(real / padded)

    status, answer = server.json("GET", "/v2/models/counted/stats")
    assert status == 200
    padding = answer["model_stats"][0]["mmserver_padding"]
    assert (int(padding["real_tokens"]), int(padding["padded_tokens"])) == (real, padded)
    assert padding["efficiency"] == pytest.approx(real / padded)
    status, config = server.json("GET", "/v2/models/counted/config")
    assert config["parameters"]["mmserver_max_batch_tokens"] == {"string_value": "64"}


@pytest.mark.parametrize("body, says", [
    ([1, 2], "expected a JSON list of strings"),
    ({"texts": ["a"]}, "expected a JSON list of strings"),
    ("just a string", "expected a JSON list of strings"),
    ([["nested"]], "expected a JSON list of strings"),
    ([], "the list is empty"),
    ({"inputs": []}, "the list is empty"),
    (["fine", "word " * 300], "text 1 is 302 tokens long; this model takes at most 256"),
])
def test_bad_input_answers_400_saying_what_is_wrong(server, body, says):
    status, answer = server.invoke("minilm", body)
    assert status == 400, answer
    assert says in answer["message"]


def test_a_body_that_is_not_utf8_or_not_json_answers_400(server):
    for body, says in ((b'["caf\xe9"]', "not UTF-8"), (b'["unclosed', "not valid JSON")):
        status, _, raw = server.request("POST", "/models/minilm/invoke", body,
                                        {"Content-Type": "application/json"})
        assert status == 400 and says in json.loads(raw)["message"]
    status, _, raw = server.request("POST", "/models/minilm/invoke", b"a,b",
                                    {"Content-Type": "text/csv"})
    assert status == 415 and "application/json" in json.loads(raw)["message"]


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_sends_bytes_and_gets_the_embeddings(server, oracle, binary):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    texts = SENTENCES[:3]
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object),
                               binary_data=binary)
    asked = triton.InferRequestedOutput("embedding", binary_data=binary)
    result = client.infer("minilm", [tensor], outputs=[asked])
    embedding = result.as_numpy("embedding")
    assert embedding.dtype == np.float32 and embedding.shape == (3, 384)
    np.testing.assert_allclose(embedding, oracle.encode(texts), atol=TOLERANCE, rtol=0)

    too_long = triton.InferInput("text", [1], "BYTES")
    too_long.set_data_from_numpy(np.array([b"word " * 300], dtype=object), binary_data=binary)
    with pytest.raises(triton.InferenceServerException, match="at most 256"):
        client.infer("minilm", [too_long])
    not_utf8 = triton.InferInput("text", [1], "BYTES")
    not_utf8.set_data_from_numpy(np.array([b"caf\xe9"], dtype=object), binary_data=True)
    with pytest.raises(triton.InferenceServerException, match="not UTF-8"):
        client.infer("minilm", [not_utf8])

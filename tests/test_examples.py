"""The example models: each artifact loads for real and answers row for row; the digits code is right."""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
import torch
import torchvision
from helpers import SAME_ANSWER_ATOL, SAME_ANSWER_RTOL, assert_same_answer
from torchvision.transforms.v2 import functional as F

from mmserver.harness.examples import EXAMPLES, load_digits_split, write_examples

SEED = 0
# Test digits sent through each image path. Measured with seed 0: 10 of the
# first 10 right in every mode (193 of the first 200); requiring 8 leaves room
# for a digit that squashing 32x32 back to 8x8 or JPEG's artefacts blur.
IMAGE_SAMPLES = 10


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """All three examples, written once for the whole module."""
    return write_examples(tmp_path_factory.mktemp("examples"), seed=SEED)


@pytest.fixture(scope="module")
def handlers(written):
    """The digits model's inference.py, imported from the written file as the server would."""
    path = written["digits"] / "code" / "inference.py"
    spec = importlib.util.spec_from_file_location("digits_inference_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits_model(handlers, written):
    return handlers.model_fn(str(written["digits"]))


@pytest.fixture(scope="module")
def test_digits():
    images, labels, _, test_idx = load_digits_split(SEED)
    return images[test_idx], labels[test_idx]


def _jit_load(path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        return torch.jit.load(str(path), map_location="cpu")


def _answer(handlers, model, body, content_type, accept="application/json"):
    """One request through the four handlers, as the server runs them."""
    data = handlers.input_fn(body, content_type)
    with torch.inference_mode():
        prediction = handlers.predict_fn(data, model)
    return json.loads(handlers.output_fn(prediction, accept))


def _rendered(image_0_to_16, side=32, invert=False):
    """A dataset digit as a (1, side, side) uint8 picture, bright on dark unless inverted."""
    pixels = (image_0_to_16 * (255.0 / 16.0)).round().to(torch.uint8)
    big = F.resize(pixels, [side, side], antialias=True)
    return 255 - big if invert else big


def test_writes_every_example_in_the_sagemaker_layout(written, tmp_path_factory):
    assert set(written) == set(EXAMPLES) == {"digits", "resnet18", "tabular", "minilm"}
    for name, model_dir in written.items():
        assert model_dir.name == "model" and model_dir.parent.name == name
        for relative in EXAMPLES[name].files:
            assert (model_dir / relative).is_file(), f"{name} lacks {relative}"
        metadata = json.loads((model_dir / "metadata.json").read_text())
        assert metadata["description"] and metadata["seed"] == SEED
        assert not list(model_dir.parent.glob(".model-*")), "a staging directory was left behind"
    assert json.loads((written["digits"] / "mmserver.json").read_text()) == {"max_batch_size": 64, "max_wait_ms": 2}
    assert json.loads((written["resnet18"] / "mmserver.json").read_text()) == {"max_batch_size": 32, "max_wait_ms": 5}
    assert not (written["resnet18"] / "code").exists(), "resnet18 must use the default handlers"
    minilm = json.loads((written["minilm"] / "mmserver.json").read_text())
    assert minilm["text"] == {"tokenizer": "tokenizer.json", "max_length": 256}
    assert minilm["max_batch_tokens"] == 2048


@pytest.mark.parametrize("rows", [1, 5])
def test_torchscript_models_answer_one_row_per_input_row(written, rows):
    resnet = _jit_load(written["resnet18"] / "model.pt")
    digits = _jit_load(written["digits"] / "model.pt")
    with torch.inference_mode():
        assert resnet(torch.rand(rows, 3, 64, 64)).shape == (rows, 10)
        assert digits(torch.rand(rows, 1, 8, 8) * 16).shape == (rows, 10)


@pytest.mark.parametrize("rows", [1, 2, 5, 7])
def test_exported_tabular_model_takes_any_batch_size(written, rows):
    program = torch.export.load(str(written["tabular"] / "model.pt2")).module()
    data = torch.rand(7, 16)
    with torch.inference_mode():
        full = program(data)
        assert program(data[:rows]).shape == (rows, 4)
        assert_same_answer(full[:rows], program(data[:rows]))  # rows must not depend on each other


def test_digits_accuracy_is_recorded_and_high(written, digits_model, handlers, test_digits):
    """The recorded accuracy is the served model's, to the image.

    It was measured in training, by the eager module on one thread; the served TorchScript
    model's logits agree within float32 rounding, so only an image whose two top logits tie
    within that tolerance may change its label.
    """
    # Measured: 0.9806 on the 360 held-out images with seed 0.
    metadata = json.loads((written["digits"] / "metadata.json").read_text())
    assert metadata["test_accuracy"] >= 0.9
    images, labels = test_digits
    with torch.inference_mode():
        logits = handlers.predict_fn(images, digits_model)
    first, second = logits.topk(2, dim=1).values.unbind(dim=1)
    ties = int((first - second <= 2 * (SAME_ANSWER_ATOL + SAME_ANSWER_RTOL * first.abs())).sum())
    correct = int((logits.argmax(dim=1) == labels).sum())
    recorded = round(metadata["test_accuracy"] * len(labels))  # 4 places are finer than 1/360
    assert abs(correct - recorded) <= ties, (correct, recorded, ties)


@pytest.mark.parametrize(
    ("content_type", "encode", "invert", "at_least"),
    [
        ("image/png", torchvision.io.encode_png, False, 8),
        ("image/png", torchvision.io.encode_png, True, 8),
        ("image/jpeg", torchvision.io.encode_jpeg, False, 8),
        ("image/jpeg", torchvision.io.encode_jpeg, True, 8),
    ],
    ids=["png", "png-dark-on-light", "jpeg", "jpeg-dark-on-light"],
)
def test_digit_pictures_get_the_right_label(handlers, digits_model, test_digits, content_type, encode, invert,
                                            at_least):
    images, labels = test_digits
    correct = 0
    for image, label in zip(images[:IMAGE_SAMPLES], labels[:IMAGE_SAMPLES]):
        body = encode(_rendered(image, invert=invert)).numpy().tobytes()
        answer = _answer(handlers, digits_model, body, content_type)
        assert len(answer) == 1
        correct += answer[0]["label"] == int(label)
    assert correct >= at_least, f"{correct}/{IMAGE_SAMPLES} right"


def test_picture_decodes_to_the_training_scale(handlers, test_digits):
    image = test_digits[0][0]
    for invert in (False, True):
        data = handlers.input_fn(torchvision.io.encode_png(_rendered(image, invert=invert)).numpy().tobytes(),
                                 "image/png")
        assert data.shape == (1, 1, 8, 8) and data.dtype == torch.float32
        assert 0 <= data.min() and data.max() <= 16
        # Bright strokes where the dataset has them, whichever way the picture was drawn.
        assert torch.corrcoef(torch.stack([data.flatten(), image.flatten()]))[0, 1] > 0.8


def test_json_rows_in_both_forms(handlers, digits_model, test_digits):
    images, labels = test_digits
    rows = images[:3]
    flat = json.dumps([r.flatten().tolist() for r in rows]).encode()
    nested = json.dumps([r[0].tolist() for r in rows]).encode()
    for body in (flat, nested):
        data = handlers.input_fn(body, "application/json; charset=utf-8")
        assert data.shape == (3, 1, 8, 8) and data.dtype == torch.float32
        assert torch.equal(data, rows)
    answer = _answer(handlers, digits_model, nested, "application/json")
    assert [a["label"] for a in answer] == labels[:3].tolist()


def test_predict_fn_is_row_wise(handlers, digits_model, test_digits):
    """The server concatenates requests; each request's rows must come out as if run alone."""
    images, _ = test_digits
    with torch.inference_mode():
        together = handlers.predict_fn(images[:6], digits_model)
        apart = torch.cat([handlers.predict_fn(images[:2], digits_model),
                           handlers.predict_fn(images[2:6], digits_model)])
    assert together.shape == (6, 10)
    assert_same_answer(together, apart)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"not json", "application/json"),
        (b"{\"a\": 1}", "application/json"),
        (b"[]", "application/json"),
        (b"[[1, 2, 3]]", "application/json"),
        (json.dumps([[0] * 63]).encode(), "application/json"),
        (json.dumps([[[0] * 8] * 7]).encode(), "application/json"),
        (json.dumps([[[0] * 8] * 7 + [[0] * 7]]).encode(), "application/json"),
        (json.dumps([["x"] * 64]).encode(), "application/json"),
        (json.dumps([[True] * 64]).encode(), "application/json"),
        (json.dumps([[17] * 64]).encode(), "application/json"),
        (json.dumps([[-1] * 64]).encode(), "application/json"),
        (json.dumps([[0] * 64, "row"]).encode(), "application/json"),
        (b"\xff\xfe not utf-8", "application/json"),
        (b"not an image", "image/png"),
        (b"", "image/jpeg"),
    ],
)
def test_malformed_bodies_raise_value_error(handlers, body, content_type):
    with pytest.raises(ValueError):
        handlers.input_fn(body, content_type)


@pytest.mark.parametrize("content_type", ["text/csv", "application/x-npy", "", None])
def test_unsupported_content_type(handlers, content_type):
    with pytest.raises(ValueError, match="^unsupported content type"):
        handlers.input_fn(b"[[0]]", content_type)


@pytest.mark.parametrize("accept", ["application/json", "*/*", "text/html, */*;q=0.8", None])
def test_output_fn_answers_json_per_row(handlers, accept):
    logits = torch.randn(3, 10)
    answer = json.loads(handlers.output_fn(logits, accept))
    assert len(answer) == 3
    for row, expected in zip(answer, logits.argmax(dim=1).tolist()):
        assert set(row) == {"label", "probabilities"}
        assert row["label"] == expected
        assert len(row["probabilities"]) == 10
        assert all(p == round(p, 4) for p in row["probabilities"])
        assert sum(row["probabilities"]) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("accept", ["text/csv", "application/x-npy"])
def test_output_fn_refuses_other_types(handlers, accept):
    with pytest.raises(ValueError, match="^unsupported accept type"):
        handlers.output_fn(torch.zeros(1, 10), accept)


def test_second_call_reuses_what_exists(written):
    before = {p: p.stat() for d in written.values() for p in d.rglob("*") if p.is_file()}
    again = write_examples(next(iter(written.values())).parents[1], seed=SEED)
    assert again == written
    after = {p: p.stat() for d in again.values() for p in d.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    for path, stat in after.items():
        assert (stat.st_ino, stat.st_mtime_ns) == (before[path].st_ino, before[path].st_mtime_ns), path


def test_names_choose_examples_and_a_new_seed_rewrites(tmp_path):
    first = write_examples(tmp_path, names=["tabular"], seed=1)
    assert list(first) == ["tabular"] and [p.name for p in tmp_path.iterdir()] == ["tabular"]
    weights = (first["tabular"] / "model.pt2").read_bytes()
    second = write_examples(tmp_path, names=["tabular"], seed=2)
    assert json.loads((second["tabular"] / "metadata.json").read_text())["seed"] == 2
    assert (second["tabular"] / "model.pt2").read_bytes() != weights


def test_incomplete_example_is_rewritten(tmp_path):
    model_dir = write_examples(tmp_path, names=["tabular"])["tabular"]
    (model_dir / "model.pt2").unlink()
    write_examples(tmp_path, names=["tabular"])
    assert torch.export.load(str(model_dir / "model.pt2")).module()(torch.rand(1, 16)).shape == (1, 4)


def test_unknown_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown example"):
        write_examples(tmp_path, names=["digits", "nope"])
    assert not list(tmp_path.iterdir())

"""A model folder's mmserver.json, read once into ModelSettings: every key typed, none ignored."""

from __future__ import annotations

import json

import pytest

from mmserver.errors import InvalidModelArtifact
from mmserver.handler.settings import KEYS, ModelSettings
from mmserver.signatures import TensorSpec


def write(tmp_path, settings) -> ModelSettings:
    (tmp_path / "mmserver.json").write_text(json.dumps(settings))
    return ModelSettings.read(tmp_path)


def test_every_key_lands_in_its_field(tmp_path):
    settings = write(tmp_path, {
        "max_batch_size": 8, "max_wait_ms": 20, "policy": "timer", "row_wise": True,
        "thread_safe": False,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}]})
    assert settings == ModelSettings(
        batching={"max_batch_size": 8, "max_wait_ms": 20, "policy": "timer"},
        row_wise=True, thread_safe=False,
        inputs=(TensorSpec("x", "FP32", (-1, 3)),), outputs=(TensorSpec("y", "INT64", (-1,)),))


def test_no_file_is_the_empty_settings(tmp_path):
    assert ModelSettings.read(tmp_path) == ModelSettings()


def test_an_unknown_key_is_refused_with_the_keys_there_are(tmp_path):
    with pytest.raises(InvalidModelArtifact) as raised:
        write(tmp_path, {"max_batch_size": 4, "max_batchsize": 4})
    assert str(raised.value) == (f"mmserver.json: unknown keys ['max_batchsize']; known: "
                                 f"{sorted(KEYS)}")
    assert {"max_batch_size", "max_wait_ms", "max_queue_size", "policy", "batch_sizing",
            "instances", "row_wise", "thread_safe", "inputs", "outputs", "isolation",
            "max_batch_tokens", "text"} == KEYS


@pytest.mark.parametrize("text, message", [
    ("{", "mmserver.json is not valid JSON: "),
    ("[1]", "mmserver.json must hold a JSON object"),
    ('{"row_wise": "yes"}', "row_wise (mmserver.json) must be true or false, got 'yes'"),
    ('{"thread_safe": 1}', "thread_safe (mmserver.json) must be true or false, got 1"),
    ('{"inputs": []}', "mmserver.json inputs must be a non-empty list"),
    ('{"isolation": "thread"}',
     "isolation (mmserver.json) must be one of 'none', 'process', got 'thread'"),
])
def test_malformed_files_are_refused_saying_why(tmp_path, text, message):
    (tmp_path / "mmserver.json").write_text(text)
    with pytest.raises(InvalidModelArtifact, match="^" + message.replace("(", r"\(").replace(
            ")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        ModelSettings.read(tmp_path)

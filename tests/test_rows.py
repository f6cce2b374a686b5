"""What batches like a tensor (``mmserver/batching/rows.py``): every structure, alone and in a runner.

The functions are checked with exact values; then each structure goes through a real
``ModelRunner`` around a small ``nn.Module`` that counts its calls, because failure
isolation hides a broken batch: if concatenating or splitting fails, the runner retries
each request alone and the answers stay right. So every batching test asserts how many
model calls the requests made, not only what they got back.

Batches form without sleeps: a ``timer`` runner with ``max_batch_size`` equal to the rows
submitted runs the moment the last request is queued (full), and its ``max_wait`` is only a
guard that lets a broken runner fail instead of hang.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from mmserver.batching import BatchSettings, ModelError, ModelRunner
from mmserver.batching.rows import batch_key, concatenate, leaves, moved, rows_of, split_rows

CPU = torch.device("cpu")
#: A full batch runs at once; a runner that fails to see it full runs it after this (and fails).
GUARD_SECONDS = 5.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 4 * GUARD_SECONDS))


def full_at(rows: int) -> BatchSettings:
    return BatchSettings(max_batch_size=rows, max_wait=GUARD_SECONDS, policy="timer")


async def submit_all(model, inputs, settings):
    async with ModelRunner(model, settings) as runner:
        return await asyncio.gather(*(runner.submit(x) for x in inputs)), runner


def numbered(rows: int, start: int, width: int = 3) -> torch.Tensor:
    """Rows ``start``, ``start + 1``, ...: every value names its row."""
    return torch.arange(start, start + rows, dtype=torch.float32).repeat_interleave(width) \
        .reshape(rows, width)


class Counting(torch.nn.Module):
    """Remembers the rows of every call; ``forward`` is the structure under test."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.calls: list[int] = []

    def count(self, rows: int) -> None:
        self.calls.append(rows)


class DictIn(Counting):
    def forward(self, batch):
        assert isinstance(batch, dict) and list(batch) == ["input_ids", "attention_mask"]
        self.count(batch["input_ids"].shape[0])
        return batch["input_ids"] * self.scale + batch["attention_mask"]


class SequenceIn(Counting):
    def __init__(self, kind: type):
        super().__init__()
        self.kind = kind

    def forward(self, batch):
        assert type(batch) is self.kind and len(batch) == 2
        self.count(batch[0].shape[0])
        return batch[0] * self.scale - batch[1]


class Affine(Counting):
    """y = 2x + 1, and what ``out`` makes of it (the output structure under test)."""

    def __init__(self, out=lambda y: y):
        super().__init__()
        self.out = out

    def forward(self, x):
        self.count(x.shape[0])
        return self.out(x * self.scale + 1)


# -- the functions, exact values ---------------------------------------------------------


def test_leaves_of_every_structure():
    a, b, c = torch.zeros(2, 1), torch.ones(2, 3), torch.full((2,), 7.0)
    assert len(leaves(a)) == 1 and leaves(a)[0] is a
    assert [x is y for x, y in zip(leaves({"a": a, "b": (b, [c])}), [a, b, c])] == [True] * 3
    assert len(leaves({"a": a, "b": (b, [c])})) == 3
    assert [x is y for x, y in zip(leaves((a, b)), [a, b])] == [True, True]
    assert [x is y for x, y in zip(leaves([c, a]), [c, a])] == [True, True]
    assert leaves({}) == []


@pytest.mark.parametrize("data, name", [([], "list"), ((), "tuple"), (3, "int"),
                                        ([torch.ones(1), "text"], "str"), (None, "NoneType")])
def test_anything_else_is_refused_with_its_type(data, name):
    with pytest.raises(TypeError) as refused:
        leaves(data)
    assert str(refused.value) == ("a request must be a torch.Tensor (or a dict, tuple or list of "
                                  f"tensors), got {name}")


def test_rows_of_every_structure():
    assert rows_of(torch.zeros(4, 2)) == 4
    assert rows_of(torch.zeros(1)) == 1
    assert rows_of({"a": torch.zeros(3, 2), "b": torch.zeros(3)}) == 3
    assert rows_of((torch.zeros(2, 5), [torch.zeros(2)])) == 2
    assert type(rows_of({"a": torch.zeros(3, 2)})) is int


@pytest.mark.parametrize("data", [torch.tensor(3.0), {"a": torch.ones(2), "b": torch.tensor(1.0)},
                                  (torch.tensor(1.0),)])
def test_a_tensor_without_rows_is_refused(data):
    with pytest.raises(ValueError) as refused:
        rows_of(data)
    assert str(refused.value) == "a request must have a batch dimension (dimension 0 counts rows)"


@pytest.mark.parametrize("data, sizes", [
    ({"input_ids": torch.ones(2, 4), "attention_mask": torch.ones(3, 4)}, "[2, 3]"),
    ((torch.ones(5, 1), torch.ones(1, 1), torch.ones(5, 2)), "[1, 5]"),
    ({}, "[]"),
])
def test_tensors_that_disagree_on_rows_are_refused(data, sizes):
    with pytest.raises(ValueError) as refused:
        rows_of(data)
    assert str(refused.value) == f"the tensors of one request must share dimension 0, got {sizes}"


def test_batch_keys_are_shape_beyond_rows_dtype_device_and_structure():
    assert batch_key(torch.zeros(5, 3, 4)) == ((3, 4), torch.float32, CPU)
    assert batch_key(torch.zeros(5, dtype=torch.int64)) == ((), torch.int64, CPU)
    assert batch_key({"a": torch.zeros(2, 3), "b": torch.zeros(2)}) == (
        "dict", (("a", ((3,), torch.float32, CPU)), ("b", ((), torch.float32, CPU))))
    assert batch_key((torch.zeros(2, 3),)) == ("tuple", (((3,), torch.float32, CPU),))
    assert batch_key([torch.zeros(2, 3)]) == ("list", (((3,), torch.float32, CPU),))
    assert batch_key(torch.zeros(1, 3)) == batch_key(torch.ones(9, 3))
    assert batch_key((torch.zeros(1, 3),)) != batch_key([torch.zeros(1, 3)])


def test_concatenate_every_structure_along_rows():
    a, b = numbered(1, 0), numbered(2, 1)
    assert torch.equal(concatenate([a, b]), numbered(3, 0))
    merged = concatenate([{"x": a, "y": a[:, 0]}, {"x": b, "y": b[:, 0]}])
    assert list(merged) == ["x", "y"]
    assert torch.equal(merged["x"], numbered(3, 0)) and torch.equal(merged["y"], torch.arange(3.0))
    pair = concatenate([(a, a * 10), (b, b * 10)])
    assert type(pair) is tuple and len(pair) == 2
    assert torch.equal(pair[1], numbered(3, 0) * 10)
    as_list = concatenate([[a], [b]])
    assert type(as_list) is list and torch.equal(as_list[0], numbered(3, 0))


def test_moved_every_structure():
    meta = torch.device("meta")
    x = torch.ones(2, 2, requires_grad=True)
    assert moved(x, meta).device == meta
    assert moved({"a": x}, meta)["a"].device == meta
    assert moved((x, [x]), meta)[1][0].device == meta
    back = moved({"a": x, "b": (x, [x], 3)}, None, to_cpu=True)
    assert not back["a"].requires_grad and not back["b"][1][0].requires_grad
    assert type(back["b"]) is tuple and type(back["b"][1]) is list and back["b"][2] == 3
    assert torch.equal(back["a"], torch.ones(2, 2))
    assert moved("text", meta) == "text"


def test_split_rows_every_structure():
    y = numbered(4, 0)
    parts = split_rows(y, [1, 3])
    assert [p.tolist() for p in parts] == [numbered(1, 0).tolist(), numbered(3, 1).tolist()]
    ids = split_rows(torch.tensor([7, 8, 9]), [2, 1])
    assert [p.tolist() for p in ids] == [[7, 8], [9]]
    as_dict = split_rows({"a": y, "b": y[:, 0]}, [3, 1])
    assert [list(d) for d in as_dict] == [["a", "b"], ["a", "b"]]
    assert as_dict[1]["b"].tolist() == [3.0]
    as_tuple = split_rows((y, y * 2), [2, 2])
    assert [type(p) for p in as_tuple] == [tuple, tuple]
    assert as_tuple[1][1].tolist() == (numbered(2, 2) * 2).tolist()
    as_list = split_rows([y], [4])
    assert type(as_list[0]) is list and torch.equal(as_list[0][0], y)


@pytest.mark.parametrize("output, message", [
    (torch.tensor(1.0), "the model returned shape () for a batch of 3 rows; its output must have "
                        "one row per input row"),
    (torch.ones(2, 5), "the model returned shape (2, 5) for a batch of 3 rows; its output must "
                       "have one row per input row"),
    ({"a": torch.ones(4)}, "the model returned shape (4,) for a batch of 3 rows; its output "
                           "must have one row per input row"),
    (7, "the model returned int; expected a tensor (or a tuple, list or dict of tensors) with one "
        "row per input row"),
    ((torch.ones(3), "x"), "the model returned str; expected a tensor (or a tuple, list or dict "
                           "of tensors) with one row per input row"),
])
def test_an_output_without_one_row_per_input_row_is_a_model_error(output, message):
    with pytest.raises(ModelError) as refused:
        split_rows(output, [1, 2])
    assert str(refused.value) == message


# -- through a runner: answers, and how many calls made them --------------------------------


def test_dict_inputs_batch_into_one_call():
    inputs = [{"input_ids": numbered(n, 10 * i), "attention_mask": torch.ones(n, 3)}
              for i, n in enumerate([1, 2, 1])]
    model = DictIn()
    outputs, runner = run(submit_all(model, inputs, full_at(4)))
    assert model.calls == [4]
    for x, y in zip(inputs, outputs):
        assert torch.equal(y, x["input_ids"] * 2 + 1)
    assert runner.stats.batch_size_counts == {4: 1}


@pytest.mark.parametrize("kind", [tuple, list])
def test_tuple_and_list_inputs_batch_into_one_call(kind):
    inputs = [kind([numbered(n, 10 * i), torch.ones(n, 3)]) for i, n in enumerate([2, 1, 2])]
    model = SequenceIn(kind)
    outputs, _ = run(submit_all(model, inputs, full_at(5)))
    assert model.calls == [5]
    for x, y in zip(inputs, outputs):
        assert torch.equal(y, x[0] * 2 - 1)


def test_structures_never_mix():
    """A tuple and a list of the same tensors, or dicts with other keys, are other batches."""
    class Any_(Counting):
        def forward(self, batch):
            first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
            self.count(first.shape[0])
            return first

    x = torch.ones(1, 3)
    inputs = [(x,), [x], {"a": x}, {"b": x}, (x,)]
    model = Any_()
    settings = BatchSettings(max_batch_size=8, max_wait=0.0, policy="timer")
    outputs, runner = run(submit_all(model, inputs, settings))
    assert sorted(model.calls) == [1, 1, 1, 2]
    # Four batches: a batch of the two dicts would fail to concatenate and be retried request
    # by request inside one batch, which the model calls alone would not show.
    assert runner.stats.batch_size_counts == {2: 1, 1: 3}
    assert all(torch.equal(y, x) for y in outputs)


@pytest.mark.parametrize("name, out, per_row", [
    ("1-D class ids", lambda y: y.argmax(dim=1), lambda x: (x * 2 + 1).argmax(dim=1)),
    ("2-D rows", lambda y: y, lambda x: x * 2 + 1),
    ("3-D rows", lambda y: y.unsqueeze(1).expand(-1, 2, -1), lambda x: (x * 2 + 1).unsqueeze(1)
     .expand(-1, 2, -1)),
])
def test_outputs_of_any_rank_are_split_back_by_rows(name, out, per_row):
    inputs = [torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[9.0, 1.0, 2.0], [0.0, 0.0, 3.0]]),
              torch.tensor([[1.0, 7.0, 0.0]])]
    model = Affine(out)
    outputs, _ = run(submit_all(model, inputs, full_at(4)))
    assert model.calls == [4]
    for x, y in zip(inputs, outputs):
        assert y.shape[0] == x.shape[0]
        assert torch.equal(y, per_row(x))
    if name.startswith("1-D"):
        assert [y.tolist() for y in outputs] == [[1], [0, 2], [1]]


@pytest.mark.parametrize("kind", [dict, tuple, list])
def test_dict_tuple_and_list_outputs_are_split_back(kind):
    def out(y):
        parts = (y, y.sum(dim=1))
        return {"logits": parts[0], "score": parts[1]} if kind is dict else kind(parts)

    inputs = [numbered(2, 0), numbered(1, 5), numbered(1, 9)]
    model = Affine(out)
    outputs, _ = run(submit_all(model, inputs, full_at(4)))
    assert model.calls == [4]
    for x, y in zip(inputs, outputs):
        assert type(y) is kind
        logits, score = (y["logits"], y["score"]) if kind is dict else y
        assert torch.equal(logits, x * 2 + 1)
        assert torch.equal(score, (x * 2 + 1).sum(dim=1))


@pytest.mark.parametrize("out, message", [
    (lambda y: y.sum(), "the model returned shape () for a batch of {rows} rows; its output "
                        "must have one row per input row"),
    (lambda y: "a label", "the model returned str; expected a tensor (or a tuple, list or dict "
                          "of tensors) with one row per input row"),
])
def test_an_output_that_cannot_be_split_fails_every_request(out, message):
    """The batched call fails to split; each request is retried alone and fails alone."""
    inputs = [numbered(1, 0), numbered(2, 1)]
    model = Affine(out)

    async def main():
        async with ModelRunner(model, full_at(3)) as runner:
            results = await asyncio.gather(*(runner.submit(x) for x in inputs),
                                           return_exceptions=True)
            assert runner.running
            return results

    results = run(main())
    assert model.calls == [3, 1, 2]  # the batch, then each request alone
    assert [type(r) for r in results] == [ModelError, ModelError]
    assert [str(r) for r in results] == [message.format(rows=1), message.format(rows=2)]


@pytest.mark.parametrize("data", [
    {"input_ids": torch.ones(2, 4), "attention_mask": torch.ones(3, 4)},
    (torch.ones(1, 3), torch.ones(2, 3)),
])
def test_a_request_whose_tensors_disagree_on_rows_is_refused_before_the_queue(data):
    model = Affine()

    async def main():
        async with ModelRunner(model, full_at(2)) as runner:
            with pytest.raises(ValueError, match="must share dimension 0"):
                await runner.submit(data)
            assert runner.queue_depth == 0
            assert runner.stats.requests_submitted == 0
            assert torch.equal(await runner.submit(torch.ones(2, 3)), torch.full((2, 3), 3.0))

    run(main())
    assert model.calls == [2]

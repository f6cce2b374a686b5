"""The messages between an HTTP worker and its engine (``engine.messages``, ``engine.channel``).

Each kind crosses as itself; anything else (an unknown kind, the wrong fields, bytes that do
not unpickle, the tuples of the protocol before typed messages) is a protocol error that
ends the connection, never taken for another message. The operations a worker may ask are
the ``ModelService`` protocol's methods, and the worker's client has each one.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import socket
import struct
from typing import Protocol

import pytest
import torch

from mmserver.engine import channel as channel_module
from mmserver.engine.channel import Channel
from mmserver.config import Settings
from mmserver.engine.client import EngineService
from mmserver.engine.workers import WorkerConnection
from mmserver.engine.messages import (
    KINDS,
    OPERATIONS,
    Admission,
    Ask,
    Cancel,
    Changed,
    Count,
    Failed,
    Free,
    ProtocolError,
    Refused,
    Result,
    Rows,
    RowsResult,
    Stages,
    decode,
    encode,
    service_methods,
)
from mmserver.errors import ModelNotFound, QueueFull
from mmserver.http.service import ModelService
from mmserver.wires import ToolkitHeaders

#: One message of every kind, with fields as the engine and the workers fill them.
EXAMPLES = [
    Ask(7, "invoke", ("affine", ToolkitHeaders("application/json", None), b"[[1.0]]")),
    Rows(((8, "affine", 3, ("shared", 4096, "torch.float32", (1, 3))),
          (11, "affine", 3, ("inline", b"\x00" * 12, "torch.float32", (1, 3))))),
    Cancel(8),
    Free((4096, 8192)),
    Count((("affine", 200, 0.0125, None), ("affine", 503, 0.001, "queue_full"))),
    Refused("affine"),
    Stages((("affine", 0.004, 0.001, 0.0005, 0.002, 0.0003),)),
    Result(7, {"modelName": "affine", "status": "ready"}),
    RowsResult(((8, ("inline", b"\x00" * 12, "torch.float32", (1, 3)), None, 0.0, 0.0),
                (11, ("shared", 4096, "torch.float32", (1, 3)), 4096, 0.0021, 0.0034))),
    Failed(9, ModelNotFound("model 'x' is not loaded")),
    Failed(10, None),
    Changed("affine"),
    Admission("affine", QueueFull("the queue of model 'affine' is full")),
    Admission("affine", None),
]


#: What gathering adds to a message of one item: the tuple around the items (its mark,
#: its end and the pickle's memo of it).
GATHERED_BYTES = 4


def _crossed(message):
    return decode(pickle.loads(pickle.dumps(encode(message), pickle.HIGHEST_PROTOCOL)))


def test_every_kind_crosses_as_itself_with_its_fields():
    assert {type(message) for message in EXAMPLES} == set(KINDS)
    for message in EXAMPLES:
        received = _crossed(message)
        assert type(received) is type(message)
        for name in message.__slots__:
            sent, got = getattr(message, name), getattr(received, name)
            if isinstance(sent, Exception):
                assert (type(got), str(got)) == (type(sent), str(sent))
            else:
                assert got == sent, (message, name)


def test_a_message_crosses_compactly():
    """No class names on the wire: each message of the hot path, gathered from one item, is
    no larger than a bare tuple tagged with its name and a few dozen bytes (70, and 9 more
    for each float beyond the first: a rows answer carries its queue and call seconds), plus
    :data:`GATHERED_BYTES` for the tuple that holds a turn's items."""
    descriptor = ("shared", 4096, "torch.float32", (1, 16))
    for message, bare, cap in [
            (Rows(((123456, "affine", 3, descriptor),)),
             ("rows", 123456, "affine", 3, descriptor), 70),
            (RowsResult(((123456, descriptor, 4096, 0.0021, 0.0034),)),
             (123456, True, (descriptor, 4096, 0.0021, 0.0034)), 70 + 2 * 9),
            (Free((4096,)), ("free", 4096), 70),
            (Count((("affine", 200, 0.0125, None),)), ("count", "affine", 200, 0.0125, None),
             70)]:
        size = len(pickle.dumps(encode(message), pickle.HIGHEST_PROTOCOL))
        assert size <= min(cap, len(pickle.dumps(bare, pickle.HIGHEST_PROTOCOL))) \
            + GATHERED_BYTES, message


def test_a_burst_gathered_into_one_message_costs_less_per_request():
    """Sixteen rows in one message take fewer bytes per request than one alone (the model's
    name and the descriptor's words are written once), and one pickle to read, not 16."""
    def invocation(n):
        return (n, "affine", 3, ("inline", bytes([n]) * 64, "torch.float32", (1, 16)))

    one = len(pickle.dumps(encode(Rows((invocation(0),))), pickle.HIGHEST_PROTOCOL))
    burst = len(pickle.dumps(encode(Rows(tuple(invocation(n) for n in range(16)))),
                             pickle.HIGHEST_PROTOCOL))
    assert burst / 16 < one - 20, (one, burst / 16)


@pytest.mark.parametrize("value", [
    (len(KINDS), 1),  # a kind this version does not have
    (-1, 1),
    ("free", 4096),  # the string-tagged tuples of before
    (5, "rows", 3, "descriptor"),  # a request id, as an untyped end once took it
    (3,),  # Free without its offsets
    (3, (4096,), 1),  # and with one field too many
    [3, 4096],  # not a tuple
    (),
    None,
], ids=repr)
def test_anything_but_a_message_is_a_protocol_error(value):
    with pytest.raises(ProtocolError, match="not a message of this protocol"):
        decode(value)


def test_only_messages_are_sent():
    with pytest.raises(ProtocolError, match="tuple is not a message"):
        encode((7, "describe", ("affine",)))


# -- the operations -----------------------------------------------------------------------


def _protocol_methods() -> list[str]:
    return [name for name, member in vars(ModelService).items()
            if inspect.iscoroutinefunction(member) and not name.startswith("_")]


def test_the_operations_are_the_protocols_methods_and_the_client_has_each():
    methods = _protocol_methods()
    assert len(methods) >= 12 and "invoke" in methods and "exposition" in methods
    assert service_methods() == tuple(methods)
    assert set(methods) < set(OPERATIONS)
    for name in methods:
        ours = getattr(EngineService, name)
        assert inspect.iscoroutinefunction(ours), name
        assert list(inspect.signature(ours).parameters) == list(
            inspect.signature(getattr(ModelService, name)).parameters), name


def test_a_protocol_method_with_keyword_only_arguments_is_refused_at_once():
    class Service(Protocol):
        async def describe(self, name: str, *, verbose: bool = False) -> dict: ...

    with pytest.raises(TypeError, match="positional arguments only"):
        service_methods(Service)


def test_a_forwarded_method_binds_its_arguments_as_the_protocol_declares():
    asked = []

    class Recording(EngineService):
        def __init__(self):
            pass

        async def _ask(self, operation, *arguments):
            asked.append((operation, arguments))

    service = Recording()
    asyncio.run(service.page(next_page_token="t", limit=2))
    asyncio.run(service.model_statistics(None))
    assert asked == [("page", (2, "t")), ("model_statistics", (None,))]
    with pytest.raises(TypeError):
        asyncio.run(service.describe())


# -- the channel --------------------------------------------------------------------------


async def _pair() -> tuple[Channel, Channel, list, list]:
    """Two channels over a socket pair, and the lists their received messages go to."""
    loop = asyncio.get_running_loop()
    left_socket, right_socket = socket.socketpair()
    left_got, right_got = [], []
    _, left = await loop.create_unix_connection(lambda: Channel(left_got.extend),
                                                sock=left_socket)
    _, right = await loop.create_unix_connection(lambda: Channel(right_got.extend),
                                                 sock=right_socket)
    return left, right, left_got, right_got


async def _until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def test_messages_sent_in_one_turn_arrive_typed_and_in_order():
    async def run():
        left, right, _, right_got = await _pair()
        for message in EXAMPLES:
            left.send(message)
        await _until(lambda: len(right_got) == len(EXAMPLES))
        assert [type(m) for m in right_got] == [type(m) for m in EXAMPLES]
        left.close()
        right.close()

    asyncio.run(run())


def test_notices_gathered_in_one_turn_leave_as_one_message_each_kind():
    async def run():
        left, right, _, right_got = await _pair()
        left.gather(Free, 64)
        left.gather(Count, ("affine", 200, 0.5))
        left.send(Changed("affine"))
        left.gather(Free, 128)
        left.gather(Count, ("affine", 503, 0.0))
        await _until(lambda: len(right_got) == 3)
        assert Changed("affine") in right_got
        assert Free((64, 128)) in right_got
        assert Count((("affine", 200, 0.5), ("affine", 503, 0.0))) in right_got
        left.gather(Free, 192)  # a later turn, a message of its own
        await _until(lambda: len(right_got) == 4)
        assert right_got[3] == Free((192,))
        left.close()
        right.close()

    asyncio.run(run())


def test_a_gathered_message_keeps_the_place_of_its_first_item():
    """A ``Cancel`` sent after its request's ``Rows`` was gathered leaves after it, so the
    engine never reads a cancel before the rows it cancels."""
    descriptor = ("inline", b"\x00" * 4, "torch.float32", (1, 1))

    async def run():
        left, right, _, right_got = await _pair()
        left.gather(Rows, (1, "affine", 3, descriptor))
        left.send(Cancel(1))
        left.gather(Rows, (2, "affine", 3, descriptor))
        await _until(lambda: len(right_got) == 2)
        assert right_got == [Rows(((1, "affine", 3, descriptor), (2, "affine", 3, descriptor))),
                             Cancel(1)]
        left.close()
        right.close()

    asyncio.run(run())


def test_a_burst_gathered_past_the_channels_limit_leaves_one_message_per_item(monkeypatch):
    """Large tensors inline (an arena with no room) can make a turn's gathered rows longer
    than one message may be: they then cross one per message, none lost."""
    monkeypatch.setattr(channel_module, "MAX_MESSAGE_BYTES", 200)
    rows = [(n, "affine", 3, ("inline", bytes([n]) * 80, "torch.float32", (1, 20)))
            for n in range(3)]  # 151 bytes as one message each, 3 x 80 bytes together

    async def run():
        left, right, _, right_got = await _pair()
        for invocation in rows:
            left.gather(Rows, invocation)
        await _until(lambda: len(right_got) == 3)
        assert right_got == [Rows((invocation,)) for invocation in rows]
        left.close()
        right.close()

    asyncio.run(run())


def _frame(value) -> bytes:
    data = pickle.dumps(value)
    return struct.pack("!I", len(data)) + data


@pytest.mark.parametrize("frame", [
    _frame((99, 4096)),
    _frame(("free", 4096)),
    struct.pack("!I", 4) + b"\x80\x05no",  # not a pickle
], ids=["unknown kind", "an untyped tuple", "not a pickle"])
def test_a_frame_that_is_no_message_ends_the_connection_and_says_why(frame, caplog):
    async def run():
        left, right, _, right_got = await _pair()
        left.send(Changed("before"))
        left._flush()
        left.transport.write(frame)
        left.send(Changed("after"))
        await asyncio.wait_for(asyncio.shield(right.lost), 5)
        await asyncio.wait_for(asyncio.shield(left.lost), 5)
        assert all(type(m) is Changed for m in right_got)
        assert Changed("after") not in right_got

    with caplog.at_level(logging.ERROR, logger="mmserver.engine.channel"):
        asyncio.run(run())
    assert "closing a connection to an engine" in caplog.text


def test_a_kind_the_receiver_never_takes_ends_the_connection(caplog):
    """The engine's end refuses what only the engine sends, and a worker's the reverse."""

    async def run():
        left, right, _, _ = await _pair()
        right.on_messages = WorkerConnection({}, None, right).on_messages  # as the engine's
        left.send(Result(1, torch.ones(1)))
        await asyncio.wait_for(asyncio.shield(right.lost), 5)
        await asyncio.wait_for(asyncio.shield(left.lost), 5)

    with caplog.at_level(logging.ERROR, logger="mmserver.engine.channel"):
        asyncio.run(run())
    assert "the engine takes no Result message from a worker" in caplog.text
    client = EngineService(Settings.from_env(), "no socket")
    with pytest.raises(ProtocolError, match="a worker takes no Ask message from the engine"):
        client._received([Ask(1, "describe", ("affine",))])

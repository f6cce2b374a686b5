"""Messages between an HTTP worker and the engine: length-prefixed pickles on a Unix socket.

A message is one of ``messages``' kinds, crossing as its compact tuple
(:func:`~mmserver.engine.messages.encode`); what arrives is decoded back into its kind, and
anything that is not a message of the protocol
(:class:`~mmserver.engine.messages.ProtocolError`) ends the connection, with the reason in
the log. :meth:`Channel.send` never blocks: messages sent in one turn of the event loop are
written together at its end, and every message a read brings is handed over in one list
(:attr:`Channel.on_messages`), so a burst of requests costs each end one wake-up, not one
per request. A channel is an asyncio protocol, not a stream: no coroutine runs
per message.

Only small tensors ride in the messages: each connection has two shared-memory arenas
(``shared``) for the rest, which the worker makes and hands to the engine as it connects, in
its first byte's ancillary data (``SCM_RIGHTS``). Only mmserver's own processes connect, through a
socket in a folder only the server's user may enter, so unpickling trusts its peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any

from mmserver.engine.messages import ProtocolError, decode, encode
from mmserver.engine.shared import Arena, shared_memory_supported

log = logging.getLogger(__name__)

#: Each message's length, in bytes, before it.
_LENGTH = struct.Struct("!I")
#: A message longer than this is refused (a body is bounded by the payload limit well below).
MAX_MESSAGE_BYTES = 2**31
#: A worker's first byte, which carries its arenas (the requests' first, then the answers').
HELLO = b"\x01"
#: How long the engine waits for a new connection's first byte.
HELLO_TIMEOUT_SECONDS = 5.0


class Channel(asyncio.Protocol):
    """One end of a connection (see the module docstring).

    ``outgoing`` is the arena this end writes tensors into, ``incoming`` the one it reads
    them from (None without shared memory: tensors then travel inside the messages).
    :attr:`lost` is done once the connection has ended. ``on_messages`` raises
    :class:`~mmserver.engine.messages.ProtocolError` for a kind its end never receives.
    """

    def __init__(self, on_messages: Callable[[list], None], outgoing: Arena | None = None,
                 incoming: Arena | None = None):
        self.on_messages = on_messages
        self.outgoing = outgoing
        self.incoming = incoming
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        #: What leaves at the end of this turn, in order: encoded messages (their length
        #: and bytes), and for each gathered kind, ``(kind, items)`` where its first item
        #: was gathered.
        self._pending: list[bytes | tuple[type, list]] = []
        #: Per kind, the items :meth:`gather` queued this turn (also in ``_pending``).
        self._gathered: dict[type, list] = {}

    # -- sending ---------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue ``message``; it leaves with the others sent in this turn of the loop."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.extend(_encoded(message))

    def gather(self, kind: type, item: Any) -> None:
        """Queue ``item`` for the one ``kind(items)`` message that leaves at the end of this
        turn, in the place of the turn's first such item: a burst of requests, of their
        answers or of notices (``Rows``, ``RowsResult``, ``Free``, ``Count``) costs each end
        one message to encode, read and dispatch, not one each. A message sent after an item
        was gathered leaves after it (a ``Cancel`` after its ``Rows``)."""
        items = self._gathered.get(kind)
        if items is None:
            if not self._pending:
                asyncio.get_running_loop().call_soon(self._flush)
            items = self._gathered[kind] = []
            self._pending.append((kind, items))
        items.append(item)

    def _flush(self) -> None:
        pending, self._pending, self._gathered = self._pending, [], {}
        data: list[bytes] = []
        for entry in pending:
            if type(entry) is tuple:
                data.extend(_gathered(*entry))
            else:
                data.append(entry)
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(data)

    def close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    @property
    def closed(self) -> bool:
        return self.lost.done()

    # -- the protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if buffer:
            buffer += data
            data = buffer
        try:
            messages, used = _messages(data)
            if data is buffer:
                del buffer[:used]
            elif used < len(data):
                buffer += data[used:]
            if messages:
                self.on_messages(messages)
        except ProtocolError as error:
            log.error("closing a connection to an engine: %s", error)
            buffer.clear()
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        for arena in (self.outgoing, self.incoming):
            if arena is not None:
                arena.close()
        if not self.lost.done():
            self.lost.set_result(None)


def _encoded(message: Any) -> tuple[bytes, bytes]:
    """``message`` as it crosses: its pickle's length, then the pickle."""
    data = pickle.dumps(encode(message), protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) >= MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {len(data)} bytes is over the channel's limit")
    return _LENGTH.pack(len(data)), data


def _gathered(kind: type, items: list) -> list[bytes]:
    """``kind(items)`` as it crosses; past the channel's limit (large tensors inline, the
    arena full), one message per item, each bounded by the payload limit."""
    try:
        return list(_encoded(kind(tuple(items))))
    except ValueError:
        return [data for item in items for data in _encoded(kind((item,)))]


def _messages(data: bytes | bytearray) -> tuple[list, int]:
    """The whole messages at the start of ``data``, and how many bytes they took."""
    messages, start, end = [], 0, len(data)
    with memoryview(data) as view:
        while end - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(view, start)
            if end - start - _LENGTH.size < length:
                break
            start += _LENGTH.size
            try:
                value = pickle.loads(view[start:start + length])
            except Exception as error:  # noqa: BLE001 - whatever the bytes were, not a message
                raise ProtocolError(f"a message that does not unpickle ({error})") from None
            messages.append(decode(value))
            start += length
    return messages, start


async def connect(path: str, on_messages: Callable[[list], None]) -> Channel:
    """A worker's connection to the engine at ``path``, with new arenas for its tensors."""
    loop = asyncio.get_running_loop()
    arenas = (Arena.create("mmserver-requests"), Arena.create("mmserver-answers")) \
        if shared_memory_supported() else None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, path)
        # One byte into a new connection's empty buffer: it cannot block.
        socket.send_fds(sock, [HELLO], [arena.fd for arena in arenas] if arenas else [])
        _, channel = await loop.create_unix_connection(
            lambda: Channel(on_messages, *(arenas or (None, None))), sock=sock)
    except BaseException:
        sock.close()
        for arena in arenas or ():
            arena.close()
        raise
    return channel


async def serve(path: str, connected: Callable[[Channel], Callable[[list], None]]
                ) -> asyncio.Task:
    """Accept workers on a Unix socket at ``path`` (mode 0600) until the returned task is
    cancelled. For each, ``connected(channel)`` returns the function its messages go to."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):  # a dead engine's
            os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(128)
    listener.setblocking(False)
    welcoming: set[asyncio.Task] = set()

    async def accept() -> None:
        try:
            while True:
                sock, _ = await loop.sock_accept(listener)
                task = asyncio.create_task(_welcome(sock, connected))
                welcoming.add(task)
                task.add_done_callback(welcoming.discard)
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)

    return asyncio.create_task(accept())


async def _welcome(sock: socket.socket, connected) -> None:
    """A new worker's first byte and its arenas, then its channel."""
    loop = asyncio.get_running_loop()
    try:
        await _readable(sock, HELLO_TIMEOUT_SECONDS)
        hello, fds, _, _ = socket.recv_fds(sock, len(HELLO), 2)
    except (OSError, TimeoutError) as error:
        log.warning("a connection to the engine sent no greeting (%s); closing it", error)
        sock.close()
        return
    if hello != HELLO or len(fds) not in (0, 2):
        log.warning("a connection to the engine did not greet as a worker; closing it")
        for fd in fds:
            os.close(fd)
        sock.close()
        return
    requests, answers = (Arena(fds[0]), Arena(fds[1])) if fds else (None, None)

    def factory() -> Channel:  # before any message can arrive
        channel = Channel(lambda messages: None, answers, requests)
        channel.on_messages = connected(channel)
        return channel

    try:
        await loop.connect_accepted_socket(factory, sock=sock)
    except BaseException:
        sock.close()
        for arena in (requests, answers):
            if arena is not None:
                arena.close()
        raise


async def _readable(sock: socket.socket, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout(timeout):
            await ready
    finally:
        loop.remove_reader(sock.fileno())

"""Messages between an HTTP worker and the engine: length-prefixed pickles on a Unix socket.

A message is any picklable value; the two ends agree on its shape (``client`` and
``engine``). :meth:`Channel.send` never blocks: messages sent in one turn of the event
loop are written together at its end, so a burst of requests costs the engine one
wake-up, not one per request. Only mmserver's own processes connect, through a socket
in a folder only the server's user may enter, so unpickling trusts its peer.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

#: Each message's length, in bytes, before it.
_LENGTH = struct.Struct("!I")
#: A message longer than this is refused (a body is bounded by the payload limit well below).
MAX_MESSAGE_BYTES = 2**31


class Channel:
    """One end of a connection (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self._pending: list[bytes] = []

    def send(self, message: Any) -> None:
        """Queue ``message``; it leaves with the others sent in this turn of the loop."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) >= MAX_MESSAGE_BYTES:
            raise ValueError(f"a message of {len(data)} bytes is over the channel's limit")
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(_LENGTH.pack(len(data)))
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not self.writer.is_closing():
            self.writer.writelines(pending)

    async def receive(self) -> Any:
        """The next message; :class:`asyncio.IncompleteReadError` when the peer is gone."""
        (length,) = _LENGTH.unpack(await self.reader.readexactly(_LENGTH.size))
        return pickle.loads(await self.reader.readexactly(length))

    def close(self) -> None:
        self._flush()
        self.writer.close()


async def connect(path: str) -> Channel:
    reader, writer = await asyncio.open_unix_connection(path, limit=2**20)
    return Channel(reader, writer)

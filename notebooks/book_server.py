"""The book's request-batching server: its ``ModelRunner`` behind HTTP, the way the book does it.

*Deep Learning with PyTorch* (Stevens, Antiga, Viehmann), chapter 15, serves its
``ModelRunner`` from a small web application (``p3ch15/request_batching_server.py``
in the public repository deep-learning-with-pytorch/dlwpt-code). Its request
handler does three things, in order, on the event loop:

1. read the whole body (refusing it as "Too large" past ``MAX_SIZE`` bytes);
2. decode it into one input tensor, on the event loop;
3. ``await runner.process_input(tensor)`` and answer the output.

That design is kept here on purpose, so that notebook 04 (and ``bench/peers.py``)
can put it beside ``mmserver.http.app`` and measure what the HTTP layer adds. What the
book does and this module keeps:

* the body is read completely before anything else is decided, so a full queue
  answers 503 "I'm too busy" only after the client has sent every byte;
* decoding runs on the event loop: while one large body is parsed, no other
  request is accepted, read or answered (defect 6 of ``docs/design.md`` section 2);
* one request carries one input *without* a batch dimension; the runner stacks
  inputs along a new dimension 0;
* errors carry their status in :class:`book_runner.HandlingError` and answer as
  plain text (``"I'm too busy"`` with 503; anything else 500, as the book's
  ``HandlingError`` defaults to).

Changes from the printed code, each needed to serve it outside the book:

* aiohttp instead of Sanic (the project's server is aiohttp; the handler's steps
  are the same), and ``POST /invoke`` instead of ``PUT /image``;
* the book decodes an image (PIL, resize, ``to_tensor``) for its CycleGAN; here the
  body is JSON (nested lists: one input) or ``application/x-npy`` (one array), so
  any TorchScript model can be served; ``decode`` can be replaced;
* the output is answered as JSON (``tensor.tolist()``) instead of a PNG;
* ``max_body_bytes`` defaults to the book's ``MAX_SIZE`` (``2**22`` bytes) and can be
  raised for bodies of several MB (appendix 12 sends them to show the event loop stall).

Run it by hand::

    python notebooks/book_server.py --port 8081 --model-dir DIR   # serves DIR/model.pt
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from pathlib import Path

import numpy as np
import torch
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book_runner  # noqa: E402  (lives beside this file)

#: The book's limit on a request body, in bytes (its ``MAX_SIZE``).
MAX_SIZE = 2**22

RUNNER = web.AppKey("runner", book_runner.ModelRunner)


def decode_body(body: bytes, content_type: str) -> torch.Tensor:
    """One input from the body: one ``.npy`` array, else JSON nested lists.

    Runs on the event loop, as the book's image decoding does. Like the book's
    handler it does not negotiate: anything not sent as ``application/x-npy`` is
    parsed as JSON.
    """
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind == "application/x-npy":
        return torch.from_numpy(np.load(io.BytesIO(body), allow_pickle=False))
    return torch.tensor(json.loads(body), dtype=torch.float32)


def make_book_app(
    model,
    *,
    max_batch_size: int = book_runner.MAX_BATCH_SIZE,
    max_wait: float = book_runner.MAX_WAIT,
    max_queue_size: int = book_runner.MAX_QUEUE_SIZE,
    decode=decode_body,
    max_body_bytes: int = MAX_SIZE,
) -> web.Application:
    """An aiohttp application serving ``POST /invoke`` with the book's runner and handler.

    ``model`` maps a stacked batch to one output row per input. ``decode(body,
    content_type)`` returns one input tensor (no batch dimension). The runner's
    batching task starts with the application and is cancelled when it stops.
    """
    runner = book_runner.ModelRunner(
        model, max_batch_size=max_batch_size, max_wait=max_wait, max_queue_size=max_queue_size
    )

    async def invoke(request: web.Request) -> web.Response:
        try:
            # 1. Read the whole body (the book streams it into a bytearray of MAX_SIZE).
            content_length = request.content_length or 0
            if content_length > max_body_bytes:
                raise book_runner.HandlingError("Too large")
            data = await request.read()
            if len(data) > max_body_bytes:
                raise book_runner.HandlingError("Too large")
            # 2. Decode on the event loop.
            try:
                tensor = decode(data, request.headers.get("Content-Type", ""))
            except book_runner.HandlingError:
                raise
            except Exception as error:  # noqa: BLE001 - a bad body, as the book's "need rgb image"
                raise book_runner.HandlingError(f"cannot decode the body: {error}", code=400)
            # 3. Queue it and wait for the batch it joins.
            output = await runner.process_input(tensor)
            return web.json_response(output.tolist())
        except book_runner.HandlingError as e:
            return web.Response(text=e.handling_msg, status=e.handling_code)

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "Healthy"})

    async def run_batches(app: web.Application):
        task = asyncio.create_task(runner.model_runner())  # the book's app.add_task
        await asyncio.sleep(0)  # let it create its lock and event before the first request
        yield
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - defect 2 may have ended it
            pass

    app = web.Application(client_max_size=max_body_bytes + 1)
    app[RUNNER] = runner
    app.router.add_post("/invoke", invoke)
    app.router.add_get("/ping", ping)
    app.cleanup_ctx.append(run_batches)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The book's batching server (ch. 15) for one model.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-dir", type=Path, required=True, help="a folder holding model.pt")
    parser.add_argument("--max-batch-size", type=int, default=book_runner.MAX_BATCH_SIZE)
    parser.add_argument("--max-wait-ms", type=float, default=book_runner.MAX_WAIT * 1000)
    parser.add_argument("--max-queue-size", type=int, default=book_runner.MAX_QUEUE_SIZE)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_SIZE)
    args = parser.parse_args(argv)
    model = torch.jit.load(str(args.model_dir / "model.pt"), map_location="cpu")
    model.eval()
    app = make_book_app(
        model,
        max_batch_size=args.max_batch_size,
        max_wait=args.max_wait_ms / 1000,
        max_queue_size=args.max_queue_size,
        max_body_bytes=args.max_body_bytes,
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()

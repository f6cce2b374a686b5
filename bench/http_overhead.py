"""What does the full mmserver path cost per request, next to a bare aiohttp handler?

Both servers run on core 0 and get the same closed-loop load from core 1, with
the same JSON body (one row of 16 numbers). mmserver serves a no-op
TorchScript model through everything a real invocation goes through: routing,
the registry, Accept negotiation, a queue reservation, decoding, the
ModelRunner with its thread hop, encoding and metrics. The bare handler reads
and decodes the same body into a tensor and encodes it back, nothing else.
The last line is

    overhead_ratio=<mmserver requests/s / bare handler requests/s>

1.0 would mean batching and the contract cost nothing; the target is 0.8.

Usage: python bench/http_overhead.py [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.process import event_loop  # noqa: E402
from mmserver.harness.testing import ServerProcess  # noqa: E402

BODY = json.dumps([[float(i) for i in range(16)]]).encode()


class BareServer(ServerProcess):
    """This file's ``--bare-server PORT``, started, awaited and stopped as mmserver is."""

    def command(self) -> list[str]:
        return [*self.pinning, sys.executable, __file__, "--bare-server", str(self.port)]


def bare_server(port: int) -> None:
    """The baseline: decode the body into a tensor and encode it back, on the loop."""
    import numpy as np
    from aiohttp import web

    async def invoke(request: web.Request) -> web.Response:
        data = torch.from_numpy(np.asarray(json.loads(await request.read()), dtype=np.float32))
        return web.Response(body=json.dumps(data.tolist()).encode(),
                            content_type="application/json")

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "Healthy"})

    app = web.Application()
    app.router.add_post("/invoke", invoke)
    app.router.add_get("/ping", ping)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                loop=event_loop())  # the loop mmserver runs on, so the ratio compares servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        bare_server(args.bare_server)
        return

    print(f"load: {harness.generator_name()}, {args.connections} connections, "
          f"{args.seconds:g} s per server; server on core {harness.SERVER_CPU}, "
          f"load on core {harness.LOAD_CPU}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        harness.save_torchscript(harness.NoOp(), torch.ones(2, 16), root / "noop")
        with harness.serving(BareServer(env=harness.ONE_THREAD, cpus=harness.SERVER_CPU,
                                        cwd=harness.REPO)) as server:
            url = f"{server.url}/invoke"
            harness.closed_loop(url, BODY, "application/json", connections=args.connections,
                                seconds=1)
            bare = harness.closed_loop(url, BODY, "application/json",
                                       connections=args.connections, seconds=args.seconds)
        with harness.mmserver(root, {"noop": root / "noop"}, "--max-batch-size", "32",
                              "--max-wait-ms", "0") as base:
            ours, mean_batch = harness.saturate_model(
                base, "noop", BODY, "application/json", connections=args.connections,
                seconds=args.seconds, warmup_seconds=1)
    for label, result in (("bare aiohttp handler", bare), ("mmserver, no-op model", ours)):
        print(f"{label:24s} {result['rps']:8.0f} requests/s  non-2xx={result['non_2xx']} "
              f"{result['socket_errors']}")
    print(f"mmserver mean batch size: {mean_batch:.1f} rows")
    print(f"overhead_ratio={ours['rps'] / bare['rps']:.3f}")


if __name__ == "__main__":
    main()

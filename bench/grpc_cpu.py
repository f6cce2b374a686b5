"""Server CPU per request over HTTP (v2, binary tensors) and over gRPC, at 1 and 32 users.

One ``mmserver serve`` with the tabular example; Triton's asyncio clients
(``tritonclient.http.aio`` and ``tritonclient.grpc.aio``) keep N requests in flight for a
few seconds each; the server's CPU seconds (its process and its children, from ``psutil``)
over the requests answered. gRPC reaches the model through the HTTP v2 operation
(``mmserver.grpc``), so the difference is what each front door costs: grpc's C core and
protobuf against aiohttp's parser, plus the JSON header gRPC's message is turned into.
Prints µs of server CPU per request and gRPC ÷ HTTP. Run under the CPU lock; the machine is
shared, so the numbers are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

from mmserver.harness.examples import write_examples
from mmserver.harness.testing import ServerProcess, free_port


def cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def drive(kind: str, address: str, users: int, seconds: float) -> int:
    module = grpc_aio if kind == "grpc" else http_aio
    rows = np.random.default_rng(0).random((1, 16), dtype=np.float32)
    done = 0
    async with module.InferenceServerClient(address) as client:
        x = module.InferInput("input", [1, 16], "FP32")
        x.set_data_from_numpy(rows)
        await client.infer("tabular", [x])  # warm the connection
        stop = time.monotonic() + seconds

        async def user():
            nonlocal done
            while time.monotonic() < stop:
                await client.infer("tabular", [x])
                done += 1
        await asyncio.gather(*(user() for _ in range(users)))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--http-workers", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_examples(Path(folder), names=["tabular"])
        grpc_port = free_port()
        with ServerProcess(["--model-root", folder, "--no-access-log", "--grpc-port",
                            str(grpc_port), "--http-workers", str(args.http_workers),
                            "--preload", "tabular=tabular/model"]) as server:
            process = psutil.Process(server.process.pid)
            addresses = {"http": server.url[len("http://"):], "grpc": f"127.0.0.1:{grpc_port}"}
            results = {}
            for users in (1, 32):
                for kind in ("http", "grpc"):
                    before = cpu_seconds(process)
                    done = asyncio.run(drive(kind, addresses[kind], users, args.seconds))
                    used = cpu_seconds(process) - before
                    results[kind, users] = used / done * 1e6
                    print(f"{kind:4} {users:2d} users: {done / args.seconds:7.0f} req/s, "
                          f"{results[kind, users]:6.0f} us server CPU per request", flush=True)
                print(f"   {users:2d} users: gRPC / HTTP server CPU per request = "
                      f"{results['grpc', users] / results['http', users]:.2f}")


if __name__ == "__main__":
    main()

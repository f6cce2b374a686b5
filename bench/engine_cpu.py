"""The engine's own CPU per request, driven the way its HTTP workers drive it.

With ``mmserver serve --http-workers N`` the HTTP workers scale with cores, but the one
engine process does not: its CPU per request sets the most requests/s the server can ever
serve, ``1 / (engine CPU per request)``, however many workers feed it. This benchmark
measures that cost without HTTP: it starts a real engine process (as the supervisor does)
pinned to core 0, and from the other cores drives it through two
:class:`~mmserver.engine.client.EngineService` objects (two workers' connections, the
class an HTTP worker serves with), each invocation exactly as a worker makes it after
reading a request.

It serves the simulated device (``mmserver.harness.simulated_device``, labelled as
simulated: t(b) = 1 ms + b x 1/32 ms, no CPU held) from two folders that differ only in
who decodes:

* ``rows``: the default codecs; the *worker* decodes the one-row JSON body, sends the
  rows through shared memory, and encodes the answer (``engine.client``'s row path);
* ``bodies``: the same model with an ``input_fn`` in its ``inference.py``; the body goes
  to the engine whole, and the engine decodes (user code runs beside its model) and
  encodes.

For each, at 1 and 32 closed-loop users, it prints requests/s, the mean batch the engine
formed, the round-trip per request at 1 user, and the engine's CPU time per request
(``psutil``: the engine process's user + system seconds ÷ requests answered in the
window). The summary gives the ratio ``bodies ÷ rows`` of engine CPU per request at 32
users, both measured in this run: what decoding in the workers saves the engine.

Last, the channel's own cost per request, without processes: a burst of ``BURST`` one-row
invocations and their answers, encoded and read back (``engine.channel``) as one message per
request and as the one gathered message per kind that a turn of the loop sends. Unlike the
windows above, which move by a tenth from one run to the next on a shared machine, this
isolates what gathering saves each end.

Usage: python bench/engine_cpu.py [--seconds 4]; ``MMSERVER_QUICK=1`` shrinks it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np
import psutil
import torch

from mmserver.config import Settings
from mmserver.engine.channel import _encoded, _messages
from mmserver.engine.client import EngineService
from mmserver.engine.messages import Rows, RowsResult
from mmserver.engine.spawn import spawn_engine, wait_ready
from mmserver.harness.simulated_device import LinearBatchTime, SimulatedDevice, write_model_folder
from mmserver.http.local import LocalService
from mmserver.http.service import Call
from mmserver.wires import ToolkitHeaders

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
#: The simulated device: 1 ms a call plus 1/32 ms a row (a batch of 32 rows in 2 ms).
FIXED_SECONDS, PER_ROW_SECONDS = 0.001, 0.001 / 32
#: Features per row: the request is one row, as bench/device_efficiency.py sends.
FEATURES = 16
#: Closed-loop users: one (the round trip alone), and enough to fill batches.
USERS = (1, 32)
#: The workers' connections the users share, round robin.
CONNECTIONS = 2
#: Before each window, the users run this long untimed (connections, caches, the sizer).
WARMUP_SECONDS = 1.0
#: Invocations a turn of a worker's loop sends at 32 users over two connections (about half).
BURST = 16
#: Calls of the simulated device's ``forward`` timed alone (the median of five repeats).
DEVICE_CALLS = 200 if QUICK else 1_000
#: Bursts timed in the channel's own measurement (its best of five repeats).
CHANNEL_BURSTS = 2_000
#: The goal the issue sets for the engine's CPU per request on a 2-core machine, in µs.
GOAL_ENGINE_US = 30.0
#: The ``bodies`` folder's decoder: the default JSON decoding, but the model's own code.
INPUT_FN = '''

def input_fn(request_body, request_content_type):
    """The default decoding, as a script's own: the engine then runs it."""
    import json as _json

    import torch as _torch
    return _torch.tensor(_json.loads(request_body), dtype=_torch.float32)
'''


@dataclasses.dataclass
class Window:
    model: str
    users: int
    requests: int
    seconds: float
    engine_cpu_seconds: float
    loop_cpu_seconds: float
    latency_seconds: float
    mean_batch: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def engine_us(self) -> float:
        return 1e6 * self.engine_cpu_seconds / self.requests

    @property
    def loop_us(self) -> float:
        return 1e6 * self.loop_cpu_seconds / self.requests


def write_folders(root: Path) -> None:
    for name in ("rows", "bodies"):
        write_model_folder(root / name, fixed_seconds=FIXED_SECONDS,
                           per_row_seconds=PER_ROW_SECONDS, input_features=FEATURES)
    with open(root / "bodies" / "code" / "inference.py", "a") as source:
        source.write(INPUT_FN)


async def drive(socket_path: str, settings: Settings, engine_pid: int, seconds: float
                ) -> list[Window]:
    body = json.dumps(np.linspace(-1, 1, FEATURES, dtype=np.float32)[None].tolist()).encode()
    headers = ToolkitHeaders("application/json", "application/json")

    async def read_body(limit: int) -> bytes:
        return body

    call = Call(params={}, query={}, headers={}, content_length=len(body),
                read_body=read_body, body_arrived=True)
    clients = [EngineService(settings, socket_path) for _ in range(CONNECTIONS)]
    for client in clients:
        await client.start()
    engine = psutil.Process(engine_pid)
    windows = []
    try:
        for name in ("rows", "bodies"):
            for users in USERS:
                windows.append(await _window(clients, engine, name, headers, call, users,
                                             seconds))
    finally:
        for client in clients:
            await client.close(timeout=1)
    return windows


async def _window(clients, engine, name, headers, call, users, seconds) -> Window:
    done, stop, latencies = [0], [False], []

    async def user(client: EngineService) -> None:
        while not stop[0]:
            started = time.perf_counter()
            answer = await client.invoke(name, headers, call)
            latencies.append(time.perf_counter() - started)
            assert answer.content_type == "application/json", answer
            done[0] += 1

    tasks = [asyncio.create_task(user(clients[i % len(clients)])) for i in range(users)]
    await asyncio.sleep(WARMUP_SECONDS)
    before = (await clients[0].describe(name))["stats"]
    count, cpu, loop, wall = done[0], _cpu(engine), _loop_cpu(engine), time.perf_counter()
    latencies.clear()
    await asyncio.sleep(seconds)
    count, cpu, wall = done[0] - count, _cpu(engine) - cpu, time.perf_counter() - wall
    loop = _loop_cpu(engine) - loop
    timed = list(latencies)
    after = (await clients[0].describe(name))["stats"]
    stop[0] = True
    await asyncio.gather(*tasks)
    batches = after["batches"] - before["batches"]
    rows = after["requestsCompleted"] - before["requestsCompleted"]
    return Window(name, users, count, wall, cpu, loop, float(np.mean(timed)),
                  rows / batches if batches else 0.0)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _loop_cpu(process: psutil.Process) -> float:
    """The CPU seconds of the engine's event-loop thread (its main thread, whose id is the
    process's): the rest is its threads that run the model and split its answers."""
    for thread in process.threads():
        if thread.id == process.pid:
            return thread.user_time + thread.system_time
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5 if QUICK else 4.0,
                        help="each window's length")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="engine-cpu-"))
    write_folders(root)
    settings = dataclasses.replace(
        Settings.from_env(), model_roots=(root,),
        preload=(("rows", str(root / "rows")), ("bodies", str(root / "bodies"))))
    socket_path = str(root / "engine.sock")
    engine, ready = spawn_engine(settings, socket_path, "WARNING", None, service=LocalService)
    try:
        answer = wait_ready(engine, ready, [])
        if answer is None or answer[0] != "ready":
            raise SystemExit(f"the engine did not start: {answer}")
        if len(cores) > 1:  # the engine on one core, the driver on the rest
            for thread in psutil.Process(engine.pid).threads():
                os.sched_setaffinity(thread.id, {cores[0]})
            os.sched_setaffinity(0, set(cores[1:]))
        windows = asyncio.run(drive(socket_path, settings, engine.pid, args.seconds))
    finally:
        engine.terminate()
        engine.join(30)
    rows = next(w for w in windows if (w.model, w.users) == ("rows", USERS[-1]))
    report(windows, len(cores), device_cpu_us(rows.mean_batch))
    report_channel(channel_costs())


def device_cpu_us(mean_batch: float) -> float:
    """µs of CPU per request that the simulated device's own ``forward`` spends at
    ``mean_batch`` rows a call (rounded to whole rows), timed alone on this thread: the median
    of five repeats of :data:`DEVICE_CALLS` calls, divided by the rows of a call."""
    device = SimulatedDevice(LinearBatchTime(FIXED_SECONDS, PER_ROW_SECONDS),
                             input_features=FEATURES)
    rows = max(1, round(mean_batch))
    batch = torch.linspace(-1, 1, FEATURES).repeat(rows, 1)
    repeats = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(DEVICE_CALLS):
            device(batch)
        repeats.append((time.thread_time() - started) / DEVICE_CALLS)
    return 1e6 * float(np.median(repeats)) / rows


def channel_costs() -> dict[str, float]:
    """µs per request to encode and read back a burst's ``Rows`` and ``RowsResult``, one
    message per request (``single``) and gathered into one message per kind (``gathered``):
    the best of five repeats of :data:`CHANNEL_BURSTS` bursts each."""
    row = np.linspace(-1, 1, FEATURES, dtype=np.float32)[None]
    answer = row[:, :4]
    invocations = [(n, "rows", 1, ("inline", (row + n).tobytes(), "torch.float32", row.shape))
                   for n in range(BURST)]
    answers = [(n, ("inline", (answer + n).tobytes(), "torch.float32", answer.shape), None,
                0.0021, 0.0034) for n in range(BURST)]

    def crossing(gathered: bool) -> None:
        for kind, items in ((Rows, invocations), (RowsResult, answers)):
            groups = [items] if gathered else [[item] for item in items]
            data = b"".join(part for group in groups for part in _encoded(kind(tuple(group))))
            _messages(data)

    costs = {}
    for name, gathered in (("single", False), ("gathered", True)):
        seconds = min(timeit.repeat(lambda: crossing(gathered), number=CHANNEL_BURSTS, repeat=5))
        costs[name] = 1e6 * seconds / (CHANNEL_BURSTS * BURST)
    return costs


def report_channel(costs: dict[str, float]) -> None:
    print(f"\nthe channel alone, a burst of {BURST} one-row requests and their answers encoded and "
          f"read back: {costs['single']:.2f} µs per request as one message each, "
          f"{costs['gathered']:.2f} µs gathered into one message per kind "
          f"({costs['gathered'] / costs['single']:.2f}x), both ends together")


def report(windows: list[Window], cores: int, device_us: float) -> None:
    print(f"engine CPU per request, driven as HTTP workers drive it; simulated device "
          f"(not a real GPU): t(b) = {FIXED_SECONDS * 1e3:g} ms + b x "
          f"{PER_ROW_SECONDS * 1e3:.5f} ms; {CONNECTIONS} worker connections; "
          f"engine on 1 of {cores} core(s), the driver on the rest")
    print(f"{'model':8} {'users':>5} {'req/s':>8} {'mean batch':>10} {'round trip ms':>13} "
          f"{'engine µs/req':>13} {'its loop µs/req':>15}")
    for w in windows:
        print(f"{w.model:8} {w.users:>5} {w.per_second:>8.0f} {w.mean_batch:>10.2f} "
              f"{w.latency_seconds * 1e3:>13.3f} {w.engine_us:>13.1f} {w.loop_us:>15.1f}")
    by = {(w.model, w.users): w for w in windows}
    rows, bodies = by["rows", USERS[-1]], by["bodies", USERS[-1]]
    print(f"\nat {USERS[-1]} users the engine spends {rows.engine_us:.1f} µs per request "
          f"when the workers decode (goal: at most {GOAL_ENGINE_US:g} µs; "
          f"{'met' if rows.engine_us <= GOAL_ENGINE_US else 'not met'}), "
          f"{bodies.engine_us:.1f} µs when it decodes a script's input_fn itself: "
          f"bodies ÷ rows = {bodies.engine_us / rows.engine_us:.2f}x")
    own = rows.engine_us - device_us
    print(f"of which the simulated device's own forward, timed alone at "
          f"{max(1, round(rows.mean_batch))} rows a call: {device_us:.1f} µs per request; the "
          f"server's own share is {own:.1f} µs ({'at most' if own <= GOAL_ENGINE_US else 'over'} "
          f"the goal's {GOAL_ENGINE_US:g} µs)")
    print(f"so one engine core serves at most {1e6 / rows.engine_us:,.0f} req/s of "
          f"worker-decoded rows (1 / its CPU per request)")


if __name__ == "__main__":
    main()

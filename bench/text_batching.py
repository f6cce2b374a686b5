"""Rows-only batching against a token budget, on the minilm example with texts of mixed lengths.

One server serves the minilm example folder under two names that differ only in how a batch is
bounded: ``rows`` (``max_batch_size`` alone) and ``tokens`` (the same, plus
``max_batch_tokens``). Closed-loop clients send one text each per request; the texts' lengths
follow a stated mix, made by ``loadtests/texts.py`` (no data set): mostly short (5 to 20
words), some long (100 to 180 words). Each name is driven for the same time, alternately, for
a few rounds (``loadtests.instruments.drive_texts``). The last lines print, over all rounds:

    throughput rows-only / token-budget = <texts/s of rows ÷ texts/s of tokens>
    p99 rows-only / token-budget        = <p99 latency of rows ÷ that of tokens>

and each one's padding efficiency (real ÷ padded tokens, read from describe). Run it on a
quiet machine; the numbers are indicative on a shared one.

With ``--ray`` (Ray Serve installed: the ``ray`` extra) a peer follows, driven the same way
with the same texts and clients: the same folder behind ``@serve.batch`` whose
``batch_size_fn`` counts padded tokens (``bench/peer_servers.py``'s ``ray-text``, the same
budget, the same MAX_WAIT). It runs after mmserver's server has stopped, so the two never
share the cores, and its rounds are not interleaved with mmserver's: compare on a quiet
machine. It prints ``throughput token-budget / ray token-budget`` and the p99 ratio.

Usage: python bench/text_batching.py [--clients 16] [--seconds 8] [--rounds 2]
       [--max-batch-tokens 2048] [--long-fraction 0.2] [--ray]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.instruments import drive_texts  # noqa: E402
from loadtests.texts import texts  # noqa: E402
from mmserver.harness.examples import write_examples  # noqa: E402
from mmserver.harness.testing import ServerProcess, free_port, http_request  # noqa: E402

PEER_SERVERS = Path(__file__).resolve().parent / "peer_servers.py"
#: The minilm example's MAX_WAIT, which the Ray peer's batch_wait_timeout_s takes too.
MAX_WAIT_MS = 5
PEER_START_SECONDS = 240


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def drive_peer(url: str, pool: list[str], clients: int, seconds: float) -> list[float]:
    """As ``drive_texts`` drives mmserver (one text per request, a fresh connection each, in
    turn through ``pool``), against a peer's ``POST /``: each request's latency in seconds."""
    stop = time.perf_counter() + seconds

    def client(index: int) -> list[float]:
        latencies, position = [], index
        while time.perf_counter() < stop:
            started = time.perf_counter()
            text = pool[position % len(pool)]
            status, _, body = http_request(url, "POST", "/", json.dumps([text]),
                                           {"Content-Type": "application/json"})
            if status != 200:
                raise RuntimeError(f"the Ray peer answered {status}: {body[:200]!r}")
            latencies.append(time.perf_counter() - started)
            position += clients
        return latencies

    with concurrent.futures.ThreadPoolExecutor(clients) as threads:
        return [s for part in threads.map(client, range(clients)) for s in part]


def ray_peer(folder: Path, args, pool: list[str]) -> list[float]:
    """The Ray Serve peer (module docstring) started, warmed, driven for every round, stopped:
    the latencies of its answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(PEER_SERVERS), "ray-text", "--port", str(port),
                                "--model-dir", str(folder), "--max-batch-size",
                                str(args.max_batch_tokens), "--max-wait-ms", str(MAX_WAIT_MS),
                                "--max-queue-size", "256"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PEER_START_SECONDS
        while True:
            try:
                if http_request(url, "POST", "/", '["ready?"]', timeout=10)[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Ray peer did not start")
            time.sleep(0.5)
        drive_peer(url, pool, args.clients, 1.0)  # warm-up
        return [s for _ in range(args.rounds)
                for s in drive_peer(url, pool, args.clients, args.seconds)]
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--long-fraction", type=float, default=0.2)
    parser.add_argument("--ray", action="store_true", help="add the Ray Serve peer")
    args = parser.parse_args()
    if args.ray and importlib.util.find_spec("ray") is None:
        parser.error("--ray needs Ray Serve: pip install -e '.[ray]'")

    root = Path(tempfile.mkdtemp(prefix="text-batching-"))
    try:
        source = write_examples(root / "examples", names=["minilm"])["minilm"]
        folders = {}
        for name, budget in (("rows", 0), ("tokens", args.max_batch_tokens)):
            folder = root / "examples" / name / "model"
            shutil.copytree(source, folder)
            settings = json.loads((folder / "mmserver.json").read_text())
            settings.update(max_batch_size=args.max_batch_size, max_batch_tokens=budget)
            (folder / "mmserver.json").write_text(json.dumps(settings))
            folders[name] = folder
        preload = [f"--preload={name}={folder}" for name, folder in folders.items()]
        pool = texts(512, args.long_fraction, seed=0)
        answered = {name: 0 for name in folders}
        latencies: dict[str, list[float]] = {name: [] for name in folders}
        with ServerProcess(["--model-root", str(root / "examples"), *preload],
                           env={"HF_HUB_OFFLINE": "1"}) as server:
            for name in folders:  # warm-up: first calls of each shape
                drive_texts(server, name, pool, args.clients, 1.0)
            for _ in range(args.rounds):
                for name in folders:
                    window = drive_texts(server, name, pool, args.clients, args.seconds)
                    answered[name] += window.answered
                    latencies[name] += window.latencies
            efficiency = {name: server.json("GET", f"/models/{name}")[1]["stats"]
                          .get("paddingEfficiency") for name in folders}
        elapsed = args.rounds * args.seconds
        rate = {name: answered[name] / elapsed for name in folders}
        for name in folders:
            print(f"{name:7} texts/s={rate[name]:8.1f}  p50={statistics.median(latencies[name]) * 1e3:7.1f} ms  "
                  f"p99={p99(latencies[name]) * 1e3:7.1f} ms  padding efficiency={efficiency[name]}")
        print(f"throughput rows-only / token-budget = {rate['rows'] / rate['tokens']:.3f}")
        print(f"p99 rows-only / token-budget        = "
              f"{p99(latencies['rows']) / p99(latencies['tokens']):.3f}")
        if args.ray:
            peer = ray_peer(folders["tokens"], args, pool)
            peer_rate = len(peer) / elapsed
            print(f"ray     texts/s={peer_rate:8.1f}  "
                  f"p50={statistics.median(peer) * 1e3:7.1f} ms  p99={p99(peer) * 1e3:7.1f} ms  "
                  "(@serve.batch, batch_size_fn = padded tokens)")
            print(f"throughput token-budget / ray token-budget = {rate['tokens'] / peer_rate:.3f}")
            print(f"p99 token-budget / ray token-budget        = "
                  f"{p99(latencies['tokens']) / p99(peer):.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

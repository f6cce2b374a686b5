"""What does each wire cost per request: v2 binary tensors, `.npy` invocations, JSON invocations?

One mmserver (core 0, one torch thread, defaults: max batch 16, max wait 5 ms)
serves the small CNN of ``harness.SmallCNN`` (one 3x32x32 row per request), and
32 closed-loop users on core 1 drive it through three wires, one at a time:

* ``v2-binary``: ``POST /v2/models/cnn/infer``, a JSON header and the row as 12,288
  raw FP32 bytes (``Inference-Header-Content-Length``), the output asked for as
  binary data (``binary_data_output``): what ``tritonclient`` sends by default;
* ``npy``: ``POST /models/cnn/invoke`` with ``Content-Type`` and ``Accept``
  ``application/x-npy``: the SageMaker route's binary wire;
* ``json``: the same route with the row as a nested JSON list, answered as JSON.

Every wire's answer is checked against the model's own output before anything is
timed. Then rounds of equal windows alternate between the wires (the order rotates
each round), on the same server process and the same warmed-up model; on a shared
machine whose speed drifts, a ratio within one round means more than any single
figure, so the summary gives the median over rounds of ``v2-binary req/s ÷ npy req/s``
and ``v2-binary req/s ÷ json req/s`` (with their range), and each window's p50 and p99.

The load generator is ``wrk`` (one thread, one connection per user) when installed,
else an aiohttp closed loop on core 1 (which may itself limit the fastest wire).

Usage: python bench/wires.py [--seconds 10] [--rounds 4] [--users 32]
(``MMSERVER_QUICK=1``: 1-second windows, one round).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.harness.testing import http_request  # noqa: E402

INPUT_SHAPE = (3, 32, 32)
QUICK = os.environ.get("MMSERVER_QUICK") == "1"
HEADER_LENGTH = "Inference-Header-Content-Length"
WIRES = ("v2-binary", "npy", "json")
ROW = np.random.default_rng(0).random((1, *INPUT_SHAPE), dtype=np.float32)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def v2_binary_body(row: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32",
                                     "shape": list(row.shape),
                                     "parameters": {"binary_data_size": row.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + row.tobytes(), len(header)


def requests_by_wire() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers) of one request of each wire."""
    body, header_length = v2_binary_body(ROW)
    return {
        "v2-binary": ("/v2/models/cnn/infer", body, {HEADER_LENGTH: str(header_length)}),
        "npy": ("/models/cnn/invoke", npy(ROW), {"Content-Type": "application/x-npy",
                                                 "Accept": "application/x-npy"}),
        "json": ("/models/cnn/invoke", json.dumps(ROW.tolist()).encode(),
                 {"Content-Type": "application/json"}),
    }


def answer_rows(wire: str, headers: dict[str, str], raw: bytes) -> np.ndarray:
    """The output rows of one answer of ``wire``."""
    if wire == "v2-binary":
        length = int(headers[HEADER_LENGTH])
        (output,) = json.loads(raw[:length])["outputs"]
        return np.frombuffer(raw[length:], dtype=np.float32).reshape(output["shape"])
    if wire == "npy":
        return np.load(io.BytesIO(raw), allow_pickle=False)
    return np.asarray(json.loads(raw), dtype=np.float32)


def check_answers(base: str, requests: dict, expected: torch.Tensor) -> None:
    """Every wire answers the model's own output, before anything is timed."""
    for wire, (path, body, headers) in requests.items():
        status, answer_headers, raw = http_request(base, "POST", path, body, headers)
        if status != 200:
            raise SystemExit(f"{wire}: {path} answered {status}: {raw[:300]!r}")
        torch.testing.assert_close(torch.from_numpy(answer_rows(wire, answer_headers, raw).copy()),
                                   expected, rtol=1e-5, atol=1e-5)


# -- the load ----------------------------------------------------------------------

window = harness.latency_window


# -- the report --------------------------------------------------------------------


def summarize(rows: list[dict]) -> str:
    """Markdown: each wire's req/s per round, median p50/p99, and v2-binary's ratios."""
    rounds = sorted({r["round"] for r in rows})
    by = {(r["wire"], r["round"]): r for r in rows}
    lines = ["| wire | req/s per round | p50 ms | p99 ms | v2-binary ÷ wire (median of rounds) |",
             "|---|---|---|---|---|"]
    for wire in WIRES:
        mine = [by[wire, k] for k in rounds if (wire, k) in by]
        ratios = [by["v2-binary", k]["rps"] / by[wire, k]["rps"] for k in rounds
                  if ("v2-binary", k) in by and (wire, k) in by and by[wire, k]["rps"]]
        ratio = "—" if wire == "v2-binary" or not ratios else (
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})")
        lines.append(f"| {wire} | {' / '.join(format(r['rps'], '.0f') for r in mine)} "
                     f"| {statistics.median(r['p50_ms'] for r in mine):.2f} "
                     f"| {statistics.median(r['p99_ms'] for r in mine):.2f} | {ratio} |")
    return "\n".join(lines)


def ratio_line(rows: list[dict], other: str) -> str:
    rounds = sorted({r["round"] for r in rows})
    by = {(r["wire"], r["round"]): r["rps"] for r in rows}
    ratios = [by["v2-binary", k] / by[other, k] for k in rounds if by.get((other, k))]
    return f"v2_binary_over_{other}={statistics.median(ratios):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1 if QUICK else 10)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 4)
    parser.add_argument("--users", type=int, default=32)
    args = parser.parse_args()

    requests = requests_by_wire()
    print(f"load: {harness.generator_name()} on core {harness.LOAD_CPU}, {args.users} users; "
          f"server on core {harness.SERVER_CPU}; {args.rounds} rounds of {args.seconds:g} s per "
          "wire; bodies: " + ", ".join(f"{wire} {len(body)} B"
                                       for wire, (_, body, _) in requests.items()))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        harness.save_torchscript(harness.SmallCNN(), torch.randn(2, *INPUT_SHAPE), root / "cnn")
        model = torch.jit.load(str(root / "cnn" / "model.pt"))
        with torch.inference_mode():
            expected = model(torch.from_numpy(ROW))
        with harness.mmserver(root, {"cnn": root / "cnn"}) as base:
            check_answers(base, requests, expected)
            for wire, (path, body, headers) in requests.items():  # warm-up
                window(base + path, body, headers, args.users, min(1.0, args.seconds))
            for round_ in range(args.rounds):
                shift = round_ % len(WIRES)
                for wire in WIRES[shift:] + WIRES[:shift]:
                    path, body, headers = requests[wire]
                    result = window(base + path, body, headers, args.users, args.seconds)
                    rows.append({"round": round_, "wire": wire, **result})
                    print(f"round={round_} {wire:9s} {result['rps']:8.0f} req/s "
                          f"p50={result['p50_ms']:7.2f} ms p99={result['p99_ms']:7.2f} ms"
                          f"{'  non-2xx=' + str(result['non_2xx']) if result['non_2xx'] else ''}",
                          flush=True)
    print()
    print(summarize(rows))
    print()
    print(ratio_line(rows, "npy"))
    print(ratio_line(rows, "json"))


if __name__ == "__main__":
    main()

"""NVIDIA's perf_analyzer against mmserver: HTTP (binary and JSON tensors) and gRPC, concurrency
1 to 32, its client- and server-side split printed beside the same run's ``/metrics``.

perf_analyzer reads a model's configuration, sends requests at a fixed concurrency, and reads
Triton's statistics (``/v2/models/{name}/stats``) before and after each measurement to print
where the server spent a request's time (queue, compute input, compute infer, compute output).
It aborts if the per-request counts differ, so this is also a check of docs/design.md section
10's statistics. Beside each of its rows this prints the same run's averages computed from
``/metrics`` (``mmserver_request_stage_seconds``, scraped before and after the run) and their
ratio: the two read the same totals, over perf_analyzer's measurement windows and over the
whole run (its warm-up included) respectively.

Setting it up (done here, into ``build/perf_analyzer/``; nothing is committed):

1. ``pip download --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64
   --python-version 3.11 perf-analyzer==2.60.0``, unzipped: the binary is
   ``perf_analyzer/bin/perf_analyzer``. It needs glibc 2.38 and GLIBCXX_3.4.32; Debian 12 has
   2.36 and gcc 12's libstdc++.
2. Debian 13's ``libc6``, ``libstdc++6`` and ``libgcc-s1``: ``apt-get download`` with a
   temporary apt configuration (its own state and lists folders) whose one source is
   ``trixie main``, then ``dpkg-deb -x`` each into ``glibc/``.
3. Run it through that glibc's loader: ``glibc/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
   --library-path glibc/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu perf_analyzer ...``.

Run it alone on the machine: ``python bench/perf_analyzer.py`` (``--quick`` for concurrency 1
and 8 only). perf_analyzer shares the CPUs with the server, so
its numbers say how the server splits a request's time, not what a dedicated client would see.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from mmserver.harness.examples import write_examples
from mmserver.harness.testing import ServerProcess, free_port, sample_value

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "build" / "perf_analyzer"
VERSION = "2.60.0"
DEBIAN_PACKAGES = ("libc6", "libstdc++6", "libgcc-s1")
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")
#: perf_analyzer's CSV columns (microseconds) for each stage.
COLUMNS = {"queue": "Server Queue", "compute_input": "Server Compute Input",
           "compute_infer": "Server Compute Infer", "compute_output": "Server Compute Output"}
MODES = {
    "http-binary": ["-i", "http"],
    "http-json": ["-i", "http", "--input-tensor-format", "json",
                  "--output-tensor-format", "json"],
    "grpc": ["-i", "grpc"],
}


def install() -> list[str]:
    """The command prefix that runs perf_analyzer, fetching what is missing (module docstring)."""
    binary = TOOLS / "wheel" / "perf_analyzer" / "bin" / "perf_analyzer"
    libs = TOOLS / "glibc" / "usr" / "lib" / "x86_64-linux-gnu"
    if not binary.exists():
        download = TOOLS / "download"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_38_x86_64", "--python-version", "3.11",
                        "-d", str(download), f"perf-analyzer=={VERSION}"], check=True)
        wheel = next(download.glob(f"perf_analyzer-{VERSION}-*.whl"))
        zipfile.ZipFile(wheel).extractall(TOOLS / "wheel")
        binary.chmod(0o755)
    if not (libs / "ld-linux-x86-64.so.2").exists():
        _debian_packages(TOOLS)
    return [str(libs / "ld-linux-x86-64.so.2"), "--library-path",
            f"{libs}:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu", str(binary)]


def _debian_mirror() -> str:
    """The Debian mirror this machine's own apt sources name (deb822 ``URIs:`` or a one-line
    ``deb URI suite`` entry): trixie's packages come from where bookworm's do."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for line in path.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        for line in path.read_text().splitlines() if path.is_file() else ():
            words = line.split()
            if len(words) > 2 and words[0] == "deb":
                return next(w for w in words[1:] if "://" in w)
    raise SystemExit("no Debian mirror in this machine's apt sources: cannot fetch Debian 13's libc")


def _debian_packages(tools: Path) -> None:
    state = tools / "apt"
    for folder in ("lists/partial", "cache/archives/partial", "sources.list.d",
                   "preferences.d"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "sources.list.d" / "trixie.sources").write_text(
        f"Types: deb\nURIs: {_debian_mirror()}\nSuites: trixie\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    config = state / "apt.conf"
    config.write_text("\n".join(f'{key} "{value}";' for key, value in {
        "Dir::State": state, "Dir::State::Lists": state / "lists", "Dir::Cache": state / "cache",
        "Dir::Etc::SourceList": "/dev/null", "Dir::Etc::SourceParts": state / "sources.list.d",
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": state / "preferences.d",
        "Dir::State::status": "/var/lib/dpkg/status"}.items()) + "\n")
    env = {**os.environ, "APT_CONFIG": str(config)}
    subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
    packages = tools / "debs"
    packages.mkdir(exist_ok=True)
    subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], env=env, cwd=packages, check=True)
    for deb in packages.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tools / "glibc")], check=True)


def stage_totals(server, model: str) -> dict[str, tuple[float, float]]:
    families = server.metrics()
    return {stage: (sample_value(families, "mmserver_request_stage_seconds_count",
                                 model=model, stage=stage),
                    sample_value(families, "mmserver_request_stage_seconds_sum",
                                 model=model, stage=stage)) for stage in STAGES}


def run(perf: list[str], server, grpc_port: int, mode: str, concurrency: int,
        model: str, shape: str) -> dict:
    before = stage_totals(server, model)
    url = (f"127.0.0.1:{grpc_port}" if mode == "grpc" else server.url[len("http://"):])
    with tempfile.NamedTemporaryFile(suffix=".csv") as report:
        done = subprocess.run(
            [*perf, "-m", model, "-u", url, *MODES[mode], "--shape", shape,
             "--concurrency-range", f"{concurrency}:{concurrency}",
             "--measurement-interval", "2000", "--stability-percentage", "100",
             "--max-trials", "6", "-f", report.name, "--verbose-csv"],
            capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"perf_analyzer {mode} c={concurrency} failed "
                               f"({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        row = next(csv.DictReader(io.StringIO(Path(report.name).read_text())))
    after = stage_totals(server, model)
    requests = after["queue"][0] - before["queue"][0]
    metrics_us = {stage: (after[stage][1] - before[stage][1]) / requests * 1e6
                  for stage in STAGES}
    return {"mode": mode, "concurrency": concurrency,
            "throughput": float(row["Inferences/Second"]),
            "p99_us": float(row.get("p99 latency", "nan")),
            "perf_us": {stage: float(row[COLUMNS[stage]]) for stage in STAGES},
            "metrics_us": metrics_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 8 only")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--http-workers", type=int, default=1)
    args = parser.parse_args()
    perf = install()
    levels = (1, 8) if args.quick else (1, 2, 4, 8, 16, 32)
    with tempfile.TemporaryDirectory() as folder:
        write_examples(Path(folder), names=["tabular"])
        grpc_port = free_port()
        with ServerProcess(["--model-root", folder, "--no-access-log", "--grpc-port",
                            str(grpc_port), "--http-workers", str(args.http_workers),
                            "--preload", "tabular=tabular/model"]) as server:
            print(f"{'mode':12} {'c':>3} {'inf/s':>8} {'p99 us':>8}  "
                  + "  ".join(f"{s + ' pa/metrics us':>30}" for s in STAGES))
            worst = 0.0
            for mode in args.modes.split(","):
                for concurrency in levels:
                    result = run(perf, server, grpc_port, mode, concurrency, "tabular",
                                 "input:16")
                    cells = []
                    for stage in STAGES:
                        pa, ours = result["perf_us"][stage], result["metrics_us"][stage]
                        ratio = pa / ours if ours else float("nan")
                        if stage in ("queue", "compute_infer") and ours >= 20:
                            worst = max(worst, abs(ratio - 1))
                        cells.append(f"{pa:9.0f} /{ours:9.1f} ({ratio:5.2f}x)")
                    print(f"{mode:12} {concurrency:3d} {result['throughput']:8.0f} "
                          f"{result['p99_us']:8.0f}  " + "  ".join(f"{c:>30}" for c in cells),
                          flush=True)
            print(f"largest queue/compute_infer disagreement (stages of 20 us or more): "
                  f"{worst:.1%}")


if __name__ == "__main__":
    main()

"""The command line: ``mmserver serve`` and ``mmserver examples``.

``serve`` reads the environment (docs/design.md section 9) and lets flags override
it. SIGTERM and SIGINT stop accepting connections, answer every accepted
request, and exit within ``Settings.shutdown_timeout_seconds`` (SageMaker
sends SIGKILL 30 s after SIGTERM).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from mmserver.allocator import keep_freed_memory_in_heap
from mmserver.batching import KNOBS, BatchSettings
from mmserver.config import ISOLATIONS, Settings
from mmserver.errors import MMServerError
from mmserver.resources import usable_cpus
from mmserver.workers import calls_running

ACCESS_LOG_FORMAT = ('%a "%r" %s %b %Tf target_model="%{X-Amzn-SageMaker-Target-Model}i"')


class AccessLog(AbstractAccessLogger):
    """One line per request in :data:`ACCESS_LOG_FORMAT`, built by one %-format.

    aiohttp's ``AccessLogger`` interprets the format per request (a call per field);
    this writes the same line for a third of the cost (about 4 instead of 12 us
    before the logging handler). Nothing is formatted when the logger is not
    enabled for INFO (``--log-level WARNING``).
    """

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        version = request.version
        self.logger.info('%s "%s %s HTTP/%d.%d" %d %d %.6f target_model="%s"',
                         request.remote or "-", request.method, request.path_qs, version.major,
                         version.minor, response.status, response.body_length, time,
                         request.headers.get("X-Amzn-SageMaker-Target-Model", "-"))

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def _preload_pair(text: str) -> tuple[str, str]:
    """NAME=URL; a relative URL that exists from here is taken from here, else from the roots."""
    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {text!r}")
    if not os.path.isabs(url) and os.path.exists(url):
        url = os.path.abspath(url)
    return name, url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmserver", description="SageMaker-style multi-model "
                                     "server with request batching")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", help="address to bind (MMSERVER_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (SAGEMAKER_BIND_TO_PORT, default 8080)")
    serve.add_argument("--model-root", action="append", type=Path, dest="model_roots",
                       help="directory model urls must resolve inside; repeatable "
                            "(MMSERVER_MODEL_ROOTS, default /opt/ml/models)")
    serve.add_argument("--preload", action="append", type=_preload_pair, default=[],
                       metavar="NAME=URL", help="load a model at start-up; repeatable")
    defaults = BatchSettings()
    for knob in KNOBS:
        default = knob.edge_value(defaults)
        shown = default if knob.kind is str else f"{default:g}"
        unit = f" {knob.unit}" if knob.unit else ""
        serve.add_argument(knob.flag, dest=knob.key, type=knob.kind, choices=knob.choices or None,
                           metavar=knob.unit.upper() or None,
                           help=f"{knob.help} ({knob.env}; default {shown}{unit})")
    serve.add_argument("--http-workers", type=int, help="HTTP processes over one engine process "
                       "that holds the models (MMSERVER_HTTP_WORKERS, default 1: one process)")
    serve.add_argument("--isolation", choices=ISOLATIONS,
                       help="where a model runs when its mmserver.json does not say: 'process' "
                            "gives each model a process of its own, so that a native crash "
                            "costs only that model (MMSERVER_ISOLATION, default none)")
    serve.add_argument("--no-access-log", action="store_true", help="no line per request")
    serve.add_argument("--log-level", default="INFO")
    examples = commands.add_parser("examples", help="write the example models")
    examples.add_argument("directory", type=Path)
    examples.add_argument("--name", action="append", dest="names",
                          help="only this example; repeatable")
    return parser


def _given(flags: dict) -> dict:
    return {k: v for k, v in flags.items() if v is not None}


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The environment's settings with the flags given on top (an absent flag is None)."""
    base = Settings.from_env()
    batch = base.batch.overridden(_given({knob.key: getattr(args, knob.key) for knob in KNOBS}))
    return dataclasses.replace(base, batch=batch, preload=tuple(args.preload), **_given({
        "host": args.host,
        "port": args.port,
        "model_roots": tuple(args.model_roots) if args.model_roots else None,
        "access_log": False if args.no_access_log else None,
        "http_workers": args.http_workers,
        "isolation": args.isolation,
    }))


def serve(args: argparse.Namespace) -> None:
    from mmserver.http.app import create_app

    try:
        settings = settings_from_args(args)
    except ValueError as error:
        sys.exit(f"mmserver: {error}")
    if settings.http_workers > 1:
        from mmserver.engine.supervisor import serve_with_workers

        sys.exit(serve_with_workers(settings, args.log_level))
    prepare_process(settings, args.log_level)
    app = create_app(settings)
    app.on_startup.append(_announce)
    try:
        _run(app, settings)
    except MMServerError as error:
        sys.exit(f"mmserver: cannot start: {error}")
    exit_past_abandoned_calls()


def prepare_process(settings: Settings, log_level: str, *, runs_models: bool = True) -> None:
    """What a process that serves does first: its log, and, where models run, glibc's
    allocator and torch's threads (before any model runs)."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(process)d %(name)s %(message)s")
    if not runs_models:
        return
    if settings.tune_malloc:  # see mmserver/allocator.py
        keep_freed_memory_in_heap()
    if "OMP_NUM_THREADS" not in os.environ:
        import torch
        torch.set_num_threads(intra_op_threads(usable_cpus(), settings.batch.instances))


def exit_past_abandoned_calls() -> None:
    """Exit 0 now, without Python's finalization, if a worker thread is still in a call.

    The drain has answered every accepted request, but a call may still run that no
    request waits for: a load whose client went away or was cut off at the shutdown
    timeout, a batch of disconnected clients, a stuck model. Finalization ends such a
    daemon thread when it next takes the interpreter lock, by unwinding its stack; inside
    torch's C++ that unwinding cannot pass a ``noexcept`` frame, and the C++ runtime
    aborts the whole process ("terminate called without an active exception", exit -6)
    instead of exiting 0. Nothing is left to finalize that matters: the app's cleanup
    has closed the models, the pools and the requirements cache.
    """
    running = calls_running()
    if not running:
        return
    logging.getLogger(__name__).warning(
        "%d call(s) still running in worker threads after the drain (a load or a model call "
        "no request waits for any more); exiting without waiting for them", running)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def intra_op_threads(cpus: int, instances: int) -> int:
    """torch's intra-op threads: the CPUs we may use, divided among the default instances.

    torch keeps one count per process (set in any thread, it changes every thread's), so
    the server's default ``instances`` divides it; ``OMP_NUM_THREADS`` overrides it.
    """
    return max(1, cpus // instances)


def _run(app: web.Application, settings: Settings, *, reuse_port: bool = False) -> None:
    """Serve ``app`` until SIGTERM or SIGINT; ``reuse_port`` lets other processes bind the
    same port (the HTTP workers)."""
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        reuse_port=reuse_port or None,
        access_log=logging.getLogger("mmserver.access") if settings.access_log else None,
        access_log_class=AccessLog,
        shutdown_timeout=settings.shutdown_timeout_seconds,
        handler_cancellation=True,
        print=None,
        loop=event_loop(settings.uvloop),
    )


def event_loop(uvloop: bool | None = None):
    """uvloop's loop when it is installed and wanted, else None (asyncio's).

    ``uvloop`` defaults to ``Settings.from_env().uvloop`` (``MMSERVER_UVLOOP``). Public so
    that baselines in ``bench/`` can run on the loop mmserver runs on.
    """
    if uvloop is None:
        uvloop = Settings.from_env().uvloop
    if not uvloop:
        return None
    try:
        import uvloop as uvloop_module
    except ImportError:
        return None
    return uvloop_module.new_event_loop()


async def _announce(app: web.Application) -> None:
    from mmserver.http.app import SERVICE

    service = app[SERVICE]
    settings, registry = service.settings, service.registry
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    base = f"http://{host}:{settings.port}"
    lines = [f"mmserver ready on {base} ({registry.device}); models: "
             f"{', '.join(e.name for e in registry.ready()) or 'none'}", "Try:",
             f"  curl {base}/ping", f"  curl {base}/models"]
    for model in registry.ready()[:3]:
        lines.append(f"  curl {base}/models/{model.name}")
    if any(e.name == "tabular" for e in registry.ready()):
        lines.append(f"  curl -H 'Content-Type: application/json' -d '[[{', '.join(['0.5'] * 16)}]]' "
                     f"{base}/models/tabular/invoke")
    print("\n".join(lines), flush=True)


def examples(args: argparse.Namespace) -> None:
    from mmserver.harness.examples import write_examples

    logging.basicConfig(level="INFO", format="%(message)s")
    written = write_examples(args.directory, names=args.names)
    for name, path in written.items():
        print(f"{name}: {path}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    {"serve": serve, "examples": examples}[args.command](args)


if __name__ == "__main__":
    main()

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
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from mmserver.batching import KNOBS, BatchSettings
from mmserver.config import SETTINGS, Settings
from mmserver.engine.supervisor import serve_with_workers
from mmserver.errors import MMServerError
from mmserver.grpc.server import attach as attach_grpc
from mmserver.harness.examples import write_examples
from mmserver.http.app import SERVICE, create_app
from mmserver.process import exit_past_abandoned_calls, prepare_process, run_app
from mmserver.setting import FOLDERS, Setting


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
    add_setting_flags(serve)
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
    serve.add_argument("--no-access-log", action="store_true",
                       help="no line per request (MMSERVER_ACCESS_LOG=0)")
    serve.add_argument("--log-level", default="INFO")
    examples = commands.add_parser("examples", help="write the example models")
    examples.add_argument("directory", type=Path)
    examples.add_argument("--name", action="append", dest="names",
                          help="only this example; repeatable")
    return parser


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for each declared setting that has one (``config.SETTINGS``), read and checked
    as its variable is."""
    for setting in SETTINGS:
        if not setting.flag:
            continue
        default = getattr(Settings, setting.field, None)
        shown = (os.pathsep.join(map(str, default)) if setting.repeatable else default)
        parser.add_argument(setting.flag_name, dest=setting.field, type=setting.flag_type,
                            action="append" if setting.repeatable else "store",
                            metavar=_metavar(setting),
                            help=f"{setting.help} ({setting.env}, default {shown})")


def _metavar(setting: Setting) -> str:
    if setting.choices:
        return "{" + ",".join(setting.choices) + "}"
    return "DIR" if setting.kind is FOLDERS else setting.key.upper()


def _given(flags: dict) -> dict:
    return {k: v for k, v in flags.items() if v is not None}


def settings_from_args(args: argparse.Namespace,
                       environ: Mapping[str, str] | None = None) -> Settings:
    """The environment's settings with the flags given on top (an absent flag is None)."""
    base = Settings.from_env(environ)
    batch = base.batch.overridden(_given({knob.key: getattr(args, knob.key) for knob in KNOBS}))
    flags = {}
    for setting in SETTINGS:
        value = getattr(args, setting.field, None) if setting.flag else None
        if value is not None and setting.repeatable:
            value = tuple(item for given in value for item in given)
        flags[setting.field] = value
    if args.no_access_log:
        flags["access_log"] = False
    return dataclasses.replace(base, batch=batch, preload=tuple(args.preload), **_given(flags))


def serve(args: argparse.Namespace) -> None:
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        sys.exit(f"mmserver: {error}")
    if settings.http_workers > 1:
        sys.exit(serve_with_workers(settings, args.log_level))
    prepare_process(settings, args.log_level)
    app = create_app(settings)
    app.on_startup.append(_announce)
    if settings.grpc_port:
        attach_grpc(app, app[SERVICE], settings, reuse_port=False)
    try:
        run_app(app, settings)
    except MMServerError as error:
        sys.exit(f"mmserver: cannot start: {error}")
    exit_past_abandoned_calls()


async def _announce(app: web.Application) -> None:
    service = app[SERVICE]
    settings, registry = service.settings, service.registry
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    base = f"http://{host}:{settings.port}"
    grpc = f", gRPC on {host}:{settings.grpc_port}" if settings.grpc_port else ""
    lines = [f"mmserver ready on {base}{grpc} ({registry.device}); models: "
             f"{', '.join(e.name for e in registry.ready()) or 'none'}", "Try:",
             f"  curl {base}/ping", f"  curl {base}/models"]
    for model in registry.ready()[:3]:
        lines.append(f"  curl {base}/models/{model.name}")
    if any(e.name == "tabular" for e in registry.ready()):
        lines.append(f"  curl -H 'Content-Type: application/json' -d '[[{', '.join(['0.5'] * 16)}]]' "
                     f"{base}/models/tabular/invoke")
    print("\n".join(lines), flush=True)


def examples(args: argparse.Namespace) -> None:
    logging.basicConfig(level="INFO", format="%(message)s")
    written = write_examples(args.directory, names=args.names)
    for name, path in written.items():
        print(f"{name}: {path}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    {"serve": serve, "examples": examples}[args.command](args)


if __name__ == "__main__":
    main()

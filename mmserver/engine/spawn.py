"""Starting an engine process and hearing its first word.

The supervisor starts the engine of ``--http-workers`` this way, and an isolated model
(``engine.isolated``) the engine of its own. Which service the engine holds is the
caller's to say (``service``: a class such as ``http.local.LocalService``, pickled by
name into the new process), so that starting an engine imports nothing of the service
that starts one: the service of this process holds isolated models, whose engines
each hold a service in turn.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

from mmserver.config import Settings
from mmserver.engine.engine import run_engine
from mmserver.engine.journal import Restart
from mmserver.status import ModelStatus

#: Processes are spawned, not forked: the parent has imported torch, whose threads a fork
#: would copy in a state the child cannot use.
CONTEXT = multiprocessing.get_context("spawn")


def spawn_engine(settings: Settings, socket_path: str, log_level: str,
                 restart: Restart | None, *, service: type, isolated: bool = False,
                 packages: Path | None = None):
    """An engine process holding a ``service(settings, isolating=...)``, started, and the
    pipe its first word comes on. ``isolated``: the engine of one isolated model
    (``engine.isolated``), which dies with this process and isolates nothing further.
    ``packages``: that model's installed ``code/requirements.txt``, which the engine puts
    first on its path as it loads the model."""
    ready, engine_end = CONTEXT.Pipe(duplex=False)
    engine = CONTEXT.Process(target=run_engine, name="mmserver-engine",
                             args=(service, settings, socket_path, engine_end, log_level,
                                   restart, os.getpid() if isolated else None, packages))
    engine.start()
    engine_end.close()
    return engine, ready


def wait_ready(engine, ready, stopping: list) -> tuple[ModelStatus, str] | None:
    """The engine's first word, or None when it ended (or a signal came) first."""
    while not stopping:
        if ready.poll(0.2):
            try:
                return ready.recv()
            except EOFError:
                return None
        if not engine.is_alive():
            return None
    return None


def cause_of_end(exitcode: int | None) -> str:
    """A process's end, as a person reads it: ``killed by SIGSEGV``, ``exit status 1``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"

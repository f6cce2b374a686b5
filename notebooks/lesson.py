"""What every notebook of the lesson does first, and how it states what its run measured.

``import lesson`` at the top of a notebook (the notebooks run from ``notebooks/``):

* puts this checkout first on ``sys.path`` and on ``PYTHONPATH``, so the notebook and every
  process it starts (a server, locust) import this ``mmserver`` and ``loadtests``;
* reads quick mode (``MMSERVER_QUICK=1``: smaller sizes and shorter runs, the same checks);
* seeds torch (``SEED``), gives torch one intra-op thread on a CPU (a fair one-core picture,
  as the server's benchmarks pin it) and tunes glibc's allocator as ``mmserver serve`` does
  (``mmserver.allocator``; appendix 10 shows why).

Claims as code: a sentence that states a number this run measured, or compares measured
things, is printed from the run's variables by :func:`say` (a Markdown f-string), and a
qualitative claim goes through :func:`claim`, which asserts it before printing it, so a
re-run that contradicts the lesson fails instead of lying. :func:`learned` prints the
closing summary the same way. The quantities the sentences name come from
``loadtests.definitions``, imported here as ``definitions``; they are measured by
``loadtests.instruments`` (``instruments``), judged by ``loadtests.verdicts`` (``verdicts``:
:func:`claim` asserts a verdict, :func:`report` prints one whichever way it went), and
:func:`record` writes them to the run's ledger (``loadtests.ledger``), which fails when a
notebook contradicts an earlier one under the same conditions.

Processes a notebook starts go through :func:`started`; :func:`stop_all` stops them (it also
runs when the kernel exits). That none outlives the notebook is checked by the tests
(``tests/test_notebooks.py``), and by the notebooks that assert it after ``stop_all``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])

import torch  # noqa: E402

from loadtests import definitions  # noqa: E402,F401 - the notebooks' one glossary
from loadtests import instruments, verdicts  # noqa: E402,F401 - how they measure and judge
from loadtests.ledger import Ledger  # noqa: E402
from mmserver.allocator import keep_freed_memory_in_heap  # noqa: E402

QUICK = os.environ.get("MMSERVER_QUICK", "") not in ("", "0")
#: Fixes the random weights and the random inputs of every notebook.
SEED = 0
torch.manual_seed(SEED)
ALLOCATOR_TUNED = keep_freed_memory_in_heap()
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu":
    torch.set_num_threads(1)

_started: list = []


def describe() -> str:
    """One line: where this run happens, for the top of each notebook."""
    return (f"device: {DEVICE} | torch {torch.__version__} | intra-op threads: "
            f"{torch.get_num_threads()} | CPUs: {os.cpu_count()} | quick mode: {QUICK}")


def quick(full, quick_value):
    """``quick_value`` in quick mode, else ``full``: one place per size a notebook shrinks."""
    return quick_value if QUICK else full


def of(count: int, total: int) -> str:
    """``3 of 72``, or ``none of 72``: a count as a sentence says it."""
    return f"{'none' if count == 0 else count} of {total}"


def say(text: str) -> None:
    """Show ``text`` (Markdown, built from the run's variables) as the notebook's prose."""
    from IPython.display import Markdown, display

    display(Markdown(text))


def claim(holds, text: str | None = None) -> None:
    """Assert a claim about this run, then state it; a run that contradicts it fails here.

    ``holds`` is a bool with its ``text``, or a ``verdicts.Verdict`` (its sentence is the text).
    A claim the run bore out is marked ✔; one that holds only because the run could not rank
    what it compared (a verdict not ``decided``: not contradicted, not shown) is marked ≈.
    """
    decided = True
    if isinstance(holds, verdicts.Verdict):
        decided, holds, text = holds.decided, holds.holds, _statements.state(holds, text)
    assert holds, f"this run contradicts the lesson's claim: {text}"
    say(f"{'✔' if decided else '≈'} {text}")


def report(verdict) -> None:
    """State a ``verdicts.Verdict`` whichever way it went (what the reader's machine decides)."""
    say(_statements.state(verdict))


_statements = verdicts.Statements()   # this notebook's: each rule stated once


def record(notebook: str, *measurements) -> None:
    """Write ``instruments.Measurement`` records to the run's ledger and print each with what
    the ledger says of it; a contradiction of an earlier notebook fails here."""
    ledger = Ledger()
    for measurement in measurements:
        notes = ledger.record(measurement, notebook)
        print(measurement.describe() + "".join(f"\n  ledger: {note}" for note in notes))


def recorded(notebook: str, quantity: str, model: str):
    """The record ``notebook`` wrote of ``quantity`` of ``model`` in this run's ledger, or None
    (a notebook run alone has no earlier notebook's records to set beside its own)."""
    return next((entry.measurement for entry in Ledger().entries()
                 if (entry.notebook, entry.measurement.quantity, entry.measurement.model)
                 == (notebook, quantity, model)), None)


def learned(*points: str) -> None:
    """The notebook's closing summary, each point built from the run's variables."""
    say("**What we learned in this run**\n\n" + "\n".join(f"- {p}" for p in points))


def started(process):
    """Remember a process the notebook started (a ``ServerProcess`` or a ``Popen``)."""
    _started.append(process)
    return process


def stop_all() -> None:
    """Stop every process :func:`started` remembered (SIGTERM, then SIGKILL past 30 s)."""
    while _started:
        process = _started.pop()
        if hasattr(process, "stop"):
            process.stop()
        elif isinstance(process, subprocess.Popen) and process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


atexit.register(stop_all)

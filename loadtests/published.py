"""Published accelerator figures that notebook 08 compares the CPU stand-in with.

Source: NVIDIA's DeepLearningExamples repository on GitHub,
``PyTorch/Classification/ConvNets/resnet50v1.5/README.md``, section "Inference performance
results" (measured by NVIDIA in the pytorch-21.03 NGC container; ResNet-50 v1.5, 224x224
images, PyTorch). The numbers are NVIDIA's, transcribed: average throughput (images/s) and
average latency (ms) per batch size. They are kept once, in ``mmserver.harness.simulated_device``,
whose simulated GPU takes its t(b) from them; this module names them for the notebooks.
"""

from __future__ import annotations

from mmserver.harness.simulated_device import PUBLISHED_BATCH_SIZES as BATCH_SIZES
from mmserver.harness.simulated_device import RESNET50, SOURCE

__all__ = ["BATCH_SIZES", "RESNET50", "SOURCE", "gain"]


def gain(name: str, batch_size: int) -> float:
    """Throughput at ``batch_size`` relative to batch 1."""
    figures = RESNET50[name]["images_per_s"]
    return figures[BATCH_SIZES.index(batch_size)] / figures[0]

"""Published accelerator figures that notebook 08 compares the CPU stand-in with.

Source: NVIDIA's DeepLearningExamples repository on GitHub,
``PyTorch/Classification/ConvNets/resnet50v1.5/README.md``, section "Inference performance
results" (measured by NVIDIA in the pytorch-21.03 NGC container; ResNet-50 v1.5, 224x224
images, PyTorch). The numbers are NVIDIA's, transcribed: average throughput (images/s) and
average latency (ms) per batch size.
"""

from __future__ import annotations

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
          "'Inference performance results' (pytorch-21.03 NGC container)")
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: name -> {"images_per_s": [...], "latency_ms": [...]} over BATCH_SIZES
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


def gain(name: str, batch_size: int) -> float:
    """Throughput at ``batch_size`` relative to batch 1."""
    figures = RESNET50[name]["images_per_s"]
    return figures[BATCH_SIZES.index(batch_size)] / figures[0]

"""The digits example's model: a small CNN trained here on scikit-learn's bundled 8x8 digits.

``harness.examples`` saves it as TorchScript with its own ``code/inference.py``; tests and
notebooks score the served model on the images :func:`load_digits_split` holds out.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

# scikit-learn's digits hold 0..16 per pixel (counts of "on" cells in a 4x4
# block); the model takes that scale and normalises inside, so JSON clients
# send the data as the dataset has it.
DIGIT_MAX = 16.0
# A fifth of the 1797 digits is held out, stratified so every class is tested.
DIGITS_TEST_FRACTION = 0.2
# Enough passes for the small CNN to pass 95% test accuracy, yet training
# takes seconds on one core.
DIGITS_EPOCHS = 25
DIGITS_BATCH_SIZE = 64
DIGITS_LEARNING_RATE = 3e-3


class DigitsNet(nn.Module):
    """A small CNN for 8x8 digits; takes the dataset's 0..16 scale as it is.

    No batch normalisation or anything else that mixes rows, so the served
    model's answer for a row does not depend on what it was batched with.
    """

    def __init__(self) -> None:
        super().__init__()
        # An attribute, not the global, so TorchScript can compile forward.
        self.input_max = DIGIT_MAX
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x / self.input_max))


def load_digits_split(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits as (images, labels, train indices, test indices).

    images are float32 (N, 1, 8, 8) in 0..16; the split is stratified and
    fixed by the seed. Public so tests and notebooks can score the served
    model on exactly the images training held out.
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:  # scikit-learn is the optional "examples" extra
        raise ImportError("the digits example needs scikit-learn: pip install 'mmserver[examples]'") from error

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(
        range(len(labels)), test_size=DIGITS_TEST_FRACTION, stratify=digits.target, random_state=seed
    )
    return images, labels, torch.tensor(train_idx), torch.tensor(test_idx)


def train_digits(seed: int = 0) -> tuple[DigitsNet, float]:
    """Train :class:`DigitsNet` on scikit-learn's digits; return it (in eval mode) and its test accuracy.

    Runs on one CPU thread: tensors this small gain nothing from more, and
    one thread keeps the arithmetic, so the weights, the same for a seed.
    """
    images, labels, train_idx, test_idx = load_digits_split(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
            torch.manual_seed(seed)
            model = DigitsNet()
            optimiser = torch.optim.Adam(model.parameters(), lr=DIGITS_LEARNING_RATE)
            order = torch.Generator().manual_seed(seed)
            model.train()
            for _ in range(DIGITS_EPOCHS):
                for batch in train_idx[torch.randperm(len(train_idx), generator=order)].split(DIGITS_BATCH_SIZE):
                    optimiser.zero_grad()
                    nn.functional.cross_entropy(model(images[batch]), labels[batch]).backward()
                    optimiser.step()
        model.eval()
        with torch.inference_mode():
            predicted = model(images[test_idx]).argmax(dim=1)
    finally:
        torch.set_num_threads(threads)
    accuracy = (predicted == labels[test_idx]).float().mean().item()
    log.info("digits: test accuracy %.4f on %d held-out images", accuracy, len(test_idx))
    return model, accuracy

"""Rows of different lengths: token sequences, padded only when their batch is formed.

A text model's request carries :class:`Sequences`, one tensor of token ids per
row, each as long as its own text. Requests of any lengths may share a batch:
collation (:func:`collate`, called by ``rows.concatenate``) pads every row to
the batch's longest and builds the attention mask, so a batch costs
``rows x longest`` padded tokens while its rows hold only their real ones.
That product is what ``max_batch_tokens`` bounds (``planner.py``) and what the
padding statistics count (``stats.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

#: The keys of a collated batch, as Hugging Face models take them.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"


@dataclasses.dataclass(frozen=True, eq=False)
class Sequences:
    """One request's rows: a 1-D int64 tensor of token ids per row, unpadded."""

    ids: tuple[torch.Tensor, ...]
    #: The id that fills a row up to its batch's longest (masked out by the attention mask).
    pad_id: int = 0

    def __post_init__(self):
        if not self.ids:
            raise ValueError("a request needs at least one sequence")
        if any(row.dim() != 1 or row.numel() == 0 for row in self.ids):
            raise ValueError("every sequence must be a non-empty 1-D tensor of token ids")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(row.numel() for row in self.ids)

    @property
    def tokens(self) -> int:
        """Real tokens, the padding a batch adds not counted."""
        return sum(self.lengths)

    @property
    def longest(self) -> int:
        return max(self.lengths)


def token_counts(data: object) -> tuple[int, int]:
    """``(real tokens, longest row)`` of a request; ``(0, 0)`` when it is not sequences."""
    if isinstance(data, Sequences):
        return data.tokens, data.longest
    return 0, 0


def padded_tokens(rows: int, longest: int) -> int:
    """What a batch of ``rows`` rows padded to ``longest`` costs, in tokens."""
    return rows * longest


def collate(requests: Sequence[Sequences]) -> dict[str, torch.Tensor]:
    """Every request's rows, in order, padded to the longest: ``input_ids`` and ``attention_mask``,
    both ``[rows, longest]`` int64."""
    rows = [row for request in requests for row in request.ids]
    longest = max(row.numel() for row in rows)
    ids = torch.full((len(rows), longest), requests[0].pad_id, dtype=torch.int64)
    mask = torch.zeros((len(rows), longest), dtype=torch.int64)
    for position, row in enumerate(rows):
        ids[position, :row.numel()] = row
        mask[position, :row.numel()] = 1
    return {INPUT_IDS: ids, ATTENTION_MASK: mask}

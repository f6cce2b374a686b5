"""Text in: strings to token sequences with the model folder's own tokenizer, as a decode step.

A folder whose ``mmserver.json`` has ``"text": {"tokenizer": "tokenizer.json",
"max_length": 256}`` takes strings, not numbers: a SageMaker body is a JSON list
of strings (or ``{"inputs": [...]}``), a v2 request one ``BYTES`` tensor of shape
``[n]``. Tokenizing is decoding, so it happens where bodies are decoded (in the
HTTP worker when there are any, always in a thread, never on the event loop),
and a request reaches the runner as :class:`~mmserver.batching.sequences.Sequences`,
its rows unpadded; the batch is padded when it is formed.

``max_length`` is the model's limit in tokens, special tokens included (for a
sentence-transformers folder, its ``max_seq_length``). A text longer than that
is refused (400), not truncated: sentence-transformers would truncate silently,
and an embedding of part of a text answers a question the client did not ask.

A :class:`TextCodec` is plain data (the tokenizer file's path and the limit), so
it crosses to an HTTP worker, which loads the tokenizer from the same folder.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmserver import codecs
from mmserver.batching.sequences import Sequences
from mmserver.errors import InvalidInput, InvalidModelArtifact, UnsupportedContentType

#: The ``mmserver.json`` key that makes a folder a text model.
TEXT_KEY = "text"
_FIELDS = {"tokenizer", "max_length"}
#: The JSON object a SageMaker body may wrap its strings in (Hugging Face's convention).
INPUTS_FIELD = "inputs"


@dataclasses.dataclass(frozen=True)
class TextCodec:
    """A text model's strings to :class:`Sequences` (see the module docstring)."""

    #: The tokenizer's ``tokenizer.json`` (Hugging Face ``tokenizers``), an absolute path.
    tokenizer_file: str
    #: The most tokens one text may have, special tokens included.
    max_length: int

    @classmethod
    def declared(cls, raw: object, model_dir: Path) -> TextCodec | None:
        """The codec ``mmserver.json``'s ``text`` entry declares (None without one)."""
        if raw is None:
            return None
        where = f"mmserver.json {TEXT_KEY}"
        if not isinstance(raw, Mapping) or set(raw) != _FIELDS:
            raise InvalidModelArtifact(f'{where} must be an object with exactly "tokenizer" '
                                       f'(a file of the folder) and "max_length", got {raw!r}')
        length = raw["max_length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidModelArtifact(f"{where}: max_length must be an integer >= 1, "
                                       f"got {length!r}")
        path = model_dir / str(raw["tokenizer"])
        if not path.is_file():
            raise InvalidModelArtifact(f"{where}: the tokenizer file {raw['tokenizer']!r} is "
                                       "not in the model folder")
        codec = cls(str(path.resolve()), length)
        codec.tokenizer()  # a broken file is refused at load, not on the first request
        return codec

    def tokenizer(self) -> Any:
        """The tokenizer, loaded once per process: no padding (the batch pads), no truncation
        (a text over ``max_length`` is refused)."""
        loaded = _TOKENIZERS.get(self.tokenizer_file)
        if loaded is None:
            with _LOCK:
                loaded = _TOKENIZERS.get(self.tokenizer_file)
                if loaded is None:
                    loaded = _load_tokenizer(self.tokenizer_file)
                    _TOKENIZERS[self.tokenizer_file] = loaded
        return loaded

    def decode(self, body: bytes, context: Any) -> Sequences:
        """A SageMaker body: JSON, a list of strings or ``{"inputs": [...]}``."""
        if codecs.media_type(context.content_type) != codecs.JSON:
            raise UnsupportedContentType(
                f"unsupported content type {context.content_type!r}; this text model takes "
                f"{codecs.JSON}: a list of strings, or {{\"{INPUTS_FIELD}\": [...]}}")
        try:
            parsed = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise InvalidInput(f"the body is not UTF-8: {error}") from None
        except json.JSONDecodeError as error:
            raise InvalidInput(f"the body is not valid JSON: {error}") from None
        if isinstance(parsed, dict) and set(parsed) == {INPUTS_FIELD}:
            parsed = parsed[INPUTS_FIELD]
        if not isinstance(parsed, list) or not all(isinstance(s, str) for s in parsed):
            raise InvalidInput(f"expected a JSON list of strings, or {{\"{INPUTS_FIELD}\": "
                               f"[...]}} holding one; got {_short(parsed)}")
        return self.tokenized(parsed)

    def from_tensors(self, data: Any, context: Any = None) -> Sequences:
        """A v2 request's one ``BYTES`` tensor of shape ``[n]``, each element UTF-8 text."""
        if not isinstance(data, np.ndarray) or data.dtype != object:
            raise InvalidInput("this text model takes one BYTES tensor of strings, shape [n]")
        if data.ndim != 1:
            raise InvalidInput(f"the BYTES tensor must have shape [n], one text per row, "
                               f"got {list(data.shape)}")
        texts = []
        for position, raw in enumerate(data.tolist()):
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise InvalidInput(f"element {position} of the BYTES tensor is not UTF-8: "
                                   f"{error}") from None
        return self.tokenized(texts)

    def tokenized(self, texts: list[str]) -> Sequences:
        """Token ids of each text; an empty list, or a text over ``max_length``, is refused."""
        if not texts:
            raise InvalidInput("expected at least one string; the list is empty")
        encodings = self.tokenizer().encode_batch(texts)
        rows = []
        for position, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                raise InvalidInput(
                    f"text {position} is {len(encoding.ids)} tokens long; this model takes at "
                    f"most {self.max_length} (its maximum sequence length, special tokens "
                    "included); split the text, or shorten it")
            rows.append(torch.tensor(encoding.ids, dtype=torch.int64))
        return Sequences(tuple(rows), pad_id=_pad_id(self.tokenizer()))


_LOCK = threading.Lock()
_TOKENIZERS: dict[str, Any] = {}


def _load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as error:  # noqa: BLE001 - any failure to read it refuses the folder
        raise InvalidModelArtifact(f"the tokenizer file {Path(path).name!r} cannot be read: "
                                   f"{error}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _pad_id(tokenizer: Any) -> int:
    """The tokenizer's padding id ([PAD]), else 0; the attention mask hides it either way."""
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    return 0


def _short(value: object) -> str:
    text = json.dumps(value)[:80] if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) < 80 else text[:77] + "..."

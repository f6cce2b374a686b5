"""Handlers for the ``minilm`` example model (copied to its ``code/inference.py``).

Sentence embeddings with all-MiniLM-L6-v2: the folder is the model as
sentence-transformers saves it (``config.json``, ``model.safetensors``,
``tokenizer.json``, its pooling and normalisation modules), so
``SentenceTransformer(folder)`` loads the same weights, and this script computes
what it computes: the transformer's last hidden state, averaged over each row's
real tokens (mean pooling), scaled to length 1 (L2 normalisation).

Only ``model_fn`` and ``predict_fn`` are here. Tokenizing is the server's decode
step (``mmserver.json``'s ``text`` names the tokenizer), so ``predict_fn`` gets a
formed batch: ``input_ids`` and ``attention_mask``, ``[rows, longest]``, every
row padded to the batch's longest. Padding never changes a row's answer: the
attention mask hides the padding from attention and from the mean, so the
script is row-wise (``MMSERVER_ROW_WISE``) and requests of any lengths may share
a call.
"""

import torch
from transformers import AutoModel

MMSERVER_ROW_WISE = True


def model_fn(model_dir):
    """The transformer from the folder, offline, on the GPU when there is one."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return AutoModel.from_pretrained(model_dir, local_files_only=True).to(device).eval()


def predict_fn(data, model):
    """One 384-float unit vector per row: mean of the real tokens' states, L2-normalised."""
    device = next(model.parameters()).device
    input_ids = data["input_ids"].to(device)
    mask = data["attention_mask"].to(device)
    states = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(states.dtype)
    summed = (states * weights).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)

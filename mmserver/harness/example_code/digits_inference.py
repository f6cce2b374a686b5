"""Handlers for the ``digits`` example model (copied to its ``code/inference.py``).

This is user code in the SageMaker PyTorch convention: the server calls
``model_fn`` once, then per request ``input_fn``, ``predict_fn`` (on a batch
that may hold many requests' rows) and ``output_fn`` (on this request's rows
only). It shows what a model's own code must respect to be batched:
``predict_fn`` is purely row-wise, and all per-request work (decoding,
validation, formatting) lives in ``input_fn`` and ``output_fn``. Because
batching other requests' rows must never change an answer, mmserver batches
user code only when it says it may: ``MMSERVER_ROW_WISE = True`` below.

The model is a TorchScript CNN trained on scikit-learn's 8x8 digits: it takes
float32 rows of shape (1, 8, 8) holding values 0..16, bright strokes on a dark
background, and returns 10 logits per row.

Accepted request bodies:

``image/png``, ``image/jpeg``
    One picture of one digit, any size (it is squashed to 8x8, so crop it
    roughly square around the digit first). Colour is reduced to grey. A dark
    digit on a light background (ink on paper) is inverted; see
    :func:`_to_digit_row`.
``application/json``
    A list of rows, each either 64 numbers or an 8x8 nested list, with values
    0..16 as in the training data: ``[[0, 0, 5, 13, ...], ...]``.

The answer (``application/json``, also for ``*/*``) is a list with one object
per row: ``{"label": 3, "probabilities": [0.0001, ...]}``.
"""

from __future__ import annotations

import io
import json
import math
import warnings

import PIL.Image
import torch
import torchvision
from torchvision.transforms.v2 import functional as F

try:  # served by mmserver: too many pixels answers 413
    from mmserver.errors import PayloadTooLarge
except ImportError:  # elsewhere: a plain rejection of the body
    PayloadTooLarge = ValueError

# Every function here is row-wise: input_fn returns rows along dimension 0 and
# predict_fn answers one row per row, so mmserver may run many requests' rows
# in one call (see the docstring of predict_fn).
MMSERVER_ROW_WISE = True

# The training data's pixel scale: scikit-learn's digits count 0..16 "on"
# cells of a 4x4 block, so 16 is full brightness.
DIGIT_MAX = 16.0
# Images are reduced to the training data's 8x8 grid.
SIDE = 8
# The model's 10 classes are the digits 0..9; probabilities are rounded to
# this many places, enough to read and small on the wire.
PROBABILITY_DIGITS = 4
# A small PNG can hold gigabytes of pixels (a decompression bomb); the size is
# read from the header and anything larger is refused before decoding.
MAX_IMAGE_PIXELS = 25_000_000

_JSON = "application/json"
_IMAGE_TYPES = ("image/png", "image/jpeg")


def model_fn(model_dir):
    """Load the TorchScript model once, on the GPU when there is one."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # TorchScript is deprecated in this torch but is the SageMaker format we
    # serve; the FutureWarning says nothing the operator can act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.*deprecated", category=FutureWarning)
        model = torch.jit.load(f"{model_dir}/model.pt", map_location=device)
    return model.eval()


def input_fn(request_body, request_content_type):
    """Turn one request body into float32 rows of shape (N, 1, 8, 8), values 0..16."""
    content_type = _media_type(request_content_type)
    if content_type == _JSON:
        return _rows_from_json(request_body)
    if content_type in _IMAGE_TYPES:
        return _to_digit_row(_decode_grey_image(request_body)).reshape(1, 1, SIDE, SIDE)
    raise ValueError(
        f"unsupported content type {request_content_type!r}; "
        f"send {_JSON}, {' or '.join(_IMAGE_TYPES)}"
    )


def predict_fn(data, model):
    """Return the model's logits, one row per input row.

    The server hands this many requests' rows concatenated along dimension 0,
    so it must not look across rows (no per-batch normalisation or sorting).
    """
    device = next(model.parameters()).device
    return model(data.to(device))


def output_fn(prediction, accept):
    """Answer this request's rows as JSON: a label and 10 probabilities each."""
    if _accepted_media_type(accept) is None:
        raise ValueError(f"unsupported accept type {accept!r}; this model answers {_JSON}")
    probabilities = torch.softmax(prediction.detach().to("cpu", torch.float32), dim=1)
    answer = [
        {
            "label": int(row.argmax()),
            "probabilities": [round(p, PROBABILITY_DIGITS) for p in row.tolist()],
        }
        for row in probabilities
    ]
    return json.dumps(answer).encode("utf-8")


def _media_type(content_type):
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def _accepted_media_type(accept):
    """The first type in an Accept header that we can produce, or None.

    A missing Accept header means the client takes anything.
    """
    if not accept or not accept.strip():
        return _JSON
    for part in accept.split(","):
        media_type = _media_type(part)
        if media_type in (_JSON, "*/*", "application/*"):
            return _JSON
    return None


def _rows_from_json(body):
    try:
        rows = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"the body is not valid JSON: {error}") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError("expected a non-empty JSON list of rows, each 64 numbers or an 8x8 nested list")
    return torch.stack([_row_from_json(row, index) for index, row in enumerate(rows)]).unsqueeze(1)


def _row_from_json(row, index):
    """One JSON row (64 numbers, or 8 lists of 8) as an 8x8 float32 tensor."""
    shape_error = ValueError(
        f"row {index} must be 64 numbers or an 8x8 nested list (a list of 8 lists of 8 numbers)"
    )
    if not isinstance(row, list):
        raise shape_error
    if len(row) == SIDE * SIDE and not any(isinstance(v, list) for v in row):
        values = row
    elif len(row) == SIDE and all(isinstance(r, list) and len(r) == SIDE for r in row):
        values = [v for r in row for v in r]
    else:
        raise shape_error
    for value in values:
        # bool is an int to Python, but true/false in a pixel row is a mistake.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"row {index} holds {value!r}; every value must be a number")
        if not (math.isfinite(value) and 0 <= value <= DIGIT_MAX):
            raise ValueError(
                f"row {index} holds {value!r}; values must lie in 0..{DIGIT_MAX:g} "
                "like the training data (scale 0..255 pixels by 16/255)"
            )
    return torch.tensor(values, dtype=torch.float32).reshape(SIDE, SIDE)


def _decode_grey_image(body):
    """Decode PNG or JPEG bytes (whichever they are) to a (1, H, W) uint8 tensor."""
    if not body:
        raise ValueError("the body is empty; expected a PNG or JPEG image")
    _check_pixel_count(body)
    try:
        return torchvision.io.decode_image(
            torch.frombuffer(bytearray(body), dtype=torch.uint8),
            mode=torchvision.io.ImageReadMode.GRAY,
        )
    except RuntimeError as error:
        raise ValueError(f"the body is not a readable PNG or JPEG image: {error}") from None


def _check_pixel_count(body):
    """Refuse an image with more than MAX_IMAGE_PIXELS pixels, reading only its header."""
    try:
        with PIL.Image.open(io.BytesIO(body)) as header:
            width, height = header.size
    except PIL.Image.DecompressionBombError as error:
        raise PayloadTooLarge(f"the image has too many pixels: {error}") from None
    except (PIL.UnidentifiedImageError, OSError) as error:
        raise ValueError(f"the body is not a readable PNG or JPEG image: {error}") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise PayloadTooLarge(
            f"the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS} are decoded")


def _to_digit_row(image):
    """Map a (1, H, W) uint8 grey image to an 8x8 float32 grid like the training data.

    The training digits are bright strokes (up to 16) on a dark background
    (0). A photographed or drawn digit is usually the opposite, dark ink on
    light paper. We tell them apart by comparing the mean brightness of the
    image's border (the outer eighth of each side) with that of its centre
    (the middle half in each direction): a digit sits in the middle, so a
    border brighter than the centre means a light background, and the image
    is inverted. Ties (a blank image) are left as they are.
    """
    pixels = image[0].to(torch.float32)
    height, width = pixels.shape
    if _border_mean(pixels) > _centre_mean(pixels):
        pixels = 255.0 - pixels
    small = F.resize(pixels.reshape(1, height, width), [SIDE, SIDE], antialias=True)
    return (small * (DIGIT_MAX / 255.0)).clamp(0.0, DIGIT_MAX)


def _border_mean(pixels):
    height, width = pixels.shape
    band_h, band_w = max(1, height // 8), max(1, width // 8)
    inner = pixels[band_h:height - band_h, band_w:width - band_w]
    # The bands are at least one pixel wide, so the border is never empty.
    return ((pixels.sum() - inner.sum()) / (pixels.numel() - inner.numel())).item()


def _centre_mean(pixels):
    height, width = pixels.shape
    centre = pixels[height // 4:height - height // 4, width // 4:width - width // 4]
    return centre.mean().item() if centre.numel() else pixels.mean().item()

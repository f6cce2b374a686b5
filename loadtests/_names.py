"""What the scenarios and the sweep must spell alike: request names and the examples folder.

The sweep reads locust's statistics by request name and points the scenarios at the
examples; both sides import these from here. No locust import (the sweep must not
pull in gevent's monkey-patching).
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: ``make serve`` writes the examples here; MMSERVER_EXAMPLES_DIR or --mm-examples-dir overrides.
DEFAULT_EXAMPLES_DIR = REPO_ROOT / "build" / "examples"
EXAMPLES_ENV = "MMSERVER_EXAMPLES_DIR"

SHED_SUFFIX = " (shed 503)"
UNLOADED_SUFFIX = " (model unloaded)"
#: The error type of the one 503 that is load shed on purpose: a full queue. A 503 for
#: another reason (an engine or a replica unavailable, a model loading again or stuck) is a
#: failure, named by its type, never shed (``mmserver.errors.Unavailable``).
SHED_TYPE = "QueueFull"


def invoke_name(model: str) -> str:
    """The request name of a 200 from ``model``: the latency to report."""
    return f"invoke {model}"


def shed_name(model: str) -> str:
    """The request name of a 503 that shedding was the expected answer to."""
    return invoke_name(model) + SHED_SUFFIX


def is_shed(status: int, error_type: str | None) -> bool:
    """Whether an answer is load shed: a 503 of a full queue, and no other."""
    return status == 503 and error_type == SHED_TYPE


def unloaded_name(model: str) -> str:
    """The request name of a 404 from a model the churn user has just unloaded."""
    return invoke_name(model) + UNLOADED_SUFFIX

"""Scenario 1: steady traffic to one model.

``SteadyUser``
    closed loop: each user sends one row, waits for the answer, pauses
    ``--mm-think-ms`` (100 ms) and sends again. Load = users / (latency + think).
    A 503 is a failure here: steady traffic should fit the server.
``OpenLoopUser``
    open loop: requests arrive at ``--mm-target-rps`` (default 20) in all,
    as Poisson arrivals spread over the ``-u`` users, whatever the latency.
    N closed-loop users can never put more than N requests in a batch; an
    open-loop source can, which is what a batching sweep needs
    (``python -m loadtests.sweep`` runs this class). 503s are shed load.

Both invoke ``--mm-model`` (default ``resnet18``, sent as one-row .npy).

    locust -f loadtests --headless -u 4 -r 4 -t 30s SteadyUser
    locust -f loadtests --headless -u 100 -r 100 -t 30s --mm-target-rps 80 OpenLoopUser
"""

import _repo_path  # noqa: F401 (before any loadtests import)

from loadtests._common import OneModelUser, OpenLoopModelUser


class SteadyUser(OneModelUser):
    """Closed loop: one row, wait for the answer, think, again."""


class OpenLoopUser(OpenLoopModelUser):
    """Poisson arrivals at --mm-target-rps (20) in all; 503s are shed load."""

    default_target_rps = 20.0

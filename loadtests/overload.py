"""Scenario 4: overload, far beyond what the server can compute.

``OverloadUser`` is open loop (see ``OpenLoopUser``) at ``--mm-target-rps``
(default 500 requests/s in all, several times what resnet18 does on a CPU).
The server's queue fills and it sheds load with 503 ``QueueFull`` +
Retry-After; those answers are counted under ``invoke <model> (shed 503)``,
not as failures: shedding is the behaviour under test. Anything else
(timeouts, 500s, refused connections, a 503 for another reason) is a failure.

A user holds one request at a time, so the server only fills its queue when
there are more users than ``max_queue_size`` plus one batch in flight: with
the server's default queue of 256, use ``-u 400`` or more.

    locust -f loadtests --headless -u 400 -r 100 -t 30s OverloadUser
"""

import _repo_path  # noqa: F401 (before any loadtests import)

from loadtests._common import OpenLoopModelUser


class OverloadUser(OpenLoopModelUser):
    default_target_rps = 500.0


"""Scenario 3: a spike, load stepped up and down by a ``LoadTestShape``.

``SpikeUser`` is a closed-loop user on ``--mm-model`` (think time
``--mm-think-ms``). ``SpikeShape`` drives how many of them run::

    base users for BASE_S, then peak users for PEAK_S   (CYCLES times)
    base users for BASE_S, then the run ends

The peak is ``-u`` (the shape reads locust's common options, hence
``use_common_options``); the rest comes from options that also read
environment variables, so tests and CI can shorten it:

=========================  ===============================  ==========================
option                     environment variable             default
=========================  ===============================  ==========================
``--mm-spike-base-users``  ``MMSERVER_SPIKE_BASE_USERS``    peak // 5 (at least 1)
``--mm-spike-base-s``      ``MMSERVER_SPIKE_BASE_S``        20
``--mm-spike-peak-s``      ``MMSERVER_SPIKE_PEAK_S``        10
``--mm-spike-cycles``      ``MMSERVER_SPIKE_CYCLES``        2
``--mm-spike-spawn-rate``  ``MMSERVER_SPIKE_SPAWN_RATE``    peak (the step takes ~1 s)
=========================  ===============================  ==========================

When the shape applies. Locust gives a run the first ``LoadTestShape`` it
finds in any of its locustfiles, and ``locust -f loadtests`` reads them all,
so without care every scenario would run under this shape. An ``init``
listener below switches it off unless the spike was chosen: ``SpikeUser``
named on the command line (or in ``LOCUST_USER_CLASSES``; a ``--config``
file cannot name user classes), or ``SpikeUser`` the only user class of the
run (``-f loadtests/spike.py``). In the web UI, start locust with
``--class-picker`` and pick ``SpikeShape`` (or "Default") there.

    MMSERVER_SPIKE_BASE_S=10 locust -f loadtests --headless -u 30 SpikeUser
"""

import os

import _repo_path  # noqa: F401 (before any loadtests import)
from locust import LoadTestShape, events

from loadtests._common import OneModelUser, log


@events.init_command_line_parser.add_listener
def _add_options(parser, **_kwargs):
    # parser.add_argument, not a group: only its own arguments appear in the web UI
    group = parser

    def env(name, default):
        return os.environ.get(name, default)

    group.add_argument("--mm-spike-base-users", type=int, env_var="MMSERVER_SPIKE_BASE_USERS",
                       default=int(env("MMSERVER_SPIKE_BASE_USERS", 0)),
                       help="users between spikes (0: a fifth of -u)")
    group.add_argument("--mm-spike-base-s", type=float, env_var="MMSERVER_SPIKE_BASE_S",
                       default=float(env("MMSERVER_SPIKE_BASE_S", 20)), help="seconds at the base")
    group.add_argument("--mm-spike-peak-s", type=float, env_var="MMSERVER_SPIKE_PEAK_S",
                       default=float(env("MMSERVER_SPIKE_PEAK_S", 10)), help="seconds at the peak (-u)")
    group.add_argument("--mm-spike-cycles", type=int, env_var="MMSERVER_SPIKE_CYCLES",
                       default=int(env("MMSERVER_SPIKE_CYCLES", 2)), help="number of spikes")
    group.add_argument("--mm-spike-spawn-rate", type=float, env_var="MMSERVER_SPIKE_SPAWN_RATE",
                       default=float(env("MMSERVER_SPIKE_SPAWN_RATE", 0)),
                       help="users started/stopped per second at a step (0: the peak, ~1 s)")


class SpikeUser(OneModelUser):
    """Closed loop; SpikeShape steps how many of them run."""


def spike_stages(options) -> list[tuple[float, int]]:
    """(duration s, users) for each step of the spike."""
    peak = max(1, int(options.num_users or 1))
    base = options.mm_spike_base_users or max(1, peak // 5)
    stages = []
    for _ in range(max(1, options.mm_spike_cycles)):
        stages += [(options.mm_spike_base_s, base), (options.mm_spike_peak_s, peak)]
    return stages + [(options.mm_spike_base_s, base)]


class SpikeShape(LoadTestShape):
    use_common_options = True  # -u is the peak

    def tick(self):
        options = self.runner.environment.parsed_options
        elapsed, end = self.get_run_time(), 0.0
        for duration, users in spike_stages(options):
            end += duration
            if elapsed < end:
                rate = options.mm_spike_spawn_rate or max(1, int(options.num_users or 1))
                return users, rate
        return None


def spike_chosen(environment) -> bool:
    named = list(getattr(environment.parsed_options, "user_classes", None) or [])
    if named:
        return SpikeUser.__name__ in named
    return [c.__name__ for c in environment.user_classes] == [SpikeUser.__name__]


@events.init.add_listener
def _shape_only_when_chosen(environment, **_kwargs):
    if isinstance(environment.shape_class, SpikeShape) and not spike_chosen(environment):
        environment.shape_class = None
    elif isinstance(environment.shape_class, SpikeShape):
        log.info("SpikeShape drives this run: %s", spike_stages(environment.parsed_options))

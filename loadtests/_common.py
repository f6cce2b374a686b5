"""What every scenario shares: options, model set-up and tear-down, payloads, request names.

Locust imports every ``*.py`` file of ``loadtests/`` whose name does not start
with ``_`` as a locustfile, so this module (and ``__init__``) is not one; the
scenario files import it as ``loadtests._common`` and so share one copy and
one set of event listeners per process.

Model set-up. Each user class names the models it needs in
``required_models(options) -> {server name: example name}``. On
``test_start`` the master (or the only process) loads the models of the user
classes *chosen for this run* with ``POST /models``; a 409 (already loaded or
loading) is fine and the model is then left alone. It remembers the names it
loaded itself (``owned``) and unloads exactly those on ``test_stop``, so the
server is left with the models it had. In locust's distributed mode
(``--processes``) the master tells the workers which names it owns (the churn
user only ever unloads those) and, when ``--run-time`` ends a headless run,
unloads them once the workers have been told to quit (locust fires the
master's ``test_stop`` before its workers stop).

Request names (rows of locust's statistics):

``invoke <model>``
    a 200 answer; its latency is the latency to report.
``invoke <model> (shed 503)``
    a 503 "queue full" answer (type ``QueueFull``), for scenarios where shedding
    is the expected outcome of the offered load (open loop, overload): counted,
    not a failure. A 503 for another reason (``EngineUnavailable``,
    ``ReplicaUnavailable``, ``ModelStillLoading``, ``ModelUnhealthy``, ``ShuttingDown``) is
    a failure whose message names its type.
``invoke <model> (model unloaded)``
    a 404 from a model the churn user has just unloaded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
import urllib.error
import urllib.request
from pathlib import Path

import gevent
from locust import FastHttpUser, events, task
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadtests._names import (
    DEFAULT_EXAMPLES_DIR,
    EXAMPLES_ENV,
    invoke_name,
    is_shed,
    shed_name,
    unloaded_name,
)
from loadtests._payload import PAYLOADS, payload

log = logging.getLogger("loadtests")

DEFAULT_HOST = "http://127.0.0.1:8080"
#: The error types mmserver answers a 404 with when the model is not (or no longer) there.
UNLOADED_TYPES = {"ModelNotFound", "RunnerClosed"}

#: Loading resnet18 takes about a second on a CPU; allow a slow, busy machine.
MANAGE_TIMEOUT_S = 120.0
OWNED_MESSAGE = "mmserver_loadtests_owned"


# -- command-line options (also in the web UI; locust copies them to workers) ----------


@events.init_command_line_parser.add_listener
def _add_options(parser, **_kwargs):
    # parser.add_argument, not a group: only its own arguments appear in the web UI
    group = parser
    group.add_argument("--mm-examples-dir", default=os.environ.get(EXAMPLES_ENV, str(DEFAULT_EXAMPLES_DIR)),
                       help=f"directory with <example>/model (default: ${EXAMPLES_ENV} or "
                            "build/examples, the `make serve` layout); must be inside the "
                            "server's model root")
    group.add_argument("--mm-model", default="resnet18", choices=sorted(PAYLOADS),
                       help="example model for SteadyUser, OpenLoopUser, SpikeUser, OverloadUser")
    group.add_argument("--mm-think-ms", type=float, default=100.0,
                       help="closed-loop users: pause after each answer, ms")
    group.add_argument("--mm-target-rps", type=float, default=0.0,
                       help="open-loop users (OpenLoopUser, OverloadUser): total arrival rate, "
                            "spread evenly over -u users (0: the class's default)")
    group.add_argument("--mm-models", type=int, default=8,
                       help="ManyModelsUser/ChurnUser: how many copies of the example to load")
    group.add_argument("--mm-many-example", default="tabular", choices=sorted(PAYLOADS),
                       help="ManyModelsUser/ChurnUser: the example loaded under N names")
    group.add_argument("--mm-zipf-s", type=float, default=1.2,
                       help="ManyModelsUser: Zipf exponent of model popularity")
    group.add_argument("--mm-churn-interval", type=float, default=1.0,
                       help="ChurnUser: seconds between unload/reload cycles")
    group.add_argument("--mm-long-fraction", type=float, default=0.2,
                       help="SentencesUser: the share of long texts (loadtests/texts.py's mix)")


def option(environment, name: str, default=None):
    options = environment.parsed_options
    return getattr(options, name, default) if options is not None else default


def examples_dir(environment) -> Path:
    return Path(option(environment, "mm_examples_dir") or os.environ.get(EXAMPLES_ENV)
                or DEFAULT_EXAMPLES_DIR).expanduser().resolve()


def example_url(environment, example: str) -> str:
    return str(examples_dir(environment) / example / "model")


# -- a plain HTTP client for set-up and tear-down (gevent-friendly, no stats) ------------


def http(host: str, method: str, path: str, body: dict | None = None,
         timeout: float = MANAGE_TIMEOUT_S) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(host.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        raise ConnectionError(f"cannot reach mmserver at {host}: "
                              f"{getattr(error, 'reason', error)}") from None
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {"message": raw[:200].decode(errors="replace")}
    return status, parsed if isinstance(parsed, dict) else {"body": parsed}


# -- shared state of one process -----------------------------------------------------------


class _State:
    #: {name: url} this run loaded (master/local), or that the master says it loaded (workers)
    owned: dict[str, str] = {}
    #: -u of the run, for open-loop users: their rate is target / users
    users: int = 1
    #: a master's test_stop came while its workers were still running
    unload_pending: bool = False


STATE = _State()


def host_of(environment) -> str:
    return (environment.host or DEFAULT_HOST).rstrip("/")


def chosen_models(environment) -> dict[str, str]:
    wanted: dict[str, str] = {}
    for user_class in environment.user_classes:
        required = getattr(user_class, "required_models", None)
        if required is not None:
            wanted.update(required(environment.parsed_options))
    return wanted


def load_models(environment, owned: dict[str, str]) -> None:
    """Load the chosen classes' models; record in ``owned`` ({name: url}) those we loaded."""
    host = host_of(environment)
    for name, example in chosen_models(environment).items():
        url = example_url(environment, example)
        status, body = http(host, "POST", "/models", {"model_name": name, "url": url})
        if status == 200:
            owned[name] = url
            log.info("loaded model %s from %s", name, url)
        elif status == 409:
            log.info("model %s already loaded; using it and leaving it loaded", name)
        else:
            raise RuntimeError(f"cannot load model {name!r} from {url} on {host}: HTTP {status} "
                               f"{body.get('message', body)} (is {examples_dir(environment)} "
                               f"inside the server's --model-root? set {EXAMPLES_ENV})")


def unload_models(environment, owned: dict[str, str], attempts: int = 100) -> None:
    """Unload what this run loaded. A 409 is a load still in progress (a churn user
    stopped in the middle of POST /models): wait for it to finish, then unload it."""
    host = host_of(environment)
    for name in owned:
        for _ in range(attempts):
            status, body = http(host, "DELETE", f"/models/{name}")
            if status == 409:
                time.sleep(0.2)
                continue
            if status == 200:
                log.info("unloaded model %s", name)
            elif status != 404:
                log.error("cannot unload model %s: HTTP %d %s", name, status,
                          body.get("message", body))
            break
        else:
            log.error("model %s was still loading after %d tries; it may stay loaded",
                      name, attempts)


@events.init.add_listener
def _on_init(environment, runner, **_kwargs):
    if isinstance(runner, WorkerRunner):
        def receive(environment, msg, **_kw):
            STATE.owned = dict(msg.data["owned"])
            STATE.users = int(msg.data["users"])
        runner.register_message(OWNED_MESSAGE, receive)


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs):
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        return
    STATE.users = max(1, int(option(environment, "num_users", 1) or 1))
    STATE.unload_pending = False
    STATE.owned = {}
    try:
        load_models(environment, STATE.owned)
    except Exception as error:  # noqa: BLE001 - report, stop the run (unloading what did load)
        log.error("%s", error)
        environment.process_exit_code = 1
        gevent.spawn_later(0.1, runner.quit)
    if isinstance(runner, MasterRunner):
        runner.send_message(OWNED_MESSAGE, {"owned": STATE.owned, "users": STATE.users})


@events.test_stop.add_listener
def _on_test_stop(environment, **_kwargs):
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        return
    if option(environment, "csv_prefix", None):
        # locust rewrites its --csv stats once a second and not again at exit, so the file could
        # miss the run's last second (a stalled server's backlog answered at the end, say).
        # The users have stopped: let the writer take one more turn with the final stats.
        gevent.sleep(1.2 * CSV_STATS_INTERVAL_SEC)
    if isinstance(runner, MasterRunner) and runner.user_count > 0:
        # Headless --run-time/quit: locust stops the master before its workers; unloading
        # now would turn their last requests into 404s. Unload on `quitting` instead.
        STATE.unload_pending = True
        return
    _unload_owned(environment)


@events.quitting.add_listener
def _on_quitting(environment, **_kwargs):
    if STATE.unload_pending:
        _unload_owned(environment)


def _unload_owned(environment) -> None:
    owned, STATE.owned, STATE.unload_pending = STATE.owned, {}, False
    if owned:
        unload_models(environment, owned)


# -- the users -----------------------------------------------------------------------------


def think_time(user) -> float:
    """Closed loop: pause ``--mm-think-ms`` after each answer (a locust ``wait_time``)."""
    return max(0.0, float(option(user.environment, "mm_think_ms", 100.0))) / 1000.0


def poisson_arrivals(rate_per_second):
    """A locust ``wait_time`` for open-loop users, as ``constant_pacing`` is for paced ones.

    Requests leave at the times of a Poisson process of ``rate_per_second`` (a number, or
    a function of the user), measured from the schedule rather than from the last
    answer, so a slow answer does not lower the rate. A user that falls more than a
    second behind (its answers took longer than the gaps) says so once and sends at once.
    """
    def rate(user) -> float:
        return rate_per_second(user) if callable(rate_per_second) else rate_per_second

    def wait_time(user) -> float:
        now = time.monotonic()
        next_at = getattr(user, "_poisson_next_at", None) or now
        next_at += random.expovariate(rate(user))
        if next_at < now - 1.0 and not getattr(user, "_poisson_behind_logged", False):
            user._poisson_behind_logged = True
            log.warning("%s is more than 1 s behind its open-loop schedule: the run offers "
                        "less than --mm-target-rps; add users (-u)", type(user).__name__)
        user._poisson_next_at = max(next_at, now)
        return user._poisson_next_at - now

    return wait_time


class InvokeUser(FastHttpUser):
    """Invokes a model, classifying the answers (see the module docstring).

    Closed loop by default (``wait_time = think_time``); open-loop classes set
    ``wait_time = poisson_arrivals(...)``.
    """

    abstract = True
    host = DEFAULT_HOST
    #: 503 counts as shed load under its own name instead of as a failure
    shed_ok = False
    wait_time = think_time
    #: requests per second of the whole run when --mm-target-rps is not given (open loop)
    default_target_rps = 20.0

    def per_user_rate(self) -> float:
        target = float(option(self.environment, "mm_target_rps", 0.0) or 0.0)
        if target <= 0:
            target = self.default_target_rps
        return target / max(1, STATE.users)

    # -- requests --
    def invoke(self, model: str, example: str, churned: bool = False, label: str | None = None,
               body: bytes | None = None, headers: dict[str, str] | None = None):
        """One invocation of ``model`` with ``example``'s one-row body, or ``body`` and
        ``headers`` when given; ``label`` names its rows in the statistics."""
        if body is None:
            body, headers = payload(example)
        name = invoke_name(label or model)
        with self.client.post(f"/models/{model}/invoke", data=body, headers=headers,
                              name=name, catch_response=True) as response:
            status = response.status_code
            if status == 200:
                if not (response.content or b"").startswith((b"[", b"{")):
                    response.failure(f"200 without a JSON body: {response.content[:80]!r}")
            elif self.shed_ok and is_shed(status, _error_type(response)):
                response.request_meta["name"] = shed_name(label or model)
                response.success()
            elif status == 404 and churned and _error_type(response) in UNLOADED_TYPES:
                response.request_meta["name"] = unloaded_name(label or model)
                response.success()
            else:
                response.failure(f"HTTP {status}: {(response.content or b'')[:200]!r}")


def _error_type(response) -> str | None:
    try:
        return json.loads(response.content).get("type")
    except (ValueError, TypeError, AttributeError):
        return None


def zipf_weights(n: int, s: float) -> list[float]:
    weights = [1.0 / math.pow(rank, s) for rank in range(1, n + 1)]
    total = sum(weights)
    return [w / total for w in weights]


class OneModelUser(InvokeUser):
    """Invokes ``--mm-model`` and nothing else (the steady, spike and overload scenarios)."""

    abstract = True

    @classmethod
    def required_models(cls, options):
        return {options.mm_model: options.mm_model}

    @task
    def invoke_model(self):
        model = self.environment.parsed_options.mm_model
        self.invoke(model, model)


class OpenLoopModelUser(OneModelUser):
    """Open loop on ``--mm-model``: Poisson arrivals at ``--mm-target-rps / -u`` per user,
    so the run offers ``--mm-target-rps`` in all whatever the latency; 503s are shed.

    A user is one connection, so it can only keep its schedule while it is idle: give
    ``-u`` at least the target rate times the worst latency (or the server's queue
    length when it is overloaded).
    """

    abstract = True
    shed_ok = True
    wait_time = poisson_arrivals(lambda user: user.per_user_rate())

    def on_start(self):
        # The first arrival, too, comes after an exponential gap: users start within
        # locust's ramp and their superposition is a Poisson stream from the start,
        # with no burst of first requests.
        gevent.sleep(self.wait_time())

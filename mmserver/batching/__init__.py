"""Request batching: the book's ``ModelRunner``, rebuilt without its defects.

Many clients each send a few rows; a model is far cheaper per row when it sees
many rows at once. A ``ModelRunner`` owns one model, queues the requests that
arrive for it, concatenates compatible ones along dimension 0 into one batch,
runs the model once in a worker thread and hands each request back exactly its
own rows.

The knobs, fields of :class:`BatchSettings` (each per runner, so per model):

``max_batch_size`` (default 16, rows)
    The most rows one model call sees. A request with more rows than this runs
    alone; it is never split and never refused. Larger batches raise
    throughput until the model stops getting cheaper per row, and raise the
    latency of every request in the batch by the extra compute.
``max_wait`` (default 0.005 s)
    How long the *oldest* queued request may wait for company before its batch
    runs anyway, measured from its arrival on the loop's monotonic clock.
    0 means never wait for company. It adds at most ``max_wait`` to the
    latency of a request that arrives at a quiet moment.
``max_queue_size`` (default 256, requests)
    Requests admitted but not yet running (queued, being decoded, or in a full
    batch waiting behind the running call). When it is full,
    :meth:`ModelRunner.reserve` and :meth:`ModelRunner.submit` raise
    :class:`QueueFull` at once, before any work is done for that request, so
    an overloaded server sheds load instead of growing an unbounded backlog.
``policy`` (default ``"greedy"``)
    ``"timer"`` is the book's rule: a batch runs when ``max_batch_size`` rows
    are queued or the oldest request has waited ``max_wait``.
    ``"greedy"`` runs whatever is queued as soon as the model is idle; while
    the model is busy, requests accumulate and form the next batch. It waits
    for company (at most ``max_wait``) only for requests that are known to be
    on their way: admitted with :meth:`ModelRunner.reserve` and still being
    decoded. A lone request to an idle model never waits. With
    ``max_wait = 0`` this is Triton's default dynamic batcher.
``batch_sizing`` (default ``"max"``)
    When a batch counts as full. ``"max"``: at ``max_batch_size`` rows, as in
    Triton, TorchServe and the book. ``"measured"``: at the size, at most
    ``max_batch_size``, that the model's own calls show to serve the most rows
    per second (a :class:`BatchSizer`, ``sizing.py``). On a CPU, where a large
    batch can be slower per row than a smaller one, this raises throughput and
    lowers latency under load; on a GPU it settles at ``max_batch_size``. One
    full batch in 16 is cut to a neighbouring size to keep measuring.

Which requests form the next batch, and how long to wait, is decided by a
:class:`BatchPlanner` (``planner.py``): a pure function of the queue and the
clock, so the policy can be read, tested and changed on its own. A formed batch
is run by a :class:`BatchExecutor` (``execution.py``): the worker thread,
per-request failure isolation and the stuck-call watchdog. The runner
(``runner.py``) ties them together: one way in (:meth:`ModelRunner.reserve`, a
:class:`Reservation`), the queue (``pending.py``), admission (``admission.py``) and the
batching step, which the callback bringing a call's result takes before it writes that
batch's answers, so the next call never waits on them.

Guarantees, whatever the policy:

* Only inputs with the same shape beyond dimension 0, the same dtype and the
  same device share a batch; the oldest queued request decides which. A dict,
  tuple or list of tensors sharing dimension 0 batches like a tensor
  (``rows.py``).
* With ``concatenate=False`` (user code that is not row-wise) each request is
  a model call of its own, still queued, shed and drained like the others.
* A request whose caller was cancelled (the client went away) is dropped
  before its batch is formed.
* If the batched call raises, the runner does not die: the batch is retried
  request by request, so only the failing requests fail. An out-of-memory
  batch is retried in halves before a single request is declared too big.
* Every submitted request is answered exactly once: its result, an exception,
  or :class:`QueueFull`. Stopping the runner answers everything it accepted.
* The model runs in a daemon worker thread under ``torch.inference_mode()``,
  never on the event loop. A call that outlives ``call_timeout`` fails its
  requests, marks the runner unhealthy, and never holds up :meth:`stop`.

The package imports no web framework and, of mmserver, only ``errors`` and
``workers`` (two leaves), so a notebook can run it on its own.
"""

from mmserver.batching.execution import BatchExecutor
from mmserver.batching.failures import is_out_of_memory
from mmserver.batching.planner import BatchPlanner, Plan
from mmserver.batching.reservation import Reservation
from mmserver.batching.runner import ModelRunner
from mmserver.batching.settings import KNOBS, POLICIES, SIZINGS, BatchSettings, Knob
from mmserver.batching.sizing import BatchSizer
from mmserver.batching.stats import BatchRecord, RunnerStats
from mmserver.errors import (
    InvocationTimeout,
    ModelError,
    ModelOutOfMemory,
    ModelUnhealthy,
    QueueFull,
    RunnerClosed,
    summarize_error,
)

__all__ = [
    "KNOBS",
    "POLICIES",
    "SIZINGS",
    "BatchExecutor",
    "BatchPlanner",
    "BatchRecord",
    "BatchSettings",
    "BatchSizer",
    "InvocationTimeout",
    "Knob",
    "ModelError",
    "ModelOutOfMemory",
    "ModelRunner",
    "ModelUnhealthy",
    "Plan",
    "QueueFull",
    "Reservation",
    "RunnerClosed",
    "RunnerStats",
    "is_out_of_memory",
    "summarize_error",
]

"""The book's request-batching ``ModelRunner``, kept with its defects on purpose.

This is the design of *Deep Learning with PyTorch* (Stevens, Antiga, Viehmann),
chapter 15, "Request batching" (``p3ch15/request_batching_server.py`` in the
public repository deep-learning-with-pytorch/dlwpt-code), restated without the
web server so that a notebook can drive it with simulated clients. Notebook 02
builds it up piece by piece; notebook 03 imports it from here to reproduce
what breaks. The finished, fixed runner is :class:`mmserver.batching.ModelRunner`;
nothing in ``mmserver`` imports this module.

The design, in one paragraph: every request handler calls
:meth:`ModelRunner.process_input`, which appends a small dict (the input, an
``asyncio.Event`` to be told when the answer is ready, the arrival time) to a
plain list under an ``asyncio.Lock``. If ``max_batch_size`` inputs are queued
it sets the ``needs_processing`` event at once; otherwise it arms a
``loop.call_at`` timer that sets it when the oldest input has waited
``max_wait``. One long-running coroutine, :meth:`ModelRunner.model_runner`,
waits for that event, takes up to ``max_batch_size`` inputs off the front of
the list, ``torch.stack``-s them, runs the model in a worker thread
(``run_in_executor``), and hands each row back by setting that request's event.
A request that finds ``max_queue_size`` inputs already queued is refused with
"I'm too busy" (HTTP 503 in the book).

Defects kept here on purpose (the numbers are those of ``docs/design.md`` section 2):

2. An exception in the model (or in ``torch.stack``) ends ``model_runner``: the
   requests of that batch are never answered and nothing empties the queue again.
3. ``schedule_processing_if_needed`` overwrites the previous timer handle
   without cancelling it. With ``max_batch_size >= 3`` a stale timer can wake
   the runner on an empty queue, and ``torch.stack([])`` kills it.
4. A caller that stops waiting (its client disconnected, its task was
   cancelled) stays in the queue and is computed anyway.
5. A lone request waits the full ``max_wait`` even when the model is idle.
7. No ``torch.inference_mode()`` (outputs carry an autograd graph) and the
   device is hard-coded.

Changes from the printed code, each needed to run it outside the Sanic app:

* The model is passed in (the book loads a CycleGAN by name), and the three
  constants are keyword arguments that default to the book's values, so that
  notebook 03 can set ``max_batch_size=3`` to trigger defect 3.
* The event loop is the running loop, captured when :meth:`model_runner`
  starts (the book uses the Sanic app's loop). Start ``model_runner`` as a task
  before the first ``process_input``, as the book's ``app.add_task`` does.
* Defect 1 is fixed here: the book creates its lock and events with
  ``loop=app.loop``, an argument Python 3.10 removed. The primitives are made
  by two one-line methods, :meth:`ModelRunner.make_lock` and
  :meth:`ModelRunner.make_event`, without ``loop=``;
  :class:`ModelRunnerAsPrinted` overrides them to pass ``loop=`` as the book
  does, so notebook 02 can show the ``TypeError`` it raises today.
* Logging is left out.
"""

from __future__ import annotations

import asyncio

import torch

# The book's constants; each is the default of the matching keyword argument.
MAX_QUEUE_SIZE = 3  # requests that may wait; one more is answered "I'm too busy" (503)
MAX_BATCH_SIZE = 2  # the most inputs stacked into one model call
MAX_WAIT = 1  # seconds the oldest queued input waits for company before its batch runs anyway

# Where batches run. Hard-coded, as in the book (defect 7).
DEVICE = torch.device("cpu")


class HandlingError(Exception):
    """The book's way to carry an HTTP status out of the request handler.

    ``handling_code`` 503 with the message "I'm too busy" is the only one the
    runner raises: the queue was full, come back later.
    """

    def __init__(self, msg: str, code: int = 500):
        super().__init__(msg)
        self.handling_code = code
        self.handling_msg = msg


class ModelRunner:
    """One model, one queue, one batching coroutine: the book's design and its defects.

    ``model`` maps a batch (inputs stacked along a new dimension 0) to a batch
    of outputs, one row per input. Each request sends one input *without* a
    batch dimension; :meth:`process_input` returns its output row.
    """

    def __init__(
        self,
        model,
        *,
        max_queue_size: int = MAX_QUEUE_SIZE,
        max_batch_size: int = MAX_BATCH_SIZE,
        max_wait: float = MAX_WAIT,
    ):
        self.model = model
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.queue = []  # oldest first; each entry a dict: input, done_event, time, then output
        self.queue_lock = None  # made by model_runner, on the loop that serves requests
        self.needs_processing = None  # set when a batch should be formed now
        self.needs_processing_timer = None  # handle of the last timer armed (not of every timer)
        self.loop = None  # the event loop model_runner runs on

    def make_lock(self) -> asyncio.Lock:
        """The lock that guards ``queue`` (the book: ``asyncio.Lock(loop=app.loop)``)."""
        return asyncio.Lock()

    def make_event(self) -> asyncio.Event:
        """An event (the book: ``asyncio.Event(loop=app.loop)``)."""
        return asyncio.Event()

    def schedule_processing_if_needed(self):
        """Decide, with the lock held, when the next batch should be formed.

        A full batch is ready: wake the runner now. Otherwise, if anything is
        queued, arm a timer for the moment the oldest input has waited
        ``max_wait``. Defect 3: the previous handle is overwritten, not
        cancelled, so only the last timer can ever be cancelled. Defect 5: a
        lone input waits for that timer even when the model has nothing to do.
        """
        if len(self.queue) >= self.max_batch_size:
            self.needs_processing.set()
        elif self.queue:
            oldest_deadline = self.queue[0]["time"] + self.max_wait
            self.needs_processing_timer = self.loop.call_at(
                oldest_deadline, self.needs_processing.set
            )

    async def process_input(self, input):
        """Queue one input, wait until the runner answers it, return its output row.

        Raises ``HandlingError`` (code 503, "I'm too busy") when the queue is
        full. Defect 4: if the caller is cancelled while waiting, its entry
        stays in the queue and the model still computes it.
        """
        our_task = {
            "done_event": self.make_event(),
            "input": input,
            "time": self.loop.time(),
        }
        async with self.queue_lock:
            if len(self.queue) >= self.max_queue_size:
                raise HandlingError("I'm too busy", code=503)
            self.queue.append(our_task)
            self.schedule_processing_if_needed()
        await our_task["done_event"].wait()
        return our_task["output"]

    def run_model(self, batch):
        """Runs in a worker thread, so the event loop keeps serving meanwhile.

        Defect 7: no ``torch.inference_mode()``, and the device is a constant.
        """
        return self.model(batch.to(DEVICE)).to("cpu")

    async def model_runner(self):
        """The batching loop; start it as a task before the first request arrives.

        Defects 2 and 3: any exception below (the model raising, or
        ``torch.stack`` on an empty list after a stale timer) ends this
        coroutine, and with it all batching.
        """
        self.loop = asyncio.get_running_loop()
        self.queue_lock = self.make_lock()
        self.needs_processing = self.make_event()
        while True:
            await self.needs_processing.wait()
            self.needs_processing.clear()
            if self.needs_processing_timer is not None:
                self.needs_processing_timer.cancel()
                self.needs_processing_timer = None
            async with self.queue_lock:
                to_process = self.queue[: self.max_batch_size]
                del self.queue[: len(to_process)]
                self.schedule_processing_if_needed()
            batch = torch.stack([t["input"] for t in to_process], dim=0)
            result = await self.loop.run_in_executor(None, self.run_model, batch)
            for t, r in zip(to_process, result):
                t["output"] = r
                t["done_event"].set()


class ModelRunnerAsPrinted(ModelRunner):
    """The book's runner with its lock and events made exactly as printed, ``loop=`` included.

    Python 3.10 removed the ``loop`` argument of the asyncio primitives, so on
    today's Python ``model_runner`` raises ``TypeError`` on its first line
    that makes one (defect 1). Notebook 02 uses this class to show it.
    """

    def make_lock(self) -> asyncio.Lock:
        return asyncio.Lock(loop=self.loop)

    def make_event(self) -> asyncio.Event:
        return asyncio.Event(loop=self.loop)

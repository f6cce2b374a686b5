"""HTTP worker processes over one engine process: ``mmserver serve --http-workers N``.

One Python process spends one core on HTTP, body reading and answering, and on a fast
device that core, not the device, is the limit. With ``--http-workers N`` (N > 1):

* the **engine** (``engine``) owns the models: the registry, the memory budget, every
  model's ``ModelRunner`` and the invocation pipeline, exactly as one ``mmserver serve``
  process does. One queue per model, whichever worker a request came through, so
  ``MAX_BATCH_SIZE`` and ``MAX_WAIT`` keep their meaning and a batch fills from every
  worker's requests;
* **N HTTP workers** share the port (``SO_REUSEPORT``: the kernel spreads connections
  over them). Each runs the same aiohttp host (``http.app``) over an ``EngineService``
  (``client``): it parses HTTP, reads and bounds bodies, and sends each operation to the
  engine on a Unix socket (``channel``), answering what the engine answers;
* the **supervisor** (``supervisor``), the process ``mmserver serve`` started, starts the
  engine, waits for its models, starts the workers, and on SIGTERM stops the workers
  first (each answers what it accepted), then the engine.

What crosses a process: the operation and its arguments, pickled; an invocation's body
and answer as bytes inside that message (no tensor is pickled: the engine decodes and
encodes, so a model's own ``input_fn``/``output_fn`` run in the engine, as MMS and
TorchServe run user code in their backend workers). Messages written in one turn of the
event loop leave in one write (``channel.Channel``).

The same engine, holding one model, is what ``"isolation": "process"`` gives a model
(``isolated``): a child of the process that holds the registry, with one process or many,
so that a native crash in that model's code costs only that model.
"""

"""What the tests, benchmarks, load tests and notebooks use around the server, not the server.

``testing`` starts a real server process and talks to it; ``examples`` writes the
example model folders ``make serve`` loads; ``simulated_device`` is a model whose
batches take a published accelerator's time; ``example_code`` is the digits
example's ``code/`` package. None of it is imported by the server itself, apart
from ``--examples`` writing the example folders.
"""

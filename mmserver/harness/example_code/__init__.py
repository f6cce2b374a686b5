"""Source files that ``mmserver.harness.examples`` copies into example model directories.

Each file here is user code in the SageMaker PyTorch convention (it becomes a
model's ``code/inference.py``), kept as a real module so it can be read, linted
and imported by tests. The server never imports this package; it loads the
copy inside the model directory like any other user's code. The files need
nothing from ``mmserver``, so they run under SageMaker's own toolkit too; where
one uses an mmserver error for a better status code, it falls back to
``ValueError`` when mmserver is absent.
"""

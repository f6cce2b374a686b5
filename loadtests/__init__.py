"""Load tests for mmserver: locust scenarios, the batching sweep, and its plots.

``locust -f loadtests`` reads every ``*.py`` file here whose name does not
start with ``_`` (``steady``, ``many_models``, ``spike``, ``overload``, and
``sweep``/``plots``, which define no users and import nothing heavy at the
top). See ``loadtests/README.md`` for the commands.
"""

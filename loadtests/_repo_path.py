"""Put the repository on ``sys.path`` so the scenarios' ``loadtests.*`` imports work.

Locust imports each scenario file on its own, with only the file's folder (and the
current directory) on ``sys.path``; from any other directory than the repository,
``import loadtests`` would fail. Each scenario starts with ``import _repo_path``,
which locust can find next to it.
"""

import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

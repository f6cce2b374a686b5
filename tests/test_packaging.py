"""The install files agree: environment.yml lists what pyproject.toml asks for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted.update(r for r in extra if not r.startswith("mmserver["))
    return {r.replace(" ", "") for r in wanted}


def _environment_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    return {m.group(1) for line in lines[start + 1:]
            if (m := re.match(r"^\s+- (\S+)\s*$", line))}


def test_environment_yml_matches_pyproject():
    assert _environment_requirements() == _pyproject_requirements()


def test_torch_is_pinned_exactly():
    requirements = _pyproject_requirements()
    assert "torch==2.14.1" in requirements
    assert "torchvision==0.29.1" in requirements


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()

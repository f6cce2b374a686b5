"""Print mmserver's runtime requirements from pyproject.toml, one a line.

Used by the Dockerfile so that the pins live in one place (pyproject.toml):

    python docker/requirements.py pyproject.toml --torch   # torch and torchvision
    python docker/requirements.py pyproject.toml           # everything

The torch lines are installed first from TORCH_INDEX_URL, which decides the
build (CPU or a CUDA version); the rest come from the ordinary index.
"""

import re
import sys
import tomllib

TORCH = re.compile(r"^(torch|torchvision)\s*([=<>!~;\[]|$)")


def main(argv: list[str]) -> None:
    path, *flags = argv
    with open(path, "rb") as f:
        requirements = tomllib.load(f)["project"]["dependencies"]
    if "--torch" in flags:
        requirements = [r for r in requirements if TORCH.match(r)]
    print("\n".join(requirements))


if __name__ == "__main__":
    main(sys.argv[1:])

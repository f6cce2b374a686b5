"""Measured-looking figures in the notebooks' markdown, and the constants allowed to stay there.

A notebook's prose may explain, predict, state its settings and cite published constants; a
number measured in the run (or a comparison of measured numbers) is printed by code from the
run's variables, never typed into markdown, where the next run would contradict it. This
module finds what the rule is about: **a figure**, a number followed by a unit of

* time: ``ns``, ``µs``/``us``, ``ms``, ``s``/``sec``/``seconds``, ``min``/``minutes``;
* rate: anything per second (``req/s``, ``requests/s``, ``rows/s``, ``GFLOP/s``, a bare ``/s``,
  ``requests per second``, ``requests per CPU second``), ``rps``, ``Hz``;
* share: ``%``, ``per cent``, and a factor written ``3.5×`` or ``3.5x`` (the sign attached to
  the number and not followed by a letter or digit, so ``3×64×64`` and ``x16`` are shapes and
  names, not factors).

A range or comparison ending in one unit counts each of its numbers (``116–119 req/s``,
``59 against 54 ms``, ``43 -> 120 ms``: two figures each). Code is not prose: inline code
spans, fenced or indented code blocks and link targets are left out before scanning.

``CITED_CONSTANTS`` lists the figures that may stay in markdown: each with its text as it
stands in the markdown, the notebook it stands in, and its source (a publication, or
``"setting NAME"`` for a setting the notebook's code assigns to ``NAME``). A figure is *cited*
when its text is the text of an entry for its notebook. ``tests/test_notebook_prose.py``
holds the notebooks to a ratchet on the uncited figures.

Nothing here imports more than the standard library: ``locust -f loadtests`` imports every
module of this folder whose name does not start with ``_``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

# -- what a figure is -----------------------------------------------------------------------

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
#: words and signs that join the numbers of one range or comparison before a shared unit
_CONNECTOR = r"(?:\s*(?:–|—|-|→|->)\s*|\s+(?:to|and|or|against|vs\.?|versus)\s+)"
_SPACE = r"[ \u00a0\u2009\u202f]?"
_TIME = (r"(?:ns|µs|μs|us|ms|milliseconds?|microseconds?|nanoseconds?|s|secs?|seconds?"
         r"|min|mins|minutes?)")
_RATE = (r"(?:[A-Za-z]*/s(?:ec(?:ond)?)?|rps|Hz|(?:[A-Za-z]+\s+)?per\s+(?:CPU\s+|wall[- ]clock\s+)?"
         r"second)")
_SHARE = r"(?:%|per\s?cent)"
_UNIT = rf"(?:{_RATE}|{_SHARE}|{_TIME})"
_FACTOR = r"(?:×|x)"

FIGURE = re.compile(
    rf"(?<![\w.,/×])(?P<numbers>{_NUMBER}(?:{_CONNECTOR}{_NUMBER})*)"
    rf"(?:{_SPACE}(?P<unit>{_UNIT})(?![\w/])|(?P<factor>{_FACTOR})(?![\w×(]))"
)
_ONE_NUMBER = re.compile(_NUMBER)
#: "200s", "503s": status codes in the plural, not seconds (seconds written without a space
#: need a decimal point: "1.5s")
_STATUS_PLURAL = re.compile(r"\d+s")
#: a range's first number that is a size, not a figure: "at batch 64 to 6.035 ms"
_SIZE_BEFORE = re.compile(r"(?:\bbatch(?:es)?(?: of)?|\bsizes?|\branks?|\bb\s*=)\s*$", re.IGNORECASE)

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INDENTED = re.compile(r"(?:^(?: {4}|\t)(?![*\-+] |\d+\. ).*\n?)+", re.MULTILINE)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_HTML_TAG = re.compile(r"<[^>\n]+>")


@dataclasses.dataclass(frozen=True)
class Figure:
    """One measured-looking figure: its text, how many numbers it holds, where it stands."""

    text: str          #: as it stands in the prose, e.g. ``"116–119 req/s"``
    numbers: int       #: numbers in it: 1, or more for a range or comparison
    kind: str          #: "time", "rate" or "share"
    notebook: str = ""  #: the notebook's file stem, e.g. ``"07_choosing_max_batch_size_and_max_wait"``
    cell: int = -1      #: index of the markdown cell in the notebook


def prose(markdown: str) -> str:
    """``markdown`` without what is code rather than prose: fenced and indented code blocks,
    inline code spans, link targets and HTML tags (each replaced by a space)."""
    text = _FENCE.sub(" ", markdown)
    text = _INDENTED.sub(" ", text)
    text = _CODE_SPAN.sub(" ", text)
    text = _LINK_TARGET.sub("] ", text)
    return _HTML_TAG.sub(" ", text)


def _kind(match: re.Match) -> str:
    if match.group("factor"):
        return "share"
    unit = match.group("unit")
    if re.fullmatch(_SHARE, unit):
        return "share"
    if re.fullmatch(_RATE, unit):
        return "rate"
    return "time"


def figures(markdown: str, notebook: str = "", cell: int = -1) -> list[Figure]:
    """Every measured-looking figure in ``markdown`` (code left out, see ``prose``)."""
    found = []
    text = prose(markdown)
    for match in FIGURE.finditer(text):
        figure = match.group(0)
        if _STATUS_PLURAL.fullmatch(figure):
            continue
        numbers = list(_ONE_NUMBER.finditer(match.group("numbers")))
        if len(numbers) > 1 and _SIZE_BEFORE.search(text[:match.start()]):
            figure = figure[numbers[1].start():]   # the first number is a batch size
            numbers = numbers[1:]
        found.append(Figure(" ".join(figure.split()), len(numbers), _kind(match), notebook, cell))
    return found


def count(found: Iterable[Figure]) -> int:
    """Figures counted as the rule counts them: every number of a range or comparison."""
    return sum(f.numbers for f in found)


# -- the constants allowed in markdown -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cited:
    """A figure allowed in a notebook's markdown: a published constant or a setting."""

    text: str      #: the figure exactly as ``figures`` reports it, e.g. ``"60 s"``
    notebook: str  #: the notebook's file stem
    source: str    #: where it comes from; ``"setting NAME"`` for a setting the code assigns

    @property
    def setting(self) -> str | None:
        """The name of the setting, when the source is one (``"setting MAX_WAIT"``)."""
        match = re.fullmatch(r"setting ([A-Za-z_][A-Za-z0-9_]*)", self.source)
        return match.group(1) if match else None


_NVIDIA = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
           "'Inference performance results' (V100 16GB, FP32, pytorch-21.03), via "
           "mmserver.harness.simulated_device")
_SAGEMAKER_MME = ("AWS, Amazon SageMaker Developer Guide, multi-model endpoints: invoke_endpoint "
                  "answers within 60 s, else ModelNotReadyException")

#: The figures allowed in markdown, notebook by notebook. Each entry's text must stand in its
#: notebook's markdown (a test checks it), so an entry goes when its sentence goes.
CITED_CONSTANTS: tuple[Cited, ...] = (
    Cited("60 s", "09_appendix_one_endpoint_many_machines", _SAGEMAKER_MME),
    Cited("10 ms", "08_latency_for_gpu_throughput", _NVIDIA + " (t(1) of the V100)"),
    Cited("31 ms", "08_latency_for_gpu_throughput", _NVIDIA + " (t(1) times TIME_SCALE)"),
    Cited("0.75 s", "09_appendix_one_endpoint_many_machines", "setting LOAD_SECONDS"),
    Cited("400 ms", "09_appendix_one_endpoint_many_machines", "setting DEVICE_CALL_SECONDS"),
    Cited("1 s", "03_what_breaks_and_how_we_fix_it", "setting MAX_WAIT"),
    Cited("0.2 s", "05_appendix_the_multi_model_contract", "setting SLOW_CALL_S"),
    Cited("100 ms", "13_appendix_locust_scenarios", "loadtests/_common.py: --mm-think-ms's default"),
    Cited("10 seconds", "13_appendix_locust_scenarios",
          "locust, locust/stats.py: CURRENT_RESPONSE_TIME_PERCENTILE_WINDOW = 10, the window of its current "
          "percentiles; its current requests/s counts the 10 s ending 2 s before the last request"),
)


def cited_texts(notebook: str, cited: Sequence[Cited] = CITED_CONSTANTS) -> set[str]:
    return {c.text for c in cited if c.notebook == notebook}


def uncited(found: Iterable[Figure], cited: Sequence[Cited] = CITED_CONSTANTS) -> list[Figure]:
    """The figures of ``found`` that no entry of ``cited`` allows in their notebook."""
    by_notebook: dict[str, set[str]] = {}
    for c in cited:
        by_notebook.setdefault(c.notebook, set()).add(c.text)
    return [f for f in found if f.text not in by_notebook.get(f.notebook, set())]


# -- notebooks --------------------------------------------------------------------------------


def cells(path: Path | str) -> list[dict]:
    """The cells of a notebook file (nbformat 4 JSON), each with its ``source`` as one string."""
    notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for cell in notebook["cells"]:
        source = cell.get("source", "")
        out.append({**cell, "source": "".join(source) if isinstance(source, list) else source})
    return out


def notebook_figures(path: Path | str) -> list[Figure]:
    """Every measured-looking figure in the markdown cells of the notebook at ``path``."""
    stem = Path(path).stem
    found = []
    for index, cell in enumerate(cells(path)):
        if cell["cell_type"] == "markdown":
            found += figures(cell["source"], stem, index)
    return found


def markdown_words(path: Path | str) -> int:
    """Words of prose in the notebook's markdown cells: whitespace-separated tokens holding a
    letter or digit, code spans and blocks left out (a lone ``|`` or ``*`` is no word)."""
    return sum(sum(1 for token in prose(c["source"]).split() if re.search(r"\w", token))
               for c in cells(path) if c["cell_type"] == "markdown")


def assigned_names(path: Path | str) -> set[str]:
    """Names the notebook's code cells assign at the start of a line (``NAME = ...``,
    ``A, B = ...``): where a setting cited as ``"setting NAME"`` must be defined."""
    names: set[str] = set()
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        for line in cell["source"].splitlines():
            match = re.match(r"\s*([A-Za-z_][\w ,]*?)\s*=(?!=)", line)
            if match:
                names.update(n.strip() for n in match.group(1).split(",") if n.strip())
    return names


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtests.claims [-v] [NOTEBOOK ...]``: per notebook, its figures, the uncited
    ones and its words of prose; with ``-v`` every uncited figure and its cell."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args
    paths = [a for a in args if a != "-v"] or sorted(
        str(p) for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    total = total_uncited = 0
    for path in paths:
        found = notebook_figures(path)
        left = uncited(found)
        total, total_uncited = total + count(found), total_uncited + count(left)
        print(f"{Path(path).stem}: {count(found)} figures, {count(left)} uncited, "
              f"{markdown_words(path)} words")
        if verbose:
            for f in left:
                print(f"  [{f.cell}] {f.kind}: {f.text}")
    print(f"all: {total} figures, {total_uncited} uncited")


if __name__ == "__main__":
    main()

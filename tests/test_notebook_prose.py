"""Measured figures belong in the run's output, not in the notebooks' markdown.

A figure typed into markdown (``148 req/s``, ``3.5×``, ``469 µs``) is true of one run and
contradicts the next. ``loadtests.claims`` finds such figures; the markdown may keep only those
listed in ``claims.CITED_CONSTANTS`` (a published constant with its source, or a setting the
notebook's code assigns). This file tests the scanner on synthetic markdown, checks the list
against the notebooks, and holds the committed notebooks to it: no notebook carries an uncited
figure, and all of them together carry at most ``MAX_FIGURES`` cited ones.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loadtests import claims
from loadtests.claims import Cited, Figure

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

#: At most this many figures in the markdown of all notebooks together, appendices included,
#: every one of them a cited constant or a setting (``claims.CITED_CONSTANTS``): what a
#: notebook measured is printed by its code, never typed into its prose.
MAX_FIGURES = 25


def texts(markdown: str) -> list[str]:
    return [f.text for f in claims.figures(markdown)]


# -- the scanner, on synthetic markdown ----------------------------------------------------------


@pytest.mark.parametrize("markdown, expected", [
    ("one call took 24.57 ms here", ["24.57 ms"]),
    ("the server answered 148 req/s", ["148 req/s"]),
    ("it served 148 requests/s, then 96/s", ["148 requests/s", "96/s"]),
    ("1709 requests per second", ["1709 requests per second"]),
    ("876 requests per CPU second", ["876 requests per CPU second"]),
    ("batching on serves 3.5× the requests", ["3.5×"]),
    ("a gain of 1.98x (two hosts), or (1.98x)", ["1.98x", "1.98x"]),
    ("83 % shed, 44% of its core", ["83 %", "44%"]),
    ("five per cent: 5 per cent", ["5 per cent"]),
    ("0.5 s, 2 min, 469 µs, 469 us, 12 ns", ["0.5 s", "2 min", "469 µs", "469 us", "12 ns"]),
    ("a pause of 2 seconds and 1.5s more", ["2 seconds", "1.5s"]),
    ("at 10 Hz or 30 rps", ["10 Hz", "30 rps"]),
    ("about 1,100 requests/s on a V100", ["1,100 requests/s"]),
    ("p99 1338 ms\u00a0and 335\u202fms", ["1338 ms", "335 ms"]),
    ("**148** req/s is bold, 148 **req/s** is not found", []),
    ("## Capacity: 134 req/s", ["134 req/s"]),
])
def test_finds_measured_looking_figures(markdown, expected):
    assert texts(markdown) == expected


@pytest.mark.parametrize("markdown", [
    "3×64×64 inputs and a 3x3 convolution, 1×3×128×128 rows",
    "PCIe 3.0 x16, resnet50v1.5, x3 the time",
    "a batch of 16 rows, the 99th percentile, p99, step 2, §3",
    "t(16)/16 and t(b)/b, b = 2, 4 and 8",
    "the 200s and the 503s, a 507s",
    "`--max-wait-ms 20` and ``148 req/s`` are code",
    "```\nserved 148 req/s\n```",
    "~~~python\nprint('3.5x')\n~~~",
    "text\n\n    limit = 1 / (469 µs + 600 µs)\n\nmore text",
    "[the table](https://example.org/10ms-100%25) and <img width=50%>",
    "5 sizes, 12 models, 4 MiB, 64 KiB, 5.5 MB",
])
def test_leaves_out_what_is_not_a_figure(markdown):
    assert texts(markdown) == []


def test_a_range_or_comparison_counts_each_number():
    found = claims.figures("116–119 req/s; 59 against 54 ms; 43 -> 120 ms; 130-320 ms; "
                           "between 45 and 52 ms; 13.6 to 35.4 ms; 0.3 s")
    assert [(f.text, f.numbers) for f in found] == [
        ("116–119 req/s", 2), ("59 against 54 ms", 2), ("43 -> 120 ms", 2), ("130-320 ms", 2),
        ("45 and 52 ms", 2), ("13.6 to 35.4 ms", 2), ("0.3 s", 1)]
    assert claims.count(found) == 13


def test_a_batch_size_before_a_range_is_not_a_figure():
    found = claims.figures("it rose from 5.847 ms at batch 64 to 6.035 ms at 128")
    assert [(f.text, f.numbers) for f in found] == [("5.847 ms", 1), ("6.035 ms", 1)]


def test_each_figure_has_its_kind_notebook_and_cell():
    found = claims.figures("469 µs, 148 req/s, 3.5×, 44 %", "04_x", 17)
    assert [(f.kind, f.notebook, f.cell) for f in found] == [
        ("time", "04_x", 17), ("rate", "04_x", 17), ("share", "04_x", 17), ("share", "04_x", 17)]


def test_cited_figures_are_allowed_only_in_their_notebook():
    found = [Figure("60 s", 1, "time", "09_a"), Figure("60 s", 1, "time", "01_b"),
             Figure("148 req/s", 1, "rate", "09_a")]
    cited = (Cited("60 s", "09_a", "AWS documentation"),)
    assert claims.uncited(found, cited) == found[1:]
    assert claims.uncited(found, ()) == found


def test_a_setting_names_its_constant():
    assert Cited("0.25 s", "09_a", "setting LOAD_SECONDS").setting == "LOAD_SECONDS"
    assert Cited("60 s", "09_a", "AWS documentation").setting is None


def test_assigned_names_and_words(tmp_path):
    import json

    notebook = tmp_path / "01_x.ipynb"
    notebook.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["Five words, `not this code`, ", "and 148 req/s. |"]},
        {"cell_type": "code", "source": "LOAD_SECONDS = 0.25\nA, B = 1, 2\nif A == B:\n    pass\n"},
    ]}))
    assert claims.assigned_names(notebook) >= {"LOAD_SECONDS", "A", "B"}
    assert "if A" not in claims.assigned_names(notebook)
    assert claims.markdown_words(notebook) == 5   # Five words and 148 req/s.
    assert [(f.text, f.cell) for f in claims.notebook_figures(notebook)] == [("148 req/s", 0)]


# -- the list of cited constants, against the notebooks -------------------------------------------


def test_there_are_notebooks_to_scan():
    assert len(NOTEBOOKS) >= 9, NOTEBOOKS


@pytest.mark.parametrize("entry", claims.CITED_CONSTANTS, ids=lambda c: f"{c.notebook}:{c.text}")
def test_every_cited_constant_stands_in_its_notebook(entry):
    path = ROOT / "notebooks" / f"{entry.notebook}.ipynb"
    assert path.exists(), f"{entry.notebook} is not a notebook"
    assert entry.source.strip(), entry
    assert entry.text in {f.text for f in claims.notebook_figures(path)}, (
        f"{entry.text!r} no longer stands in {entry.notebook}'s markdown: remove the entry")
    if entry.setting is not None:
        assert entry.setting in claims.assigned_names(path), (
            f"{entry.notebook} cites {entry.text!r} as the setting {entry.setting}, "
            "which its code does not assign")


# -- the notebooks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_types_an_uncited_figure(notebook):
    left = claims.uncited(claims.notebook_figures(notebook))
    listing = "\n".join(f"  cell {f.cell}: {f.text}" for f in left)
    assert not left, (
        f"{notebook.stem} carries {claims.count(left)} uncited figures in its markdown: print "
        f"measured numbers from code, or cite the constant in loadtests.claims.CITED_CONSTANTS\n{listing}")


def test_the_notebooks_carry_few_figures_in_their_prose():
    total = sum(claims.count(claims.notebook_figures(p)) for p in NOTEBOOKS)
    assert total <= MAX_FIGURES, (total, MAX_FIGURES)


#: Issue 28's bound on the core path (the notebooks whose names do not contain ``appendix``):
#: a lesson a reader finishes.
CORE_MAX_WORDS = 12_000


def test_the_core_path_is_short_enough_to_finish():
    core = [p for p in NOTEBOOKS if "appendix" not in p.stem]
    words = sum(claims.markdown_words(p) for p in core)
    assert len(core) >= 5 and words <= CORE_MAX_WORDS, (len(core), words)


# -- how a range is written ------------------------------------------------------------------------

#: Two numbers joined by a hyphen: a range written as a subtraction ("3-4", "0.1%-1.0%",
#: "5-20 words"). Names that carry numbers (resnet18-224, mmserver-nb12-) are not ranges.
HYPHEN_RANGE = re.compile(r"(?<![\w.\-/:+])\d+(?:\.\d+)?%?-\d+(?:\.\d+)?%?(?![\w\-/.]*[A-Za-z_/])")


def hyphen_ranges(text: str) -> list[str]:
    return HYPHEN_RANGE.findall(text)


def test_a_range_joined_by_a_hyphen_is_found_and_a_name_is_not():
    assert hyphen_ranges("its largest fell in the 3-4 bin; 0.1%-1.0% of requests; (5-20 words)") == [
        "3-4", "0.1%-1.0%", "5-20"]
    assert hyphen_ranges("resnet18-224 in mmserver-nb12-x, 3–4 rows, 0.1–1.0%, t(b) = 20 ms - 3 ms") == []


def printed_and_prose(notebook: Path) -> list[tuple[int, str]]:
    """Each cell's markdown and the text its outputs printed, as a reader sees them."""
    found = []
    for number, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            found.append((number, "".join(cell["source"])))
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                found.append((number, "".join(output["text"])))
            for kind in ("text/markdown", "text/plain"):
                if kind in output.get("data", {}):
                    found.append((number, "".join(output["data"][kind])))
    return found


#: A negative number in a sentence written with a hyphen ("(-0.30 to 1.23 ms", "share: -4%"),
#: which reads as a dash. Printed arrays and JSON bodies ("[-0.19, -0.14]") are data, not prose.
HYPHEN_MINUS = re.compile(r"(?:(?<=[\s(])|^)(?<!, )-\d+(?:\.\d+)?%?")


def hyphen_minuses(text: str) -> list[str]:
    return HYPHEN_MINUS.findall(text)


def test_a_negative_number_with_a_hyphen_is_found_and_data_are_not():
    assert hyphen_minuses("in this run (-0.30 to 1.23 ms); fixed share: -4% (from −259% to 44%)") == [
        "-0.30", "-4%"]
    assert hyphen_minuses("200  [[-0.1913, -0.1274]]; [-0.3777  0.2459]; slope −0.75; 20 ms - 3 ms; "
                          "resnet18-224; --max-wait-ms") == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_negative_number_a_notebook_prints_has_a_minus_sign(notebook):
    """A negative number in a sentence carries a minus sign (U+2212, ``instruments.signed``)."""
    hyphens = [(cell, found) for cell, text in printed_and_prose(notebook)
               for found in hyphen_minuses(text)]
    assert not hyphens, hyphens


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_range_a_notebook_prints_reads_as_a_range(notebook):
    """A range is written as ``instruments.show_range`` writes it, with an en dash
    (``3–4``, ``0.1–1.0%``); ``3-4`` reads as a subtraction."""
    hyphens = [(cell, found) for cell, text in printed_and_prose(notebook)
               for found in hyphen_ranges(text)]
    assert not hyphens, hyphens

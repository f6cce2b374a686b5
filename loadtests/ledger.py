"""The run's ledger: every quantity the notebooks measured, in one file, checked against itself.

Each notebook records what it measured (an ``instruments.Measurement``: quantity, model,
conditions, value, spread) with :meth:`Ledger.record`. The file is JSON lines, one record per
line, appended, so notebooks run one after another (or a re-run of one) add to the same run's
file. Recording a quantity of a model:

* already recorded under the **same conditions**, the two values must agree within the noise band
  (``definitions.agree``), or :class:`Contradiction` is raised: a cross-notebook contradiction
  becomes a failing cell, not a reviewer's finding. One exception: values more than the band
  apart whose ranges over their repeats overlap (``definitions.indistinguishable``) cannot be
  told apart by this run, and the note says so instead of calling them either the same number or
  a contradiction. On a shared machine whose speed drifts, a notebook's noisy measurement spans
  both. Ranges that miss each other fail only when enough repeats stand behind them: when
  ``definitions.chance_apart`` of the two repeat counts (how often one measurement's repeats
  fall apart like that by chance) is at most ``definitions.CHANCE_LEVEL``; three repeats against
  three (one time in ten) are too few, and the note says so. A value that is not positive (a
  fixed share whose noisy line crossed zero) has no ratio to the other, so only its range is
  compared; and a range that reaches across zero pins nothing down, so it is not compared at all;
* recorded by another notebook under **different conditions**, the note returned says which
  conditions differ (t_http at MAX_BATCH_SIZE 1 and 16 are two quantities, and the sentence must
  say which one it means); a notebook's own records under other conditions are not cited back
  to it (its cells compare them);
* with **no earlier record**, the note says that nothing was compared: a notebook run alone must
  not read as if it had agreed with one that did not run.

Which file: ``MMSERVER_LEDGER`` when set (``tests/test_notebooks.py`` gives each test run its
own), else ``results/run-ledger.jsonl`` of the checkout; :meth:`Ledger.clear` starts a new run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import definitions
from loadtests.instruments import Measurement

LEDGER_ENV = "MMSERVER_LEDGER"
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "results" / "run-ledger.jsonl"


class Contradiction(AssertionError):
    """A quantity measured twice under the same conditions, outside the noise band, by enough
    repeats whose ranges miss each other."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the ledger: who measured what."""

    notebook: str
    measurement: Measurement


class Ledger:
    """The run's results file (see the module docstring)."""

    def __init__(self, path: str | Path | None = None, band: float = definitions.NOISE_BAND):
        self.path = Path(path or os.environ.get(LEDGER_ENV) or DEFAULT_PATH)
        self.band = band

    def entries(self) -> list[Entry]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                data = json.loads(line)
                out.append(Entry(data["notebook"], Measurement.from_json(data["measurement"])))
        return out

    def clear(self) -> None:
        """Start a new run: forget every record."""
        self.path.unlink(missing_ok=True)

    def earlier(self, record: Measurement) -> list[Entry]:
        """Entries of the same quantity and model, whatever their conditions."""
        return [e for e in self.entries()
                if (e.measurement.quantity, e.measurement.model) == (record.quantity, record.model)]

    def check(self, record: Measurement, notebook: str) -> list[str]:
        """What recording ``record`` would say, without recording it: one note per earlier
        record of the same quantity and model, or one saying that nothing was compared. Raises
        :class:`Contradiction` when one under the same conditions disagrees beyond the band."""
        notes, own_other = [], 0
        for entry in self.earlier(record):
            before = entry.measurement
            differ = _differences(before.where, record.where)
            if differ and entry.notebook == notebook:
                own_other += 1   # this notebook's other point of the quantity: its cells compare them
                continue
            untold = (f"{record.quantity} of {record.model} cannot be told apart from {entry.notebook}'s: "
                      f"{before.describe()} there; now {record.describe()}. ")
            if differ:
                notes.append(f"{record.quantity} of {record.model} was also measured in {entry.notebook}, under "
                             f"other conditions ({'; '.join(differ)}), so the two are not compared: "
                             f"{before.describe()}.")
            elif any(r.spread[0] <= 0 < r.spread[1] for r in (before, record)):   # a range across zero
                notes.append(f"{record.quantity} of {record.model} is not compared with {entry.notebook}'s: "
                             f"{before.describe()} there; now {record.describe()}. A range that reaches zero or "
                             "below (a pass whose line crossed zero) pins the quantity down to no number the "
                             "other could agree or disagree with.")
            elif before.value > 0 and record.value > 0 and definitions.agree(before.value, record.value, self.band):
                notes.append(f"{record.quantity} of {record.model} agrees with {entry.notebook} within the "
                             f"noise band ({self.band:.0%}): {before.describe()}; now {record.describe()}.")
            elif definitions.indistinguishable(before.spread, record.spread, self.band):
                notes.append(untold + f"The values are more than the noise band ({self.band:.0%}) apart, but "
                             "their ranges over the repeats overlap: this run's noise is too wide to call it "
                             "agreement or a contradiction.")
            elif (chance := definitions.chance_apart(before.repeats, record.repeats)) > definitions.CHANCE_LEVEL:
                notes.append(f"{record.quantity} of {record.model} differs from {entry.notebook}'s by "
                             f"{definitions.value_gap(before.value, record.value):.0%} and their "
                             f"ranges over the repeats miss each other: {before.describe()} there; now "
                             f"{record.describe()}. But {before.repeats} repeats against {record.repeats} of one and "
                             f"the same measurement fall apart like that {chance:.0%} of the time by chance alone, "
                             f"more than the {definitions.CHANCE_LEVEL:.0%} a contradiction needs: too few repeats "
                             "to call it one.")
            else:
                raise Contradiction(
                    f"{notebook} contradicts {entry.notebook}: {record.quantity} of {record.model} under the "
                    f"same conditions is {record.describe()} here against {before.describe()} there, more "
                    f"than the noise band ({self.band:.0%}) apart, and their ranges over {before.repeats} and "
                    f"{record.repeats} repeats miss each other (by chance alone {chance:.2%} of the time)")
        if notes:
            return notes
        if own_other:
            return [f"no other notebook's record of {record.quantity} of {record.model} in this run's ledger: "
                    f"nothing compared ({notebook}'s own records under other conditions are its cells' to judge)."]
        return [f"no earlier record of {record.quantity} of {record.model} in this run's ledger: nothing compared."]

    def record(self, record: Measurement, notebook: str) -> list[str]:
        """Check ``record`` against the ledger (:meth:`check`), then append it; the notes."""
        notes = self.check(record, notebook)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"notebook": notebook, "measurement": record.as_json()}) + "\n")
        return notes


def _differences(before: dict, now: dict) -> list[str]:
    return [f"{key}: {before.get(key, '—')} there, {now.get(key, '—')} here"
            for key in sorted(before.keys() | now.keys()) if _norm(before.get(key)) != _norm(now.get(key))]


def _norm(value):
    """JSON turns tuples into lists: compare what the file would hold."""
    return json.loads(json.dumps(value))

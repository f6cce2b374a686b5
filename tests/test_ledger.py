"""The run's ledger: a quantity measured again under the same conditions must agree within the
noise band, or recording it fails; under other conditions the note says which differ."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from loadtests import definitions, ledger  # noqa: E402
from loadtests.instruments import measurement  # noqa: E402


def t_http(value_us: float, max_batch_size: int = 16, body_bytes: int = 49280, repeats: int = 5):
    value = value_us * 1e-6
    return measurement("t_http", "noop", value, "s", (0.9 * value, 1.1 * value), repeats,
                       {"max_batch_size": max_batch_size, "body_bytes": body_bytes, "clock": "server CPU"},
                       {"mean_batch": 12.5})


@pytest.fixture
def run(tmp_path) -> ledger.Ledger:
    return ledger.Ledger(tmp_path / "run.jsonl")


def test_a_record_comes_back_as_written(run):
    record = t_http(131)
    (note,) = run.record(record, "04")
    assert note == "no earlier record of t_http of noop in this run's ledger: nothing compared."
    (entry,) = run.entries()
    assert (entry.notebook, entry.measurement) == ("04", record)


def test_agreement_within_the_band_is_noted(run):
    run.record(t_http(131), "04")
    (note,) = run.record(t_http(120), "07")
    assert "agrees with 04" in note
    assert len(run.entries()) == 2


def test_a_contradiction_under_the_same_conditions_fails(run):
    """04's 91 µs and 07's 131 µs, both 'through t_http_s', had they been the same conditions,
    five repeats each: ranges that far apart happen by chance 0.8 % of the time."""
    run.record(t_http(91), "04")
    with pytest.raises(ledger.Contradiction, match=r"07 contradicts 04: .* 5 and 5 repeats .* 0\.79%"):
        run.record(t_http(131), "07")
    assert len(run.entries()) == 1       # the contradicting record is not written


@pytest.mark.parametrize("before, now, chance", [(3, 3, "10%"), (7, 3, "2%"), (1, 7, "25%")])
def test_ranges_apart_over_too_few_repeats_cannot_be_told_apart(run, before, now, chance):
    """The same gap as above, over too few repeats: one measurement's repeats fall apart like
    that more often than ``CHANCE_LEVEL``, so the note says so and nothing fails."""
    run.record(t_http(91, repeats=before), "04")
    (note,) = run.record(t_http(131, repeats=now), "07")
    assert "differs from 04's by 44%" in note and "too few repeats to call it one" in note and "agrees" not in note
    assert f"{before} repeats against {now}" in note and f"{chance} of the time" in note
    assert len(run.entries()) == 2


def test_how_many_repeats_a_contradiction_needs():
    """7 against 5 (0.25 %) fails at the 1 % level; 7 against 3 (1.7 %) only at a 2 % level."""
    assert definitions.chance_apart(5, 5) == pytest.approx(2 / 252)
    assert definitions.chance_apart(7, 5) <= definitions.CHANCE_LEVEL < definitions.chance_apart(7, 3)
    assert definitions.chance_apart(1, 1) == 1.0
    with pytest.raises(ValueError):
        definitions.chance_apart(0, 3)


def test_overlapping_ranges_beyond_the_band_cannot_be_told_apart(run):
    """01's fixed share of the small CNN, 52% over 13-76% on a drifting machine, against 10's 39%
    over 37-42%: a third apart, yet each range holds the other's value's neighbourhood."""
    share = lambda value, low, high: measurement("fixed share", "small-cnn", value, "share", (low, high), 5,
                                                 {"clock": "wall", "threads": 1})
    run.record(share(0.52, 0.13, 0.76), "01")
    (note,) = run.record(share(0.39, 0.37, 0.42), "10")
    assert "cannot be told apart from 01's" in note and "agrees" not in note
    assert len(run.entries()) == 2
    # the same gap with ranges that miss each other is a contradiction
    with pytest.raises(ledger.Contradiction, match="07 contradicts 10"):
        run.record(share(0.60, 0.58, 0.62), "07")     # overlaps 01's range, misses 10's (0.37-0.42)


def test_a_value_that_is_not_positive_is_judged_by_its_range(run):
    """CI's quick run of 10: the small CNN's fixed share came out -117 % (its noisy line crossed
    zero). It has no ratio to 01's 45 %; its range decides, and a tight one still fails."""
    share = lambda value, low, high: measurement("fixed share", "small-cnn", value, "share", (low, high), 5,
                                                 {"clock": "wall", "threads": 1})
    run.record(share(0.45, 0.42, 0.51), "01")
    (note,) = run.record(share(-1.17, -2.5, 0.44), "10")
    assert "is not compared with 01's" in note and "reaches zero or below" in note
    notes = run.record(share(0.41, -2.01, 0.66), "04")   # 10's run: 41 % over a range across zero
    assert "is not compared with 01's" in notes[0] and not any("agrees" in note for note in notes)
    with pytest.raises(ledger.Contradiction, match="07 contradicts 01"):
        run.record(share(-1.17, -1.3, -1.0), "07")


def test_other_conditions_are_named(run):
    run.record(t_http(91, max_batch_size=16), "04")
    (note,) = run.record(t_http(254, max_batch_size=1), "07")
    assert "other conditions" in note and "max_batch_size: 16 there, 1 here" in note


def test_a_notebooks_own_other_points_are_not_cited_back_to_it(run):
    """Notebook 06 compares its saturated and overloaded batch times in a verdict; the ledger
    does not then tell it that it measured the same quantity under other conditions."""
    run.record(t_http(91, max_batch_size=16), "06")
    (note,) = run.record(t_http(254, max_batch_size=1), "06")
    assert note.startswith("no other notebook's record of t_http of noop") and "06's own" in note


def test_other_models_and_quantities_do_not_meet(run):
    run.record(t_http(91), "04")
    other = measurement("t_http", "cnn", 300e-6, "s", (3e-4, 3e-4), 1, {"max_batch_size": 16})
    (note,) = run.record(other, "04")
    assert "nothing compared" in note


def test_the_file_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.LEDGER_ENV, str(tmp_path / "env.jsonl"))
    run = ledger.Ledger()
    run.record(t_http(100), "01")
    assert (tmp_path / "env.jsonl").exists()
    run.clear()
    assert run.entries() == []


def test_a_record_read_back_prints_its_tuples_as_tuples(tmp_path):
    """07's ledger quoted 01's record as fit_sizes=[2, 4, 8]; 01 printed fit_sizes=(2, 4, 8)."""
    import json

    from loadtests.instruments import Measurement
    record = measurement("F", "m", 0.01, "s", (0.009, 0.011), 5, {"fit_sizes": (2, 4, 8), "clock": "cpu"})
    back = Measurement.from_json(json.loads(json.dumps(record.as_json())))
    assert back == record and "fit_sizes=(2, 4, 8)" in back.describe()

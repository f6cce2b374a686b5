"""Every verdict the lesson prints, as a pure function of measurement records.

A notebook never types a verdict ("pays", "follows", "fills by itself", "indistinguishable",
"the wait saved"): it calls one of these functions on the records its instruments returned
(``loadtests.instruments.Measurement``) and prints the :class:`Verdict`'s sentence, whose verb
comes from the result. ``lesson.claim(verdict)`` asserts that it holds, where the lesson
depends on it; ``lesson.say(verdict.sentence)`` reports it whichever way it went, where the
reader's machine decides (whether batch 1 lies on the cost line, for one).

Comparisons refuse what cannot be compared (:class:`Incomparable`): two policies at different
offered loads, a served gain against a per-row speedup, an account of the server's core that
leaves ``t_http`` out or reads the model's call on the wall clock.
``tests/test_verdicts.py`` holds each function to records where it must hold and where it
must not, including the counterexamples of the lesson's review.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import definitions
from loadtests.instruments import Measurement, show_values, signed

#: The model's or the server's gain from which batching is worth its added latency at all ...
PAYS_A_LITTLE = 1.2
#: ... and from which it clearly pays (notebook 01's scale).
PAYS = 2.0

#: What each gain is, in the sentence that names it.
GAINS = {"speedup": "the model's per-row speedup (the model alone, in process)",
         "served gain": "the served gain (through the server, its per-call work shared too)"}


class Incomparable(ValueError):
    """Two records that do not measure the same thing under comparable conditions."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim's result: whether it holds, the word the result chose, the sentence to print, and
    the rule it decided by (``rule``), which a notebook states once rather than after every
    verdict that applied it."""

    claim: str
    holds: bool
    word: str
    sentence: str
    rule: str = ""
    #: False where the claim holds only because this run could not rank what it compared (the
    #: saving, say, was not told from noise): not contradicted, and not shown either.
    decided: bool = True

    def __bool__(self) -> bool:
        return self.holds

    def __str__(self) -> str:
        return self.sentence


class Statements:
    """How one notebook states its verdicts: each one's sentence, followed by its rule (in
    brackets) the first time a verdict applies that rule, and never again: the reader has it
    then, and a rule repeated after every verdict buries the verdicts."""

    def __init__(self) -> None:
        self._stated: set[str] = set()

    def state(self, verdict: Verdict, text: str | None = None) -> str:
        """``verdict``'s sentence (or ``text``, a caller's wording of it), with its rule if new."""
        text = verdict.sentence if text is None else text
        if not verdict.rule or verdict.rule in self._stated:
            return text
        self._stated.add(verdict.rule)
        return f"{text} ({verdict.rule})"


def comparable(a: Measurement, b: Measurement, *, same_quantity: bool = True,
               ignore: tuple[str, ...] = ()) -> None:
    """Raise :class:`Incomparable` unless ``a`` and ``b`` are the same quantity under the same
    conditions (``ignore`` lists conditions the comparison is about, e.g. the policy)."""
    if same_quantity and a.quantity != b.quantity:
        raise Incomparable(f"{a.quantity} and {b.quantity} are different quantities")
    wa, wb = a.where, b.where
    differ = [f"{k}: {wa.get(k, '—')} against {wb.get(k, '—')}" for k in sorted(wa.keys() | wb.keys())
              if k not in ignore and wa.get(k) != wb.get(k)]
    if differ:
        raise Incomparable(f"{a.describe()} and {b.describe()} were measured under different conditions: "
                           + "; ".join(differ))


def _gain_name(gain: Measurement) -> str:
    if gain.quantity not in GAINS:
        raise Incomparable(f"{gain.quantity!r} is not a gain: give a speedup or a served gain")
    return GAINS[gain.quantity]


def pays(gain: Measurement) -> Verdict:
    """Whether batching pays, by the gain ``gain`` measured: under ``PAYS_A_LITTLE`` it barely
    pays, from ``PAYS`` it pays, between them a little. The case is settled only when neither
    the gain's noise band nor its range over the repeats reaches a threshold; otherwise the
    sentence names what reaches it (the band, or the repeats' range), says a re-run may sort
    it into the neighbouring case, and the verdict is not ``decided`` (a notebook marks it ≈,
    not ✔). The sentence names which gain it judges (the model's per-row speedup or the
    served gain): the two differ."""
    name, x = _gain_name(gain), gain.value
    if x < PAYS_A_LITTLE:
        word = "barely pays"
    elif x < PAYS:
        word = "pays a little"
    else:
        word = "pays"
    low, high = gain.spread
    near = [t for t in (PAYS_A_LITTLE, PAYS) if definitions.agree(x, t)]
    crossed = [t for t in (PAYS_A_LITTLE, PAYS) if min(low, x) < t <= max(high, x)]
    shown = f"{x:.3f}" if near else f"{x:.2f}"   # near a threshold, enough digits to see which side
    sentence = (f"By {name} of {gain.model}, {shown}× at MAX_BATCH_SIZE {gain.where.get('max_batch_size', '?')}, "
                f"batching {word} (scale: under {PAYS_A_LITTLE}× it barely pays, from {PAYS_A_LITTLE}× a little, "
                f"from {PAYS}× it pays)")
    if near:
        sentence += f"; within the noise band of {near[0]}×, a re-run may sort it into the neighbouring case."
    elif crossed:
        sentence += (f"; its repeats ran {low:.2f}–{high:.2f}×, across {crossed[0]}×, so a re-run may "
                     f"sort it into the neighbouring case.")
    else:
        sentence += "."
    return Verdict("batching pays", x >= PAYS_A_LITTLE, word, sentence,
                   decided=not (near or crossed))


def follows(served: Measurement, predicted_x: float, predicted_by: str = "the serial limits' ratio") -> Verdict:
    """Whether the served gain follows a predicted gain: the same number within the noise band
    (``definitions.agree``). Outside it the sentence says it does not, and by how much; when the
    prediction lies inside the served gain's own range over its repeats, that it cannot tell."""
    _gain_name(served)
    off = served.value / predicted_x - 1
    holds = definitions.agree(served.value, predicted_x)
    low, high = served.spread
    inside = not holds and low <= predicted_x <= high
    word = "follows" if holds else "cannot be told apart from" if inside else "does not follow"
    sentence = (f"The served gain of {served.model} ({served.value:.2f}×) {word} {predicted_by} "
                f"({predicted_x:.2f}×): off by {_signed_share(off)}, "
                + ("within" if holds else "outside") + f" the noise band ({definitions.NOISE_BAND:.0%})")
    sentence += (f", but inside the served gain's own range over its repeats ({low:.2f}–{high:.2f}×)." if inside
                 else ".")
    return Verdict("the served gain follows the prediction", holds, word, sentence)


def _band_edges(edges: list[float]) -> str:
    return (f"the band's edge at {edges[0]:.3f}" if len(edges) == 1 else
            f"both of the band's edges, {edges[0]:.3f} and {edges[1]:.3f}")


def account_explains(served: Measurement, t_http: Measurement, call: Measurement, batch_size: int,
                     efficiency: Measurement | None = None) -> Verdict:
    """Whether the two-part account ``1 / (t_http + t(b)/b)`` explains what one core served.

    ``served``: ``instruments.served_per_cpu_second``; ``t_http``: ``instruments.t_http``;
    ``call``: ``instruments.call_time`` of the same model at ``b`` on the CPU clock. It holds
    only when the account *with* ``t_http`` agrees with the measurement within the noise band
    **and** the account *without* it does not **and** the two accounts differ by more than the
    band (``t_http`` over the band of ``t(b)/b``): an account whose verdict would be the same
    with ``t_http`` set to zero, or that a band's worth of noise could move from one side to
    the other, tests nothing about ``t_http`` (it then says it cannot tell). When the efficiency's
    range over the repeats (``efficiency``, ``instruments.efficiency``'s record, else the served
    rate's range alone) reaches across the band's edge, the sentence says a re-run may differ;
    but where ``t_http`` is too small to set the two accounts apart, no re-run of this size can
    say that it counts, so the word says it cannot tell whether ``t_http`` counts in and the
    sentence says what a re-run may still change.
    """
    if t_http.quantity != "t_http" or not t_http.value > 0:
        raise Incomparable(f"the account needs a measured t_http, got {t_http.describe()}")
    if call.quantity != f"t({batch_size})":
        raise Incomparable(f"the account needs t({batch_size}), got {call.quantity}")
    if call.where.get("clock") != "cpu":
        raise Incomparable(f"the account is per CPU second: t({batch_size}) must be on the CPU clock, "
                           f"got {call.where.get('clock')!r}")
    per_row = call.value / batch_size
    with_http = served.value * (t_http.value + per_row)
    without_http = served.value * per_row
    explains = definitions.agree(with_http, 1.0)
    resolvable = not definitions.agree(with_http, without_http)   # t_http over the band of t(b)/b
    tells = resolvable and not definitions.agree(without_http, 1.0)
    low, high = (efficiency.spread if efficiency is not None else
                 tuple(rate * (t_http.value + per_row) for rate in served.spread))
    edges = [e for e in (1 / (1 + definitions.NOISE_BAND), 1 + definitions.NOISE_BAND) if low <= e <= high]
    if not resolvable and (explains or edges):   # no re-run of this size can say that t_http counts
        word = "cannot tell whether t_http counts in"
    elif edges and (tells or not explains):   # its repeats lie on both sides of the band's edge
        word = "cannot tell, over its repeats, whether it explains"
    elif explains and tells:
        word = "explains"
    elif explains:
        word = "cannot tell whether t_http counts in"
    else:
        word = "does not explain"
    direction = ("served more than the account predicts (the model's calls or the server's own work cost less in "
                 "the server than as measured apart)" if with_http > 1 else "served less than the account predicts")
    places = 3 if edges else 2   # beside the band's edges, to their decimals
    sentence = (f"The account 1 / (t_http + t({batch_size})/{batch_size}) {word} what one core served of "
                f"{served.model}: efficiency {with_http:.{places}f} with t_http ({t_http.value * 1e6:.0f} µs), "
                f"{without_http:.{places}f} without it")
    if word == "explains":
        sentence += f"; only the account with t_http is within the noise band ({definitions.NOISE_BAND:.0%}) of 1."
    elif not resolvable and (explains or edges):
        sentence += (f"; t_http is {t_http.value / per_row:.0%} of t({batch_size})/{batch_size}, so the two accounts "
                     f"differ by less than the noise band ({definitions.NOISE_BAND:.0%}): t_http is too small beside "
                     "the model's call for this measurement to test it")
        sentence += "." if explains else (
            f". Over the repeats the efficiency with t_http ran {low:.3f}–{high:.3f}, reaching across "
            f"{_band_edges(edges)}: a re-run may find the account within the band or beyond it, but not t_http's part.")
    elif explains and not edges:
        sentence += (f"; both are within the noise band ({definitions.NOISE_BAND:.0%}) of 1, so t_http is too "
                     "small beside the model's call for this measurement to test it.")
    elif not edges:
        sentence += f"; the core {direction}, beyond the noise band ({definitions.NOISE_BAND:.0%})"
        sentence += ("; the account without t_http lies within the band, as if the server added far less to each "
                     "request here than the no-op's t_http." if with_http > 1 and definitions.agree(without_http, 1.0)
                     else ".")
    else:
        sentence += (f"; over the repeats the efficiency with t_http ran {low:.3f}–{high:.3f}, reaching across "
                     f"{_band_edges(edges)}: a re-run may sort it either way.")
    return Verdict("the two-part account explains the served rate", explains and tells, word, sentence)


def fills_by_itself(run: Measurement) -> Verdict:
    """Whether greedy's batches filled by themselves at saturation: the mean batch (the
    record's context, from ``instruments.capacity``) at least ``SATURATED_BATCH_SHARE`` of
    its MAX_BATCH_SIZE."""
    mean_batch, cap = run.observed.get("mean_batch"), run.where.get("max_batch_size")
    if mean_batch is None or cap is None:
        raise Incomparable(f"{run.describe()} holds no mean batch and MAX_BATCH_SIZE")
    holds = mean_batch >= definitions.SATURATED_BATCH_SHARE * cap
    word = "filled by themselves" if holds else "did not fill by themselves"
    load = _load_phrase(run, "at this load")
    return Verdict("batches fill by themselves", holds, word,
                   f"{run.model}'s batches {word} {load}: {mean_batch:g} of {cap} rows on average "
                   f"(full means at least {definitions.SATURATED_BATCH_SHARE:.0%}).")


def indistinguishable(a: Measurement, b: Measurement, setting: str = "policy") -> Verdict:
    """Whether two settings' p99s (records with a spread over repeats) cannot be ranked: they
    are not ``definitions.told_apart`` (ranges that miss each other by more than the noise band,
    or over enough repeats), or their values agree within the band (two ranges a millisecond
    apart rank nothing). The sentence says which it was: "not told apart" is what the repeats
    show, not a claim that the two are the same. Refused unless measured under the same
    conditions but ``setting`` (and MAX_WAIT and MAX_BATCH_SIZE, the settings being compared):
    the same offered load above all."""
    comparable(a, b, ignore=(setting, "max_wait_ms", "max_batch_size"))
    holds = not _told_apart(a, b)
    word = "not told apart" if holds else "told apart"
    load = _load_phrase(a, "at one load")
    names = ((a.model, b.model) if a.model != b.model else
             (f"{a.model} under {setting_label(a)}", f"under {setting_label(b)}"))
    return Verdict("the settings are indistinguishable", holds, word,
                   f"{names[0]} and {names[1]} are {word} {load}: p99 {' against '.join(_values(a, b))}"
                   + (f"; {_why_not_apart(a, b)}." if holds else f"{_how_apart(a, b)}."), TOLD_APART_RULE)


def _told_apart(a: Measurement, b: Measurement) -> bool:
    """Whether two settings' records rank them: values beyond the noise band and
    ``definitions.told_apart`` over their repeats. Every verdict that ranks settings asks this."""
    return not definitions.agree(a.value, b.value) and definitions.told_apart(
        a.spread, a.repeats, b.spread, b.repeats, samples_a=a.samples, samples_b=b.samples)


def _gap(gap: float) -> str:
    """A gap between two ranges inside the noise band, to as many places as keep it visibly
    inside: "14.9%", not "15%" beside a band of 15%."""
    return "under 1%" if gap < 0.01 else f"{gap:.1%}" if round(gap, 2) >= definitions.NOISE_BAND else f"{gap:.0%}"


def _how_apart(a: Measurement, b: Measurement) -> str:
    """For two records :func:`_told_apart` ranks although their ranges overlap, or miss each
    other by no more than the noise band, the clause that says what ranked them (the order of
    their repeats), else nothing: a reader who sees two touching ranges ranked is owed the reason."""
    if definitions.indistinguishable(a.spread, b.spread):
        if not (a.samples and b.samples):
            return ""
        lead = "their ranges overlap"
    else:
        gap = definitions.range_gap(a.spread, b.spread)
        if gap > definitions.NOISE_BAND:
            return ""
        lead = f"their ranges miss each other by {_gap(gap)}, inside the noise band ({definitions.NOISE_BAND:.0%})"
    chance = (definitions.rank_chance(a.samples, b.samples) if a.samples and b.samples else
              definitions.chance_apart(a.repeats, b.repeats))
    said = "under 0.1%" if chance < 0.001 else f"{chance:.1%}"
    return (f"; {lead}, but their repeats rank them: chance alone would order {a.repeats} "
            f"against {b.repeats} so consistently {said} of the time")


def _why_not_apart(a: Measurement, b: Measurement) -> str:
    """Why :func:`_told_apart` does not rank ``a`` and ``b``, in the rule's own terms: their
    values within the band, their ranges overlapping (with, where both kept their repeats, the
    chance that repeats of one measurement come out so ordered), or a gap inside the band over
    too few repeats (with the chance that repeats of one measurement part so)."""
    if definitions.agree(a.value, b.value):
        return f"their values lie within the noise band ({definitions.NOISE_BAND:.0%}) of each other"
    if definitions.indistinguishable(a.spread, b.spread):
        if not (a.samples and b.samples):
            return "their ranges over the repeats overlap"
        return (f"their ranges over the repeats overlap, and chance alone would order {a.repeats} repeats "
                f"against {b.repeats} at least as consistently {definitions.rank_chance(a.samples, b.samples):.1%} "
                f"of the time, above {definitions.CHANCE_LEVEL:.0%}")
    gap = definitions.range_gap(a.spread, b.spread)
    chance = definitions.chance_apart(a.repeats, b.repeats)
    return (f"their ranges miss each other by {_gap(gap)}, inside the noise band "
            f"({definitions.NOISE_BAND:.0%}), and {a.repeats} repeats against {b.repeats} part so by chance "
            f"alone {chance:.1%} of the time, above {definitions.CHANCE_LEVEL:.0%}")


#: How every verdict that ranks two records says what :func:`_told_apart` asks (its ``rule``).
TOLD_APART_RULE = (f"Two measurements are told apart only when their values differ by more than the noise band, "
                   f"{definitions.NOISE_BAND:.0%}, and their ranges over the repeats miss each other by more "
                   f"than it too, or their repeats are ordered so consistently that chance alone would order "
                   f"them so at most {definitions.CHANCE_LEVEL:.0%} of the time.")


def wait_saved(greedy: Measurement, waiting: Measurement) -> Verdict:
    """What a MAX_WAIT saved of greedy's device time per request at the *same* offered load
    (``definitions.device_time_saved``): refused at different loads, since batches grow
    with the load whatever the setting. It says "saved" only when the two are told apart
    (:data:`TOLD_APART_RULE`) and the wait's is the smaller; when they are not told apart (values
    within the noise band, or ranges over the repeats that do not rank them) it holds and says
    that this run cannot tell the saving from noise, and why; it fails only when the wait is
    told apart as costing more."""
    if greedy.quantity != "device time per request":
        raise Incomparable(f"the wait's saving is in device time per request, got {greedy.quantity!r}")
    comparable(greedy, waiting, ignore=("policy", "max_wait_ms"))
    saved = definitions.device_time_saved(greedy.value, waiting.value)
    apart = _told_apart(greedy, waiting)
    holds = saved > 0 or not apart
    word = "saved" if apart and saved > 0 else "cost more" if apart else "did not measurably save"
    load = (f"{_load(greedy)} requests/s" if "offered_rps" in greedy.where
            else greedy.where.get("load", "the same load"))
    compared = (f"{' against '.join(_values(waiting, greedy))} without the wait "
                f"({abs(saved):.0%} {'less' if saved >= 0 else 'more'})")
    single = greedy.repeats == 1 and waiting.repeats == 1
    if apart:
        sentence = (f"At {load}, the wait {word} device time per request: {compared}"
                    + ("; one run per setting, told apart by the noise band alone." if single else
                       f"{_how_apart(greedy, waiting)}."))
    else:
        sentence = (f"At {load}, the wait's device time per request was not told apart from greedy's: {compared}; "
                    f"{_why_not_apart(greedy, waiting)}, so this run cannot tell the saving from noise.")
    return Verdict("the wait saved device time", holds, word, sentence, "" if single else TOLD_APART_RULE,
                   decided=apart)


def on_the_line(t1: Measurement, fixed: Measurement, per_row: Measurement,
                same_kernels: Measurement | None = None) -> Verdict:
    """Whether the measured one-row call lies on the cost line (``t(1)`` against ``F + c``
    within the noise band). A property of the reader's CPU kernels, not a law: notebooks print
    it, they do not assert it.

    ``same_kernels``: the same one-row call timed a second time on the very same kernels
    (appendix 10: with oneDNN off, where batch 1 runs none of oneDNN's). Where the two timings
    differ beyond the noise band, the run's own noise is wider than any gap it could report,
    and the verdict places the call on neither side ("not placed", not decided).

    Off the line by the medians, the verdict also asks the passes: where the three records kept
    their rounds (``instruments.call_time``, ``instruments.cost_line``), each pass's ``t(1)``
    over its own ``F + c``. A pass ratio that reaches into the band, or past 1, leaves the side
    unsettled ("unsettled", not decided): the line moves from pass to pass as much as ``t(1)``
    does, and the medians alone would call a gap that the passes do not all show. On the line by
    the medians, a pass ratio beyond the band leaves it unsettled too: the medians alone would
    call a fit that the passes do not all show."""
    if t1.quantity != "t(1)":
        raise Incomparable(f"need the measured t(1), got {t1.quantity!r}")
    comparable(fixed, per_row, same_quantity=False)
    line = fixed.value + per_row.value
    if same_kernels is not None:
        if (same_kernels.quantity, same_kernels.model) != (t1.quantity, t1.model):
            raise Incomparable(f"need a second t(1) of {t1.model}, got {same_kernels.describe()}")
        if not definitions.agree(t1.value, same_kernels.value):
            apart = definitions.value_gap(t1.value, same_kernels.value)
            return Verdict("batch 1 is on the cost line", False, "not placed",
                           f"On this machine this run cannot place {t1.model}'s batch 1: two timings of the same "
                           f"kernels took {t1.value * 1e3:.2f} and {same_kernels.value * 1e3:.2f} ms, {apart:.0%} "
                           f"apart, beyond the noise band ({definitions.NOISE_BAND:.0%}), so t(1) against the line's "
                           f"F + c = {line * 1e3:.2f} ms ({t1.value / line:.2f}×) lies within the run's own noise.",
                           decided=False)
    holds = definitions.agree(t1.value, line)
    ratio = t1.value / line
    passes = _pass_ratios(t1, fixed, per_row)
    unsettled = (f"On this machine this run cannot place {t1.model}'s batch 1: by the medians, t(1) = "
                 f"{t1.value * 1e3:.2f} ms is {ratio:.2f}× the line's F + c = {line * 1e3:.2f} ms, but pass by pass "
                 f"t(1) over that pass's F + c ran {min(passes, default=0):.2f}–{max(passes, default=0):.2f}×, ")
    if holds and passes and not all(definitions.agree(p, 1.0) for p in passes):
        return Verdict("batch 1 is on the cost line", False, "unsettled",
                       unsettled + f"reaching beyond the noise band ({definitions.NOISE_BAND:.0%}), so the passes do "
                       "not say that it lies on the line.", decided=False)
    if not holds and passes:
        near = min(passes) if ratio > 1 else max(passes)   # the pass nearest the line
        crossed = (near > 1) != (ratio > 1)
        if crossed or definitions.agree(near, 1.0):
            return Verdict("batch 1 is on the cost line", False, "unsettled",
                           unsettled + ("crossing 1" if crossed else
                                        f"reaching into the noise band ({definitions.NOISE_BAND:.0%})")
                           + ", so the passes do not say on which side of the line it lies.",
                           decided=False)
    word = "on the line" if holds else "off the line"
    apart = definitions.value_gap(t1.value, line)
    edge = at_band_edge(t1.value, line)
    gap = f"{apart:.1%}" if edge else f"{apart:.0%}"
    each = ""
    if passes:
        each = (f"; pass by pass, each t(1) over its own pass's F + c, {min(passes):.2f}–{max(passes):.2f}×, every "
                "one " + ("within" if holds else "beyond") + " the band")
        if not min(passes) <= ratio <= max(passes):
            each += " (the two medians come from different passes, so their ratio need not lie among the passes')"
    return Verdict("batch 1 is on the cost line", holds, word,
                   f"On this machine {t1.model}'s batch 1 is {word}: by the medians, t(1) = {t1.value * 1e3:.2f} ms "
                   f"against the line's F + c = {line * 1e3:.2f} ms, {ratio:.2f}×, the larger {gap} above the "
                   f"smaller (noise band {definitions.NOISE_BAND:.0%}){each}"
                   + ("; at the band's edge, so a re-run may put it on the other side." if edge else "."))


def _pass_ratios(t1: Measurement, fixed: Measurement, per_row: Measurement) -> tuple[float, ...]:
    """Each pass's ``t(1) / (F + c)``, where the three records kept the same passes; else ()."""
    rounds = {len(r.samples) for r in (t1, fixed, per_row)}
    if len(rounds) != 1 or rounds == {0}:
        return ()
    return tuple(t / (f + c) for t, f, c in zip(t1.samples, fixed.samples, per_row.samples))


#: How close to the noise band a gap must lie for a reported verdict to say a re-run may flip it.
EDGE_SHARE = 0.05


def at_band_edge(a: float, b: float) -> bool:
    """Whether the gap between ``a`` and ``b`` (the larger over the smaller, less one) lies within
    ``EDGE_SHARE`` of the noise band, on either side: a re-run may put it on the other side."""
    return abs(definitions.value_gap(a, b) - definitions.NOISE_BAND) < EDGE_SHARE


def cpu_within_wall(cpu: Measurement, wall: Measurement, source: str) -> Verdict:
    """One call size of one model timed on the calling thread's CPU clock (``cpu``) and, in
    another run (``source``: "notebook 01"), on the wall clock (``wall``). Two quantities, which
    the ledger does not compare; yet one bound joins them: a one-thread call's CPU time cannot
    exceed its wall time. It holds while the CPU time stays under the wall time or within the
    noise band of it; a CPU time beyond the band above says that the call itself ran slower in
    this run (another core, another moment of a shared machine), not that the clocks differ.
    Refused: other quantities or models, the clocks the other way round, more than one thread."""
    if (cpu.quantity, cpu.model) != (wall.quantity, wall.model):
        raise Incomparable(f"need one quantity of one model, got {cpu.describe()} and {wall.describe()}")
    if (cpu.where.get("clock"), wall.where.get("clock")) != ("cpu", "wall"):
        raise Incomparable("need the CPU clock's record first and the wall clock's second")
    if cpu.where.get("threads") != 1 or wall.where.get("threads") != 1:
        raise Incomparable("the CPU time of a call on several threads may exceed its wall time")
    ratio = cpu.value / wall.value
    within = definitions.agree(cpu.value, wall.value)
    holds = within or cpu.value < wall.value
    word = "within the noise band" if within else "under it" if holds else "above it, beyond the noise band"
    band = f"{definitions.NOISE_BAND:.0%}"
    why = ((f" ({band}): above it by {ratio - 1:.0%}, which two runs of a shared machine can differ by; within "
            "one run a one-thread call's CPU time never exceeds its wall time.") if within and ratio > 1 else
           (f" ({band}): below it by {1 - ratio:.0%}, as the bound allows: CPU time leaves out any moment the call "
            "waited for its core.") if within else
           ": CPU time leaves out any moment the call waited for its core, and the two are separate runs of a "
           "shared machine." if holds else
           f" ({band}). A one-thread call's CPU time cannot exceed its wall time, so the call itself ran slower "
           "here (another core, another moment of a shared machine): the two numbers differ by more than "
           "their clocks.")
    return Verdict("a call's CPU time stays within its wall time", holds, word,
                   f"{cpu.quantity} of {cpu.model} on the CPU clock here, {cpu.value * 1e3:.2f} ms, is {ratio:.2f}× "
                   f"the {wall.value * 1e3:.2f} ms {source} timed on the wall clock, {word}{why}")


def passes_on(served: Measurement, model_gain: Measurement) -> Verdict:
    """Whether the server passed the model's gain on: the served gain against the model's
    speedup over its *measured* t(1) (``instruments.speedup_over_t1``), the gain a server that
    added nothing to a request would show, since batching off pays the measured batch-1 call.

    Within the noise band the server passed the gain on; beyond it but not ``definitions.told_apart``
    over the repeats, it cannot be told apart from passing it on (it holds: nothing contradicts
    it). Told apart above, the server added less time
    to each request with batching on than off (a served gain above the model's is possible
    only then), so a batch shared the server's per-call work too; both hold. Below it, the
    server's own work per request ate part of the gain: it does not hold. Refused: the per-row
    ``speedup`` (against ``t₁``, which no server pays), another model, another MAX_BATCH_SIZE.
    """
    if served.quantity != "served gain":
        raise Incomparable(f"need the served gain, got {served.quantity!r}")
    if model_gain.quantity != "speedup over t(1)":
        raise Incomparable(f"the served gain compares with the model's speedup over its measured t(1), "
                           f"not with {model_gain.quantity!r}: a server with batching off pays t(1)")
    if served.model != model_gain.model:
        raise Incomparable(f"the served gain of {served.model} against the speedup of {model_gain.model}")
    b = served.where.get("max_batch_size")
    if b != model_gain.where.get("max_batch_size"):
        raise Incomparable(f"served at MAX_BATCH_SIZE {b}, the speedup at "
                           f"{model_gain.where.get('max_batch_size')}")
    off = served.value / model_gain.value - 1
    if definitions.agree(served.value, model_gain.value):
        word, why = "passed on", f"within the noise band ({definitions.NOISE_BAND:.0%})" + (
            "; near its edge, so a re-run may land outside it." if at_band_edge(served.value, model_gain.value)
            else ".")
    elif not _told_apart(served, model_gain):
        word = "cannot be told apart from passing on"
        why = (f"the repeats do not confirm the gap: the served gain ran "
               f"{served.spread[0]:.2f}–{served.spread[1]:.2f}× over {served.repeats}, the model's "
               f"{model_gain.spread[0]:.2f}–{model_gain.spread[1]:.2f}× over {model_gain.repeats}, and "
               f"{_why_not_apart(served, model_gain)}.")
    elif off > 0:
        word = "passed on and added to"
        why = (f"beyond the noise band ({definitions.NOISE_BAND:.0%}): with batching on, each request cost the "
               "server less beyond the model's call, as timed alone, than with it off (the per-call work a batch "
               "shares, a call that runs faster inside the server than alone with batching on, or a batch-1 request "
               "that costs the server more with a real model than its no-op t_http with batching off).")
    else:
        word = "ate part of"
        why = (f"beyond the noise band ({definitions.NOISE_BAND:.0%}): the server's own work per request "
               "took a share of each request's time that batching did not shrink.")
    head = (f"Through the server {served.model} gained {served.value:.2f}× (served gain) against "
            f"{model_gain.value:.2f}× in process over the measured t(1), at MAX_BATCH_SIZE {b}: ")
    if word == "cannot be told apart from passing on":
        return Verdict("the server passes the model's gain on", True, word, head + (
            f"the served gain came out {_signed_share(off)} against the model's, beyond the noise band "
            f"({definitions.NOISE_BAND:.0%}), but this run cannot tell whether the server added to the gain or "
            f"only passed it on; {why}"), TOLD_APART_RULE, decided=False)
    return Verdict("the server passes the model's gain on", word != "ate part of", word,
                   head + f"the server {word} the model's gain ({_signed_share(off)}), {why}", TOLD_APART_RULE)


def _exceeds(a: float, b: float) -> bool:
    """``a`` larger than ``b`` beyond the noise band (a positive ``a`` exceeds any ``b`` ≤ 0)."""
    return a > 0 and (b <= 0 or (a > b and not definitions.agree(a, b)))


def larger_share_gains_more(share_big: Measurement, speedup_big: Measurement,
                            share_small: Measurement, speedup_small: Measurement) -> Verdict:
    """Whether, of two models, the first, whose fixed share (``instruments.fixed_share``) is the
    larger beyond the noise band, also has the larger per-row speedup (``instruments.speedup``)
    beyond it. It does not hold when the first model's share is not the larger beyond the band
    (the sentence says so) or when its speedup is not. Refused: records of other quantities, a
    share and a speedup of different models, two speedups under different conditions (clock,
    threads, MAX_BATCH_SIZE)."""
    for share, gain in ((share_big, speedup_big), (share_small, speedup_small)):
        if share.quantity != "fixed share" or gain.quantity != "speedup":
            raise Incomparable(f"need a fixed share and a per-row speedup, got {share.quantity!r} and "
                               f"{gain.quantity!r}")
        if share.model != gain.model:
            raise Incomparable(f"the fixed share of {share.model} with the speedup of {gain.model}")
    if share_big.model == share_small.model:
        raise Incomparable(f"two records of one model, {share_big.model}")
    comparable(share_big, share_small)
    comparable(speedup_big, speedup_small)
    big, small = share_big.model, share_small.model
    overlap = definitions.indistinguishable(share_big.spread, share_small.spread)
    shares = f"fixed share {share_big.shown()} against {share_small.shown()}"
    gains = f"per-row speedup {speedup_big.value:.2f}× against {speedup_small.value:.2f}×"
    band = f"noise band {definitions.NOISE_BAND:.0%}" + (
        "; the shares' ranges over the passes overlap, so only their medians rank them" if overlap else "")
    if not _exceeds(share_big.value, share_small.value):
        word = "has no larger fixed share"
        sentence = f"{big} {word} than {small} beyond the {band} ({shares}; {gains})."
    else:
        word = "gained more" if _exceeds(speedup_big.value, speedup_small.value) else "did not gain more"
        sentence = (f"{big} had the larger fixed share, {share_big.shown()} against {share_small.shown()} for "
                    f"{small}, and {word} from a batch than {small} at MAX_BATCH_SIZE "
                    f"{speedup_big.where.get('max_batch_size', '?')}: {gains} ({band}).")
    return Verdict("the larger fixed share gains more", word == "gained more", word, sentence)


def grows_with_padded_tokens(fewer_rows: Measurement, more_rows: Measurement,
                             longer: Measurement) -> Verdict:
    """Whether a text model's call costs by its padded tokens (rows x length) rather than its rows.

    Three ``instruments.padded_call_time`` records of one model and clock: ``fewer_rows`` and
    ``more_rows`` hold the *same* padded tokens in ``k`` times the rows, ``longer`` has
    ``more_rows``'s rows at ``m`` times the tokens. The two models make opposite predictions for
    each pair: padded tokens say 1× and ``m``×, rows say ``k``× and 1×. The verdict asks which
    prediction each measured ratio lies nearer, on a log scale (so the midpoint between 1× and 4×
    is 2×), and holds when both lie nearer padded tokens'.

    Why not "the equal-token pair agrees within the noise band": a call also costs what padded
    tokens do not count (a fixed part, attention's L²), so equal tokens need not cost equally
    (0.92× in one run, 0.85× in another of the same model on a noisy machine), and a claim
    that reads that gap as a finding fails on the machine, not on the model. The midpoint
    leaves a factor of 2 each way when ``k = m = 4``. Otherwise the word says which pair failed:
    the same tokens in more rows costing nearer the rows' prediction (or beyond it the other way,
    fewer rows costing more than padded tokens can say), or more tokens not costing more (a
    device that is not yet full).
    """
    for record in (fewer_rows, more_rows, longer):
        if record.quantity != "t(b, L)":
            raise Incomparable(f"need t(b, L) records, got {record.quantity!r}")
        if record.model != fewer_rows.model:
            raise Incomparable(f"{record.model} and {fewer_rows.model} are different models")
        comparable(fewer_rows, record, ignore=("rows", "length"))
    tokens = {id(r): r.where["rows"] * r.where["length"] for r in (fewer_rows, more_rows, longer)}
    if tokens[id(fewer_rows)] != tokens[id(more_rows)] or fewer_rows.where["rows"] >= more_rows.where["rows"]:
        raise Incomparable("fewer_rows and more_rows must hold the same padded tokens, more_rows in more rows")
    if longer.where["rows"] != more_rows.where["rows"] or tokens[id(longer)] <= tokens[id(more_rows)]:
        raise Incomparable("longer must have more_rows's rows at a greater length")
    k = more_rows.where["rows"] / fewer_rows.where["rows"]
    m = tokens[id(longer)] / tokens[id(more_rows)]
    same_tokens = more_rows.value / fewer_rows.value
    more_tokens = longer.value / more_rows.value
    same = math.sqrt(1 / k) < same_tokens < math.sqrt(k)   # nearer 1× than k× (or 1/k×)
    grows = more_tokens > math.sqrt(m)                     # nearer m× than 1×
    if same and grows:
        word = "grows with padded tokens, not with rows"
    elif same_tokens >= math.sqrt(k):
        word = "grows with rows, not only with padded tokens"
    elif not same:
        word = "is not set by padded tokens alone"
    else:
        word = "is flat here, growing with neither rows nor padded tokens"

    def shape(r: Measurement) -> str:
        return f"{r.where['rows']} × {r.where['length']}"

    sentence = (f"{fewer_rows.model}'s call ({fewer_rows.where['clock']} clock) {word}: the same "
                f"{tokens[id(more_rows)]} padded tokens in {k:g}× the rows took {same_tokens:.2f}× as long "
                f"(t({shape(more_rows)}) = {more_rows.value * 1e3:.2f} ms against t({shape(fewer_rows)}) = "
                f"{fewer_rows.value * 1e3:.2f} ms), where padded tokens predict 1× and rows {k:g}×; {m:g}× the "
                f"tokens in the same rows took {more_tokens:.2f}× (t({shape(longer)}) = {longer.value * 1e3:.2f} ms), "
                f"where padded tokens predict {m:g}× and rows 1×. Padded tokens are followed when the first "
                f"ratio lies between {1 / math.sqrt(k):.2g}× and {math.sqrt(k):.2g}× and the second above "
                f"{math.sqrt(m):.2g}× (the midpoints, on a log scale, between the two predictions).")
    return Verdict("a call costs by its padded tokens", same and grows, word, sentence)


def pick_for_p99_budget(points: list[tuple[Measurement, Measurement]], budget_s: float,
                        setting: str = "batching") -> Verdict:
    """Which setting serves the most within a p99 budget, over the loads each was driven at.

    ``points``: (throughput, p99) record pairs, one per setting (the conditions' ``setting``)
    and load, both from the same windows. Per setting, its best point is the highest throughput
    whose p99 is within ``budget_s``. The pick is the setting with the best such throughput; if
    the runner-up's throughput is not told apart from the pick's (:func:`_told_apart`), the
    tied setting whose p99 there is told apart below every other tied one's is picked, and
    otherwise the sentence says that it cannot choose between them.
    It holds when some setting meets the budget and the pick is told apart from the runner-up.
    A setting listed whose p99 lies within the noise band under the budget (the pick or another),
    and a setting that missed it by less than the band, are said to be so: this run's verdict on
    them may not be the next's.
    """
    best: dict[str, tuple[Measurement, Measurement]] = {}    # per setting, its best (throughput, p99)
    for rate, p99 in points:
        if p99.quantity != "p99" or rate.quantity != "text throughput":
            raise Incomparable(f"need (text throughput, p99) pairs, got ({rate.quantity}, {p99.quantity})")
        if rate.where != p99.where:
            raise Incomparable("a pair's throughput and p99 come from different runs")
        name = rate.where[setting]
        if p99.value <= budget_s and (name not in best or rate.value > best[name][0].value):
            best[name] = (rate, p99)
    missed = sorted({rate.where[setting] for rate, _ in points} - best.keys())
    if not best:
        loads = sorted({str(p99.where.get("clients", "?")) for _, p99 in points}, key=lambda c: (len(c), c))
        where = (f"at the load compared ({loads[0]} clients)" if len(loads) == 1 else
                 f"at any of the loads compared ({', '.join(loads)} clients)")
        return Verdict("a setting meets the p99 budget", False, "no setting meets",
                       f"No setting meets the p99 budget of {budget_s * 1e3:.0f} ms {where}.")
    ranked = sorted((rate for rate, _ in best.values()), key=lambda r: r.value, reverse=True)
    pick = ranked[0]
    tied = [r for r in ranked[1:] if not _told_apart(pick, r)]
    listing = "; ".join(f"{r.where[setting]} {r.value:.1f} texts/s ({r.spread[0]:.1f}–{r.spread[1]:.1f}) "
                        f"at {r.where.get('clients', '?')} client{'' if r.where.get('clients') == 1 else 's'}" for r in ranked)
    p99_of = {r.where[setting]: best[r.where[setting]][1] for r in (pick, *tied)}
    lowest = min(p99_of.values(), key=lambda r: r.value)
    if tied and all(_told_apart(lowest, other) for other in p99_of.values() if other is not lowest):
        word = "pick"
        chosen = lowest.where[setting]
        others = [name for name in p99_of if name != chosen]
        shown = _values(lowest, *(p99_of[name] for name in others))
        sentence = (f"For a p99 budget of {budget_s * 1e3:.0f} ms, {word} {chosen}: its best throughput within the "
                    f"budget cannot be told apart from {_and(others)}'s, since {_why_not_apart(pick, tied[0])}, but its p99 there, "
                    f"{shown[0]}, is told apart below {_and([f'{name} {text}' for name, text in zip(others, shown[1:])])}. "
                    f"Best within the budget: {listing}")
        pick, tied = best[chosen][0], []
    elif tied:
        word = "cannot choose between"
        sentence = (f"For a p99 budget of {budget_s * 1e3:.0f} ms we {word} {pick.where[setting]} and "
                    + ", ".join(r.where[setting] for r in tied) + ": their best throughputs cannot be told "
                    f"apart, since {_why_not_apart(pick, tied[0])}. Best within the budget: {listing}")
    else:
        word = "pick"
        within = "Best within the budget" if len(ranked) > 1 else "The only setting within the budget"
        sentence = f"For a p99 budget of {budget_s * 1e3:.0f} ms, {word} {pick.where[setting]}. {within}: {listing}"
    sentence += (f"; not within it at that load: {', '.join(missed)}." if missed else ".")
    for name in (r.where[setting] for r in ranked):   # the pick's, and every other setting's listed
        near = best[name][1]
        if definitions.agree(near.value, budget_s):
            sentence += (f" The p99 of {name}, {near.value * 1e3:.0f} ms, lies within the noise band "
                         f"({definitions.NOISE_BAND:.0%}) under the budget: a re-run may find it over.")
        elif near.repeats > 1 and near.spread[1] > budget_s:
            sentence += (f" The p99 of {name}, {near.value * 1e3:.0f} ms, ran up to {near.spread[1] * 1e3:.0f} ms over "
                         f"the {near.counted()}, over the budget in some: a re-run may find it over.")
    for name in missed:
        closest = min((p99 for _, p99 in points if p99.where[setting] == name), key=lambda r: r.value)
        if definitions.agree(closest.value, budget_s):
            sentence += (f" The p99 of {name}, {closest.value * 1e3:.0f} ms, missed it by {closest.value / budget_s - 1:.1%}, "
                         f"within the noise band ({definitions.NOISE_BAND:.0%}): a re-run may let it in.")
        elif closest.repeats > 1 and closest.spread[0] <= budget_s:
            sentence += (f" The p99 of {name}, {closest.value * 1e3:.0f} ms, missed it, but ran "
                         f"{closest.spread[0] * 1e3:.0f}–{closest.spread[1] * 1e3:.0f} ms over the "
                         f"{closest.counted()}, within the budget in some: a re-run may let it in.")
    return Verdict("one setting serves the most within the p99 budget", not tied, word, sentence, TOLD_APART_RULE)


def pads_less(candidate: Measurement, baseline: Measurement, setting: str = "batching") -> Verdict:
    """Whether ``candidate``'s calls held less padding than ``baseline``'s at the same load:
    two ``instruments.padding_efficiency`` records under the same conditions but ``setting``.
    It holds when the two are told apart (:func:`_told_apart`) and the candidate's efficiency
    is the higher."""
    if candidate.quantity != "padding efficiency":
        raise Incomparable(f"need padding efficiency records, got {candidate.quantity!r}")
    comparable(candidate, baseline, ignore=(setting,))
    apart = _told_apart(candidate, baseline)
    holds = apart and candidate.value > baseline.value
    if holds:
        word = "padded less than"
    elif not apart:
        word = "cannot be told apart in padding from"
    else:
        word = "padded more than"
    return Verdict("one setting pads less", holds, word,
                   f"At {candidate.where.get('clients', '?')} clients, {candidate.where[setting]} {word} "
                   f"{baseline.where[setting]}: padding efficiency {candidate.value:.2f} "
                   f"({candidate.spread[0]:.2f}–{candidate.spread[1]:.2f} over {candidate.counted()}) against "
                   f"{baseline.value:.2f} ({baseline.spread[0]:.2f}–{baseline.spread[1]:.2f} over "
                   f"{baseline.counted()}), real tokens over the padded tokens the model ran.", TOLD_APART_RULE)

# -- a batching runner alone (notebooks 02 and 03) -------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def timer_on_time(delay: Measurement) -> Verdict:
    """Whether a ``call_at`` timer set its event when it was armed to, every repeat (within
    ``TIMER_TOLERANCE_S`` before and ``SCHEDULING_SLACK_S`` after), and a cancelled one never
    did (``instruments.timer_delay``)."""
    if delay.quantity != "timer delay":
        raise Incomparable(f"need a timer delay, got {delay.quantity!r}")
    armed, (low, high) = delay.where["armed_s"], delay.spread
    fired = delay.observed.get("cancelled_fired")
    on_time = armed - definitions.TIMER_TOLERANCE_S <= low and high < armed + definitions.SCHEDULING_SLACK_S
    holds = on_time and fired is False
    word = "on time" if on_time else "not on time"
    sentence = (f"A timer armed for {_ms(armed)} set its event {word}: after {_ms(delay.value)} "
                f"(from {_ms(low)} to {_ms(high)} over {delay.repeats} timers; on time is from "
                f"{_ms(armed - definitions.TIMER_TOLERANCE_S)} to under {_ms(armed + definitions.SCHEDULING_SLACK_S)}); "
                "a cancelled one " + ("never did." if fired is False else "set it anyway."))
    return Verdict("a timer fires when armed, a cancelled one never", holds, word, sentence)


def own_rows(rows: Measurement) -> Verdict:
    """Whether every answered client got its own input's output back (``instruments.own_rows``)."""
    if rows.quantity != "own rows":
        raise Incomparable(f"need the share of own rows, got {rows.quantity!r}")
    holds = rows.value == 1.0
    word = "its own" if holds else "not always its own"
    return Verdict("each client gets its own row", holds, word,
                   f"Each of the {rows.repeats} answered clients got {word} input back, mirrored"
                   + ("." if holds else f": {rows.value:.0%} of them did."))


def waited_max_wait(wait: Measurement, max_wait_s: float) -> Verdict:
    """Whether a queue wait was the whole MAX_WAIT: at least it (less ``TIMER_TOLERANCE_S``) and
    no more than ``SCHEDULING_SLACK_S`` past it (``instruments.queue_wait``)."""
    if wait.quantity != "queue wait":
        raise Incomparable(f"need a queue wait, got {wait.quantity!r}")
    holds = max_wait_s - definitions.TIMER_TOLERANCE_S <= wait.value < max_wait_s + definitions.SCHEDULING_SLACK_S
    word = "the whole MAX_WAIT" if holds else "not the MAX_WAIT"
    return Verdict("a lone request waits MAX_WAIT", holds, word,
                   f"Client {wait.where.get('client')} waited {wait.value:.3f} s before its batch ran: "
                   f"{word} of {max_wait_s:g} s (from {max_wait_s - definitions.TIMER_TOLERANCE_S:.3f} s to under "
                   f"{max_wait_s + definitions.SCHEDULING_SLACK_S:.3f} s).")


def launched_at_once(wait: Measurement) -> Verdict:
    """Whether a client's call started at once on its arrival: a queue wait under
    ``SCHEDULING_SLACK_S`` (``instruments.queue_wait``)."""
    if wait.quantity != "queue wait":
        raise Incomparable(f"need a queue wait, got {wait.quantity!r}")
    holds = wait.value < definitions.SCHEDULING_SLACK_S
    word = "at once" if holds else "not at once"
    return Verdict("the batch launched at once", holds, word,
                   f"Client {wait.where.get('client')}'s batch launched {word}: {_ms(wait.value)} after it "
                   f"arrived (at once means under {_ms(definitions.SCHEDULING_SLACK_S)}).")


def refused_at_once(refusal: Measurement, expected: Sequence[int]) -> Verdict:
    """Whether exactly the ``expected`` clients were refused, each while the model was running a
    call, and each heard it within ``SCHEDULING_SLACK_S`` (``instruments.refusal_time``)."""
    if refusal.quantity != "longest time to refuse":
        raise Incomparable(f"need a longest time to refuse, got {refusal.quantity!r}")
    refused = list(refusal.observed.get("refused", ()))
    busy = bool(refusal.observed.get("while_busy"))
    quick = refusal.value < definitions.SCHEDULING_SLACK_S
    holds = refused == list(expected) and busy and quick
    word = "at once" if quick else "late"
    return Verdict("a full queue refuses at once", holds, word,
                   f"Clients {_and(map(str, refused))} were refused (503), "
                   + ("each" if busy else "not all") + " while the model was running a batch, "
                   f"and heard it {word}: within {refusal.value * 1e6:.0f} µs of arriving"
                   + ("" if refused == list(expected) else f" (the script expected {list(expected)})") + ".")


def grouped_as(batches: Measurement, expected: Sequence[Sequence[int]], max_batch_size: int) -> Verdict:
    """Whether the model calls held exactly the ``expected`` clients, in order, none over
    ``max_batch_size`` rows (``instruments.batch_sizes``)."""
    if batches.quantity != "batch size":
        raise Incomparable(f"need batch sizes, got {batches.quantity!r}")
    grouping = [sorted(g) for g in batches.observed.get("grouping", ())]
    want = [sorted(g) for g in expected]
    holds = grouping == want and batches.spread[1] <= max_batch_size
    word = "as predicted" if holds else "not as predicted"
    return Verdict("the calls grouped the clients as predicted", holds, word,
                   f"The {batches.repeats} model calls grouped the clients {word}: {grouping}, "
                   f"{batches.value:.2f} rows per call, at most {batches.spread[1]:g} "
                   f"(MAX_BATCH_SIZE {max_batch_size}).")


def wait_costs(timer_p50: Measurement, greedy_p50: Measurement, max_wait_s: float, full_call_s: float) -> Verdict:
    """Whether waiting for company cost the median request about MAX_WAIT: ``timer``'s p50 over
    ``greedy``'s at the same offered load by more than half of MAX_WAIT and less than MAX_WAIT
    plus a full call (``instruments.open_loop_latency``)."""
    comparable(timer_p50, greedy_p50, ignore=("policy",))
    cost = timer_p50.value - greedy_p50.value
    holds = 0.5 * max_wait_s < cost < max_wait_s + full_call_s
    word = "of the order of MAX_WAIT" if holds else "not of the order of MAX_WAIT"
    return Verdict("waiting costs the median request about MAX_WAIT", holds, word,
                   f"At {timer_p50.where.get('offered_rps')} requests/s the median request took "
                   f"{_ms(timer_p50.value)} under `timer` against {_ms(greedy_p50.value)} under `greedy`: "
                   f"waiting for company cost it {ms_between(timer_p50.value, greedy_p50.value)}, {word} "
                   f"({_ms(max_wait_s)}: more than half of it and less than it plus a full call, "
                   f"{_ms(0.5 * max_wait_s)} to {_ms(max_wait_s + full_call_s)}).")


def ms_between(later_s: float, sooner_s: float) -> str:
    """The difference of two times as the sentence prints them (:func:`_ms`, one decimal), so that
    62.5 ms against 12.0 ms reads "50.5 ms" and not the unrounded 50.6."""
    return f"{round(later_s * 1e3, 1) - round(sooner_s * 1e3, 1):.1f} ms"


def kept_up(growths: Sequence[Measurement], bound_s: float, bound_from: str = "") -> Verdict:
    """Whether a runner kept up with its load at every rate of a sweep: the backlog growth
    (``instruments.backlog_growth``: the last quarter of the arrivals against the first)
    stayed under ``bound_s`` at each. A backlog that grew through a run would add about three
    quarters of the run's length times the share by which arrivals outran the runner, far past
    a call. ``bound_from`` says how the bound was worked out, printed beside it. Refused:
    records of another quantity, or of more than one runner."""
    if not growths or any(g.quantity != "backlog growth" for g in growths):
        raise Incomparable("need the backlog growth at each rate")
    if len({g.model for g in growths}) != 1:
        raise Incomparable(f"records of several runners: {sorted({g.model for g in growths})}")
    worst = max(growths, key=lambda g: g.value)
    holds = worst.value < bound_s
    word = "kept up" if holds else "fell behind"
    return Verdict("the runner kept up", holds, word,
                   f"`{worst.model}` {word} " + ("at every rate" if holds else f"at {worst.where.get('offered_rps')} "
                                                 "requests/s")
                   + f": at most, the last quarter of its arrivals took {_ms(abs(worst.value))} "
                   + ("longer than" if worst.value >= 0 else "less than")
                   + f" the first (medians, at {worst.where.get('offered_rps')} requests/s), "
                   + ("under" if holds else "past") + f" {_ms(bound_s)}" + (f", {bound_from}." if bound_from else "."))


def served_the_offered(served_rps: Mapping[str, Sequence[float]], offered_rps: Sequence[float]) -> Verdict:
    """Whether every runner served what was offered at every rate, within the noise band
    (``served_rps[name][i]`` against ``offered_rps[i]``, the same arrivals sent to each). Below
    the ceiling a runner serves at most what arrives, so this finds only a runner that fell
    short: a backlog that grew. A request that failed never reaches it: ``instruments.open_loop``
    waits on every answer and raises the first failure."""
    short = [(name, offered, served) for name, rates in served_rps.items()
             for served, offered in zip(rates, offered_rps, strict=True)
             if not definitions.agree(served, offered)]
    holds = not short
    word = "served what was offered" if holds else "fell short"
    last = [f"`{name}`{' served' if n == 0 else ''} {rates[-1]:.0f}"
            for n, (name, rates) in enumerate(served_rps.items())]
    said = (f"at {offered_rps[-1]:.0f} requests/s offered, "
            + (", ".join(last[:-1]) + " and " if len(last) > 1 else "") + last[-1]
            if holds else
            "; ".join(f"`{name}` served {served:.0f} of {offered:.0f} requests/s" for name, offered, served in short))
    return Verdict("every runner served what was offered", holds, word,
                   f"Every runner {word} at every rate, within the noise band ({definitions.NOISE_BAND:.0%}): "
                   f"{said}. Below the ceiling a runner serves at most what arrives, so this finds only a runner "
                   f"that fell short.")


def answered_in_batches(answered_s: Sequence[float], max_batch_size: int, slack_s: float) -> Verdict:
    """Whether requests sent together were answered in batches, judged from the client's side
    alone (notebook 05, while the model is being unloaded and its metrics are going).

    ``answered_s``: when each answer was read. Answers read within ``slack_s`` of the one before
    form a *wave*, one call's answers; so waves must lie more than ``slack_s`` apart, as calls of
    a slow model do. Batched, ``n`` requests make at most ``ceil(n / B) + 1`` waves (the first
    call may have started on the first arrival alone), none of more than ``B``; one call each
    makes ``n`` waves of one."""
    times = sorted(answered_s)
    waves: list[list[float]] = []
    for seconds in times:
        if waves and seconds - waves[-1][-1] <= slack_s:
            waves[-1].append(seconds)
        else:
            waves.append([seconds])
    most = math.ceil(len(times) / max_batch_size) + 1
    holds = bool(times) and len(waves) <= most and all(len(wave) <= max_batch_size for wave in waves)
    word = "in batches" if holds else "not in batches"
    sizes = ", ".join(str(len(wave)) for wave in waves)
    return Verdict("the requests were answered in batches", holds, word,
                   f"The {len(times)} answers came {word}: {len(waves)} waves of {sizes} (answers read within "
                   f"{_ms(slack_s)} of each other form one), against at most {most} waves of at most "
                   f"{max_batch_size} when batched, {len(times)} of one when not.")


def shares_server_work(t_http_batched: Measurement, t_http_alone: Measurement) -> Verdict:
    """Whether batching shares out part of the server's own work: ``t_http`` at MAX_BATCH_SIZE
    1 exceeds ``t_http`` at the larger MAX_BATCH_SIZE beyond the noise band. The two are
    different quantities (the batch size is a condition of ``t_http``), so the sentence names
    both sizes and the mean batch the server formed. Refused: other quantities, other bodies,
    clients or clocks, or records at the same MAX_BATCH_SIZE."""
    for record in (t_http_batched, t_http_alone):
        if record.quantity != "t_http":
            raise Incomparable(f"need two t_http records, got {record.quantity!r}")
    comparable(t_http_batched, t_http_alone, ignore=("max_batch_size",))
    big, one = t_http_batched.where.get("max_batch_size"), t_http_alone.where.get("max_batch_size")
    if one != 1 or not big or big <= 1:
        raise Incomparable(f"need t_http at MAX_BATCH_SIZE 1 and above it, got {one} and {big}")
    holds = _exceeds(t_http_alone.value, t_http_batched.value)
    word = "shared out part of" if holds else "did not share out"
    return Verdict("batching shares the server's per-call work", holds, word,
                   f"Batching {word} the server's own work per request: t_http at MAX_BATCH_SIZE {big} "
                   f"(mean batch {t_http_batched.observed.get('mean_batch', '?')}) was "
                   f"{t_http_batched.value * 1e6:.0f} µs, and {t_http_alone.value * 1e6:.0f} µs at MAX_BATCH_SIZE 1 "
                   f"(noise band {definitions.NOISE_BAND:.0%}).")


def server_share(t_http: Measurement, call: Measurement, batch_size: int) -> Verdict:
    """Whether the server's own work per request (``t_http`` at MAX_BATCH_SIZE ``b``) is larger
    than the model's share of a batched call, ``t(b)/b`` on the CPU clock. Reported, not
    asserted: which is larger depends on the model and the machine. Refused: a t_http at another
    MAX_BATCH_SIZE, a call at another size or on the wall clock."""
    if t_http.quantity != "t_http" or t_http.where.get("max_batch_size") != batch_size:
        raise Incomparable(f"need t_http at MAX_BATCH_SIZE {batch_size}, got {t_http.describe()}")
    if call.quantity != f"t({batch_size})" or call.where.get("clock") != "cpu":
        raise Incomparable(f"need t({batch_size}) on the CPU clock, got {call.describe()}")
    per_row = call.value / batch_size
    share = t_http.value / (t_http.value + per_row)
    word = "larger" if t_http.value > per_row else "smaller"
    return Verdict("the server's work outweighs the model's share", word == "larger", word,
                   f"At MAX_BATCH_SIZE {batch_size} the server's own work per request (t_http "
                   f"{t_http.value * 1e6:.0f} µs) is {word} than {call.model}'s share of a batched call "
                   f"(t({batch_size})/{batch_size} = {per_row * 1e6:.0f} µs): {share:.0%} of a request's core time, "
                   f"t_http + t({batch_size})/{batch_size}.")


def _wait_pair(greedy: Measurement, waiting: Measurement, quantity: str | None = None) -> None:
    if quantity is not None and greedy.quantity != quantity:
        raise Incomparable(f"need {quantity} records, got {greedy.quantity!r}")
    comparable(greedy, waiting, ignore=("max_wait_ms",))
    if not greedy.where.get("max_wait_ms", 1) < waiting.where.get("max_wait_ms", 0):
        raise Incomparable(f"the first record must have the shorter max_wait: {greedy.where.get('max_wait_ms')} "
                           f"against {waiting.where.get('max_wait_ms')}")


def _ranked(greedy: Measurement, waiting: Measurement, more: str, less: str, same: str) -> str:
    """The word for how the longer wait's record ranks against the shorter's: ``more`` or
    ``less`` when :func:`_told_apart`, else ``same``; the one rule of every wait verdict."""
    if not _told_apart(greedy, waiting):
        return same
    return more if waiting.value > greedy.value else less


def _batches(greedy: Measurement, waiting: Measurement) -> tuple[str, str]:
    _wait_pair(greedy, waiting, "mean batch")
    word = _ranked(greedy, waiting, "fuller", "emptier", "unchanged")
    return word, (f"With max_wait {waiting.where['max_wait_ms']:g} ms the batches of {greedy.model} were {word}: "
                  f"{waiting.value:.1f} rows per call against {greedy.value:.1f} with "
                  f"{greedy.where['max_wait_ms']:g} ms"
                  + (f"; {_why_not_apart(greedy, waiting)}." if word == "unchanged" else
                     f"{_how_apart(greedy, waiting)}."))


def wait_fills_batches(greedy: Measurement, waiting: Measurement) -> Verdict:
    """Whether a longer max_wait made the batches fuller (``instruments.mean_batch``, larger
    beyond the noise band), at the same load. Refused: other conditions, or the longer wait first."""
    word, sentence = _batches(greedy, waiting)
    return Verdict("the wait fills the batches", word == "fuller", word, sentence, TOLD_APART_RULE)


def wait_leaves_batches(greedy: Measurement, waiting: Measurement) -> Verdict:
    """Whether a longer max_wait left the batches as they were (mean batches within the noise
    band), at the same load: what greedy does when no request is ever on its way."""
    word, sentence = _batches(greedy, waiting)
    return Verdict("the wait leaves the batches", word == "unchanged", word, sentence, TOLD_APART_RULE)


def wait_is_a_bound(queued: Measurement, without: Measurement) -> Verdict:
    """Whether max_wait acted as a bound, not a fixed delay: the mean queue wait
    (``instruments.queue_wait``) under half the record's max_wait (a delay held by every
    request of a burst's first call would put the mean above half of it). ``without``: the
    same load's queue wait with max_wait 0 ms, printed beside it: what the requests waited
    for a running call alone."""
    if queued.quantity != "queue wait":
        raise Incomparable(f"need a queue wait, got {queued.quantity!r}")
    wait_s = queued.where.get("max_wait_ms", 0) / 1e3
    if not wait_s > 0:
        raise Incomparable(f"a record with no max_wait tells nothing of it: {queued.describe()}")
    if without.where.get("max_wait_ms") != 0:
        raise Incomparable(f"need the queue wait with max_wait 0 ms beside it, got {without.describe()}")
    _wait_pair(without, queued, "queue wait")
    holds = queued.value < wait_s / 2
    word = "a bound, not a delay" if holds else "as long as a delay"
    return Verdict("max_wait is a bound", holds, word,
                   f"For {queued.model} max_wait {wait_s * 1e3:g} ms was {word}: the mean queue wait was "
                   f"{queued.value * 1e3:.1f} ms, against {without.value * 1e3:.1f} ms with 0 ms (a delay that "
                   f"every request of a burst's first call sat out would put the mean above half of max_wait, "
                   f"{wait_s * 1e3 / 2:g} ms).")


def wait_delays(greedy: Measurement, waiting: Measurement) -> Verdict:
    """Whether a longer max_wait made an answer (``instruments.answer_latency``: the first,
    median or last of a burst) come later, told apart (:func:`_told_apart`, over the bursts), at
    the same load. The sentence says later, sooner, or not told apart, and why not."""
    if not greedy.quantity.endswith(" answer"):
        raise Incomparable(f"need answer latencies, got {greedy.quantity!r}")
    _wait_pair(greedy, waiting, greedy.quantity)
    word = _ranked(greedy, waiting, "later", "sooner", "neither sooner nor later, as far as this run can tell")
    shown = " against ".join(_values(waiting, greedy))
    return Verdict("the wait delays the answer", word == "later", word,
                   f"With max_wait {waiting.where['max_wait_ms']:g} ms the {greedy.quantity} of a burst to "
                   f"{greedy.model} came {word}: {shown} with {greedy.where['max_wait_ms']:g} ms (medians over "
                   f"bursts)" + (f"; {_why_not_apart(greedy, waiting)}." if word.startswith("neither") else
                                 f"{_how_apart(greedy, waiting)}."),
                   TOLD_APART_RULE)


# -- notebook 06: the kind of load, a stall, and a full queue ------------------------------------


def share_bracket(share: tuple[float, float]) -> str:
    """A share's bracket as its histogram gives it, one number when both ends print the same."""
    low, high = f"{share[0] * 100:.1f}", f"{share[1]:.1%}"
    return high if f"{low}%" == high else f"{low}–{high}"


def batches_past_users(largest_batch: float, users: int, open_rps: float, closed_rps: float) -> Verdict:
    """Whether an open loop's batches grew past what ``users`` closed-loop users allow (the
    upper bound of the largest batch's histogram bin against ``users``). Refused unless both
    loads ran at the same mean rate (within twice the noise band: locust's open loop runs a
    little short of what it asks): batches grow with the rate whatever the kind of load."""
    if not definitions.agree(open_rps, closed_rps, 2 * definitions.NOISE_BAND):
        raise Incomparable(f"the open loop ran at {open_rps:.0f} requests/s and the closed loop at "
                           f"{closed_rps:.0f}: different rates, not the same load of another kind")
    holds = largest_batch > users
    word = "grew past" if holds else "did not grow past"
    return Verdict("an open loop's batches grow past the closed loop's users", holds, word,
                   f"At about the same mean rate ({open_rps:.0f} against {closed_rps:.0f} requests/s) the open "
                   f"loop's batches {word} the {users} rows that {users} closed-loop users allow (its largest in a bin "
                   f"up to {largest_batch:g} rows).")


def stall_hidden(closed_share: tuple[float, float], open_share: tuple[float, float],
                 closed_max_s: float, stall_s: float) -> Verdict:
    """Whether a closed loop hid a stall an open loop exposed: the closed loop lived through it
    (its slowest request at least 90 % of the stall) yet its share of slow requests (bracketed,
    ``(low, high)``) lies below the open loop's through the same stall, which is at least 1 %."""
    lived = closed_max_s >= 0.9 * stall_s
    holds = lived and open_share[0] > max(closed_share[1], 0.01)
    word = "hid" if holds else "did not hide"
    return Verdict("a closed loop hides a stall", holds, word,
                   f"The closed loop {word} the {stall_s:g} s stall: its slowest request took {closed_max_s:.2f} s "
                   f"({'it lived through the stall' if lived else 'it never met the stall'}), yet only "
                   f"{share_bracket(closed_share)} of its requests took over {stall_s / 2:g} s, against "
                   f"{share_bracket(open_share)} of the open loop's through the same stall.")


def stall_is_the_cause(with_stall: tuple[float, float], without_stall: tuple[float, float],
                       stall_s: float) -> Verdict:
    """Whether the open loop's share of slow requests is the stall's: with the stall it lies
    above the same load's share without one, and is at least 1 %."""
    holds = with_stall[0] > max(without_stall[1], 0.01)
    word = "is" if holds else "is not"
    return Verdict("the slow share is the stall's", holds, word,
                   f"The open loop's share of requests over {stall_s / 2:g} s {word} the stall's: "
                   f"{share_bracket(with_stall)} with it, {share_bracket(without_stall)} of the same load without it.")


def sheds_cleanly(drain: Measurement, failed: int, max_batch_size: int) -> Verdict:
    """Whether an overloaded server shed the excess and kept working: more 503s per second
    than answers (``instruments.drain_rate``'s context), no request failed, full batches."""
    if drain.quantity != "drain rate":
        raise Incomparable(f"need a drain rate, got {drain.quantity!r}")
    shed, mean_batch = drain.observed["shed_rps"], drain.observed["mean_batch"]
    full = mean_batch >= definitions.SATURATED_BATCH_SHARE * max_batch_size
    holds = shed > drain.value and failed == 0 and full
    word = "shed the excess cleanly" if holds else "did not shed the excess cleanly"
    return Verdict("an overloaded server sheds cleanly", holds, word,
                   f"Overloaded, the server {word}: {shed:.0f} refusals (503) a second against {drain.value:.0f} answers a second, "
                   f"{failed or 'none'} failed, batches of {mean_batch:g} of {max_batch_size} rows on average.")


def queue_bound_holds(wait: Measurement, drain: Measurement, batch: Measurement,
                      max_queue_size: int, max_batch_size: int) -> Verdict:
    """Whether the full queue's bounds at the *measured* drain rate ``X`` hold the median
    accepted wait: ``Q / X`` (admitted as a batch ended) to ``(Q + B) / X``
    (``definitions.full_queue_wait_s``), each widened by the noise band. Refused unless the
    queue stayed full, the bounds' premise: arrivals (at the rate that reached the server)
    refilled the ``B`` places a batch frees within half a batch's time."""
    if (wait.quantity, drain.quantity, batch.quantity) != ("accepted latency", "drain rate", "batch time"):
        raise Incomparable("need an accepted latency, a drain rate and a batch time")
    band = definitions.NOISE_BAND
    least = definitions.least_queue_wait_s(max_queue_size, drain.value)
    most = definitions.full_queue_wait_s(max_queue_size, max_batch_size, drain.value)
    refill = definitions.refill_s(max_batch_size, drain.value + drain.observed["shed_rps"])
    if refill >= 0.5 * batch.value:
        raise Incomparable(f"arrivals refilled a batch's {max_batch_size} places in {refill * 1e3:.0f} ms of a "
                           f"{batch.value * 1e3:.0f} ms batch: the queue did not stay full, so its bounds do not apply")
    holds = (1 - band) * least <= wait.value <= (1 + band) * most
    word = "hold" if holds else "do not hold"
    where = (", outside them" if not holds else
             f", {wait.value / most - 1:.1%} above the upper bound itself, within its {band:.0%} widening"
             if wait.value > most else
             f", {1 - wait.value / least:.1%} below the lower bound itself, within its {band:.0%} widening"
             if wait.value < least else "")
    return Verdict("the queue bounds at the drain rate hold the median wait", holds, word,
                   f"The queue bounds at the drain rate {word} the median wait: {max_queue_size} / "
                   f"{drain.value:.0f} per second = {least * 1e3:.0f} ms at least, ({max_queue_size} + "
                   f"{max_batch_size}) / {drain.value:.0f} per second = {most * 1e3:.0f} ms at most (each widened "
                   f"by {band:.0%}); the median accepted request took {wait.value * 1e3:.0f} ms"
                   f"{where}. The bounds apply because the queue stayed full: arrivals "
                   f"refilled a batch's {max_batch_size} places in about {refill * 1e3:.0f} ms of a "
                   f"{batch.value * 1e3:.0f} ms batch. The drain rate comes from the wait's own window, so this "
                   f"checks the queue's accounting, not a forecast.")


def shedding_costs(capacity: Measurement, drain: Measurement, batch_saturated: Measurement,
                   batch_overloaded: Measurement) -> Verdict:
    """Whether refusing requests slowed the server's full batches beyond the noise band against
    the same batches without shedding (the refusals' work shares the model's core). What it
    answered against its capacity is printed beside it: with calls that cannot overlap, slower
    batches already mean fewer answers. Refused at different MAX_BATCH_SIZEs."""
    sizes = {r.where.get("max_batch_size") for r in (capacity, drain, batch_saturated, batch_overloaded)}
    if len(sizes) != 1:
        raise Incomparable(f"records at different MAX_BATCH_SIZEs: {sorted(map(str, sizes))}")
    holds = batch_overloaded.value > (1 + definitions.NOISE_BAND) * batch_saturated.value
    word = "ran slower" if holds else "did not clearly run slower"
    lost = 1 - drain.value / capacity.value
    return Verdict("shedding slows the batches", holds, word,
                   f"While it shed, the server's batches {word}: they took {batch_overloaded.value * 1e3:.0f} ms "
                   f"against {batch_saturated.value * 1e3:.0f} ms in the run without shedding (noise band "
                   f"{definitions.NOISE_BAND:.0%}; the refusals' work shares the model's core, and two runs of a "
                   f"shared machine differ by its drift too), and it answered {drain.value:.0f}/s while shedding, "
                   f"{lost:.0%} {'short of' if lost >= 0 else 'over'} its capacity of {capacity.value:.0f}/s.")


def capacity_bound_too_short(wait: Measurement, capacity: Measurement, max_queue_size: int,
                             max_batch_size: int) -> Verdict:
    """Whether the queue bound predicted from the capacity (before the overload),
    ``(Q + B) / capacity``, fell short of the median accepted wait under overload by more than
    the noise band; within the band the two cannot be told apart."""
    if capacity.quantity != "capacity" or wait.quantity != "accepted latency":
        raise Incomparable("need a capacity and an accepted latency")
    predicted = definitions.full_queue_wait_s(max_queue_size, max_batch_size, capacity.value)
    holds = wait.value > predicted and not definitions.agree(wait.value, predicted)
    word = ("was too short" if holds else
            "cannot be told apart from the median, within the noise band" if definitions.agree(wait.value, predicted)
            else "was not too short")
    return Verdict("the bound from the capacity is too short", holds, word,
                   f"The upper bound predicted from the capacity, ({max_queue_size} + {max_batch_size}) / "
                   f"{capacity.value:.0f} per second = {predicted * 1e3:.0f} ms, {word}: the median took "
                   f"{wait.value / predicted:.2f} times as long.")


# -- notebook 08: MAX_WAIT on a simulated GPU, and who feeds it ------------------------------------


def _load_phrase(record: Measurement, otherwise: str) -> str:
    """The load a record was measured under, as a sentence puts it: its closed-loop clients (users,
    connections), else its offered rate, else ``otherwise``."""
    where = record.where
    clients = where.get("clients", where.get("users", where.get("connections")))
    if clients is not None:
        return f"with {clients} closed-loop client{'' if clients == 1 else 's'}"
    return f"at {where['offered_rps']:g} requests/s offered" if "offered_rps" in where else otherwise


def _load(record: Measurement) -> str:
    load = record.where.get("offered_rps")
    return f"{load:g}" if isinstance(load, (int, float)) else "the same load"


def _need(record: Measurement, quantity: str) -> None:
    if record.quantity != quantity:
        raise Incomparable(f"need {quantity!r}, got {record.describe()}")


def no_more_throughput(greedy: Measurement, waiting: Measurement) -> Verdict:
    """Whether, saturated, a MAX_WAIT served no more than greedy: the waiting setting's capacity
    at most the noise band above greedy's (``instruments.capacity`` of two copies under the same
    conditions). It does not hold when the wait served more beyond the band. Where greedy's
    batches were already full on average (its mean batch within the band of max_batch_size), the
    word is "ran one schedule": a full batch was queued at nearly every call, so batches ran full
    before any MAX_WAIT ran out, under either policy, and the comparison tests the setup, not
    the wait."""
    _need(greedy, "capacity")
    comparable(greedy, waiting)
    holds = waiting.value <= (1 + definitions.NOISE_BAND) * greedy.value
    mean_batch, b = greedy.observed.get("mean_batch"), greedy.where.get("max_batch_size")
    full = isinstance(mean_batch, (int, float)) and isinstance(b, int) and definitions.agree(mean_batch, b)
    one_schedule = holds and full
    word = "ran one schedule" if one_schedule else "bought no throughput" if holds else "bought throughput"
    return Verdict("saturated, the wait buys no throughput", holds, word,
                   f"Saturated, {'the two copies' if one_schedule else 'the wait'} {word}"
                   + (", as the full batches show" if one_schedule else "")
                   + f": {waiting.model} served {waiting.value:.0f} requests/s against {greedy.model}'s "
                   f"{greedy.value:.0f}, {waiting.value / greedy.value:.2f}× ({'not ' if holds else ''}above "
                   f"{greedy.model}'s by more than the {definitions.NOISE_BAND:.0%} noise band); greedy's batches "
                   f"already held {greedy.observed.get('mean_batch', '?')} of {greedy.where.get('max_batch_size', '?')} "
                   "rows on average"
                   + ("; a full batch was queued at nearly every call, so batches ran full before MAX_WAIT ran out: "
                      "this comparison tests the setup, not the wait." if one_schedule else "."))


def cuts_device_time(line: list[Measurement]) -> Verdict:
    """Whether each longer MAX_WAIT, at one offered load, cut the device time per request beyond
    the noise band (records ordered by MAX_WAIT, ``instruments.sweep_point``)."""
    for record in line:
        _need(record, "device time per request")
        comparable(line[0], record, ignore=("policy", "max_wait_ms"))
    waits = [r.where.get("max_wait_ms") for r in line]
    if waits != sorted(waits) or len(line) < 2:
        raise Incomparable(f"need two or more points ordered by MAX_WAIT, got waits {waits}")
    cut = [b.value < a.value and not definitions.agree(a.value, b.value) for a, b in zip(line, line[1:])]
    holds = all(cut)
    word = "cut" if holds else "did not cut at every step"
    ms = ", ".join(f"{r.value * 1e3:.2f}" for r in line)
    return Verdict("each longer wait cuts the device time per request", holds, word,
                   f"At {_load(line[0])} requests/s each longer MAX_WAIT "
                   f"({', '.join(f'{w:g}' for w in waits)} ms) {word} the device time per request beyond the "
                   f"noise band ({definitions.NOISE_BAND:.0%}): {ms} ms.")


def wait_costs_latency(greedy_p50: Measurement, waiting_p50: Measurement, t1_s: float) -> Verdict:
    """Whether a MAX_WAIT ``W`` cost the median request a large part of the wait and no more
    than the wait and two batch-1 calls: ``W/4 < Δp50 < W + 2·t(1)`` (the first request of a
    batch waits all of W, later ones less; a call on the fuller batch may take longer). Refused
    at different loads."""
    _need(greedy_p50, "p50")
    comparable(greedy_p50, waiting_p50, ignore=("policy", "max_wait_ms"))
    wait_s = float(waiting_p50.where["max_wait_ms"]) / 1e3
    cost = waiting_p50.value - greedy_p50.value
    holds = 0.25 * wait_s < cost < wait_s + 2 * t1_s
    word = "cost the median request" if holds else "did not cost the median request a share of the wait,"
    return Verdict("the wait costs the median request", holds, word,
                   f"At {_load(greedy_p50)} requests/s a MAX_WAIT of {wait_s * 1e3:g} ms {word} "
                   f"{signed(format(cost * 1e3, '+.0f'))} ms (p50 {greedy_p50.value * 1e3:.0f} → {waiting_p50.value * 1e3:.0f} ms; "
                   f"expected between a quarter of the wait and the wait plus two batch-1 calls, "
                   f"{0.25 * wait_s * 1e3:.0f} to {(wait_s + 2 * t1_s) * 1e3:.0f} ms).")


def saves_less_when_busier(greedy_low: Measurement, waiting_low: Measurement,
                           greedy_high: Measurement, waiting_high: Measurement) -> Verdict:
    """Whether the same MAX_WAIT saved a smaller share of greedy's device time per request at
    the higher load, by more than the noise band's worth of percentage points (the shares are
    ``definitions.device_time_saved``; a share of 0.15 less, not 15 % of the share less)."""
    for g, w in ((greedy_low, waiting_low), (greedy_high, waiting_high)):
        _need(g, "device time per request")
        comparable(g, w, ignore=("policy", "max_wait_ms"))
    if waiting_low.where.get("max_wait_ms") != waiting_high.where.get("max_wait_ms"):
        raise Incomparable("the two loads ran different waits")
    low = definitions.device_time_saved(greedy_low.value, waiting_low.value)
    high = definitions.device_time_saved(greedy_high.value, waiting_high.value)
    holds = low - high > definitions.NOISE_BAND
    word = "saved less" if holds else "did not save clearly less"
    return Verdict("the busier the device, the less a wait buys", holds, word,
                   f"At {_load(greedy_high)} requests/s the same wait {word} of greedy's device "
                   f"time per request than at {_load(greedy_low)}: {high:.0%} against {low:.0%} "
                   f"(clearly: by more than {definitions.NOISE_BAND * 100:.0f} percentage points).")


def neighbour_gains(beside_greedy: Measurement, beside_waiting: Measurement,
                    called: str | None = None) -> Verdict:
    """Whether a model's p50 fell when only its neighbour on the same device turned from
    greedy to waiting, told apart (:func:`_told_apart`: beyond the noise band, and over the
    repeats). Otherwise the two cannot be told apart, and the sentence says why. ``called``:
    what the lesson calls the model ("model B"), said with its name."""
    _need(beside_greedy, "p50")
    comparable(beside_greedy, beside_waiting)
    apart = _told_apart(beside_greedy, beside_waiting)
    holds = apart and beside_waiting.value < beside_greedy.value
    word = "finished sooner" if holds else "finished later" if apart else "could not be told apart"
    return Verdict("a neighbour's wait is this model's gain", holds, word,
                   f"Beside a waiting neighbour, the median request of "
                   f"{f'{called} ({beside_greedy.model})' if called else beside_greedy.model} {word}: p50 "
                   f"{' beside a greedy one, '.join(_values(beside_greedy, beside_waiting))} beside a waiting one"
                   + (f"; {_why_not_apart(beside_greedy, beside_waiting)}." if not apart else
                      f"; noise band {definitions.NOISE_BAND:.0%}."), TOLD_APART_RULE)


def core_feeds(t_http: Measurement, ceiling: Measurement, whose: str = "") -> Verdict:
    """Whether one core has the CPU to serve the device's ceiling: ``cores_to_feed`` = ceiling
    (``instruments.offline_ceiling``, rows/s) × ``t_http`` (``instruments.t_http``), over
    t_http's whole range across the repeats. Under 1 beyond the noise band at the range's
    high end: it has; over 1 beyond the band at its low end: it lacks; a range that reaches
    into the band around 1: cannot tell. ``whose``: whose CPU it is, when not the whole
    server's ("the engine alone"); t_http is taken as it was measured, at the load and batches
    of its run, and set against the ceiling's rate."""
    _need(t_http, "t_http")
    _need(ceiling, "offline ceiling")
    cores = definitions.cores_to_feed(ceiling.value, t_http.value)
    low, high = (definitions.cores_to_feed(ceiling.value, t) for t in t_http.spread)
    if high < 1 and not definitions.agree(high, 1.0):
        word = "has"
    elif low > 1 and not definitions.agree(low, 1.0):
        word = "lacks"
    else:
        word = "may or may not have"
    ends = f"{low:.2f} in each of" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f} over"
    spread = f"{ends} {t_http.counted()}; " if t_http.repeats > 1 else ""
    return Verdict("one core has the CPU to feed the device", word == "has", word,
                   f"One core {word} the CPU to serve {ceiling.model}'s ceiling of {ceiling.value:.0f} requests/s "
                   f"at {t_http.value * 1e6:.0f} µs of CPU per request ({whose + ', ' if whose else ''}"
                   f"{t_http.model}{_measured_at(t_http) if whose else ''}): cores_to_feed = "
                   f"{cores:.2f} ({spread}noise band {definitions.NOISE_BAND:.0%} around 1).")


def _measured_at(t_http: Measurement) -> str:
    """Where a t_http record was measured, as a clause: its batches, when it says."""
    batch = t_http.observed.get("mean_batch")
    return "" if batch is None else f", measured at batches of {batch:g} rows"


def beats_serial(served: Measurement, t_http: Measurement, call_s: float, batch_size: float, *,
                 room: bool = True) -> Verdict:
    """Whether the server served more than a runner that starts a call only after the loop has
    taken the last one's answers would: above ``serial_limit_rps(t_http, t(b), b)`` beyond the
    noise band (the loop's work overlapped the device's call). ``b`` is the run's mean batch,
    ``call_s`` the device's call at it: the batches the run formed, not the cap. ``room``:
    :func:`overlap_can_show`'s answer for the run; without room (the lower of the device's
    ceiling and one core's ``1 / t_http`` near the estimate) a rate above the estimate neither
    shows nor rules out the overlap, and the sentence says so instead of calling it consistent
    with overlapping."""
    _need(t_http, "t_http")
    if served.quantity not in ("served", "capacity"):
        raise Incomparable(f"need a served rate or a capacity, got {served.quantity!r}")
    limit = definitions.serial_limit_rps(t_http.value, call_s, batch_size)
    holds = served.value > limit and not definitions.agree(served.value, limit)
    word = "overlapped" if holds else "did not clearly overlap"
    # the estimate over t_http's repeats, against the served rate's: do the ranges keep apart?
    limits = sorted(definitions.serial_limit_rps(t, call_s, batch_size) for t in t_http.spread)
    apart = served.spread[0] > limits[1]
    ranges = (f" Over the repeats the served rate ran {served.spread[0]:.0f}–{served.spread[1]:.0f}/s and the estimate, "
              f"from t_http's range, {limits[0]:.0f}–{limits[1]:.0f}/s"
              + ("." if apart or not holds else ": the ranges overlap, so a re-run may not tell the two apart."))
    return Verdict("the loop's work overlaps the device's call", holds, word,
                   f"{served.model} served {served.value:.0f} requests/s, {served.value / limit:.2f}× the serial "
                   f"estimate 1 / (t_http + t(b)/b) = {limit:.0f}/s at its mean batch b = {batch_size:.1f} rows (noise band "
                   f"{definitions.NOISE_BAND:.0%}): "
                   + ("consistent with the loop's work overlapping the device's call." if holds and room else
                      "with too little room below the run's cap, this neither shows nor rules out the loop's work "
                      "overlapping the device's call." if not room else
                      "the loop's work did not clearly overlap the device's call.")
                   + (ranges if served.repeats > 1 or t_http.repeats > 1 else ""),
                   decided=apart or not holds)


def overlap_can_show(ceiling_rps: float, t_http: Measurement, call_s: float, batch_size: float) -> Verdict:
    """Whether a run leaves room for :func:`beats_serial` to show the overlap: the most one process
    could serve, the lower of the device's ceiling and one core's ``1 / t_http``, lies beyond
    ``(1 + NOISE_BAND)²`` times the serial estimate. A served rate must clear the band above the
    estimate while itself falling short of its cap by up to the band; with less room a run can
    pass or fail ``beats_serial`` by noise alone, so the verdict is reported, not asserted."""
    _need(t_http, "t_http")
    band = definitions.NOISE_BAND
    limit = definitions.serial_limit_rps(t_http.value, call_s, batch_size)
    core_rps = 1 / t_http.value
    cap = min(ceiling_rps, core_rps)
    holds = cap > (1 + band) ** 2 * limit
    places = 3 if f"{cap / limit:.2f}" == f"{(1 + band) ** 2:.2f}" else 2   # apart where two places would tie
    return Verdict("the run leaves room to show the overlap", holds, "room" if holds else "no room",
                   f"At {t_http.model} the most one process could serve, the lower of the device's ceiling "
                   f"({ceiling_rps:.0f}/s) and one core's 1 / t_http ({core_rps:.0f}/s), is {cap / limit:.{places}f}× the "
                   f"serial estimate {limit:.0f}/s, " + ("beyond" if holds else "short of") + " the noise band twice "
                   f"over, (1 + {band:.0%})² = {(1 + band) ** 2:.{places}f}×: " + (
                       "room to tell the loop's work overlapping the device's call from the two taking turns." if holds else
                       "too little room to tell the two apart, so the comparison below is reported, not asserted."))


def compared(a: Measurement, b: Measurement, a_is: str, b_is: str) -> Verdict:
    """Two records of one quantity, ``a`` against ``b``: more, fewer, or not told apart (within
    the noise band, or :func:`_told_apart` fails over their repeats; then it holds: the two
    cannot be told apart). Conditions may differ (the comparison is about them); the sentence
    names each side by ``a_is`` and ``b_is``."""
    if a.quantity != b.quantity:
        raise Incomparable(f"{a.quantity} against {b.quantity}")
    same = not _told_apart(a, b)
    shown = _values(a, b)
    word = ("within the noise band of" if definitions.agree(a.value, b.value) else
            "not told apart, over the repeats, from" if same else "more than" if a.value > b.value else "less than")
    why = (f": {_why_not_apart(a, b)}" if same and not definitions.agree(a.value, b.value) else
           "; one run each, told apart by the noise band alone" if not same and a.repeats == b.repeats == 1 else
           _how_apart(a, b) if not same else "")
    return Verdict("the two cannot be told apart", same, word,
                   f"{a.quantity} {a_is}: {shown[0]}, {word} {b_is}: {shown[1]}; "
                   f"{a.value / b.value:.2f}×, the larger {definitions.value_gap(a.value, b.value):.0%} "
                   f"above the smaller (noise band {definitions.NOISE_BAND:.0%}){why}.", TOLD_APART_RULE)


def _values(*records: Measurement) -> list[str]:
    """Records set side by side in one sentence, each with its range when it has repeats
    (``Measurement.shown``: one way to write a value in every sentence), all in one unit, that
    of the smallest of their values, so that ``768 ms`` is never set against ``1.03 s`` (it
    reads ``768 ms … against 1057 ms``). Single readings share the decimals of the larger, as a
    range's two ends do: ``6.7 ms against 21.2 ms``, not ``6.71 ms against 21.2 ms``. Ranges
    share the most decimals any of them needs, so that whether they overlap reads off the page:
    ``68.5–90.6 ms`` against ``90.5–101.0 ms``, never against ``91–101 ms``."""
    scale = min((abs(record.value) for record in records if record.value), default=1.0)
    one_unit = len({record.unit for record in records}) == 1
    if all(record.repeats == 1 for record in records) and one_unit:
        return show_values([record.value for record in records], records[0].unit, scale)
    needs = [d for d in (record.own_decimals(scale) for record in records) if d is not None]
    decimals = max(needs) if len(needs) > 1 and one_unit else None
    return [record.shown(scale_of=scale, decimals=decimals) for record in records]


def setting_label(record: Measurement) -> str:
    """A sweep point's batching setting as the server's flags name it."""
    w = record.where
    label = f"{w['policy']} {w['max_batch_size']}"
    return label + (f" / {w['max_wait_ms']:g} ms" if w["policy"] == "timer" else "")


def choose_setting(points: Sequence[Mapping[str, Any]], budget_s: float, default: str) -> Verdict:
    """Q(c)'s answer, by the reader's criteria and no others.

    ``points``: one per setting and offered load, each ``{"p99": ..., "served share": ...,
    "shed": n, "sent": rps}``: the p99 and the served share (``definitions.served_share``) over
    the point's repeats (``instruments.over_repeats`` of ``instruments.sweep_point``'s records),
    the requests it shed and the median rate the load generator sent. ``default``: the label
    (:func:`setting_label`) of the setting a reader runs when nothing says otherwise.

    1. A setting *holds* the budget at a load when its p99 is within ``budget_s`` in every
       repeat (the highest of its range), it shed nothing there, and the load reached it: the
       rate sent is not below the offered one beyond the noise band. A setting that broke the
       budget in one run of two is not one to recommend for it, nor one whose slow answers held
       the generator's users back, so that it was judged at a load it never received.
    2. The candidates hold it at the highest load any setting holds it.
    3. Among them, the largest served share at the next load up (the share of what reached the
       server that it answered: not the served rate, which counts each run's own random
       arrivals); a candidate not told apart from the best (:func:`_told_apart`: within the
       noise band of it, or ranges over the repeats that overlap it or miss it narrowly over
       too few repeats) stays tied with it.
    4. A tie goes to ``default`` when it is among them; otherwise the data cannot choose, and
       the verdict fails and names them. Device time, p50 and the like never enter.

    A setting that missed the budget at that load by less than the noise band (and shed
    nothing) is named after the verdict: a re-run may let it in. A chosen setting whose
    highest repeat there came within the noise band under the budget is named too: a re-run
    may push it out. So is a setting set aside by rule 1 for the load alone at that load or
    above (at any load where none holds): its p99 there says nothing of the load offered.
    """
    by_setting: dict[str, dict[float, Mapping[str, Any]]] = {}
    for point in points:
        p99, share = point["p99"], point["served share"]
        if p99.quantity != "p99" or share.quantity != "served share":
            raise Incomparable(f"need p99 and served share records, got {p99.quantity!r} and {share.quantity!r}")
        if p99.where != share.where or p99.model != share.model:
            raise Incomparable("a point's p99 and served share come from different runs")
        by_setting.setdefault(setting_label(p99), {})[p99.where["offered_rps"]] = point
    models = {point["p99"].model for point in points}
    if len(models) > 1:
        raise Incomparable(f"points of different models: {sorted(models)}")

    def within(point) -> bool:
        return point["p99"].spread[1] <= budget_s and point["shed"] == 0

    def received(point) -> bool:
        return not _exceeds(point["p99"].where["offered_rps"], point["sent"])

    def holds_at(point) -> bool:
        return within(point) and received(point)

    def unsent(from_load: float) -> str:
        """The points rule 1 set aside for the load alone, at ``from_load`` and above, where
        setting them aside could change the answer."""
        short = [(label, load, point["sent"]) for label, at in by_setting.items() for load, point in sorted(at.items())
                 if load >= from_load and within(point) and not received(point)]
        return (" Not judged where the load generator fell short of the offered load by more than the noise band, "
                "though p99 and shedding were within the budget there: "
                + _and(f"{label} at {load:g} requests/s offered ({sent:.0f} sent)" for label, load, sent in short)
                + "." if short else "")

    held = {label: max((load for load, point in at.items() if holds_at(point)), default=None)
            for label, at in by_setting.items()}
    budget = f"p99 ≤ {budget_s * 1e3:.4g} ms"   # as set, not rounded: a p99 at the edge is judged by it
    if all(load is None for load in held.values()):
        unshed = [(point["p99"].spread[1], label, load) for label, at in by_setting.items()
                  for load, point in at.items() if point["shed"] == 0 and received(point)]
        nearest = ""
        if unshed:
            p99, label, load = min(unshed)
            nearest = (f" Nearest: {label} at {load:g} requests/s, its highest repeat's p99 {p99 * 1e3:.0f} ms, "
                       f"{p99 / budget_s - 1:.0%} over" + (
                           f", within the noise band ({definitions.NOISE_BAND:.0%}): a re-run may let it in."
                           if definitions.agree(p99, budget_s) else "."))
        return Verdict("the data choose one setting", False, "no setting holds",
                       f"For {budget}: no setting holds it with nothing shed at any load swept.{nearest}"
                       f"{unsent(float('-inf'))}")
    top = max(load for load in held.values() if load is not None)
    candidates = [label for label, load in held.items() if load == top]
    loads = sorted({load for at in by_setting.values() for load in at})
    above = [load for load in loads if load > top]
    highest = {label: by_setting[label][top]["p99"].spread[1] for label in candidates}
    evidence = f"held {budget} up to {top:g} requests/s" + (
        f", its highest repeat's p99 there {highest[candidates[0]] * 1e3:.0f} ms" if len(candidates) == 1 else
        f": {', '.join(candidates)}; their highest repeat's p99 there: "
        + ", ".join(f"{label}: {p99 * 1e3:.0f} ms" for label, p99 in highest.items()))
    near = {label: at[top]["p99"].spread[1] for label, at in by_setting.items()
            if label not in candidates and top in at and at[top]["shed"] == 0 and received(at[top])
            and definitions.agree(at[top]["p99"].spread[1], budget_s)}   # missed it by less than the band
    tied, ranked = candidates, False
    if len(candidates) > 1 and above:
        nxt = above[0]
        shares = {label: by_setting[label][nxt]["served share"] for label in candidates if nxt in by_setting[label]}
        if shares:
            best = max(shares, key=lambda label: shares[label].value)
            tied = [label for label in shares if not _told_apart(shares[best], shares[label])]
            tied.sort(key=lambda label: -shares[label].value)
            ranked = True
            evidence += (f"; share of what reached the server answered at {nxt:g} requests/s offered: "
                         + ", ".join(f"{label}: {_fine_share(shares[label])}" for label in shares))
    if above:
        evidence += f"; no setting held it at {_and(f'{load:g}' for load in above)} requests/s"
    caveat = (f" {_and(near)} missed the budget at {top:g} requests/s by less than the noise band "
              f"({definitions.NOISE_BAND:.0%}; " + (
                  f"its highest repeat's p99 there {next(iter(near.values())) * 1e3:.0f} ms" if len(near) == 1 else
                  "highest repeat's p99 " + ", ".join(f"{label} {p99 * 1e3:.0f} ms" for label, p99 in near.items()))
              + "): a re-run may let " + ("them" if len(near) > 1 else "it") + " in"
              + (", and the default with it." if default in near else ".") if near else "")
    narrow = {label: highest[label] for label in tied if definitions.agree(highest[label], budget_s)}
    if narrow:
        clear = [label for label in candidates if label not in narrow]
        caveat += (f" {_and(narrow)} held it by less than the noise band ({definitions.NOISE_BAND:.0%}; "
                   + ", ".join(f"{p99 * 1e3:.1f} ms" for p99 in narrow.values()) + f" against {budget_s * 1e3:.4g} ms"
                   + "): a re-run may push " + ("them" if len(narrow) > 1 else "it") + " out at "
                   + f"{top:g} requests/s, "
                   + (f"where {_and(clear)} would still hold it." if clear else "and the choice move down a load"
                      + (f", unless the same re-run lets {_and(near)} in." if near else ".")))
    caveat += unsent(top)
    if len(tied) == 1:
        return Verdict("the data choose one setting", True, "run",
                       f"For {budget}, run: {tied[0]} ({evidence}).{caveat}", TOLD_APART_RULE)
    if default not in tied:
        return Verdict("the data choose one setting", False, "cannot choose between",
                       f"For {budget} this sweep cannot choose between {_and(tied)} ({evidence}).{caveat}",
                       TOLD_APART_RULE)
    order = "largest served share first" if ranked else "no load above to rank them"
    return Verdict("the data choose one setting", True, "run the default",
                   f"For {budget} this sweep ties {_and(tied)}; the default breaks the tie, so run the default: "
                   f"{default} ({evidence}; tied, {order}: {', '.join(tied)}).{caveat}", TOLD_APART_RULE)


def heap_keeps_buffers(fault_share: float, fewer_faults: int) -> Verdict:
    """Whether, with glibc's thresholds fixed, the heap kept a call's buffers for the next call
    (appendix 10): the most any run faulted in per call, as a share of the pages its layer
    outputs fill (``fault_share``), under ``1 / fewer_faults``, the notebook's line between a
    run that faulted and one that did not."""
    if not 0 <= fault_share or fewer_faults < 1:
        raise ValueError(f"need a share >= 0 and a count >= 1, got {fault_share!r} and {fewer_faults!r}")
    holds = fault_share < 1 / fewer_faults
    word = "keeps the buffers" if holds else "does not keep the buffers"
    return Verdict("the heap keeps a call's buffers", holds, word,
                   f"With the thresholds fixed, {'no' if holds else 'a'} run faulted in more than 1/{fewer_faults} "
                   f"of the pages its layer outputs fill ({fault_share:.2%} of them per call at most): the heap "
                   f"{word} for the next call.")


def unload_waited(statuses: Sequence[int], unload_status: int, after_status: int, unload_s: float,
                  last_answer_s: float, slack_s: float, unanswered_at_send: int) -> Verdict:
    """Whether an unload waited for the work its model had accepted (appendix 05): the DELETE
    went out while requests were still unanswered (``unanswered_at_send``, at least one: else
    there was nothing to wait for), every request answered 200, the DELETE answered 200 no
    sooner than the last of them, and an invocation after it got 404. Times are seconds from
    the burst's start as the client read them; ``slack_s`` is how far apart the client's threads
    may read answers sent together."""
    ok = sum(status == 200 for status in statuses)
    after_last = unload_s >= last_answer_s - slack_s
    holds = (unanswered_at_send >= 1 and ok == len(statuses) and unload_status == 200
             and after_status == 404 and after_last)
    word = "waited for" if holds else "did not wait for"
    return Verdict("an unload waits for the accepted work", holds, word,
                   f"The unload {word} the accepted work: {ok} of the {len(statuses)} requests answered 200; "
                   f"the DELETE, sent while {unanswered_at_send} of them were unanswered, answered {unload_status} "
                   f"{'after' if after_last else 'before'} the last of them "
                   f"({unload_s:.2f} s against {last_answer_s:.2f} s, {slack_s * 1e3:.0f} ms allowed for the client's "
                   f"threads); an invocation after it got {after_status}"
                   + (" (the model was gone)." if after_status == 404 else "."))


def no_sooner_than_batches(last_answer_s: float, requests: int, max_batch_size: int, call_s: float,
                           slack_s: float) -> Verdict:
    """Whether the last of ``requests`` sent together was answered no sooner than full batches
    allow: ``ceil(requests / max_batch_size)`` calls of ``call_s`` each, one after another (less
    ``slack_s``, the client's reading). Sooner would mean calls ran side by side, or ran short."""
    calls = math.ceil(requests / max_batch_size)
    lower_s = calls * call_s
    holds = last_answer_s >= lower_s - slack_s
    word = "no sooner than" if holds else "sooner than"
    return Verdict("the last answer waits for full batches", holds, word,
                   f"The last answer came {word} full batches allow: after {last_answer_s:.2f} s, against "
                   f"{lower_s:.2f} s for {calls} calls of {call_s:g} s ({slack_s * 1e3:.0f} ms allowed for the "
                   f"client's threads).")


def batched_rows_match(worst_share: float, bitwise_rows: int, rows: int, sizes: Sequence[int]) -> Verdict:
    """Whether every row computed in a batch matched its answer computed alone within
    ``torch.testing.assert_close``'s float32 tolerance (appendix 10): ``worst_share`` is the
    largest difference as a share of that element's own tolerance (``atol + rtol × |alone|``),
    ``bitwise_rows`` how many of the ``rows`` batched rows were bitwise equal."""
    if worst_share < 0 or not 0 <= bitwise_rows <= rows:
        raise ValueError(f"need a share >= 0 and 0 <= {bitwise_rows} <= {rows}")
    holds = worst_share <= 1
    word = "matched" if holds else "did not match"
    return Verdict("a batched row matches its answer alone", holds, word,
                   f"Every row batched in {_and(str(b) for b in sizes)} {word} its answer alone within "
                   f"`assert_close`'s float32 tolerance, no difference using more than {worst_share:.0%} of its own; "
                   + (f"{bitwise_rows} of {rows} batched rows were bitwise equal to their answer alone."
                      if bitwise_rows else "not one batched row was bitwise equal to its answer alone.")
                   if holds else
                   f"A row batched in {_and(str(b) for b in sizes)} {word} its answer alone within `assert_close`'s "
                   f"float32 tolerance: a difference used {worst_share:.0%} of its own.")


#: Rows a busy model's mean batch must exceed to count as batched (appendix 05): well above
#: one, and well under what its clients can fill.
MANY_ROWS = 2


def runners_batch_apart(busy_mean_batch: float, busy_clients: int, busy_wait_s: float,
                        lone_wait_s: float, lone_requests: int) -> Verdict:
    """Whether two models in one server batch in runners of their own (appendix 05): the model
    with many clients formed batches of more than ``MANY_ROWS`` rows on average, and the one with
    a single client did not queue behind them: its requests' mean queue wait (``*_wait_s``,
    arrival in the runner to the call's start) was shorter than the busy model's, beyond the
    noise band. One shared runner would have queued the lone client's requests among the busy
    model's rows, to wait as long as they do. The lone client's batches of one row are not
    tested: one closed-loop client never has two requests in flight, so they hold by
    construction."""
    batched = busy_mean_batch > MANY_ROWS
    ahead = lone_wait_s < busy_wait_s and not definitions.agree(lone_wait_s, busy_wait_s)
    holds = batched and ahead
    word = "batched apart" if holds else "did not batch apart"
    return Verdict("each model batches in its own runner", holds, word,
                   f"The two models {word}: the busy one, with {busy_clients} clients, formed batches of "
                   f"{busy_mean_batch:.1f} rows on average (the claim asks for more than {MANY_ROWS}) and its requests "
                   f"waited {busy_wait_s * 1e3:.2f} ms in its queue on average; the other's one client's "
                   f"{lone_requests} requests waited {lone_wait_s * 1e3:.2f} ms "
                   f"({'shorter, beyond' if ahead else 'not shorter beyond'} the noise band of "
                   f"{definitions.NOISE_BAND:.0%}).")


def _fine_share(share: Measurement) -> str:
    """A served share to a tenth of a per cent, with its range: near 100 % whole per cents hide
    what a setting shed (99.5 % reads 100 %)."""
    low, high = (f"{end * 100:.1f}" for end in share.spread)
    spread = f"{high}% in each of" if low == high else f"{low}–{high}% over"
    return f"{share.value:.1%} ({spread} {share.counted()})" if share.repeats > 1 else f"{share.value:.1%}"


def faulting_slows(faulted: Sequence[tuple[int, float, float]]) -> Verdict:
    """Whether calls that fault their activations in afresh run fewer rows per second (appendix 10).

    ``faulted`` holds one ``(batch_size, rows_per_s, fixed_rows_per_s)`` per run of a batch
    size that faulted in a fresh process: its rate, and the median rate of the processes with
    glibc's thresholds fixed at the same size. Judged by the median of the ratios: below the
    noise band, "slower than" (it holds); within it the two cannot be told apart at this many
    processes, and the sentence says so (it holds: nothing was contradicted, and the notebook
    reports it rather than ticking it); above it, "faster than": the lesson is wrong.
    Comparing each size with itself, and not the ratio of 16 to 8, is the point: a process that
    faults at both sizes keeps that ratio and still pays for every page.
    """
    if not faulted:
        raise ValueError("no faulting run to judge")
    middle = statistics.median(rate / fixed for _, rate, fixed in faulted)
    word = ("as fast, within the noise band, as" if definitions.agree(middle, 1.0)
            else "slower than" if middle < 1 else "faster than")
    by_size: dict[tuple[int, float], list[str]] = {}
    for b, rate, fixed in sorted(faulted):
        by_size.setdefault((b, fixed), []).append(f"{rate:.0f}")
    runs = "; ".join(f"batch {b}: {_and(rates)} against {fixed:.0f} rows/s" for (b, fixed), rates in by_size.items())
    slower = sum(rate < fixed and not definitions.agree(rate, fixed) for _, rate, fixed in faulted)
    sentence = (f"Where glibc as it is faulted, calls ran {word} the same batch size with the thresholds fixed, "
                f"at the median of the runs: {middle:.2f}× the rows/s ({slower} of {len(faulted)} "
                f"run{'s' * (len(faulted) > 1)} slower beyond the noise band; {runs}; "
                f"noise band {definitions.NOISE_BAND:.0%})")
    sentence += ("; more processes (`PROCESSES_PER_CASE`) may tell them apart." if word.startswith("as fast")
                 else ".")
    return Verdict("faulting calls run slower", word != "faster than", word, sentence)


def misses_reach(percentiles_ms: Mapping[float, float], slow: int, requests: int, load_ms: float,
                 margin: int = 3) -> Verdict:
    """Whether the misses reach exactly the percentiles their count predicts (appendix 09).

    ``slow`` requests of ``requests`` waited for a load, as their answers said (every such
    request takes at least ``load_ms``). The *q*-th percentile (``percentiles_ms``: *q* in
    (0, 1) -> its value) is then predicted to take ``load_ms`` or more exactly when the misses'
    share exceeds ``1 - q``: counted from the answers, not from the latencies, so a warm request
    that was as slow can make a prediction miss. A percentile whose edge lies within ``margin`` requests of that count is
    too close to call (interpolation between neighbours decides it) and is left out. It holds
    when every percentile judged went as predicted, and at least one was judged.
    """
    if not 0 <= slow <= requests or requests < 1:
        raise ValueError(f"need 0 <= slow <= requests, got {slow} of {requests}")
    share = slow / requests
    held, missed, close, slow_ones, fast_ones, loaded, unloaded = [], [], [], [], [], [], []
    for q, value_ms in sorted(percentiles_ms.items()):
        name = f"p{round(q * 100)}"
        took_load = value_ms >= load_ms
        (slow_ones if took_load else fast_ones).append(name)
        if abs(share - (1 - q)) * requests < margin:
            close.append(name)
            continue
        predicted = share > 1 - q
        (loaded if predicted else unloaded).append(name)
        (held if predicted == took_load else missed).append(name)
    holds = bool(held) and not missed
    sentence = (f"{slow} of {requests} requests waited for a load, by their answers (a share of {share:.2f}); "
                f"a percentile q was predicted to take the load's {load_ms:.0f} ms or more when that "
                f"share exceeds 1 − q. Predicted: {_and(loaded) if loaded else 'no percentile'} to include a load"
                + (f", {_and(unloaded)} not. " if unloaded else ". ")
                + f"The prediction held at {_and(held) if held else 'none'}")
    sentence += f" and missed at {_and(missed)}" if missed else ""
    sentence += (f"; {_and(close)} lay within {margin} requests of the edge, too close to call." if close else ".")
    sentence += (f" Measured: {_and(slow_ones) if slow_ones else 'no percentile'} included a load"
                 + (f", {_and(fast_ones)} did not." if fast_ones else "."))
    return Verdict("the slow requests reach the percentiles their count predicts", holds,
                   "held" if holds else "missed", sentence)


def zipf_fits(counts: Sequence[int], exponent: float, sigmas: float = 3.0) -> tuple[Verdict, float, float]:
    """Whether requests counted by popularity rank fall as ``1 / rank^exponent`` (appendix 13).

    ``counts``: requests answered per model, rank 1 first. The exponent is fitted over all of
    them at once, a weighted least-squares line through (log rank, log count) whose weights
    are the counts (a count of n has a counting noise of √n, so its logarithm one of 1/√n);
    its standard error comes from the same weights. It holds when the fitted exponent lies
    within ``sigmas`` standard errors of ``exponent``: a fit over every rank, not the ratio of
    two, and a band from this run's own counts, not a fixed factor. Returns the verdict, the
    fitted exponent and its standard error.
    """
    if len(counts) < 2 or min(counts) < 1:
        raise ValueError(f"need at least two ranks, each with a request; got {list(counts)}")
    x = [math.log(rank) for rank in range(1, len(counts) + 1)]
    y = [math.log(n) for n in counts]
    total = sum(counts)
    x_mean = sum(n * xi for n, xi in zip(counts, x)) / total
    y_mean = sum(n * yi for n, yi in zip(counts, y)) / total
    spread = sum(n * (xi - x_mean) ** 2 for n, xi in zip(counts, x))
    fitted = -sum(n * (xi - x_mean) * (yi - y_mean) for n, xi, yi in zip(counts, x, y)) / spread
    error = 1 / math.sqrt(spread)
    apart = abs(fitted - exponent) / error
    holds = apart <= sigmas
    sentence = (f"Fitted over ranks 1–{len(counts)} (the log of each count n weighted by n: a count of n has a "
                f"noise of √n, so its log one of 1/√n), the server's counts fall as 1 / rank^s with s = {fitted:.2f} ± {error:.2f}, "
                f"{apart:.1f} standard errors from the scenario's {exponent:g}: "
                + (f"within {sigmas:g}, so popularity is skewed as the scenario draws it."
                   if holds else f"further apart than {sigmas:g}, so this run's popularity was "
                   + ("flatter" if fitted < exponent else "steeper") + " than the scenario draws it."))
    return (Verdict("popularity falls as the scenario's Zipf curve", holds, "within" if holds else "apart",
                    sentence), fitted, error)


def kernels_point_the_way(model: str, kernel_ratio: float, off_line: float, placed: bool = True,
                          noise_gap: float | None = None) -> Verdict:
    """Whether batch 1's kind of kernel points the way t(1) lies off the cost line (appendix 10).

    ``kernel_ratio``: batch 2's time with oneDNN off (batch 1's kind of kernel, PyTorch's own)
    over its time with oneDNN on; above 1, PyTorch's own kernels are the slower. ``off_line``:
    t(1) over the line's ``F + c``. Slower kernels at batch 1 predict a t(1) above the line,
    faster ones a t(1) below it. A match is a direction, not an account: batch 2's change of
    kernel need not cost what batch 1's does. Within the noise band either number says nothing.
    ``placed``: False where :func:`on_the_line` could not place t(1) (its own timings moved
    beyond the band, or not every pass put it beyond the band on one side): then the run has no
    settled gap to ask the kernels about, and ``noise_gap`` (how far apart two timings of the same kernels lay, as
    ``definitions.value_gap``; None when that was not the reason) says whether the kernel
    ratio itself lies within what the run's noise did to one kind of kernel, widened by the
    noise band (10's run: 22 % against 19 % is no evidence for the kernels).
    """
    said = (f"with oneDNN off, batch 2 ran batch 1's kind of kernel and took {kernel_ratio:.2f}× its time with "
            f"oneDNN on, and t(1) was {off_line:.2f}× the line's F + c")
    if not placed:
        moved = definitions.value_gap(kernel_ratio, 1.0)
        within = noise_gap is not None and not _exceeds(1 + moved, 1 + noise_gap)
        holds, word, why = False, "not placed", (
            "this run could not place t(1) against the line ("
            + (f"two timings of its kernels differed by {noise_gap:.0%}, beyond the noise band"
               if noise_gap is not None else "not every pass put it beyond the noise band on one side of the line")
            + "), so this run has no settled gap to ask the kernels about"
            + (f"; and the change of kernel moved batch 2 by {moved:.0%}, not beyond the noise band past the "
               f"{noise_gap:.0%} that noise moved one kind of kernel, so this run does not credit it to the kernels "
               "either" if within else ""))
    elif definitions.agree(off_line, 1.0):
        holds, word, why = False, "no gap", "t(1) lay on the line, so there is no gap for the kernels to explain"
    elif definitions.agree(kernel_ratio, 1.0):
        holds, word, why = False, "within the noise band", (
            "the change of kernel moved batch 2's time only within the noise band, so this run cannot tell it from no "
            "effect, and it does not account for the gap")
    elif (kernel_ratio > 1) == (off_line > 1):
        kind = "slower" if kernel_ratio > 1 else "faster"
        side = "above" if off_line > 1 else "below"
        holds, word, why = True, "points the way", (
            f"PyTorch's own kernels are the {kind} ones, which points the way the gap does (t(1) {side} the line); "
            "a direction, not an account: batch 2's change of kernel need not cost what batch 1's does")
    else:
        holds, word, why = False, "points the other way", (
            "the change of kernel points the other way from the gap, so it does not account for it")
    return Verdict("batch 1's kernels point the way its gap does", holds, word,
                   f"{model}: {said}; {why} (noise band {definitions.NOISE_BAND:.0%}).")


def kernels_summary(said: Verdict, placed: Verdict) -> str:
    """What appendix 10's summary says after "batch 2 on batch 1's kind of kernel took R× its
    oneDNN time;", from :func:`kernels_point_the_way`'s verdict ``said``. Where t(1) was not
    placed it takes :func:`on_the_line`'s own word from ``placed`` ("unsettled" or "not placed"),
    so one state of the run keeps one name across the summary."""
    if said.word == "not placed":
        return ("but this run could not place t(1) against the line "
                f"({placed.word}), so it has no settled gap to set that beside")
    return {
        "points the way": ("that points the way t(1) lies off the line; a direction, not an account, as this run "
                           "never timed batch 1's 3×3 convolutions on oneDNN"),
        "points the other way": "that points the other way from where t(1) lies, so it does not account for it",
        "within the noise band": ("that lies within the noise band of its oneDNN time, so this run cannot credit where "
                                  "t(1) lies to the kernels"),
        "no gap": "but t(1) lay on the line, so there is no gap to set that beside",
    }[said.word]


#: Threads whose Python work the GIL runs one after the other occupy about one core at once; up
#: to this many (the interpreter's own moments outside the GIL, and the timer's rounding).
ONE_CORE = 1.1
#: Two processes *used a second core* past this many times the cores two threads occupied.
SECOND_CORE = 1.2


def threads_took_turns(threads_cores: float, threads_s: float, one_s: float, one_cores: float) -> Verdict:
    """Whether two threads decoding at once took turns: together they occupied under
    :data:`ONE_CORE` cores at once (CPU seconds over wall seconds). Their wall time against one
    decode's (``one_s``, on ``one_cores``) is printed beside it, as what it is: a measure that
    also moves when a decode runs slower beside another."""
    holds = threads_cores < ONE_CORE
    word = "took turns" if holds else "ran at once"
    ratio = threads_s / one_s
    beside = (", two decodes' worth" if definitions.agree(ratio, 2.0) else
              f", not 2×: each used about {threads_s * threads_cores / 2 * 1e3:.0f} ms of CPU in a thread against "
              f"{one_s * one_cores * 1e3:.0f} ms alone; why a decode's time differed beside another, this cell does "
              "not measure")
    return Verdict("two threads took turns", holds, word,
                   f"Two threads occupied {threads_cores:.2f} cores at once: they {word} (under {ONE_CORE:g}: the GIL "
                   f"ran their Python work one after the other). The cores are the measure: the two took "
                   f"{ratio:.2f}× one decode's wall time{beside}.")


def processes_used_a_second_core(processes_cores: float, threads_cores: float, processes_s: float,
                                 one_s: float, load: float, cores: int) -> Verdict:
    """Whether two processes decoding at once, each with its own interpreter and GIL, occupied
    more than :data:`SECOND_CORE` times the cores two threads did. Where they did not, the
    sentence says that the run cannot show what they gain: other work held the second core
    (``load``, the load average on ``cores`` cores, is printed)."""
    holds = processes_cores > SECOND_CORE * threads_cores
    if holds:
        sentence = (f"Two processes, each with its own interpreter and GIL, occupied {processes_cores:.2f} cores at "
                    f"once ({processes_s / one_s:.2f}× one decode's wall time, with a load average of {load:.1f}).")
    else:
        sentence = (f"This run cannot show what two processes gain: they occupied {processes_cores:.2f} cores at once, "
                    f"not {SECOND_CORE:g}× the threads' {threads_cores:.2f}, because other work held the second core "
                    f"(load average {load:.1f} on {cores} cores). What would separate them: the same cell with a core "
                    "free.")
    return Verdict("two processes used a second core", holds,
                   "used a second core" if holds else "cannot show", sentence)


# -- notebook 13: a spike, and the recovery after it -------------------------------------------


def spike_hurt(baseline_s: float, level_s: float, peak_s: float, factor: float, peak_users: int,
               base_users: int) -> Verdict:
    """Whether a load spike hurt the probe: the p95 of its worst window during the peak above
    ``factor`` × the pre-spike ``level_s`` (the slowest window but one; ``baseline_s``, the
    median window, is printed beside it)."""
    holds = peak_s > factor * level_s
    word = "hurt" if holds else "did not clearly hurt"
    return Verdict("the spike hurt", holds, word,
                   f"The spike {word}: the probe's p95 went from {baseline_s * 1e3:.0f} ms before it (median; its "
                   f"level, the slowest window but one, {level_s * 1e3:.0f} ms) to {peak_s * 1e3:.0f} ms in its worst "
                   f"window ({peak_users} users against {base_users}; it hurts past {factor:g}× the level).")


def recovered_for_good(recovery_s: float | None, *, base_s: float, spare_s: float, window_s: float,
                       level_s: float, factor: float, drain_windows: int, lone_over: int,
                       note: str) -> Verdict:
    """Whether the probe's p95 was back *for good* after a spike (within ``factor`` × the
    pre-spike ``level_s`` from some window on, never two windows in a row over it afterwards)
    with at least ``spare_s`` of the ``base_s`` base period to spare.

    ``recovery_s``: from the peak's end to the end of the first window back for good (one
    ``window_s`` when it is the first window after the peak: the method's resolution); None
    when no window was. ``drain_windows``: the windows a backlog draining as fast as one timed
    before the spike takes; more is printed as unexplained. ``lone_over``: later windows over
    the factor, each alone. ``note``: what the probes answered, printed last."""
    line = f"{factor * level_s * 1e3:.0f} ms, {factor:g}× the pre-spike level ({level_s * 1e3:.0f} ms)"
    lone_over = int(lone_over)   # a count of numpy booleans is a numpy integer, whose != is no bool
    later = (f"; later, {lone_over} lone {window_s:g} s window{'s' * (lone_over != 1)} over the factor, never two "
             f"in a row" if lone_over else "")
    if recovery_s is None:
        return Verdict("it recovered for good", False, "did not recover",
                       f"It did not recover within the {base_s:g} s base period: no window after the peak was back "
                       f"for good under {line} ({note}).")
    holds = recovery_s < base_s - spare_s
    word = "recovered" if holds else "recovered too late"
    windows = round(recovery_s / window_s)
    if windows <= 1:
        when = f"from the first {window_s:g} s window after the peak, as fast as this method can tell"
    else:
        when = f"{recovery_s:.1f} s after the peak ended" + (
            f": {windows} windows, where a backlog draining as fast as the one timed before the spike would take "
            f"{drain_windows}, and this run does not say what held latency up the rest" if windows > drain_windows else "")
    return Verdict("it recovered for good", holds, word,
                   f"It {word} with {base_s - recovery_s:.1f} s of the {base_s:g} s base period to spare (the claim "
                   f"asks for at least {spare_s:g} s): the p95 was back for good under {line}, {when} "
                   f"({note}{later}).")


# -- notebook 09: one endpoint, many hosts ----------------------------------------------------


#: Of the first requests of models asked for oldest first, at least this share find their model
#: evicted (the prediction says all; a quarter of slack for the router's choice of host).
EVICTED_SHARE = 0.75
#: Repeats of a model just asked for are cold at most this share of the time, for a router that
#: sends a model's requests to a host that holds it (one blind to holders: about 29% at 3 repeats).
AFFINITY_COLD_SHARE = 0.1
#: When every model fits, loads are *rare*: at most this share of the requests.
RARE_SHARE = 0.05
#: A host runs *near its ceiling* above this share of its offline ceiling.
NEAR_CEILING = 0.8
#: A second host *adds most of a second device* past this many times one host's throughput,
#: each host taking more than :data:`BUSY_HOST_SHARE` of the requests.
SCALING = 1.5
BUSY_HOST_SHARE = 0.3
#: Half the clients leave the calls *part-empty*: under this share of the full run's throughput,
#: with batches under this share of full.
PART_EMPTY = 0.85


def evicted_in_load_order(cold_first: int, firsts: int) -> Verdict:
    """Whether models asked for in load order, oldest first (where LRU and FIFO evict alike),
    found their model evicted: at least :data:`EVICTED_SHARE` of the ``firsts`` first requests
    were cold."""
    holds = cold_first >= EVICTED_SHARE * firsts
    word = "found their model evicted" if holds else "mostly found their model loaded"
    return Verdict("the oldest model is evicted", holds, word,
                   f"Asked for in load order, oldest first (an order in which LRU and FIFO evict alike), {cold_first} "
                   f"of {firsts} first requests {word}" + (" and waited for a load." if holds else
                                                          f" (at least {EVICTED_SHARE:.0%} were to wait for a load)."))


def repeats_stay_warm(cold_repeat: int, repeats: int, blind_share: float) -> Verdict:
    """Whether the router kept a model's repeats on a host that holds it: at most
    :data:`AFFINITY_COLD_SHARE` of ``repeats`` were cold; ``blind_share``, what a router blind to
    holders would make cold, is printed beside it."""
    holds = cold_repeat <= AFFINITY_COLD_SHARE * repeats
    said = "none" if cold_repeat == 0 else f"only {cold_repeat}" if holds else f"{cold_repeat}"
    return Verdict("repeats stay warm", holds, "affinity" if holds else "no affinity",
                   f"{'Affinity' if holds else 'No affinity'}: {said} of {repeats} repeats were cold (about "
                   f"{blind_share:.0%} would be, were the router to ignore which host holds the model).")


def skew_keeps_hot(hit_ratio: float, fit_share: float) -> Verdict:
    """Whether skewed (Zipf) traffic found its model loaded more often than the share of models
    that fit in the slots, which is what uniform traffic would."""
    holds = hit_ratio > fit_share
    word = "kept more than the fitting share hot" if holds else "kept no more than the fitting share hot"
    return Verdict("the skew keeps models hot", holds, word,
                   f"The skew {word}: hit ratio {hit_ratio:.2f} against {fit_share:.2f}.")


def popular_stays_loaded(top_hits: float, rare_hits: float) -> Verdict:
    """Whether the most requested model found itself loaded more often than the rare ones."""
    holds = top_hits > rare_hits
    return Verdict("the popular model stays loaded", holds, "held longer" if holds else "not held longer",
                   f"The popular model was held for {top_hits:.2f} of its requests; the rare ones hit "
                   f"{'only ' if holds else ''}{rare_hits:.2f} of the time ({1 - rare_hits:.2f} of their requests "
                   f"waited for a load).")


def churn_causes_loads(churn_misses: int, fit_misses: int, requests: int) -> Verdict:
    """Whether loads come from churn: with every model fitting, at most :data:`RARE_SHARE` of
    ``requests`` waited for a load, and more did under churn."""
    holds = churn_misses > fit_misses and fit_misses <= RARE_SHARE * requests
    fit = ("no request waited for a load (none" if fit_misses == 0 else
           f"a load was {'rare' if fit_misses <= RARE_SHARE * requests else 'not rare'} ({fit_misses}")
    return Verdict("churn causes the loads", holds, "churn" if holds else "not churn alone",
                   f"When all fit, {fit} of {requests} requests); under churn {churn_misses} of {requests} waited for "
                   "one.")


def tail_is_misses(slow_warm: int, warm: int, requests: int) -> Verdict:
    """Whether the slow tail is made of misses: at most :data:`RARE_SHARE` of a run's ``requests``
    among the ``warm`` ones (those that found their model loaded) took as long as a load."""
    holds = slow_warm <= RARE_SHARE * requests
    said = (f"none of the {warm} warm requests" if slow_warm == 0 else
            f"{'only ' if holds else ''}{slow_warm} of the {warm} warm requests")
    return Verdict("the tail is misses", holds, "misses" if holds else "not misses alone",
                   f"The tail is {'' if holds else 'not '}made of misses: {said} (those that found their model "
                   "loaded, in both runs) took as long as a load.")


def host_near_ceiling(rate: float, ceiling: float, clients: int) -> Verdict:
    """Whether one host ran near its offline ceiling: above :data:`NEAR_CEILING` of it."""
    holds = rate > NEAR_CEILING * ceiling
    word = "ran near its ceiling" if holds else "ran well below its ceiling"
    return Verdict("one host runs near its ceiling", holds, word,
                   f"One host with {clients} clients {word}: {rate:.1f} of {ceiling:.0f} requests/s.")


def second_host_scales(two_rate: float, one_rate: float, per_host: Sequence[int]) -> Verdict:
    """Whether a second host added most of a second device's throughput: more than
    :data:`SCALING` × one host's, with each host (``per_host``: requests each answered) busy,
    taking more than :data:`BUSY_HOST_SHARE` of the requests."""
    scaling = two_rate / one_rate
    busy = min(per_host) > BUSY_HOST_SHARE * sum(per_host)
    holds = scaling > SCALING and busy
    return Verdict("a second host scales", holds, "added" if holds else "did not add",
                   f"A second host {'added' if holds else 'did not add'} most of a second device's throughput for a "
                   f"model whose calls hold no CPU: {two_rate:.1f} against {one_rate:.1f} requests/s ({scaling:.2f}×), "
                   + ("both hosts busy." if busy else "one host nearly idle."))


#: A median latency of at least this many calls is a request that waited out a call before its own.
WAITED_OUT_CALLS = 1.5


def few_clients_part_empty(few_rate: float, full_rate: float, mean_batch: float, max_batch: int,
                           ceiling: float, clients: int, p50_s: float, call_s: float) -> Verdict:
    """Whether too few clients left two hosts' calls part-empty: under :data:`PART_EMPTY` of the
    full run's throughput, with mean batches under :data:`PART_EMPTY` of ``max_batch``. ``p50_s``
    (the few clients' median latency) in calls of ``call_s`` says how: greedy starts a call for
    whoever is queued when the device frees, so a client back a moment later waits out that
    whole call, and a median near two calls is a request that did."""
    holds = few_rate < PART_EMPTY * full_rate and mean_batch < PART_EMPTY * max_batch
    return Verdict("few clients leave the calls part-empty", holds, "part-empty" if holds else "not part-empty",
                   f"With {clients} clients the two hosts served {few_rate:.1f} requests/s, {few_rate / ceiling:.2f}× one "
                   f"device's ceiling: their calls ran {'part-empty' if holds else 'about as full'} ({mean_batch:.2f} rows "
                   f"of {max_batch} on average)"
                   + (f", consistent with calls that started for whoever had come back when the device freed: the "
                      f"median request took {p50_s / call_s:.1f} calls ({p50_s * 1e3:.0f} ms against {call_s * 1e3:.0f} ms "
                      f"a call)" + (", its own and the one it waited out" if p50_s >= WAITED_OUT_CALLS * call_s else "")
                      + ". Offer enough concurrency, or a scaling test measures its clients." if holds else "."))


# -- notebook 12: a large body decoded beside small requests -----------------------------------


#: A small request *stalled* behind a large body's parse when it waited more than this share of
#: the parse alone (``json.loads`` in the notebook's kernel): less could be anything else a
#: server does; more is most of the parse.
STALL_SHARE = 0.5
#: Latency against send time (ms per ms) at or below which the small requests sent during a
#: parse form a *ramp*: each waited for about the same moment, the parse's end (−1 exactly).
RAMP_SLOPE = -0.5


def stalled_behind_parse(worst_s: float, parse_s: float, server: str,
                         whole_decode_s: float | None = None) -> Verdict:
    """Whether a small request stalled behind a large JSON body's parse: the worst of those in
    flight beside the large one waited more than :data:`STALL_SHARE` of ``parse_s``, the parse
    alone. ``server`` names it, and where it parses; ``whole_decode_s``, when timed, the
    server's whole decode (the parse, then the lists into a tensor), printed beside it: the
    conversion holds the GIL too, so a stall may last as long as both."""
    holds = worst_s > STALL_SHARE * parse_s
    word = "a stall" if holds else "no stall"
    whole = ("" if whole_decode_s is None else
             f" ({whole_decode_s * 1e3:.0f} ms for its whole decode, the lists' conversion included"
             + ("; the wait outlasted even that: reading the body and one core shared by two threads may add "
                "to it, not timed apart here)" if worst_s > whole_decode_s else ")"))
    return Verdict("a small request stalled behind the parse", holds, word,
                   f"On {server} the worst small request beside the large one waited {worst_s * 1e3:.0f} ms, "
                   f"against {parse_s * 1e3:.0f} ms for json.loads alone{whole}: {word} (one counts when it "
                   f"passes {STALL_SHARE:.0%} of the parse).")


def loop_hardly_noticed(worst_s: float, stalls_s: Mapping[str, float], body: str) -> Verdict:
    """Whether a body whose decoding is a copy (``body``) left the loop free: the worst small
    request beside it waited less than :data:`STALL_SHARE` of the least of ``stalls_s`` (case ->
    the worst small request's wait beside the same rows as JSON)."""
    least = min(stalls_s.values())
    holds = worst_s < STALL_SHARE * least
    word = "hardly noticed" if holds else "noticed"
    return Verdict("the loop hardly noticed the decoding", holds, word,
                   f"With the same rows as {body} the worst small request beside the large one waited "
                   f"{worst_s * 1e3:.0f} ms, against "
                   + _and(f"{ms * 1e3:.0f} ms ({case})" for case, ms in stalls_s.items())
                   + (" as JSON" if not all("JSON" in case for case in stalls_s) else "")   # unless the labels say so
                   + f": the loop {word} the decoding ({STALL_SHARE:.0%} of the least is the line).")


def parse_ramps(slopes: Mapping[str, float | None]) -> Verdict:
    """Whether every server of ``slopes`` (case -> latency against send time, ms per ms, of the
    small requests that stalled while the large body was in the server; None with too few of
    them) shows the ramp of a stall: a slope at or below :data:`RAMP_SLOPE`."""
    holds = all(slope is not None and slope <= RAMP_SLOPE for slope in slopes.values())
    word = "show the ramp" if holds else "do not all show the ramp"
    shown = _and(f"{case} {'n/a' if slope is None else signed(format(slope, '+.2f'))}"
                 for case, slope in slopes.items())
    return Verdict("the stall is a ramp", holds, word,
                   f"Latency against send time during the parse, in ms per ms sent later: {shown}; they {word} "
                   f"(at most {signed(format(RAMP_SLOPE, '+.1f'))}; −1: every one waited for the same moment, the "
                   f"end of the parse).")


def _signed_share(fraction: float) -> str:
    """A relative difference as a signed whole percentage with a true minus: ``+12%``, ``−4%``."""
    return signed(format(fraction, "+.0%"))


def _and(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"

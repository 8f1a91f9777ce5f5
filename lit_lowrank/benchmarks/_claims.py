"""Claims that can fail: a paper's quantity over paired units, with a 95% CI and a verdict.

A claim is computed from per-unit measurements (seeds, splits, episodes, prompts,
noise draws, interleaved timing repeats) taken on the *same* units for every method
compared. Its verdict is one of four:

- ``holds``: the whole CI lies on the claimed side of ``target``;
- ``fails``: the whole CI lies on the wrong side;
- ``inconclusive``: the CI straddles the target, or fewer than :data:`MIN_UNITS` independent
  units were measured (a rule, not a statistic: two repeats of one deterministic step say nothing);
- ``no_headroom``: set by :func:`resolve` when a premise the claim ``requires`` did not hold —
  the regime gave the mechanism no room to act, so the test could not have shown it either way.

``op="within"`` is an equivalence claim ("matches"): ``|estimate| <= target``, holding
when the whole CI lies in ``[-target, target]`` and failing when it lies wholly outside.

.. code-block:: python

    from lit_lowrank.benchmarks.harness import claim, paired

    ours, base, units = paired(rows, "val_acc", {"method": "sds_lora"}, {"method": "lora"})
    claim("SDS-LoRA above LoRA in validation accuracy",
          paper="outperforms LoRA by 1.2 points on GLUE", quantity="val acc(SDS) - val acc(LoRA), fraction",
          values=ours, baseline=base, units=units, target=0.0, op=">")

The same function builds a control: the same quantity computed where the claim must
not hold (a null model, shuffled tags, a random drafter). :class:`BenchmarkResult`
marks a benchmark invalid when a control holds.

A **premise** (:func:`premise`) is the measured condition a claim's mechanism needs in this
regime, usually an oracle or upper bound against the baseline on the same units ("oracle routes
beat the best global filter"); a claim names it with ``requires=``. A **competitor**
(:func:`competitor`) is the claim's quantity computed with the cheapest alternative that could win
for the wrong reason (a random move of the same size, the baseline with more steps) in the
method's place; :func:`resolve` reports beside each claim which competitors pass it too.

.. code-block:: python

    ceiling = premise("oracle", "oracle routes beat the best global filter", needs="routing has headroom",
                      quantity="acc(oracle) - acc(global)", values=oracle, baseline=glob, target=0.0, op=">")
    ours = claim("Castor above the global filter", ..., name="routing", requires="oracle")
    rand = competitor("routing", "random routes above the global filter", competitor="random routes",
                      quantity="acc(random) - acc(global)", values=rnd, baseline=glob, target=0.0, op=">")
    claims = resolve([ours], premises=[ceiling], competitors=[rand])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_OPS = (">=", ">", "<=", "<", "within")
VERDICTS = ("holds", "fails", "inconclusive", "no_headroom")
MIN_UNITS = 3
_COMPARE = ("difference", "ratio")
_CI = ("t", "bootstrap")
BOOTSTRAP_RESAMPLES = 10_000


def _check(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}`={value!r}, expected one of {list(allowed)}.")


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of the mean; ``None`` for fewer than two units."""
    from scipy import stats

    n = values.size
    if n < 2:
        return None
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_interval(n_units: int, statistic: Callable[[np.ndarray], float], level: float = 0.95,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap over units: ``statistic(idx)`` on resampled unit indices."""
    if n_units < 2:
        return None
    rng = np.random.default_rng(seed)
    stats = np.array([statistic(rng.integers(0, n_units, n_units)) for _ in range(resamples)], dtype=float)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return None
    lo, hi = np.quantile(stats, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def verdict_of(ci: tuple[float, float] | None, target: float, op: str) -> str:
    """``holds`` / ``fails`` / ``inconclusive`` for a CI against ``target`` under ``op``."""
    _check("op", op, _OPS)
    if ci is None:
        return "inconclusive"
    lo, hi = ci
    if op == ">=":
        return "holds" if lo >= target else "fails" if hi < target else "inconclusive"
    if op == ">":
        return "holds" if lo > target else "fails" if hi <= target else "inconclusive"
    if op == "<=":
        return "holds" if hi <= target else "fails" if lo > target else "inconclusive"
    if op == "within":  # equivalence: the CI inside [-target, target]
        return "holds" if -target <= lo and hi <= target else "fails" if lo > target or hi < -target \
            else "inconclusive"
    return "holds" if hi < target else "fails" if lo >= target else "inconclusive"


def _as_array(name: str, values: Iterable[float]) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"`{name}` is empty: a claim needs at least one unit.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"`{name}` has non-finite values {arr.tolist()}: a claim needs finite measurements.")
    return arr


def _names(arg: str, value: str | Sequence[str] | None) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"`{arg}`={value!r}, expected a premise name or a list of names.")
    return names


def _record(text: str, paper: str, quantity: str, unit: str, n: int, estimate: float,
            ci: tuple[float, float] | None, target: float, op: str, method: str,
            values: np.ndarray | None, units: Sequence[Any] | None, note: str | None,
            name: str | None = None, requires: str | Sequence[str] | None = None) -> dict[str, Any]:
    if not paper or not quantity:
        raise ValueError(f"claim {text!r}: `paper` (the abstract's statement) and `quantity` (what is measured, "
                         "with unit) are required.")
    verdict = verdict_of(ci, target, op)
    if n < MIN_UNITS and verdict != "inconclusive":
        # by rule: fewer than three independent units decide nothing, whatever the interval says
        verdict = "inconclusive"
        note = f"{note + '; ' if note else ''}fewer than {MIN_UNITS} independent units: inconclusive by rule"
    out: dict[str, Any] = {
        "claim": text, "paper": paper, "quantity": quantity, "unit": unit, "n": int(n),
        "estimate": float(estimate), "ci": None if ci is None else [float(ci[0]), float(ci[1])],
        "ci_method": method, "target": float(target), "op": op, "verdict": verdict, "holds": verdict == "holds",
    }
    if values is not None and values.size <= 64:
        out["values"] = [float(v) for v in values]
    if units is not None and len(units) <= 64:
        out["units"] = [u if isinstance(u, (int, str, float)) else str(u) for u in units]
    if note:
        out["note"] = note
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name`={name!r}, expected a non-empty string.")
        out["name"] = name
    required = _names("requires", requires)
    if required:
        out["requires"] = required
    return out


def claim(text: str, *, paper: str, quantity: str, values: Iterable[float], target: float, op: str = ">=",
          baseline: Iterable[float] | None = None, compare: str = "difference", ci: str = "t",
          unit: str = "seed", units: Sequence[Any] | None = None, level: float = 0.95,
          note: str | None = None, name: str | None = None,
          requires: str | Sequence[str] | None = None) -> dict[str, Any]:
    """A claim over paired per-unit measurements.

    Args:
        text: the claim at the benchmark's scale ("SDS-LoRA loss below LoRA's at κ = 100").
        paper: the abstract's statement with its numbers, verbatim.
        quantity: what is measured, with its unit ("loss(SDS)/loss(LoRA) at step 200, ratio").
        values: one measurement per unit for the method (or the per-unit quantity itself).
        baseline: the baseline's measurement on the same units; then the per-unit quantity is
            ``values - baseline`` (``compare="difference"``) or ``values / baseline``
            (``compare="ratio"``: estimated as the geometric mean, its CI from the mean log ratio).
        target, op: the claim is ``estimate op target``; the verdict reads the CI. ``op="within"``:
            ``|estimate| <= target`` (an equivalence margin; the CI must lie inside it).
        ci: ``"t"`` (Student t over units, the default: honest at 3-5 seeds) or ``"bootstrap"``
            (percentile, paired, for many units).
        unit: what one unit is ("seed", "prompt", "episode", "split", "batch"); ``units`` their ids.
            Units are independent draws; fewer than :data:`MIN_UNITS` make the verdict ``inconclusive``.
        name: a short id that premises' ``requires`` and competitors' ``for`` refer to.
        requires: the names of the premises (:func:`premise`) the claim's mechanism needs here;
            :func:`resolve` turns the verdict into ``no_headroom`` when one of them did not hold.
    """
    _check("op", op, _OPS)
    _check("compare", compare, _COMPARE)
    _check("ci", ci, _CI)
    vals = _as_array("values", values)
    if baseline is not None:
        base = _as_array("baseline", baseline)
        if base.shape != vals.shape:
            raise ValueError(f"`baseline` has {base.size} units but `values` has {vals.size}: "
                             "a paired claim needs the same units for both.")
        if compare == "ratio":
            if np.any(vals <= 0) or np.any(base <= 0):
                raise ValueError("`compare`='ratio' needs positive values and baseline.")
            per_unit = np.log(vals / base)
        else:
            per_unit = vals - base
    else:
        if compare == "ratio":
            if np.any(vals <= 0):
                raise ValueError("`compare`='ratio' without a baseline needs positive per-unit ratios.")
            per_unit = np.log(vals)
        else:
            per_unit = vals
    if units is not None and len(units) != per_unit.size:
        raise ValueError(f"`units` has {len(units)} ids for {per_unit.size} values.")
    if ci == "t":
        interval = t_interval(per_unit, level)
    else:
        interval = bootstrap_interval(per_unit.size, lambda idx: float(per_unit[idx].mean()), level)
    estimate = float(per_unit.mean())
    shown = per_unit
    if compare == "ratio":
        estimate = math.exp(estimate)
        interval = None if interval is None else (math.exp(interval[0]), math.exp(interval[1]))
        shown = np.exp(per_unit)
    return _record(text, paper, quantity, unit, per_unit.size, estimate, interval, target, op, ci, shown, units, note,
                   name, requires)


def statistic_claim(text: str, *, paper: str, quantity: str, n_units: int,
                    statistic: Callable[[np.ndarray], float], target: float, op: str = ">=",
                    unit: str = "seed", units: Sequence[Any] | None = None, level: float = 0.95,
                    resamples: int = BOOTSTRAP_RESAMPLES, note: str | None = None, name: str | None = None,
                    requires: str | Sequence[str] | None = None) -> dict[str, Any]:
    """A claim whose quantity is a function of all units (an average rank, a rate, a max).

    ``statistic(idx)`` computes the quantity from the units at indices ``idx`` (with
    repeats); the estimate is ``statistic(arange(n_units))`` and the CI a paired
    percentile bootstrap over units (every method resampled with the same indices).
    ``name`` and ``requires`` as in :func:`claim`.
    """
    if n_units < 1:
        raise ValueError(f"`n_units`={n_units}, expected >= 1.")
    estimate = float(statistic(np.arange(n_units)))
    if not math.isfinite(estimate):
        raise ValueError(f"claim {text!r}: the statistic on all units is {estimate}.")
    interval = bootstrap_interval(n_units, statistic, level, resamples)
    return _record(text, paper, quantity, unit, n_units, estimate, interval, target, op, "bootstrap",
                   None, units, note, name, requires)


def premise(name: str, text: str, *, needs: str, statistic: Callable[[np.ndarray], float] | None = None,
            **kwargs: Any) -> dict[str, Any]:
    """The measured condition a claim's mechanism needs in this regime (a claim with the same fields).

    ``needs`` says what the mechanism needs ("per-node routing has headroom over one global filter");
    the rest is :func:`claim`'s arguments (or :func:`statistic_claim`'s when ``statistic`` is given),
    usually an oracle or upper bound against the baseline on the claim's own units.

    .. code-block:: python

        premise("oracle_routes", "oracle routes beat the best global filter", needs="routing headroom",
                quantity="acc(oracle) - acc(best global), fraction", values=oracle, baseline=best,
                units=splits, unit="split", target=0.0, op=">")
    """
    if not needs:
        raise ValueError(f"premise {name!r}: `needs` (what the mechanism needs in this regime) is required.")
    if statistic is not None:
        return statistic_claim(text, paper=needs, statistic=statistic, name=name, **kwargs)
    return claim(text, paper=needs, name=name, **kwargs)


def competitor(for_claim: str, text: str, *, competitor: str, paper: str = "(competitor)",
               statistic: Callable[[np.ndarray], float] | None = None, **kwargs: Any) -> dict[str, Any]:
    """A claim's quantity with the cheapest alternative that could win for the wrong reason in the method's place.

    ``for_claim`` is the ``name`` of the claim; ``competitor`` names the alternative ("a random move
    of the same radius", "LoRA with 2x the steps", "RTN at equal bits"). When its verdict is
    ``holds``, :func:`resolve` lists it under the claim's ``matched_by``: the claim does not show
    that the method's mechanism is what won.
    """
    if not competitor:
        raise ValueError(f"competitor for {for_claim!r}: `competitor` (what stands in for the method) is required.")
    out = (statistic_claim(text, paper=paper, statistic=statistic, **kwargs) if statistic is not None
           else claim(text, paper=paper, **kwargs))
    out["for"], out["competitor"] = for_claim, competitor
    return out


def resolve(claims: Sequence[dict[str, Any]], premises: Sequence[dict[str, Any]] = (),
            competitors: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Claims with their premises and competitors applied (new dicts; the inputs are not changed).

    A claim whose ``requires`` names a premise that did not hold gets ``verdict = "no_headroom"``
    (``measured_verdict`` keeps what its CI said, ``premises_failed`` which premise); each claim gets
    ``competitors`` (name, estimate, verdict of every competitor computed for it) and ``matched_by``
    (those whose verdict is ``holds`` too). Unknown names raise, naming them.
    """
    by_name = {p.get("name"): p for p in premises}
    if None in by_name:
        raise ValueError("a premise lacks `name`: build premises with `premise(name, ...)`.")
    claim_names = {c.get("name") for c in claims} - {None}
    for comp in competitors:
        if comp.get("for") not in claim_names:
            raise ValueError(f"competitor {comp.get('claim')!r} is `for` {comp.get('for')!r}, but no claim has that "
                             f"`name` (claims named: {sorted(claim_names)}).")
    out = []
    for c in claims:
        c = dict(c)
        required = c.get("requires", [])
        unknown = [r for r in required if r not in by_name]
        if unknown:
            raise ValueError(f"claim {c.get('claim')!r} requires {unknown}, which no premise is named "
                             f"(premises: {sorted(by_name)}).")
        failed = [r for r in required if by_name[r].get("verdict") != "holds"]
        if failed:
            c["measured_verdict"] = c["verdict"]
            c["verdict"], c["holds"], c["premises_failed"] = "no_headroom", False, failed
        mine = [comp for comp in competitors if c.get("name") is not None and comp.get("for") == c.get("name")]
        if mine:
            c["competitors"] = [{"competitor": m["competitor"], "estimate": m["estimate"], "ci": m["ci"],
                                 "verdict": m["verdict"]} for m in mine]
            c["matched_by"] = [m["competitor"] for m in mine if m["verdict"] == "holds"]
        out.append(c)
    return out


def paired(rows: Sequence[Mapping[str, Any]], metric: str, a: Mapping[str, Any], b: Mapping[str, Any],
           unit: str = "seed") -> tuple[list[float], list[float], list[Any]]:
    """Per-unit ``metric`` of the rows matching ``a`` and of those matching ``b``, aligned by ``unit``.

    Raises when the two sets of units differ (an unpaired comparison) or a unit appears twice.
    """
    va, vb = per_unit(rows, metric, unit, **a), per_unit(rows, metric, unit, **b)
    if set(va) != set(vb):
        raise ValueError(f"unpaired comparison on {metric!r}: {dict(a)} has {unit}s {sorted(va, key=str)}, "
                         f"{dict(b)} has {sorted(vb, key=str)}.")
    keys = sorted(va, key=str)
    return [va[k] for k in keys], [vb[k] for k in keys], keys


def per_unit(rows: Sequence[Mapping[str, Any]], metric: str, unit: str = "seed", **match: Any) -> dict[Any, float]:
    """``{unit id: metric}`` over the rows whose fields equal ``match``."""
    out: dict[Any, float] = {}
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            if metric not in row or unit not in row:
                raise KeyError(f"row {row} lacks {metric!r} or the unit field {unit!r}.")
            key = row[unit]
            if key in out:
                raise ValueError(f"{unit}={key!r} appears twice among rows matching {match}: "
                                 "add the distinguishing field to the match.")
            out[key] = float(row[metric])
    if not out:
        raise ValueError(f"no row matches {match} (metric {metric!r}).")
    return out

"""Claims that can fail: a paper's quantity over paired units, with a 95% CI and a verdict.

A claim is computed from per-unit measurements (seeds, splits, episodes, prompts,
noise draws, interleaved timing repeats) taken on the *same* units for every method
compared. Its verdict is three-valued:

- ``holds``: the whole CI lies on the claimed side of ``target``;
- ``fails``: the whole CI lies on the wrong side;
- ``inconclusive``: the CI straddles the target (or there is one unit only).

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_OPS = (">=", ">", "<=", "<", "within")
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


def _record(text: str, paper: str, quantity: str, unit: str, n: int, estimate: float,
            ci: tuple[float, float] | None, target: float, op: str, method: str,
            values: np.ndarray | None, units: Sequence[Any] | None, note: str | None) -> dict[str, Any]:
    if not paper or not quantity:
        raise ValueError(f"claim {text!r}: `paper` (the abstract's statement) and `quantity` (what is measured, "
                         "with unit) are required.")
    verdict = verdict_of(ci, target, op)
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
    return out


def claim(text: str, *, paper: str, quantity: str, values: Iterable[float], target: float, op: str = ">=",
          baseline: Iterable[float] | None = None, compare: str = "difference", ci: str = "t",
          unit: str = "seed", units: Sequence[Any] | None = None, level: float = 0.95,
          note: str | None = None) -> dict[str, Any]:
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
        unit: what one unit is ("seed", "prompt", "episode", "split", "repeat"); ``units`` their ids.
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
    return _record(text, paper, quantity, unit, per_unit.size, estimate, interval, target, op, ci, shown, units, note)


def statistic_claim(text: str, *, paper: str, quantity: str, n_units: int,
                    statistic: Callable[[np.ndarray], float], target: float, op: str = ">=",
                    unit: str = "seed", units: Sequence[Any] | None = None, level: float = 0.95,
                    resamples: int = BOOTSTRAP_RESAMPLES, note: str | None = None) -> dict[str, Any]:
    """A claim whose quantity is a function of all units (an average rank, a rate, a max).

    ``statistic(idx)`` computes the quantity from the units at indices ``idx`` (with
    repeats); the estimate is ``statistic(arange(n_units))`` and the CI a paired
    percentile bootstrap over units (every method resampled with the same indices).
    """
    if n_units < 1:
        raise ValueError(f"`n_units`={n_units}, expected >= 1.")
    estimate = float(statistic(np.arange(n_units)))
    if not math.isfinite(estimate):
        raise ValueError(f"claim {text!r}: the statistic on all units is {estimate}.")
    interval = bootstrap_interval(n_units, statistic, level, resamples)
    return _record(text, paper, quantity, unit, n_units, estimate, interval, target, op, "bootstrap",
                   None, units, note)


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

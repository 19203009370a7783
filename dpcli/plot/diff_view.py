"""A diff drawn (``dpcli plot DIFF``, ``dpcli diff --plot``): each group's difference new − old with its 95% margin,
the groups flagged changed marked; as text (bars either side of 0) or as a picture (matplotlib).

Groups are shown most significant first (smallest p, then the largest difference), the first ``top`` (20); groups
released in one file only have no difference and are left out of the chart (the table lists them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from dpcli.core.display import quantity_text
from dpcli.errors import UsageError
from dpcli.plot.release_view import ReleaseView, label_of
from dpcli.plot.terminal import bar

#: Groups drawn by default.
TOP = 20


@dataclass(frozen=True)
class DiffBars:
    """What a diff chart draws: the statistic, per group its label, difference, margin and whether it changed."""

    column: str
    labels: list[str]
    diffs: list[float]
    margins: list[float | None]
    changed: list[bool]


def diff_bars(view: ReleaseView, value: str | None = None, top: int | None = None) -> DiffBars:
    """The groups of a diff to draw (see the module docstring) for ``value`` (default: the first statistic)."""
    column = value or view.values[0]
    if column not in view.values:
        raise UsageError(f"{view.name!r} compares no {column!r} (it compares {', '.join(view.values)})", field="value")
    t = view.table.filter(pl.col(f"{column}_diff").is_not_null())
    t = t.with_columns(pl.col(f"{column}_diff").cast(pl.Float64).abs().alias("__size")).sort(
        ["p", "__size"], descending=[False, True], nulls_last=True).head(top if top is not None else TOP)
    labels = [label_of(r, view.keys) for r in t.select(list(view.keys)).to_dicts()]
    margins = t[f"{column}_diff_moe95"].cast(pl.Float64).to_list()
    return DiffBars(column, labels, t[f"{column}_diff"].cast(pl.Float64).to_list(), margins,
                    [c == "changed" for c in t["changed"].to_list()])


def _caption(view: ReleaseView) -> str:
    s = view.summary
    fdr = s.get("fdr")
    rate = f" at a false-discovery rate of {fdr:g}" if isinstance(fdr, int | float) else ""
    shared = " · the two releases share their noise: differences exact" if s.get("shared_noise") else ""
    return f"±: 95% margins of the difference · *: changed{rate}{shared}"


def diff_text(view: ReleaseView, width: int, value: str | None = None, top: int | None = None) -> str:
    """The chart as text in ``width`` cells: a bar either side of a centre line per group, its difference ± margin."""
    if view.empty or not view.table.filter(pl.col(f"{view.values[0]}_diff").is_not_null()).height:
        return f"diff {view.name}: no group released in both files, nothing to draw"
    d = diff_bars(view, value, top)
    texts = [f"{'+' if x > 0 else ''}{quantity_text(x)}" + (f" ±{quantity_text(m)}" if m is not None else "")
             + (" *" if c else "") for x, m, c in zip(d.diffs, d.margins, d.changed, strict=True)]
    label_w = max(len(s) for s in d.labels)
    text_w = max(len(t) for t in texts)
    half = max((width - label_w - text_w - 4) // 2, 6)
    scale = max(abs(x) + (m or 0.0) for x, m in zip(d.diffs, d.margins, strict=True)) or 1.0
    lines = [f"{d.column}: new − old by {', '.join(view.keys)}"]
    for label, x, t in zip(d.labels, d.diffs, texts, strict=True):
        left = bar(-x, scale, half).rjust(half)
        right = bar(x, scale, half).ljust(half)
        lines.append(f"{label:<{label_w}} {left}│{right} {t:>{text_w}}")
    return "\n".join([*lines, _caption(view)])


def diff_figure(view: ReleaseView, value: str | None = None, top: int | None = None) -> Any:
    """The chart as a matplotlib figure: horizontal bars of the differences with error bars, changed ones
    highlighted, a line at 0."""
    from dpcli.plot.figure import _STYLE, _pyplot

    plt = _pyplot()
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7, 1.0 + 0.28 * max(1, min(len(view.table), top or TOP))))
        if view.empty or not view.table.filter(pl.col(f"{view.values[0]}_diff").is_not_null()).height:
            ax.axis("off")
            ax.text(0.5, 0.5, f"diff {view.name}: no group released in both files", ha="center", va="center")
            return fig
        d = diff_bars(view, value, top)
        y = list(range(len(d.labels)))
        errors = [m if m is not None and math.isfinite(m) else 0.0 for m in d.margins]
        colours = ["#DD8452" if c else "#8C8C8C" for c in d.changed]
        ax.barh(y, d.diffs, xerr=errors, color=colours, ecolor="#222222", capsize=2, height=0.7)
        ax.axvline(0, color="#222222", linewidth=0.8)
        ax.set_yticks(y, d.labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"{d.column}: new − old")
        ax.set_ylabel(", ".join(view.keys))
        ax.set_title(f"{d.column}: difference by {', '.join(view.keys)}", pad=18)
        caption = _caption(view).replace("±", "error bars").replace("*: changed", "orange: changed")
        ax.text(0.5, 1.01, caption, transform=ax.transAxes, ha="center", va="bottom", fontsize=7.5, color="#555555")
    return fig

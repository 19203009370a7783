"""PNG and SVG pictures with matplotlib (the ``plot`` extra: ``pip install 'dpcli[plot]'``).

SVG output is deterministic for one matplotlib version: a fixed font (DejaVu Sans, shipped with
matplotlib) drawn as paths, a fixed hash salt for element ids, and no date in the metadata, so
tests compare it byte for byte. Only released values are drawn: margins are the noise's 95%
margins, never a distance to a true value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpcli.errors import UsageError
from dpcli.plot.budget_view import BudgetTimeline
from dpcli.plot.release_view import (
    ReleaseView,
    bars,
    level_totals,
    pyramid,
    released_total,
    sex_cells,
    stream_lines,
)

FORMATS = (".png", ".svg")
_STYLE = {"svg.hashsalt": "dpcli", "svg.fonttype": "path", "font.family": "DejaVu Sans", "font.size": 9,
          "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 100}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("drawing to a file needs matplotlib: pip install 'dpcli[plot]' "
                         "(without -o, the chart is drawn in the terminal)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def picture_format(path: str, field: str = "output") -> str:
    """The picture format of ``path``: ``.png`` or ``.svg``, refused otherwise; ``field`` names the
    option that gave it."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"must end in .png or .svg, got {path!r}", field=field)
    return suffix


def check_target(path: str, field: str = "output") -> str:
    """The picture format of ``path`` (:func:`picture_format`), and may it be written (the gate):
    refused before anything is read."""
    from dpcli.access import gate

    suffix = picture_format(path, field)
    gate().check_write(path, "picture")
    return suffix


def save(fig: Any, path: str) -> None:
    """Write ``fig`` to ``path`` atomically, through the gate (SVG without a date, PNG without software
    metadata)."""
    import io

    from dpcli.access import gate

    buf = io.BytesIO()
    suffix = picture_format(path)
    metadata = {"Date": None, "Creator": "dpcli"} if suffix == ".svg" else {"Software": "dpcli"}
    plt = _pyplot()
    with plt.rc_context(_STYLE):  # the hash salt is read when saving
        fig.savefig(buf, format=suffix[1:], metadata=metadata, bbox_inches="tight")
    gate().write(path, buf.getvalue(), "picture")


def release_figure(view: ReleaseView, value: str | None = None, top: int | None = None,
                   keys: list[str] | None = None, group: str | None = None, level: str | None = None,
                   totals: bool = False) -> Any:
    """The figure of a release: bars with margins, lines with bands, a sex × age pyramid, or a
    tabulate level's totals (``totals``)."""
    plt = _pyplot()
    if view.kind == "diff" and not view.empty:
        from dpcli.plot.diff_view import diff_figure

        return diff_figure(view, value, top)
    with plt.rc_context(_STYLE):
        if view.empty:
            return _empty_figure(plt, view)
        if view.kind in ("histogram", "topk", "sql"):
            fig = _bars_figure(plt, view, value, top)
        elif view.kind == "tabulate" and totals:
            chosen, labels, values, margins = level_totals(view, level, top if top is not None else 20)
            fig = _bars(plt, labels, values, margins, "count", "population group", f"released totals at {chosen}")
        elif view.kind == "stream-replay":
            fig = _stream_figure(plt, view, value, keys, top if top is not None else 5)
        else:
            fig = _pyramid_figure(plt, view, group, level)
        ax = fig.axes[0]
        caption = view.caption(_marks(view, value, top, keys, totals, level))
        ax.set_title(ax.get_title(), pad=16 + 10 * caption.count("\n"))  # above every line of the caption
        ax.text(0.5, 1.01, caption, transform=ax.transAxes, ha="center", va="bottom", fontsize=7.5,
                color="#555555")
    return fig


def _marks(view: ReleaseView, value: str | None, top: int | None, keys: list[str] | None, totals: bool,
           level: str | None) -> str | None:
    """What the figure draws around its values (error bars, a stream's bands), None when it draws nothing."""
    if view.kind in ("histogram", "topk", "sql"):
        return "error bars" if bars(view, value, top)[2] is not None else None
    if view.kind == "stream-replay":
        lines = stream_lines(view, value, keys, top if top is not None else 5)["lines"].values()
        return "bands" if all(line[2] is not None for line in lines) else None
    if totals:
        return "error bars" if level_totals(view, level, top if top is not None else 20)[3] is not None else None
    return "error bars" if view.margin_of("count") is not None else None


def _empty_figure(plt: Any, view: ReleaseView) -> Any:
    """A release with no rows: a picture that says so (a job drawing every day's release still gets a file)."""
    fig, ax = plt.subplots(figsize=(7, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, view.empty_text(), transform=ax.transAxes, ha="center", va="center", fontsize=9)
    return fig


def _bars_figure(plt: Any, view: ReleaseView, value: str | None, top: int | None) -> Any:
    labels, values, margins = bars(view, value, top if top is not None else 20)
    column = value or view.values[0]
    threshold = view.threshold if column in ("count", "count_units") else None
    return _bars(plt, labels, values, margins, column, ", ".join(view.keys),
                 f"{column} by {', '.join(view.keys)}" + (f" (top {len(labels)})" if top else ""), threshold)


def _bars(plt: Any, labels: list[str], values: list[float], margins: list[float] | None, xlabel: str, ylabel: str,
          title: str, threshold: float | None = None) -> Any:
    """Horizontal bars, first label on top, with error bars and an optional threshold line."""
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7, 0.8 + 0.28 * max(len(labels), 1)))
        y = list(range(len(labels)))
        ax.barh(y, values, xerr=margins, color="#4C72B0", ecolor="#222222", capsize=2, height=0.7,
                label="released value" + (" ± 95% noise margin" if margins else ""))
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if threshold is not None:
            ax.axvline(threshold, color="#C44E52", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        ax.legend(loc="lower right", fontsize=8, frameon=False)
        ax.set_title(title)
    return fig


def _stream_figure(plt: Any, view: ReleaseView, value: str | None, keys: list[str] | None, top: int) -> Any:
    from datetime import datetime

    data = stream_lines(view, value, keys, top)
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for i, (label, (times, vals, margins, windows)) in enumerate(data["lines"].items()):
            colour = f"C{i % 10}"
            for w, window in enumerate(dict.fromkeys(windows)):  # one segment per window (totals restart)
                idx = [j for j, x in enumerate(windows) if x == window]
                x = [datetime.fromisoformat(times[j]) for j in idx]
                _segment(ax, x, [vals[j] for j in idx], [margins[j] for j in idx] if margins else None, colour,
                         label if w == 0 else None)
        ax.set_xlabel("trigger time")
        ax.set_ylabel(data["value"])
        ax.set_title(f"{data['value']} per trigger, by {', '.join(view.keys)} (running totals within each window)")
        ax.legend(fontsize=8, frameon=False)
        fig.autofmt_xdate()
    return fig


def _segment(ax: Any, x: list[Any], v: list[float], m: list[float] | None, colour: str, label: str | None) -> None:
    """One window's line of a key, with its band of margins."""
    ax.plot(x, v, marker=".", linewidth=1.2, color=colour, label=label)
    if m:
        ax.fill_between(x, [a - b for a, b in zip(v, m, strict=True)],
                        [a + b for a, b in zip(v, m, strict=True)], color=colour, alpha=0.18, linewidth=0)


def _pyramid_figure(plt: Any, view: ReleaseView, group: str | None, level: str | None) -> Any:
    p = pyramid(view, group, level)
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7, 1.2 + 0.25 * max(len(p["ages"]), 1)))
        ax.set_title(f"{p['group']} at {p['level']}")
        if not p["ages"]:
            value, margin = released_total(p)
            ax.barh([0], [value], xerr=[margin] if margin is not None else None, color="#4C72B0", capsize=3)
            ax.set_yticks([0], ["total (only the total was released)"])
            ax.set_xlabel("count")
            return fig
        y = list(range(len(p["ages"])))
        colours = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
        for i, sex in enumerate(p["sexes"][:2]):
            sign = -1 if i == 0 else 1
            values, margins = sex_cells(p, sex)
            ax.barh(y, [sign * v for v in values], xerr=margins,
                    color=colours[i], ecolor="#222222", capsize=2, height=0.8, label=f"sex {sex}")
        ax.set_yticks(y, p["ages"])
        ax.axvline(0, color="#222222", linewidth=0.8)
        lim = max(abs(x) for x in ax.get_xlim())
        ax.set_xlim(-lim, lim)  # both sexes on one symmetric scale
        ticks = [t for t in ax.get_xticks() if abs(t) <= lim]
        ax.set_xticks(ticks, [f"{abs(t):g}" for t in ticks])
        ax.set_xlabel("count (left: first sex code, right: second)")
        ax.set_ylabel("age")
        ax.legend(fontsize=8, frameon=False)
    return fig


def budget_figure(tl: BudgetTimeline) -> Any:
    """One panel per quantity: the running spend over time, its limit, refresh periods, schedules' reservation."""
    plt = _pyplot()
    keys = list(tl.spent)
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(len(keys) or 1, 1, figsize=(7, 2.2 * max(len(keys), 1)), squeeze=False)
        for ax, key in zip(axes[:, 0], keys or [""], strict=True):
            if not key:
                ax.set_title("nothing spent yet")
                continue
            ax.step(tl.times, tl.spent[key], where="post", color="#4C72B0", label=f"{key} spent")
            if key in tl.limits:
                ax.axhline(tl.limits[key], color="#C44E52", linestyle="--", linewidth=1, label="limit")
            if key == "epsilon" and tl.reserved:
                ax.axhline(tl.reserved, color="#8172B3", linestyle=":", linewidth=1, label="reserved by schedules")
            for start in tl.periods:
                ax.axvline(start, color="#999999", linewidth=0.8)
            ax.set_ylabel(key)
            ax.legend(fontsize=8, frameon=False, loc="upper left")
        axes[0, 0].set_title(f"budget of {tl.analyst} ({tl.mode} ledger)")
        fig.autofmt_xdate()
    return fig

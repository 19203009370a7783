"""The pictures as text, for a terminal: bars drawn with Unicode block characters, margins as ±.

Widths are in terminal cells; labels and numbers are never cut (a long label narrows the bars).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpcli.core.display import PARAMETERS, Rounding, figure_text, parameter_text, quantity_text
from dpcli.plot.budget_view import BudgetTimeline

if TYPE_CHECKING:  # polars is imported only to draw a release, never for the budget
    from dpcli.plot.release_view import Pyramid, ReleaseView

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(value: float, scale: float, width: int) -> str:
    """``value`` as a bar of at most ``width`` cells when ``scale`` fills them (negative values: empty)."""
    if scale <= 0 or value <= 0:
        return ""
    eighths = round(min(value / scale, 1.0) * width * 8)
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")


def bar_chart(labels: list[str], values: list[float], margins: list[float] | None, width: int,
              threshold: float | None = None, scale: float | None = None) -> list[str]:
    """One line per label: the label, a bar, the value and its ± margin; a threshold marker line.
    Bars fill the width at ``scale`` (default: the largest value)."""
    label_w = max((len(s) for s in labels), default=0)
    texts = _value_texts(values, margins)
    text_w = max((len(t) for t in texts), default=0)
    bar_w = max(width - label_w - text_w - 3, 10)
    top = scale if scale is not None else max([*values, threshold or 0, 0.0])
    lines = [f"{label:<{label_w}} {bar(v, top, bar_w):<{bar_w}} {t:>{text_w}}" for label, v, t in
             zip(labels, values, texts, strict=True)]
    if threshold is not None and top > 0:
        pos = min(round(threshold / top * bar_w), bar_w - 1)
        lines.append(f"{'':<{label_w}} {' ' * pos}┆ threshold {quantity_text(threshold)}")
    return lines


def _value_texts(values: list[float], margins: list[float] | None) -> list[str]:
    """Each value as a number, with its ± margin when there are margins."""
    return [quantity_text(v) + (f" ±{quantity_text(m)}" if margins else "")
            for v, m in zip(values, margins or values, strict=True)]


def release_text(view: ReleaseView, width: int, value: str | None = None, top: int | None = None,
                 keys: list[str] | None = None, group: str | None = None, level: str | None = None,
                 totals: bool = False) -> str:
    """A compact chart of ``view`` in ``width`` cells, with a title and the caption."""
    from dpcli.plot.release_view import bars, level_totals, pyramid, stream_lines

    if view.empty:
        return view.empty_text()
    if view.kind == "diff":
        from dpcli.plot.diff_view import diff_text

        return diff_text(view, width, value, top)
    if view.kind in ("histogram", "topk", "sql"):
        labels, values, margins = bars(view, value, top if top is not None else 20)
        has_margins = margins is not None
        column = value or view.values[0]
        body = bar_chart(labels, values, margins, width, view.threshold if column in ("count", "count_units") else None)
        title = f"{column} by {', '.join(view.keys)}"
    elif view.kind == "stream-replay":
        data = stream_lines(view, value, keys, top if top is not None else 5)
        body = [_stream_line(label, *line) for label, line in data["lines"].items()]
        has_margins = all(line[2] is not None for line in data["lines"].values())
        title = f"{data['value']} per trigger, by {', '.join(view.keys)}"
    elif totals:
        chosen, labels, values, margins = level_totals(view, level, top if top is not None else 20)
        title = f"released totals at {chosen}"
        body = bar_chart(labels, values, margins, width)
        has_margins = margins is not None
    else:
        p = pyramid(view, group, level)
        title = f"{p['group']} at {p['level']}: count by sex and age"
        body = _pyramid_lines(p, width)
        has_margins = view.margin_of("count") is not None
    return "\n".join([title, *body, view.caption("±" if has_margins else None)])


def _stream_line(label: str, times: list[str], vals: list[float], margins: list[float] | None, _: object) -> str:
    """A key's released values as a sparkline, and its last value (± margin) and trigger time."""
    return (f"{label}: " + _sparkline(vals) + f"  last {quantity_text(vals[-1])}"
            + (f" ±{quantity_text(margins[-1])}" if margins else "") + f" at {times[-1]}")


def _sparkline(values: list[float]) -> str:
    ticks = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(ticks[min(int((v - lo) / span * 7.999), 7)] for v in values)


def _pyramid_lines(p: Pyramid, width: int) -> list[str]:
    from dpcli.plot.release_view import released_total, sex_cells

    if not p["ages"]:
        value, margin = released_total(p)
        return [f"total {quantity_text(value)}" + (f" ±{quantity_text(margin)}" if margin is not None else "")
                + " (only the total was released for this group)"]
    lines = []
    scale = max((v for v, _ in p["cells"].values()), default=0.0)  # one scale for every sex
    for sex in p["sexes"]:
        values, margins = sex_cells(p, sex)
        lines += bar_chart([f"sex {sex} {age}" for age in p["ages"]], values, margins, width, scale=scale)
    return lines


def _spent(key: str, value: float, rounding: Rounding) -> str:
    """A spend or its limit: ε, δ and ρ as :func:`dpcli.core.display.parameter_text` shows them (spent up, the
    limit down), a br ledger's units and calls as whole numbers."""
    return figure_text(key, value, rounding) if key in PARAMETERS else f"{value:.4g}"


def budget_text(tl: BudgetTimeline, width: int) -> str:
    """The spend so far against each limit (one bar per quantity), and a sparkline of its growth."""
    lines = [f"budget of {tl.analyst} ({tl.mode} ledger): spent so far, against the limit"]
    if not tl.times:
        return "\n".join([*lines, "nothing spent yet"])
    labels, values, tops = [], [], []
    for key, series in tl.spent.items():
        labels.append(key)
        values.append(series[-1])
        tops.append(tl.limits.get(key, max(series) or 1.0))
    label_w = max(len(s) for s in labels)
    bar_w = max(width - label_w - 28, 10)
    for key, value, top in zip(labels, values, tops, strict=True):
        frac = value / top if top else 0.0
        lines.append(f"{key:<{label_w}} {bar(value, top, bar_w):<{bar_w}} {_spent(key, value, 'up')} of "
                     f"{_spent(key, top, 'down')} ({frac:.0%})")
        lines.append(f"{'':<{label_w}} {_sparkline(tl.spent[key])} over {len(tl.times)} entries")
    if tl.reserved:
        lines.append(f"schedules reserve ε {parameter_text(tl.reserved, 'up')} of this period")
    if tl.periods:
        lines.append(f"refresh periods began: {', '.join(t.date().isoformat() for t in tl.periods)}")
    return "\n".join(lines)

"""Notes on a stream-replay run: why it released nothing, and a retry.

Each note is a function of public inputs only: the triggers a run executes (from ``--through``
and the ``through`` of the stream's earlier runs), the query, and the number of released rows
(post-processing of the noisy output). None says whether any event was fed, kept or dropped.
"""

from __future__ import annotations

from datetime import datetime

from dpcli.advice import Note
from dpcli.core.display import utc_text
from dpcli.tasks.reports import StreamReport
from dpcli.tasks.stream.algorithm import naive_utc


def _time(g: int, step: int) -> str:
    """The end of global trigger ``g`` (ISO 8601, UTC)."""
    return utc_text(naive_utc(g * step))


def empty_run(through: int, previous: int | None, step: int, *, kept: bool) -> Note:
    """0 rows: no trigger was due (``through`` is the last run's, ``previous``), or the triggers that ran
    released no key. ``kept``: the run fed a persisted stream, which keeps events of later triggers."""
    if kept and previous is not None and through <= previous:
        return Note(f"0 rows: no trigger has ended since the last run (the next ends at {_time(through + 1, step)}); "
                    "events of triggers not yet run are kept in the state and counted when their trigger runs")
    later = ("events of later triggers are kept in the state and counted when their trigger runs" if kept
             else "events after --through are not part of this release")
    return Note(f"0 rows: no key was released by the triggers up to {_time(through, step)} (a key is released once "
                f"its noisy count of distinct units passes the selection threshold); {later}")


def retry(recorded: int, through: int, step: int) -> Note:
    """The run repeated the last run's input: that run's rows again, free. Triggers due since (``through`` after
    the ``recorded`` one) run with the next new input."""
    text = "same input as the stream's last run: a retry, returning the rows that run released (free)"
    if through > recorded:
        text += f"; the triggers after {_time(recorded, step)} run with the next new input"
    return Note(text)



def chosen_for_stream(metadata: StreamReport) -> Note:
    """The run that chose a persisted stream's ``auto`` bounds (released values): they hold for every later run,
    though only this run's records were read to choose them."""
    auto = metadata.get("auto") or {}
    shown = [f"--max-contributions {auto['max_contributions']}"] if "max_contributions" in auto else []
    if "bounds" in auto:
        shown.append(f"--bounds {auto['bounds'][0]:g}:{auto['bounds'][1]:g}")
    return Note(f"chosen from this first run's records for the whole stream: {', '.join(shown) or 'the bounds'}; "
                "later runs keep them, and C counts a unit's records over every run (docs/cron.md: choosing C for a "
                "long stream)")


def records_used_up(triggers: int, max_records: int) -> list[Note]:
    """A persisted stream that has run more triggers than C: each unit's first C records count over the whole
    stream, so a unit with a record in every trigger has stopped counting, and later triggers count fewer of
    the units that are active (public: the triggers run since the stream's first run, and C)."""
    if triggers <= max_records:
        return []
    return [Note(f"this stream has run {triggers} triggers since its first run and counts each unit's first "
                 f"{max_records} records over the whole stream: units active in more than {max_records} triggers "
                 "have stopped counting, so later triggers count fewer of them (docs/cron.md: choosing C for a "
                 "long stream)")]


def fed_before(run: int, until: str) -> Note:
    """The input is one an earlier run was fed (``until``: that run's ``--through``, as the state records it):
    its events are not fed again (this run only runs the triggers due). The same header-only file of two quiet
    days is this too."""
    return Note(f"this input was fed at run {run} (up to {utc_text(datetime.fromisoformat(until))}): its events are "
                "not counted again, this run only runs the triggers due (a late correction is a new release: feed only "
                "events not fed before)")

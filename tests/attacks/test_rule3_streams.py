"""Rule 3 for ``dpcli stream-replay``: one more unit changes nothing public but noisy values.

Attacks on stream-replay's public report (issue 15, finding 3). Everything dpcli prints, writes to the
ledger or returns as an exit code must be covered by the charged (ε, δ). With the noise seed forced to
one constant (so that D and D′ draw the same noise), a neighbouring dataset D′ = D plus one unit must
give the same exit code, stderr, --json summary and ledger summary: only noisy released values may
differ, and here the extra unit's key (held by one unit, δ ≈ 1e-9) is never released, so even the rows
agree. The engine review (issue 20) added: which of -0.0 and 0.0 a record holds never shows.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from stream_engine_checks import _plan, _query, _seed
from stream_reports import BASE, NEWCOMER, THROUGH, _differs, _rows, _run

from dpcli.tasks import stream as sr


@pytest.mark.parametrize("when", ["2026-11-01T03:00:00", "2026-11-06T21:00:00"], ids=["inside", "latest"])
@pytest.mark.parametrize("mode", ["full", "state"])
def test_one_more_unit_changes_nothing_public(monkeypatch, tmp_path, forced_seed, when, mode):
    """(a) D vs D′ = D + one unit with one event in a key of its own (inside the data's time span, or the
    latest event of all): exit code, stderr, every --json summary field, the ledger's summaries and the
    rows of the other keys are identical."""
    data = tmp_path / "data.csv"
    state = tmp_path / "s.state"
    extra = ["--state", str(state), "--through", THROUGH] if mode == "state" else []
    pair = (("d", _rows()), ("d2", _rows([{**NEWCOMER, "ts": when}])))
    runs = [_run(monkeypatch, tmp_path, tag, ["stream-replay", str(data), *BASE, *extra, "--json"],
                 state if mode == "state" else None, data=df) for tag, df in pair]
    assert runs[0]["exit"] == 0, runs[0]["stderr"]
    assert runs[0]["summary"]["releases"] >= 6
    assert _differs(*runs) == []
    if mode == "full":  # and without --json (no --through: now): the stderr summary line (-v prints it)
        plain = [_run(monkeypatch, tmp_path, f"plain-{tag}", ["-v", "stream-replay", str(data), *BASE, "-o",
                                                              str(tmp_path / "o.csv")], data=df) for tag, df in pair]
        assert plain[0]["exit"] == 0 and plain[0]["stderr"]
        assert _differs(*plain) == []


def test_the_sign_of_a_zero_key_never_shows():
    """-0.0 and 0.0 are one key (as polars compares); which of them a record holds must not show in the
    release: the same rows whether one record, all or none hold -0.0."""
    q = _query(max_records=1)
    tables = []
    for keys in ([0.0] * 300, [-0.0] + [0.0] * 299, [0.0] * 299 + [-0.0], [-0.0] * 300):
        df = pl.DataFrame({"ts": list(range(300)), "user": [f"u{i}" for i in range(300)], "key": keys})
        t = sr.run_stream(df.lazy(), q, _plan(q), _seed("zero"), sr.naive_utc(1000)).table
        tables.append([(r[:3], math.copysign(1.0, r[3]), r[4:]) for r in t.rows()])
    assert tables[0] and all(t == tables[0] for t in tables)

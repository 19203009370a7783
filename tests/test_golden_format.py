"""Issue 39 item 8 changed how releases are written (one number and time format), never what is released.

``tests/golden_prev/`` holds each golden file that the change re-recorded, as it was before (recorded at
commit 5691f01, budget.txt at 12592bd, tabulate.txt and schedules.txt at cedd5cc, copied here so the test needs no git history). Each is compared with
today's output of the same commands under the seed material it was recorded with (3; :func:`seed_material_v3`),
both parsed and every value compared exactly: each command's output as JSON, numbers as exact decimals (``32``
is ``32.0``), strings equal once every ISO 8601 timestamp in them is read as the moment it names (a naive one
is UTC, so ``2026-11-01 00:00:00`` is ``2026-11-01T00:00:00Z``); text outputs and the commands themselves
unchanged (``budget compose``'s and tabulate's plan: figures rounded up to 4 digits, :func:`_figures`). A golden
file re-recorded for a change of format gets its previous copy here; a change of values (a seed, a
calibration) is no format change and re-records ``tests/golden`` alone (see tests/test_golden.py).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from test_golden import _release_text

from dpcli.release import seeds

GOLDEN = Path(__file__).parent / "golden"
PREVIOUS = Path(__file__).parent / "golden_prev"

#: An ISO 8601 moment as dpcli wrote one before or after the change: ``T`` or a space, an optional fraction,
#: and ``Z``, an offset or nothing (naive: UTC).
_MOMENT = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?")


def _instant(match: re.Match[str]) -> str:
    moment = datetime.fromisoformat(match.group(0).replace(" ", "T"))
    utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return f"<moment {utc.isoformat()}>"


def _values(text: str) -> Any:
    """A command's output as values: JSON with exact decimal numbers and timestamps read as moments, or text."""
    try:
        doc = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    except ValueError:
        return _MOMENT.sub(_instant, text)
    return _moments(doc)


def _moments(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _moments(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_moments(v) for v in doc]
    if isinstance(doc, str):
        return _MOMENT.sub(_instant, doc)
    return doc


def _runs(text: str) -> list[tuple[str, Any]]:
    """(command, its output as values) for every ``$ dpcli …`` block of a golden file."""
    blocks = re.split(r"^(\$ dpcli .*)$", text, flags=re.MULTILINE)
    assert blocks[0] == "", "a golden file starts with a command"
    return [(blocks[i], _values(blocks[i + 1])) for i in range(1, len(blocks), 2)]


def _mismatch(old: Any, new: Any, where: str = "") -> str | None:
    """Where ``old`` and ``new`` differ as values (None: nowhere); a number's type (int or float) is format."""
    if isinstance(old, dict) and isinstance(new, dict):
        if list(old) != list(new):
            return f"{where}: keys {list(old)} != {list(new)}"
        return next((m for k in old if (m := _mismatch(old[k], new[k], f"{where}.{k}"))), None)
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{where}: {len(old)} items != {len(new)}"
        pairs = enumerate(zip(old, new, strict=True))
        return next((m for i, (a, b) in pairs if (m := _mismatch(a, b, f"{where}[{i}]"))), None)
    if isinstance(old, str) and isinstance(new, str) and old != new and _same_but_epsilon(old, new):
        return None  # a sentence whose ε is rounded up to 4 digits (a schedule's "(ε = 0.004814)")
    if type(old) is not type(new) or old != new:
        return f"{where}: {old!r} != {new!r}"
    return None


CHANGED = sorted(p.name for p in PREVIOUS.glob("*.txt"))


def test_the_previous_copies_are_of_golden_files():
    assert CHANGED, "tests/golden_prev holds the golden files issue 39 item 8 re-recorded"
    assert all((GOLDEN / name).exists() for name in CHANGED)


def seed_material_v3(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The seed material as version 3 built it (when the previous copies were recorded): version 4 (issue 38) added
    ``rules`` and nothing else."""
    material = SEED_MATERIAL(*args, **kwargs)
    del material["rules"]
    return {**material, "material": 3}


SEED_MATERIAL = seeds.seed_material


@pytest.mark.parametrize("name", CHANGED)
def test_a_golden_release_changed_only_in_format(name, tmp_path, state_dir, monkeypatch):
    """The previous copy against today's release of the same commands under the seed the copy was recorded with
    (material 3: a later change of seed material changes every noisy value, which is no change of format)."""
    monkeypatch.setattr(seeds, "seed_material", seed_material_v3)
    text = _release_text(name.removesuffix(".txt"), tmp_path, state_dir, monkeypatch)
    old, new = _runs((PREVIOUS / name).read_text()), _runs(text)
    assert [c for c, _ in old] == [c for c, _ in new], f"{name}: the commands differ"
    assert (PREVIOUS / name).read_text() != text, f"{name} did not change: drop its copy"
    for (command, before), (_, after) in zip(old, new, strict=True):
        if command.startswith(FIGURES) and "--json" not in command:
            before, after = _figures(before, after)
        assert _mismatch(before, after) is None, f"{name}, {command}: {_mismatch(before, after)}"


#: Text outputs whose figures (ε, δ, ρ) went from rounded to nearest to 4 significant digits rounded up.
FIGURES = ("$ dpcli budget compose", "$ dpcli tabulate --dry-run")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


_EPSILON = re.compile(r"ε = (-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)")


def _same_but_epsilon(old: str, new: str) -> bool:
    """Two sentences equal but for the figures after ``ε = ``, each new one the old rounded up to 4 digits (only
    those: any other figure of a ledger sentence, a count or a size, must be equal)."""
    if _EPSILON.sub("ε = #", old) != _EPSILON.sub("ε = #", new):
        return False
    pairs = zip(_EPSILON.findall(old), _EPSILON.findall(new), strict=True)
    return all(_figures(f"ε = {a}", f"ε = {b}")[0] == "same figures" for a, b in pairs)


def _figures(old: str, new: str) -> tuple[Any, Any]:
    """A text whose figures were rounded to nearest (``budget compose``: 6 digits; tabulate's plan: 3) and now to 4
    significant digits rounded up (a cost or a guarantee is never understated): the words (and the table's
    columns, spacing aside) must be equal, and each new figure at least the old one less half its last digit and
    at most the old one plus half its last digit plus one step of its own 4th digit (``7e-09`` was
    7.000000000006e-09, now ``7.001e-09``; ``3.85`` was 3.8517, now ``3.852``). Equal pairs compare as equal."""
    def words(text: str) -> str:
        return " ".join(_NUMBER.sub("#", text).split())

    if words(old) != words(new):
        return words(old), words(new)
    for a, b in zip(_NUMBER.findall(old), _NUMBER.findall(new), strict=True):
        x, y = Decimal(a), Decimal(b)
        half = Decimal(5).scaleb(x.as_tuple().exponent - 1) if x else Decimal(0)  # type: ignore[operator]
        if not x - half <= y <= x + half + Decimal(1).scaleb(y.adjusted() - 3):
            return a, b
    return "same figures", "same figures"


def test_the_comparison_catches_a_changed_value_and_a_moved_moment():
    """The check can fail: a count one apart, a margin shown as 70 where 70.5 was, a moment an hour later,
    a naive moment read as UTC (equal), and an integer printed as a float (equal) are told apart as they should."""
    run = '$ dpcli x\n{{"count": {c}, "m": {m}, "t": "{t}"}}\n'
    base = _runs(run.format(c=140, m=70.5, t="2026-11-01 00:00:00"))
    assert _mismatch(base, _runs(run.format(c=140.0, m=70.5, t="2026-11-01T00:00:00Z"))) is None
    assert _mismatch(base, _runs(run.format(c=141, m=70.5, t="2026-11-01T00:00:00Z")))
    assert _mismatch(base, _runs(run.format(c=140, m=70, t="2026-11-01T00:00:00Z")))
    assert _mismatch(base, _runs(run.format(c=140, m=70.5, t="2026-11-01T01:00:00Z")))
    assert _mismatch(base, _runs(run.format(c=140, m=70.5, t="2026-11-01T00:00:00+01:00")))


def test_the_figures_check_catches_a_figure_rounded_down_or_moved():
    assert _figures("ε = 15.3  (α = 7.36)", "ε = 15.32  (α = 7.36)") == ("same figures", "same figures")
    assert _figures("delta = 7e-09", "delta = 7.001e-09") == ("same figures", "same figures")
    assert _figures("ε = 15.3", "ε = 15.24") != ("same figures", "same figures")  # below the old figure's rounding
    assert _figures("ε = 15.3", "ε = 15.4") != ("same figures", "same figures")  # beyond it
    assert _figures("ε step 2  3.85", "ρ step 2  3.852") != ("same figures", "same figures")  # other words
    # in a ledger sentence only ε may be re-rounded: a count one apart is a changed value
    assert _same_but_epsilon("epoch 0 (ε = 0.004813147610117)", "epoch 0 (ε = 0.004814)")
    assert not _same_but_epsilon("8 group(s), ε = 0.5", "9 group(s), ε = 0.5")
    assert not _same_but_epsilon("count 1704 (ε = 0.5)", "count 1705 (ε = 0.5)")

"""The TOML spec of ``dpcli tabulate`` (SafeTab-style tabulation, paper 003), parsed and validated.

Every error names the offending key (``levels[2].moe``, ``iterations.detailed.1010.race``…).
See ``sample_data/safetab_spec.toml`` for a complete example and docs/commands/tabulate.md for the format.
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpcli.core.exact import to_fraction
from dpcli.errors import InputMissingError, UsageError, os_reason
from dpcli.io.opening import open_binary, refuse_private
from dpcli.io.tables import fingerprint_bytes
from dpcli.tasks import bound_elsewhere

NOISES = ("geometric", "discrete-gaussian")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


class SpecError(UsageError):
    """A malformed spec: a public input like an option, so a usage error (exit 2); exit 78 is kept for damaged state."""


@dataclass(frozen=True)
class Iteration:
    """A characteristic iteration: which persons belong to it."""

    code: str
    kind: str  # "race" or "ethnicity"
    ranges: tuple[tuple[int, int], ...]
    alone: bool  # race: all of a person's codes in range (True) or at least one (False)
    total_only: bool


@dataclass(frozen=True)
class GeoLevel:
    name: str
    prefix: int | None  # entities = the first `prefix` characters of the block id (0: one national entity)
    column: str | None  # or: a column of the public blocks file (non-nested areas)


@dataclass(frozen=True)
class Level:
    """A population-group level: geography level × iteration level, with its budget."""

    index: int
    geography: str
    iterations: str
    stability: int
    moe: float | None
    budget: Fraction | None  # the level's total ε (geometric) or ρ (discrete Gaussian), if given directly
    total_only: bool
    truncate: bool  # always True: records in more than `stability` groups are truncated, never refused

    @property
    def name(self) -> str:
        return f"({self.geography}, {self.iterations})"


@dataclass(frozen=True)
class Spec:
    noise: str
    moe_calibration: str  # "paper": eq. 37-38 as printed; "exact": the exact 95% margin is ≤ the target
    gamma: Fraction
    thresholds: tuple[int, int, int]
    sexes: tuple[str, ...]
    age_bins: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # lower edges, 3 granularities
    columns: dict[str, str]
    blocks: str | None  # geography.blocks as written: a catalog public name, or a path relative to the spec
    geo_levels: dict[str, GeoLevel]
    iterations: dict[str, tuple[Iteration, ...]]
    levels: tuple[Level, ...]
    #: the spec file's directory (where a relative block list lies; the list is bound by its digest)
    base: Path = bound_elsewhere("the block list's digest (Reads)", default=Path("."))

    @property
    def blocks_file(self) -> Path | None:
        """``geography.blocks`` as a path, next to the spec file (personal mode)."""
        return self.base / self.blocks if self.blocks else None


def _err(key: str, msg: str) -> SpecError:
    return SpecError(f"spec: {key}: {msg}")


def _get(d: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise _err(f"{where}{key}", "is required")
        return default
    value = d[key]
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _err(f"{where}{key}", f"must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise _err(f"{where}{key}", f"must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
             dict: "a table"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _ranges(values: Any, key: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(values, list) or not values:
        raise _err(key, "must be a non-empty list of codes or ranges like \"1000-1999\"")
    out = []
    for v in values:
        m = _RANGE.match(str(v))
        if not m:
            raise _err(key, f"{v!r} is not a code or a range like \"1000-1999\"")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise _err(key, f"range {v!r} is empty")
        out.append((lo, hi))
    return tuple(out)


def load_spec(path: str) -> Spec:
    """Read and validate a spec file."""
    return read_spec(path)[0]


def read_spec(path: str) -> tuple[Spec, str]:
    """Read, fingerprint and validate a spec file: (the spec, the fingerprint of the bytes parsed).

    The file is opened once by its literal path (no ``~`` or glob expansion) and read whole; those
    bytes are both hashed (the fingerprint enters the release seed) and parsed. The block list it
    names is resolved next to the spec file, literally too. ``-`` reads the spec from standard input
    (its block list is then relative to the working directory, or a catalog public name).
    """
    if path == "-":
        return _parse_spec_bytes(sys.stdin.buffer.read(), path, Path("."))
    fh, _ = open_binary(path, "spec file")
    try:
        with fh:
            data = fh.read()
    except OSError as exc:
        raise InputMissingError(f"cannot read spec file {path!r}: {os_reason(exc)}") from None
    return _parse_spec_bytes(data, path, Path(path).parent)


def _parse_spec_bytes(data: bytes, path: str, base: Path) -> tuple[Spec, str]:
    """A spec from its bytes: (the spec, their fingerprint). TOML's own messages are withheld (a
    private file named as a spec would be quoted by them)."""
    refuse_private(data[:32], "spec file", path)
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"spec: {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"at line (\d+), column (\d+)", str(exc))  # digits only: the parser's words are withheld
        where = f" (at line {at[1]}, column {at[2]})" if at else ""
        raise SpecError(f"spec: {path}: not valid TOML{where}") from None
    return parse_spec(raw, base), fingerprint_bytes(data)


_TOP_KEYS = ("noise", "gamma", "thresholds", "sexes", "age_bins", "columns", "geography", "iterations", "levels",
             "moe_calibration")
_LEVEL_KEYS = ("geography", "iterations", "stability", "moe", "epsilon", "rho", "total_only", "on_unstable")
#: Accepted ranges of a level's budget (as for --epsilon/--rho) and margin of error: outside them the
#: samplers' scales or the accounting's floats would overflow.
_BUDGET_RANGE = {"epsilon": (Fraction(1, 10**12), Fraction(10**6)), "rho": (Fraction(1, 10**24), Fraction(10**12))}
_MAX_MOE = 1e12


def parse_spec(raw: dict[str, Any], base: Path = Path(".")) -> Spec:
    """Validate a parsed TOML spec, section by section; every error names its key (exit 78)."""
    for k in raw:
        if k not in _TOP_KEYS:
            raise _err(k, f"unknown key (expected one of {', '.join(sorted(_TOP_KEYS))})")
    noise, calibration, gamma = _noise_and_gamma(raw)
    thresholds = _thresholds(raw)
    sexes = _sexes(raw)
    age_bins = _age_bins(raw)
    columns = _columns(raw)
    blocks, geo_levels = _geography(raw)
    iterations = {name: _iteration_set(name, its) for name, its in _get(raw, "iterations", "", dict).items()}
    raw_levels = _get(raw, "levels", "", list)
    if not raw_levels:
        raise _err("levels", "needs at least one population-group level")
    levels = tuple(_level(i, lv, noise, geo_levels, iterations) for i, lv in enumerate(raw_levels))
    return Spec(noise, calibration, gamma, thresholds, sexes, age_bins, columns, blocks, geo_levels, iterations,
                levels, base)


def _thresholds(raw: dict[str, Any]) -> tuple[int, int, int]:
    th = _get(raw, "thresholds", "", list)
    if len(th) != 3 or not all(isinstance(t, int) and not isinstance(t, bool) for t in th) or not th[0] < th[1] < th[2]:
        raise _err("thresholds", f"must be three integers θ1 < θ2 < θ3, got {th!r}")
    return th[0], th[1], th[2]


def _sexes(raw: dict[str, Any]) -> tuple[str, ...]:
    sexes = _get(raw, "sexes", "", list, ["1", "2"])
    if not sexes or len(set(map(str, sexes))) != len(sexes):
        raise _err("sexes", "must be a non-empty list of distinct codes")
    return tuple(map(str, sexes))


def _columns(raw: dict[str, Any]) -> dict[str, str]:
    """The input's column for each of block, race, ethnicity, sex and age."""
    columns = _get(raw, "columns", "", dict)
    for c in ("block", "race", "ethnicity", "sex", "age"):
        if not isinstance(columns.get(c), str):
            raise _err(f"columns.{c}", "is required (the input column's name)")
    return dict(columns)


def _noise_and_gamma(raw: dict[str, Any]) -> tuple[str, str, Fraction]:
    noise = _get(raw, "noise", "", str, "geometric")
    if noise not in NOISES:
        raise _err("noise", f"must be one of {', '.join(NOISES)}, got {noise!r}")
    calibration = _get(raw, "moe_calibration", "", str, "paper")
    if calibration not in ("paper", "exact"):
        raise _err("moe_calibration", f"must be paper (eq. 37-38) or exact, got {calibration!r}")
    gamma_raw = _get(raw, "gamma", "", (int, float, str), 0.1)
    gamma = _number(gamma_raw, "gamma")
    if not 0 < gamma < 1 or not 0.0 < float(gamma) < 1.0:  # (its float, used by the accounting, too)
        raise _err("gamma", f"must be in (0, 1), got {gamma_raw}")
    return noise, calibration, gamma


def _number(value: Any, key: str) -> Fraction:
    try:
        return to_fraction(value)
    except (ValueError, ArithmeticError):
        raise _err(key, f"must be a number, got {value!r}") from None


def _age_bins(raw: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    bins = _get(raw, "age_bins", "", list)
    if len(bins) != 3:
        raise _err("age_bins", "must list three bin sets (coarse, medium, fine), each as lower edges starting at 0")
    for j, b in enumerate(bins):
        if not _lower_edges(b):
            raise _err(f"age_bins[{j}]", "must be increasing integer lower edges starting at 0")
    if not len(bins[0]) < len(bins[1]) < len(bins[2]):
        raise _err("age_bins", "bin sets must get finer: fewer bins first (e.g. 4, 9, 23)")
    return tuple(bins[0]), tuple(bins[1]), tuple(bins[2])


def _lower_edges(b: Any) -> bool:
    """Is ``b`` a non-empty list of increasing integers starting at 0?"""
    return isinstance(b, list) and bool(b) and b[0] == 0 and all(isinstance(x, int) for x in b) and b == sorted(set(b))


def _geography(raw: dict[str, Any]) -> tuple[str | None, dict[str, GeoLevel]]:
    geo = _get(raw, "geography", "", dict)
    blocks = geo.get("blocks")
    if blocks is not None and not isinstance(blocks, str):
        raise _err("geography.blocks", "must be a file name")
    geo_levels: dict[str, GeoLevel] = {}
    for name, g in _get(geo, "levels", "geography.", dict).items():
        where = f"geography.levels.{name}."
        if not isinstance(g, dict):
            raise _err(where[:-1], "must be a table like { prefix = 2 } or { column = \"aiannh\" }")
        prefix = _get(g, "prefix", where, int, None)
        column = _get(g, "column", where, str, None)
        if (prefix is None) == (column is None):
            raise _err(where[:-1], "needs exactly one of prefix or column")
        if prefix is not None and prefix < 0:
            raise _err(where + "prefix", "must be ≥ 0")
        if column is not None and blocks is None:
            raise _err(where + "column", "needs geography.blocks (the public block list holding that column)")
        geo_levels[name] = GeoLevel(name, prefix, column)
    return blocks, geo_levels


def _iteration_set(lname: str, its: Any) -> tuple[Iteration, ...]:
    if not isinstance(its, dict) or not its:
        raise _err(f"iterations.{lname}", "must be a table of iteration codes")
    items = []
    for code, it in its.items():
        where = f"iterations.{lname}.{code}."
        if not isinstance(it, dict):
            raise _err(where[:-1], "must be a table like { race = [\"1000-1999\"], alone = true }")
        if ("race" in it) == ("ethnicity" in it):
            raise _err(where[:-1], "needs exactly one of race or ethnicity")
        kind = "race" if "race" in it else "ethnicity"
        alone = _get(it, "alone", where, bool, False)
        if kind == "ethnicity" and "alone" in it:
            raise _err(where + "alone", "applies to race iterations only")
        items.append(Iteration(str(code), kind, _ranges(it[kind], where + kind), alone,
                               _get(it, "total_only", where, bool, False)))
    return tuple(sorted(items, key=lambda i: i.code))


def _level(i: int, lv: Any, noise: str, geo_levels: dict[str, GeoLevel],
           iterations: dict[str, tuple[Iteration, ...]]) -> Level:
    where = f"levels[{i}]."
    if not isinstance(lv, dict):
        raise _err(where[:-1], "must be a table")
    g = _get(lv, "geography", where, str)
    if g not in geo_levels:
        raise _err(where + "geography", f"{g!r} is not in geography.levels")
    it = _get(lv, "iterations", where, str)
    if it not in iterations:
        raise _err(where + "iterations", f"{it!r} is not in iterations")
    s = _get(lv, "stability", where, int)
    if s < 1:
        raise _err(where + "stability", "must be ≥ 1")
    moe, budget = _level_budget(lv, where, noise)
    # Records over the stability bound are always truncated: refusing them would make the exit
    # status depend on private records. "truncate" is still accepted (the only behaviour).
    unstable = _get(lv, "on_unstable", where, str, "truncate")
    if unstable != "truncate":
        raise _err(where + "on_unstable", "can only be truncate (records over the stability are always "
                   "truncated to their first s iterations; refusing them would reveal them)")
    for k in lv:
        if k not in _LEVEL_KEYS:
            raise _err(where + k, "unknown key")
    return Level(i, g, it, s, moe, budget, _get(lv, "total_only", where, bool, False), unstable == "truncate")


def _level_budget(lv: dict[str, Any], where: str, noise: str) -> tuple[float | None, Fraction | None]:
    """A level's target margin of error or its explicit ε (geometric) / ρ (discrete Gaussian): exactly one."""
    moe = _get(lv, "moe", where, (int, float), None)
    budget_key = "epsilon" if noise == "geometric" else "rho"
    other = "rho" if noise == "geometric" else "epsilon"
    if other in lv:
        raise _err(where + other, f"does not apply to {noise} noise (use {budget_key} or moe)")
    budget_raw = lv.get(budget_key)
    if (moe is None) == (budget_raw is None):
        raise _err(where[:-1], f"needs exactly one of moe or {budget_key}")
    if moe is not None:
        return _checked_moe(moe, where), None
    return None, _checked_budget(budget_raw, budget_key, where)


def _checked_moe(moe: float, where: str) -> float:
    if not (math.isfinite(moe) and moe >= 1):
        raise _err(where + "moe", f"must be ≥ 1, got {moe}")
    if moe > _MAX_MOE:
        raise _err(where + "moe", f"must be ≤ {_MAX_MOE:g}, got {moe}")
    return float(moe)


def _checked_budget(budget_raw: Any, budget_key: str, where: str) -> Fraction:
    """A level's ε or ρ: a positive number within the range its samplers and accounting handle."""
    budget = _number(budget_raw, where + budget_key)
    if budget <= 0:
        raise _err(where + budget_key, "must be > 0")
    lo, hi = _BUDGET_RANGE[budget_key]
    if not lo <= budget <= hi:
        raise _err(where + budget_key, f"must be in [{float(lo):g}, {float(hi):g}], got {budget_raw}")
    return budget

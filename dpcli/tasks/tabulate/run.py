"""A tabulation computed: the persons prepared and counted into cells of atoms in a few polars queries
(:func:`level_counts`), then each level's totals and Sex × Age marginals with their noise and the adaptive choice
of the marginals (:func:`run_tabulate`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from dpcli import bounding
from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.errors import DataError, type_text, withheld
from dpcli.frames import collect
from dpcli.tasks.reports import TabulateReport
from dpcli.tasks.tabulate.plan import TabulatePlan, noise_for, plan_tabulate
from dpcli.tasks.tabulate.query import Iteration, Level, Spec

if TYPE_CHECKING:
    from polars.datatypes import DataTypeClass  # a list's item type may be a class (pl.List(pl.Int64).inner)


@dataclass
class TabulateRelease:
    table: pl.DataFrame
    metadata: TabulateReport


def _codes(expr: pl.Expr, dtype: pl.DataType | DataTypeClass) -> pl.Expr:
    """Integer codes from an integer or text column; anything unparsable becomes null (dropped later)."""
    if dtype.is_integer():
        return expr.cast(pl.Int64, strict=False)
    return expr.cast(pl.String).str.strip_chars().cast(pl.Int64, strict=False)


def _prepare(frame: pl.LazyFrame, spec: Spec, name: str) -> pl.LazyFrame:
    """The spec's columns, typed: ``__block``, ``__race`` (list of codes), ``__eth``, ``__sex``, ``__age``.

    Only the *schema* is checked here (missing columns and unusable types are errors, the
    same for every dataset of that schema); values that do not parse become nulls, and
    :func:`_usable` drops their records.
    """
    c = spec.columns
    schema = frame.collect_schema()
    race_type = check_columns(schema, spec, name)
    race = pl.col(c["race"])
    if race_type == pl.String:
        # ';'-separated codes; an NDJSON list of codes is read as its JSON text ("[1000,2000]", see
        # dpcli.io.inputs.open_input), so a bracketed value is split on commas, quotes dropped.
        text = race.str.strip_chars()
        listed = text.str.starts_with("[") & text.str.ends_with("]")
        items = text.str.slice(1, text.str.len_chars() - 2).str.replace_all('"', "", literal=True)
        race = pl.when(listed).then(items.str.split(",")).otherwise(text.str.split(";"))
        inner: pl.DataType | DataTypeClass = pl.String()
    elif isinstance(race_type, pl.List):
        inner = race_type.inner
    else:
        race = pl.concat_list(race)
        inner = race_type
    return frame.select(
        pl.col(c["block"]).cast(pl.String).alias("__block"),
        race.list.eval(_codes(pl.element(), inner)).alias("__race"),
        _codes(pl.col(c["ethnicity"]), schema[c["ethnicity"]]).alias("__eth"),
        pl.col(c["sex"]).cast(pl.String).alias("__sex"),
        _codes(pl.col(c["age"]), schema[c["age"]]).alias("__age"),
    )


def check_columns(schema: pl.Schema, spec: Spec, name: str) -> pl.DataType:
    """Check the spec's columns against the input's schema (the same for every dataset of that
    schema: missing columns and unusable types are errors); returns the race column's type."""
    c = spec.columns
    for key, col in c.items():
        if col not in schema:
            from dpcli.access import gate
            from dpcli.io.schemas import did_you_mean

            hint = "" if gate().restricted else did_you_mean(col, schema.names())  # names private to an analyst
            raise DataError(f"column {col!r} (columns.{key} of the spec) not found in {name}{hint}")
    try:
        for key in ("ethnicity", "age"):
            dtype = schema[c[key]]
            if not (dtype.is_integer() or dtype == pl.String):
                raise DataError(f"column {c[key]!r} ({key}) must hold integer codes (integers or text), "
                                f"but is {type_text(dtype)}")
        for key in ("block", "sex"):
            if schema[c[key]].is_nested():
                raise DataError(f"column {c[key]!r} ({key}) must hold codes, but is {type_text(schema[c[key]])}")
        race_type = schema[c["race"]]
        inner = _race_codes_type(race_type, c["race"])
        if not (inner.is_integer() or inner == pl.String):
            raise DataError(f"column {c['race']!r} (race) must hold integer codes, but is {type_text(race_type)}")
    except DataError:
        from dpcli.access import gate

        if gate().restricted:  # a service-mode analyst: the columns' types are not theirs to read
            raise DataError(f"a column of the spec cannot be used as codes in {name} (by its type)") from None
        raise
    return race_type


def _race_codes_type(race_type: pl.DataType, column: str) -> pl.DataType | DataTypeClass:
    """The type of one race code in a race column: text (``;``-separated), a list's items, or integers."""
    if race_type == pl.String:
        return pl.String()
    if isinstance(race_type, pl.List):
        return race_type.inner
    if race_type.is_integer():
        return race_type
    raise DataError(f"column {column!r} (race) must hold ';'-separated codes, integers or lists, "
                    f"but is {type_text(race_type)}")


def _usable(spec: Spec) -> pl.Expr:
    """The records the tabulation keeps: every field present and parsable, a known sex code, age ≥ 0.

    (Blocks outside the public list are dropped by the join with it.) Dropping is part of the
    bounded transformation: it removes a record's contribution entirely, which the sensitivity
    analysis already covers, and it is never counted or reported.
    """
    race = pl.col("__race")
    return (
        pl.all_horizontal(pl.col(c).is_not_null() for c in ("__block", "__race", "__eth", "__sex", "__age"))
        & (race.list.len() > 0)
        & ~race.list.eval(pl.element().is_null()).list.any()
        & pl.col("__sex").is_in(list(spec.sexes))
        & (pl.col("__age") >= 0)
    ).fill_null(False)


def _entities(blocks: pl.DataFrame, spec: Spec, level: Level) -> pl.DataFrame:
    """The level's geographic entities, from the public block list only."""
    geo = spec.geo_levels[level.geography]
    if geo.prefix == 0:
        return pl.DataFrame({"geo_id": ["ALL"]})
    if geo.prefix is not None:
        ids = blocks.select(pl.col("block").str.slice(0, geo.prefix).alias("geo_id"))
    else:
        assert geo.column is not None  # a geography level has a prefix or a column (tabulate_spec)
        ids = blocks.select(pl.col(geo.column).alias("geo_id")).filter(
            pl.col("geo_id").is_not_null() & (pl.col("geo_id") != "")
        )
    return ids.unique().sort("geo_id")


def _geo_expr(spec: Spec, level: Level) -> pl.Expr:
    geo = spec.geo_levels[level.geography]
    if geo.prefix == 0:
        return pl.lit("ALL")
    if geo.prefix is not None:
        return pl.col("__block").str.slice(0, geo.prefix)
    area = pl.col(f"__area_{geo.column}")
    return pl.when(area == "").then(None).otherwise(area)


def block_columns(spec: Spec) -> list[str]:
    """The columns of the public block list a spec uses: ``block`` and the area columns of its levels."""
    return ["block", *sorted({g.column for g in spec.geo_levels.values() if g.column})]


def read_blocks(spec: Spec, blocks: pl.LazyFrame) -> pl.DataFrame:
    """The public block list: column ``block`` plus any area columns the geography levels use.

    ``blocks`` is the list as the caller opened it (:func:`dpcli.release.open_block_list`: its
    fingerprint enters the seed, and the charge checks it was not changed while read).
    """
    cols = block_columns(spec)
    schema = blocks.collect_schema()
    for col in cols:
        if col not in schema:
            raise DataError(f"public block list {spec.blocks!r} lacks column {col!r}")
    df = blocks.select([pl.col(c).cast(pl.String) for c in cols]).collect()
    if df["block"].null_count() or df["block"].n_unique() != df.height:
        raise DataError(f"public block list {spec.blocks!r}: block ids must be unique and non-null")
    return df


def _age_bin(edges: tuple[int, ...]) -> pl.Expr:
    idx = pl.lit(0, dtype=pl.Int64)
    for j, e in enumerate(edges[1:], start=1):
        idx = pl.when(pl.col("__age") >= e).then(pl.lit(j, dtype=pl.Int64)).otherwise(idx)
    return idx


def _bin_labels(edges: tuple[int, ...]) -> list[str]:
    """``0-17``, ``18-44`` …, a single year as ``20``, the last as ``65+``."""
    inner = [f"{lo}-{hi - 1}" if hi - 1 > lo else str(lo) for lo, hi in itertools.pairwise(edges)]
    return [*inner, f"{edges[-1]}+"]


#: Bits per word of a race signature (Int64 words, the sign bit unused).
_WORD = 63


_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class _Atoms:
    """The classes of codes a spec's iterations cannot tell apart ("atoms"), from the spec alone.

    Every range ``lo-hi`` of an iteration starts an atom at ``lo`` and one at ``hi + 1``: atom k ≥ 1
    holds the codes in ``[bounds[k-1], bounds[k])``, atom 0 those below ``bounds[0]``. Every code of
    an atom is in the same ranges as the atom's representative, so whether a record belongs to an
    iteration is a function of its atoms: for race, the *set* of its codes' atoms (alone: all in the
    iteration's atoms; in combination: one of them), for ethnicity its code's atom.
    """

    bounds: tuple[int, ...]

    @classmethod
    def of(cls, iterations: list[Iteration]) -> _Atoms:
        edges = {b for it in iterations for lo, hi in it.ranges for b in (lo, hi + 1)}
        return cls(tuple(sorted(b for b in edges if b <= _INT64_MAX)))  # no Int64 code reaches a larger one

    def __len__(self) -> int:
        return len(self.bounds) + 1

    def index(self, code: pl.Expr) -> pl.Expr:
        """The atom of an Int64 code: how many bounds are ≤ it."""
        return pl.sum_horizontal([(code >= b).cast(pl.Int64) for b in self.bounds]) if self.bounds else pl.lit(0)

    def of_iteration(self, it: Iteration) -> list[int]:
        """The atoms whose codes are in ``it``'s ranges (decided on each atom's representative)."""
        reps = [self.bounds[0] - 1 if self.bounds else 0, *self.bounds]
        return [k for k, c in enumerate(reps) if any(lo <= c <= hi for lo, hi in it.ranges)]

    def words(self) -> int:
        return -(-len(self) // _WORD)


def _race_words(atoms: _Atoms) -> list[pl.Expr]:
    """A record's race signature: the set of its codes' atoms as bit masks, ``_WORD`` atoms a word."""
    codes = pl.col("__race").list.eval(atoms.index(pl.element())).list.unique()
    out = []
    for w in range(atoms.words()):
        lo = w * _WORD
        # (`pow` runs on every atom, the `when` only picks: its exponent is kept in range.)
        bit = pl.when(pl.element().is_between(lo, lo + _WORD - 1)).then(
            pl.lit(2, dtype=pl.Int64).pow((pl.element() - lo).clip(0, _WORD - 1))).otherwise(pl.lit(0, dtype=pl.Int64))
        out.append(codes.list.eval(bit).list.sum().cast(pl.Int64).alias(f"__race_w{w}"))
    return out


def _atom_membership(it: Iteration, race: _Atoms, eth: _Atoms) -> pl.Expr:
    """Whether the records of a signature (``__eth_atom``, ``__race_w*``) are in iteration ``it``."""
    if it.kind == "ethnicity":
        return pl.col("__eth_atom").is_in(eth.of_iteration(it))
    inside = set(race.of_iteration(it))
    masks = [sum(1 << (k - w * _WORD) for k in inside if k // _WORD == w) for w in range(race.words())]
    words = [pl.col(f"__race_w{w}") for w in range(race.words())]
    if it.alone:  # every atom of the record in the iteration's
        return pl.all_horizontal([(c & (_INT64_MAX ^ m)) == 0 for c, m in zip(words, masks, strict=True)])
    return pl.any_horizontal([(c & m) != 0 for c, m in zip(words, masks, strict=True)])


#: A level → its bounded counts: one row per (``geo_id``, ``iteration``, ``__sex``, ``__a0``, ``__a1``,
#: ``__a2``) with persons, ``n`` (Int64) of them. See :data:`CountsEngine`.
LevelCounts = Callable[[Level], pl.DataFrame]


#: (spec, the public block list) → :data:`LevelCounts`, on some engine (polars here, or Spark:
#: :func:`dpcli.spark.tabulate.level_counts`); everything after the counts runs on the driver.
CountsEngine = Callable[[Spec, pl.DataFrame], LevelCounts]


#: The columns and types of a level's counts, on every engine.
COUNT_SCHEMA = {"geo_id": pl.String, "iteration": pl.String, "__sex": pl.String, "__a0": pl.Int64,
                "__a1": pl.Int64, "__a2": pl.Int64, "n": pl.Int64}


def run_tabulate(
    frame: pl.LazyFrame, spec: Spec, stream: KeyedStream, with_error: bool = False, *, blocks: pl.LazyFrame,
    name: str = "the input", engine: CountsEngine | None = None, plan: TabulatePlan | None = None,
) -> TabulateRelease:
    """All levels: bound (stability), count, noisy step 1, adaptive step 2. Output rows in a fixed order.

    ``blocks``: the public block list, as opened (and fingerprinted) by :func:`dpcli.release.open_block_list`.
    ``engine`` counts on another engine than polars (``frame`` then only gives the schema to check)."""
    blocks_df = read_blocks(spec, blocks)
    if engine is None:
        counts_of = level_counts(frame, spec, blocks_df, name)
    else:
        check_columns(frame.collect_schema(), spec, name)
        counts_of = engine(spec, blocks_df)
    plan = plan or plan_tabulate(spec)
    parts: list[pl.DataFrame] = []
    meta_levels = []
    for level, per_group in zip(plan.levels, plan.per_group, strict=True):
        counts = counts_of(level).select([pl.col(c).cast(d) for c, d in COUNT_SCHEMA.items()])
        part, info = _tabulate_level(counts, blocks_df, spec, plan, level, per_group,
                                     stream.child(f"level-{level.index}"), with_error)
        parts.append(part)
        meta_levels.append(info)
    out = pl.concat(parts, how="vertical")
    return TabulateRelease(out, {"levels": meta_levels, "rows": out.height})


def level_counts(frame: pl.LazyFrame, spec: Spec, blocks_df: pl.DataFrame, name: str) -> LevelCounts:
    """The polars :data:`LevelCounts`, in three queries: one pass over the records, then every level.

    The pass parses and filters the records and counts them by geography (the block id cut to the
    longest prefix a level uses, and the area columns), sex, age bins and the atoms of their codes
    (:class:`_Atoms`), which decide every iteration they match: a table of cells no larger than the
    records (much smaller at census scale). The iterations are matched once per distinct signature;
    on the first call, the cells' memberships (stability enforced, as per record: a record's
    memberships are its signature's) are counted once per (iterations, stability) of the levels,
    and every level's counts follow from those in one :func:`polars.collect_all`."""
    race = _Atoms.of([it for its in spec.iterations.values() for it in its if it.kind == "race"])
    eth = _Atoms.of([it for its in spec.iterations.values() for it in its if it.kind == "ethnicity"])
    signature = ["__eth_atom", *[f"__race_w{w}" for w in range(race.words())]]
    # An inner join with the public block list drops the records whose block is not on it (and adds
    # the area columns non-nested geography levels use); block ids are unique there, so no record is
    # duplicated. Cells keep the block id cut to the longest prefix a level uses, and the areas.
    areas = [f"__area_{a}" for a in sorted({g.column for g in spec.geo_levels.values() if g.column})]
    longest = max((g.prefix or 0 for g in spec.geo_levels.values()), default=0)
    public = blocks_df.lazy().select(pl.col("block").alias("__block"), *[pl.col(a[7:]).alias(a) for a in areas])
    persons = _prepare(frame, spec, name).filter(_usable(spec)).join(public, on="__block", how="inner").select(
        pl.col("__block").str.slice(0, longest), *areas, "__sex",
        *[_age_bin(edges).alias(f"__a{i}") for i, edges in enumerate(spec.age_bins)],
        eth.index(pl.col("__eth")).alias("__eth_atom"), *_race_words(race),
    )
    cells = collect(persons.group_by(["__block", *areas, "__sex", "__a0", "__a1", "__a2", *signature])
                    .agg(pl.len().cast(pl.Int64).alias("n")), f"cannot read {name}")
    # Which iterations each signature belongs to, once per iteration level (codes in the spec's order).
    signatures = cells.select(signature).unique().lazy().with_columns(
        pl.concat_list([pl.when(_atom_membership(it, race, eth)).then(pl.lit(it.code)) for it in its])
        .list.drop_nulls().alias(f"__its_{its_name}")
        for its_name, its in spec.iterations.items()
    )

    def by_area(iterations: str, stability: int) -> pl.LazyFrame:
        """The cells' memberships, bounded, counted by the cells' geography (the finest the levels use)."""
        its = signatures.select(*signature, pl.col(f"__its_{iterations}").alias("__its"))
        # Stability, enforced: each record keeps its first s iterations of this level (in code order:
        # `__its` lists them as the spec sorts them), so it is in at most s population groups, which
        # is exactly what the level's per-group budget ρ_i/s is calibrated for. A record's memberships
        # are its signature's, so capping the signatures caps every record. Nothing counts the truncated.
        bounded = bounding.cap_memberships(its, "__its", stability)
        assert bounded.stability.max_groups == stability and bounded.stability.linf("count") == 1
        rows = cells.lazy().join(bounded.frame, on=signature, how="inner").explode("__its").filter(
            pl.col("__its").is_not_null())
        return rows.group_by(["__block", *areas, "__its", "__sex", "__a0", "__a1", "__a2"]).agg(pl.col("n").sum())

    def one_level(level: Level, by_geo: pl.DataFrame) -> pl.LazyFrame:
        rows = by_geo.lazy().with_columns(_geo_expr(spec, level).alias("geo_id")).filter(pl.col("geo_id").is_not_null())
        return rows.group_by(["geo_id", "__its", "__sex", "__a0", "__a1", "__a2"]).agg(pl.col("n").sum()).rename(
            {"__its": "iteration"})

    done: dict[int, pl.DataFrame] = {}

    def counts(level: Level) -> pl.DataFrame:
        if not done:  # every level on the first call: by area once per (iterations, stability), then each level
            keys = list(dict.fromkeys((lv.iterations, lv.stability) for lv in spec.levels))
            try:
                by_geo = dict(zip(keys, pl.collect_all([by_area(*k) for k in keys]), strict=True))
                tables = pl.collect_all([one_level(lv, by_geo[lv.iterations, lv.stability]) for lv in spec.levels])
            except pl.exceptions.PolarsError as exc:
                raise DataError(f"counting population groups: {withheld(exc)}") from None
            done.update({lv.index: t for lv, t in zip(spec.levels, tables, strict=True)})
        return done[level.index]

    return counts


# SafeTab's step 1 (noisy totals) and step 2 (the Sex × Age cells each total allows) for one level.
# Each noise draw has its own child of the level's keyed stream (``step1``, ``total_only``, ``total``,
# ``marginal-1`` … ``marginal-3``); the rows are drawn in that order.
def _tabulate_level(
    counts: pl.DataFrame, blocks: pl.DataFrame, spec: Spec, plan: TabulatePlan, level: Level, per_group: Fraction,
    stream: KeyedStream, with_error: bool,
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """One level's rows: noisy step-1 totals choose each group's branch, then its total or marginal.

    Every noise parameter comes from ``plan`` (the seed's calibration) and ``per_group`` (the
    level's ρ_i/s); ``spec`` gives the shape (iterations, age bins, sexes)."""
    totals = _level_totals(counts, blocks, spec, level)
    branch = _branches(totals, plan, level, per_group, stream)
    cell_noise = noise_for(plan.noise, (1 - plan.gamma) * per_group)
    out_rows = _total_rows(totals, branch, plan, per_group, stream, with_error)
    out_rows += _marginal_rows(counts, totals, branch, spec, cell_noise, stream, with_error)
    result = pl.concat(out_rows, how="diagonal") if out_rows else None
    if result is None:
        result = pl.DataFrame(schema={"geo_id": pl.String, "iteration": pl.String, "sex": pl.String,
                                      "age": pl.String, "count": pl.Int64, "__bin": pl.Int64})
    result = result.sort(["geo_id", "iteration", "sex", "__bin"], nulls_last=False).with_columns(
        pl.lit(level.name).alias("level")
    ).select(["level", "geo_id", "iteration", "sex", "age", "count"] + (["moe95"] if with_error else []))
    # Public or noisy only: `groups` is enumerated from the spec and the public block list;
    # `branches` is a function of the noisy step-1 totals (it is visible in the rows anyway).
    info = {
        "level": level.name,
        "groups": totals.height,
        "branches": {name: int((branch == v).sum()) for v, name in
                     ((-1, "total_only"), (0, "total"), (1, "coarse"), (2, "medium"), (3, "fine"))},
        "per_group": f"{float(per_group):.6g}",
        "noise": cell_noise.describe(),
    }
    return result, info


def _level_totals(counts: pl.DataFrame, blocks: pl.DataFrame, spec: Spec, level: Level) -> pl.DataFrame:
    """Every population group of the level (entity × iteration, enumerated from public inputs, in
    order) with its true total and whether it is TotalOnly."""
    its = spec.iterations[level.iterations]
    groups = _entities(blocks, spec, level).join(
        pl.DataFrame({"iteration": [it.code for it in its], "__total_only": [it.total_only for it in its]}),
        how="cross",
    ).sort(["geo_id", "iteration"])
    return groups.join(counts.group_by(["geo_id", "iteration"]).agg(pl.col("n").sum().alias("true")),
                       on=["geo_id", "iteration"], how="left").with_columns(pl.col("true").fill_null(0))


def _branches(totals: pl.DataFrame, plan: TabulatePlan, level: Level, per_group: Fraction,
              stream: KeyedStream) -> np.ndarray:
    """Step 1 (not released): each group's branch from its noisy total with γ·ρ_i/s against the
    thresholds θ1 < θ2 < θ3 (0: total, 1-3: coarse to fine cells), or −1 for a TotalOnly group."""
    total_only = totals["__total_only"].to_numpy() | level.total_only
    true = totals["true"].to_numpy().astype(np.int64)
    step1 = true + noise_for(plan.noise, plan.gamma * per_group).sample(stream.child("step1"), totals.height)
    th1, th2, th3 = plan.thresholds
    branch = np.where(step1 < th1, 0, np.where(step1 < th2, 1, np.where(step1 < th3, 2, 3)))
    return np.where(total_only, -1, branch)


def _total_rows(totals: pl.DataFrame, branch: np.ndarray, plan: TabulatePlan, per_group: Fraction,
                stream: KeyedStream, with_error: bool) -> list[pl.DataFrame]:
    """Released totals: TotalOnly groups (with all of ρ_i/s) and branch 0 (with the (1 − γ) share)."""
    out_rows = []
    for kind, mask, param in (("total_only", branch == -1, per_group),
                              ("total", branch == 0, (1 - plan.gamma) * per_group)):
        if not mask.any():
            continue
        noise = noise_for(plan.noise, param)
        sel = totals.filter(pl.Series(mask))
        values = sel["true"].to_numpy() + noise.sample(stream.child(kind), sel.height)
        df = sel.select("geo_id", "iteration").with_columns(
            pl.lit(None, dtype=pl.String).alias("sex"), pl.lit("total").alias("age"), pl.Series("count", values),
            pl.lit(-1, dtype=pl.Int64).alias("__bin"),
        )
        if with_error:
            df = df.with_columns(pl.lit(noise.margin95()).alias("moe95"))
        out_rows.append(df)
    return out_rows


def _marginal_rows(counts: pl.DataFrame, totals: pl.DataFrame, branch: np.ndarray, spec: Spec,
                   cell_noise: mech.Noise, stream: KeyedStream, with_error: bool) -> list[pl.DataFrame]:
    """Released Sex × Age cells of the groups in branches 1-3, at that branch's age bins."""
    out_rows = []
    for b in (1, 2, 3):
        mask = branch == b
        if not mask.any():
            continue
        edges = spec.age_bins[b - 1]
        labels = _bin_labels(edges)
        sel = totals.filter(pl.Series(mask)).select("geo_id", "iteration")
        cells = sel.join(pl.DataFrame({"sex": list(spec.sexes)}), how="cross").join(
            pl.DataFrame({"__bin": list(range(len(labels))), "age": labels}), how="cross"
        )
        binned = counts.group_by(["geo_id", "iteration", "__sex", f"__a{b - 1}"]).agg(pl.col("n").sum()).rename(
            {"__sex": "sex", f"__a{b - 1}": "__bin"}
        )
        cells = cells.join(binned, on=["geo_id", "iteration", "sex", "__bin"], how="left").with_columns(
            pl.col("n").fill_null(0)
        ).sort(["geo_id", "iteration", "sex", "__bin"])
        values = cells["n"].to_numpy() + cell_noise.sample(stream.child(f"marginal-{b}"), cells.height)
        df = cells.select("geo_id", "iteration", "sex", "age", pl.col("__bin").cast(pl.Int64)).with_columns(
            pl.Series("count", values)
        )
        if with_error:
            df = df.with_columns(pl.lit(cell_noise.margin95()).alias("moe95"))
        out_rows.append(df)
    return out_rows

"""The options commands share: their declarations (one name per idea, docs/vocabulary.md), the
parsing of numbers into exact values with one-line errors, and the option groups a command turns
into library values (``--schedule …`` → :class:`dpcli.core.schedules.ScheduleSpec`, ``--engine …``
→ :class:`dpcli.spark.engine.EngineRequest`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, Literal, overload

import typer

from dpcli.core.exact import to_fraction
from dpcli.core.ranges import ANY_POSITIVE, POSITIVE_RANGES, PROBABILITY_RANGE, Range
from dpcli.errors import UsageError

if TYPE_CHECKING:  # the library is imported when a command runs, not for --help
    from dpcli.cli._groups import ChoiceOptions
    from dpcli.spark.engine import EngineRequest
    from dpcli.tasks import ExpectedSize
    from dpcli.tasks.auto_bounds import AutoBounds
    from dpcli.tasks.targets import MarginTarget

#: Longest accepted spelling of a number (longer texts are refused before parsing).
MAX_NUMBER_TEXT = 100


@overload
def parse_number(option: str, text: str) -> Fraction: ...
@overload
def parse_number(option: str, text: str | None) -> Fraction | None: ...
def parse_number(option: str, text: str | None) -> Fraction | None:
    """``text`` as an exact Fraction (decimal or n/d), or None when absent.

    Refuses (one-line usage error) non-numbers, non-finite values, texts over
    :data:`MAX_NUMBER_TEXT` characters and decimal exponents beyond ±1000, so
    the exact conversion never builds an enormous integer.
    """
    if text is None:
        return None
    if len(text) > MAX_NUMBER_TEXT:
        raise UsageError(f"{option} must be a number of at most {MAX_NUMBER_TEXT} characters, got {len(text)}")
    try:
        value = to_fraction(text)
    except (ValueError, ArithmeticError):
        raise UsageError(f"{option} must be a finite number (decimal or n/d), got {text!r}") from None
    return value


@overload
def positive(option: str, text: str, required: bool = False, limits: Range | None = None) -> Fraction: ...
@overload
def positive(option: str, text: str | None, required: Literal[True], limits: Range | None = None) -> Fraction: ...
@overload
def positive(option: str, text: str | None, required: bool = False, limits: Range | None = None) -> Fraction | None: ...
def positive(option: str, text: str | None, required: bool = False, limits: Range | None = None) -> Fraction | None:
    """A number > 0 (ε, ρ, scales) inside ``limits`` (default: :data:`POSITIVE_RANGES` by flag)."""
    if text is None:
        if required:
            raise UsageError(f"{option} is required")
        return None
    value = parse_number(option, text)
    if value <= 0:
        raise UsageError(f"{option} must be > 0, got {text.strip()}")
    return (limits or POSITIVE_RANGES.get(option, ANY_POSITIVE)).check(option, value, text)


@overload
def probability(option: str, text: str, required: bool = False, allow_zero: bool = True,
                limits: Range = PROBABILITY_RANGE) -> Fraction: ...
@overload
def probability(option: str, text: str | None, required: Literal[True], allow_zero: bool = True,
                limits: Range = PROBABILITY_RANGE) -> Fraction: ...
@overload
def probability(option: str, text: str | None, required: bool = False, allow_zero: bool = True,
                limits: Range = PROBABILITY_RANGE) -> Fraction | None: ...
def probability(
    option: str, text: str | None, required: bool = False, allow_zero: bool = True, limits: Range = PROBABILITY_RANGE
) -> Fraction | None:
    """A δ: 0 (when ``allow_zero``) or a number in ``limits`` (default [1e-100, 1/2])."""
    if text is None:
        if required:
            raise UsageError(f"{option} is required")
        return None
    return limits.check(option, parse_number(option, text), text, zero_ok=allow_zero)


def bounds(option: str, text: str | None) -> tuple[float, float] | None:
    """``LO:HI`` as two finite floats with LO < HI."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2:
        raise UsageError(f"{option} must look like LO:HI (e.g. 0:600), got {text!r}")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise UsageError(f"{option} must look like LO:HI with numbers, got {text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise UsageError(f"{option} needs finite LO < HI, got {text!r}")
    return lo, hi


def columns(option: str, text: str) -> tuple[str, ...]:
    """A comma-separated list of column names (no empties, no repeats)."""
    names = tuple(c.strip() for c in text.split(","))
    if not names or any(not c for c in names):
        raise UsageError(f"{option} must be a comma-separated list of column names, got {text!r}")
    if len(set(names)) != len(names):
        raise UsageError(f"{option} lists a column twice: {text!r}")
    return names


# Shared option declarations for commands that read a table and release a result.
InputArg = Annotated[
    str,
    typer.Argument(help="Input file (CSV, Parquet or NDJSON, optionally .gz/.bz2/.xz; '-' reads CSV from stdin), "
                   "or a directory of Parquet files (never a free replay).", show_default=False,
                   metavar="INPUT"),
]
InputFormatOpt = Annotated[
    str | None, typer.Option("--input-format", help="Input format: csv, parquet or ndjson (default: from the "
                                                    "extension).")
]
DelimiterOpt = Annotated[
    str | None, typer.Option("--delimiter", "-d", help="CSV field separator of the input: one character, or 'tab' "
                                                       "(default ',', and tab for a .tsv or .tab file).")
]
OutputOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the result to FILE (atomically) instead of stdout; a "
                             "name ending in .gz (x.csv.gz, x.json.gz) is written gzip-compressed, the same bytes on "
                             "every run.")
]
FormatOpt = Annotated[
    str | None, typer.Option("--format", help="Output format: csv, parquet or json (default: from the extension of "
                             "-o; csv for stdout, a name without one, or a device or pipe such as /dev/null).")
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Machine-readable summary: on stdout with -o FILE; without -o, result and summary as one JSON document.",
    ),
]


UnitOpt = Annotated[
    str | None, typer.Option("--privacy-unit", help="Column identifying the privacy unit (e.g. user_id); a catalog "
                             "dataset's is the operator's.", show_default=False)
]
EpsilonOpt = Annotated[str | None, typer.Option("--epsilon", help="ε of this release (total over all its parts).")]
DeltaOpt = Annotated[str | None, typer.Option("--delta", help="δ of this release, in [0, 1).")]
EngineOpt = Annotated[
    str, typer.Option("--engine", help="Where to bound and aggregate: polars (this machine) or spark (pip install "
                      "'dpcli[spark]').")
]
MasterOpt = Annotated[
    str | None, typer.Option("--master", help="--engine spark: local[N], spark://HOST:PORT, yarn or k8s://URL "
                             "(default: local[*]).")
]
RemoteOpt = Annotated[
    str | None, typer.Option("--remote", help="--engine spark on a Spark Connect server sc://HOST:PORT (pip install "
                             "'dpcli[spark-connect]'; no Java here; instead of --master).")
]
SparkConfOpt = Annotated[
    list[str] | None,
    typer.Option("--spark-conf", help="--engine spark: a resource setting KEY=VALUE, e.g. spark.executor.memory=8g "
                 "(repeatable; settings that could change or publish a result are refused)."),
]
ScheduleOpt = Annotated[
    str | None, typer.Option("--schedule", help="Run as part of the named schedule over growing snapshots.")
]
SchedulerOpt = Annotated[
    str, typer.Option("--scheduler", help="bbscheduler (a new epoch when the noisy count of units has grown by 1+γ), "
                      "bbimprover (every run) or fixed.")
]
TotalEpsilonOpt = Annotated[str | None, typer.Option("--total-epsilon", help="ε of the whole schedule, forever.")]
TotalDeltaOpt = Annotated[str | None, typer.Option("--total-delta", help="δ of the whole schedule (0: pure).")]
GammaOpt = Annotated[str | None, typer.Option("--gamma", help="bbscheduler: growth factor between epochs (default: "
                                                              "Alg. 1).")]
BetaOpt = Annotated[str, typer.Option("--beta", help="bbscheduler: failure probability β used to derive γ.")]
ImproverCOpt = Annotated[
    str | None,
    typer.Option("--improver-c", help="bbimprover: c in ε_t ∝ t^-(1/2+c), 0 < c < 1/4 (default 0.1; "
                 "an existing schedule keeps its own)."),
]
ImproverIndexOpt = Annotated[
    str | None,
    typer.Option("--improver-index", help="bbimprover: t counts runs (the default). rows (Algorithm 2 as "
                 "printed) is refused for new schedules; one made with it counts runs from now on."),
]

ThroughOpt = Annotated[
    str | None,
    typer.Option("--through", help="--schedule: the moment this run's snapshot holds data through (e.g. the day "
                 "of a daily job): its retry is a free replay, another input for it is refused, an earlier moment "
                 "is a backfill."),
]
RunsOpt = Annotated[
    int | None,
    typer.Option("--runs", help="With --dry-run: how many of the next runs to plan (--schedule: default 30, a month "
                 "of daily runs; stream-replay: default 1).", min=1, max=100_000, show_default=False),
]


# The expected size: a size the user states where a plan needs one (sizes are private: never read).
RowsOpt = Annotated[
    str | None,
    typer.Option("--rows", help="Rows the plan assumes. --dry-run --schedule (fixed, bbimprover): the input's "
                 "expected rows, N, FIRST:LAST growing geometrically over the runs planned, or N1,N2,… run by run. "
                 "--target-relative-moe (and histogram's mean targets): N, the bounded rows of the smallest group "
                 "the margin must hold for. Stated, never read from the data.",
                 show_default=False),
]
# The expected number of privacy units: what a bbscheduler's epochs follow (stated, never read).
UnitsOpt = Annotated[
    str | None,
    typer.Option("--units", help="Privacy units the plan assumes. --dry-run --schedule with bbscheduler: the "
                 "expected distinct units of the input (its epochs follow them), N, FIRST:LAST growing "
                 "geometrically over the runs planned, or N1,N2,… run by run. Stated, never read from the data.",
                 show_default=False),
]
#: The largest size --rows takes (a trillion rows).
MAX_ROWS = 10**12


def expected_size(text: str | None, dry_run: bool, scheduled: bool, relative: bool = False,
                  targeted: bool = False, units: str | None = None) -> ExpectedSize | None:
    """``--rows N``, ``FIRST:LAST`` or ``N1,N2,…`` (whole numbers in [1, 10^12]): a schedule's dry run plans with
    it, a relative margin target (``relative``) is a fraction of it, and a mean's margin target (``targeted``)
    holds for groups of at least N rows. ``--units`` (``units``), in the same forms, states privacy units
    instead: a bbscheduler's dry run only (:func:`dpcli.release.schedule_plan.plan_schedule` checks the
    scheduler)."""
    from dpcli.tasks import ExpectedSize

    if text is not None and units is not None:
        raise UsageError("give one of --rows (rows) and --units (privacy units)")
    if units is not None:
        if not (dry_run and scheduled):
            raise UsageError("--units states the privacy units a bbscheduler's plan follows: use it with "
                             "--dry-run --schedule")
        first, last, each = _sizes("--units", units)
        return ExpectedSize(first, last, each, counts="units")
    if text is None:
        return None
    if not (dry_run and scheduled) and not relative and not targeted:
        raise UsageError("--rows states the expected size for a plan: use it with --dry-run --schedule, with "
                         "--target-relative-moe, or with a mean's --target-moe")
    first, last, each = _sizes("--rows", text)
    if each and (relative or targeted):
        raise UsageError("a margin target takes one size in --rows (N), not one per run")
    return ExpectedSize(first, last, each)


def _sizes(option: str, text: str) -> tuple[int, int, tuple[int, ...]]:
    """(first, last, each) of ``N``, ``FIRST:LAST`` or ``N1,N2,…`` (one-line usage errors naming ``option``)."""
    listed = "," in text
    parts = text.split(",") if listed else text.split(":")
    if (not listed and len(parts) > 2) or not all(p.strip().isdigit() and len(p.strip()) <= 13 for p in parts):
        raise UsageError(f"{option} must be N, FIRST:LAST or N1,N2,… (each run's size) in whole numbers "
                         f"(e.g. 10000:50000), got {text!r}")
    values = [int(p) for p in parts]
    if not all(1 <= v <= MAX_ROWS for v in values):
        raise UsageError(f"{option} must lie in [1, 10^12], got {text!r}")
    return values[0], values[-1], tuple(values) if listed else ()


def engine_request(engine: str, master: str | None, remote: str | None, spark_conf: list[str] | None) -> EngineRequest:
    """The ``--engine`` option group (checked by the release path before any data is read)."""
    from dpcli.spark.engine import EngineRequest

    return EngineRequest(engine, master, remote, tuple(spark_conf or ()))


# Margin targets: dpcli chooses ε (or ρ) from the accuracy needed (dpcli.tasks.targets).
TargetMoeOpt = Annotated[
    str | None,
    typer.Option("--target-moe", help="Choose the smallest ε (ρ for Gaussian noise) whose 95% margins meet this: "
                 "X for every column, or COLUMN=X,… (count, count_units, sum; histogram also mean with --rows N, "
                 "and a quantile's rank margin in rows as median_rank=R or p90_rank=R); instead of --epsilon/--rho.",
                 show_default=False),
]
TargetRelativeMoeOpt = Annotated[
    str | None,
    typer.Option("--target-relative-moe", help="Like --target-moe, as a fraction R of the count stated with "
                 "--rows N (margin ⌊R·N⌋): R or COLUMN=R,… (count, count_units; histogram also a quantile's "
                 "rank, median_rank=R).", show_default=False),
]


def margin_target(moe: str | None, relative: str | None, size: ExpectedSize | None,
                  scheduled: bool) -> MarginTarget | None:
    """``--target-moe`` or ``--target-relative-moe`` (one of them, not with a schedule), parsed."""
    from dpcli.tasks.targets import parse_target

    if moe is None and relative is None:
        return None
    if moe is not None and relative is not None:
        raise UsageError("give one of --target-moe and --target-relative-moe")
    if scheduled:
        raise UsageError("a schedule sets each run's ε itself: drop --target-moe/--target-relative-moe")
    if moe is not None:
        if size is not None and size.first != size.last:
            raise UsageError("--target-moe takes one size in --rows (N: the rows of the smallest group a mean's "
                             "margin must hold for)")
        return parse_target(moe, size=size.first if size is not None else None)
    assert relative is not None
    if size is None or size.first != size.last:
        raise UsageError("--target-relative-moe needs --rows N: the expected count of the smallest group the "
                         "margin must hold for (stated, never read from the data)")
    return parse_target(relative, relative=True, size=size.first)


# Bounds dpcli chooses from the data (docs/choosing-parameters.md): `N|auto`, `LO:HI|auto`, the shares.
#: The largest count bound an option accepts (--max-partitions, --max-contributions).
MAX_CAP = 10**6


def cap(option: str, text: str | None) -> int | Literal["auto"] | None:
    """``N`` (1 to :data:`MAX_CAP`) or ``auto``; None when not given."""
    if text is None:
        return None
    if text.strip() == "auto":
        return "auto"
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{option} must be a whole number or auto, got {text!r}") from None
    if not 1 <= value <= MAX_CAP:
        raise UsageError(f"{option} must be between 1 and {MAX_CAP} (or auto), got {text.strip()}")
    return value


def bounds_or_auto(option: str, text: str | None) -> tuple[float, float] | Literal["auto"] | None:
    """``LO:HI`` (:func:`bounds`) or ``auto``."""
    if text is not None and text.strip() == "auto":
        return "auto"
    return bounds(option, text)


def share(option: str, text: str | None) -> Fraction | None:
    """A share of a release's budget, in (0, 0.5] (the release keeps at least half)."""
    return positive(option, text, limits=SHARE_RANGE)


SHARE_RANGE = Range(Fraction(0), Fraction(1, 2), "0", "0.5")
#: The caps of histogram and sql, chosen from the data when left out (``with_defaults`` of their tasks).
LeftOutPartitionsOpt = Annotated[
    str | None,
    typer.Option("--max-partitions", metavar="N|auto", show_default=False,
                 help="At most this many groups per unit (chosen at random), or auto: chosen privately from the "
                      "data. [default: auto where dpcli can choose (a note says when it cannot: a br ledger, "
                      "--engine spark, a schedule, a margin target), else 1]"),
]
LeftOutContributionsOpt = Annotated[
    str | None,
    typer.Option("--max-contributions", metavar="N|auto", show_default=False,
                 help="At most this many rows per unit per group, or auto: chosen privately from the data. "
                      "[default: as --max-partitions]"),
]
AutoShareOpt = Annotated[
    str | None,
    typer.Option("--auto-share", help="Share of the budget that chooses the auto bounds, in (0, 0.5] (default 0.1).",
                 show_default=False),
]
ReportBiasOpt = Annotated[
    bool | None,
    typer.Option("--report-bias/--no-report-bias",
                 help="Also release noisy shares of the units' rows the bounds cut and the values they clamped "
                      "(costs --bias-share of the budget). histogram reports them by default wherever the release "
                      "can pay for it; topk, sql and stream-replay only when asked.", show_default=False),
]
BiasShareOpt = Annotated[
    str | None,
    typer.Option("--bias-share", help="Share of the budget the --report-bias counts spend, in (0, 0.5] "
                                      "(default 0.025).", show_default=False),
]


@dataclass(frozen=True)
class BoundOptions:
    """The bound options of a command as given: each cap a number, ``auto`` or None (default 1; None too for a
    bound the command does not have), the value bounds ``LO:HI``, ``auto`` or None, the shares, and whether the
    bias report is asked for (None: left to the command's default). Every command turns them into its query
    through these methods."""

    partitions: int | Literal["auto"] | None
    contributions: int | Literal["auto"] | None
    values: tuple[float, float] | Literal["auto"] | None
    auto_share: Fraction | None = None
    report_bias: bool | None = False  # None: neither --report-bias nor --no-report-bias (the command's default)
    bias_share: Fraction | None = None

    @classmethod
    def given(cls, partitions: int | Literal["auto"] | None, contributions: int | Literal["auto"] | None,
              values: tuple[float, float] | Literal["auto"] | None, choice: ChoiceOptions) -> BoundOptions:
        """The bounds as parsed (caps and value bounds, parsed first) with the shares of ``choice`` parsed now."""
        return cls(partitions, contributions, values, share("--auto-share", choice.auto_share), choice.report_bias,
                   share("--bias-share", choice.bias_share))

    @property
    def max_partitions(self) -> int:
        """The partition cap given (1 when left out, and a placeholder when auto)."""
        return self.partitions if isinstance(self.partitions, int) else 1

    @property
    def max_contributions(self) -> int:
        return self.contributions if isinstance(self.contributions, int) else 1

    @property
    def value_bounds(self) -> tuple[float, float] | None:
        return self.values if isinstance(self.values, tuple) else None

    @property
    def chooses(self) -> bool:
        return "auto" in (self.partitions, self.contributions, self.values)

    def auto_bounds(self) -> AutoBounds | None:
        """The bounds left to dpcli (None: none); ``--auto-share`` without any auto is refused."""
        from dpcli.tasks.auto_bounds import AUTO_SHARE, AutoBounds

        if not self.chooses:
            if self.auto_share is not None:
                raise UsageError("--auto-share needs a bound given as auto (bounds left out are chosen at the "
                                 "default share, 0.1)")
            return None
        return AutoBounds(self.partitions == "auto", self.contributions == "auto", self.values == "auto",
                          self.auto_share or AUTO_SHARE)

    @property
    def bias(self) -> Fraction | None:
        """The bias report's share (None: no report); ``--bias-share`` without ``--report-bias`` is refused."""
        from dpcli.tasks.bias_report import BIAS_SHARE

        if not self.report_bias:
            if self.bias_share is not None:
                raise UsageError("--bias-share needs --report-bias")
            return None
        return self.bias_share or BIAS_SHARE

    def check_engine(self, engine: str) -> None:
        """Auto bounds and the bias report are computed by polars: refused with another engine."""
        if engine != "polars" and (self.chooses or self.report_bias):
            raise UsageError("auto bounds and --report-bias are computed by the polars engine only: drop --engine "
                             "spark, or give the bounds")

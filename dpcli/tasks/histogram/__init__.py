"""User-level DP group-by (``dpcli histogram``), importable without the CLI: a package of the task's shape.

* :mod:`.query`: the query (:class:`HistogramQuery`), its aggregations and the measurements they need;
* :mod:`.plan`: the release planned from the query and the ledger alone (no data): :func:`plan_histogram`, and
  the dry run's description (:func:`describe_plan`, :func:`largest_cap_margins`);
* :mod:`.run`: the release computed: bounding, aggregation, selection and noise (:func:`run_histogram`);
* :mod:`.auto`: bounds left out or ``auto``, chosen from the data at their share of the budget;
* :mod:`.target`: a margin target (``--target-moe``) turned into the budget that meets it;
* :mod:`.task`: the task (:class:`HistogramTask`) the release path runs.

The measurements, their sensitivities and the calibration are in ``docs/histogram.md``. The names below are the
package's public interface; its modules import each other, never this file.
"""

from dpcli.tasks.histogram.auto import QUANTILE_WIDEN_STEPS, plannable, quantile_model_noise
from dpcli.tasks.histogram.plan import (
    HistogramPlan,
    NoisyStatistic,
    describe_plan,
    largest_cap_margins,
    measurement_sensitivity,
    plan_histogram,
    quantile_candidates,
    quantile_rank_margin,
)
from dpcli.tasks.histogram.query import (
    QUANTILE_OFFSET,
    QUANTILE_STEPS,
    SIMPLE_AGGREGATIONS,
    VALUE_AGGREGATIONS,
    HistogramQuery,
    parse_quantile,
    quantile_label,
    quantile_measurement,
)
from dpcli.tasks.histogram.run import HistogramRelease, bounding_salt, run_histogram, true_values
from dpcli.tasks.histogram.task import HistogramTask, KeptBounds

__all__ = [
    "QUANTILE_OFFSET",
    "QUANTILE_STEPS",
    "QUANTILE_WIDEN_STEPS",
    "SIMPLE_AGGREGATIONS",
    "VALUE_AGGREGATIONS",
    "HistogramPlan",
    "HistogramQuery",
    "HistogramRelease",
    "HistogramTask",
    "KeptBounds",
    "NoisyStatistic",
    "bounding_salt",
    "describe_plan",
    "largest_cap_margins",
    "measurement_sensitivity",
    "parse_quantile",
    "plan_histogram",
    "plannable",
    "quantile_candidates",
    "quantile_label",
    "quantile_measurement",
    "quantile_model_noise",
    "quantile_rank_margin",
    "run_histogram",
    "true_values",
]

"""Differentially private top-k (``dpcli topk``), a package of the task's shape (:mod:`.query`, :mod:`.plan`,
:mod:`.run`, :mod:`.auto`, :mod:`.threshold`, :mod:`.target`, :mod:`.task`; its modules import each other, never
this file, which re-exports the public names), LinkedIn's KnownGumb and UnkGumb (paper 000), and for
groups discovered from the data by default a two-stage selection: private partition selection on
distinct-unit counts (thresholding, paper 002) followed by KnownGumb over the groups it released
(:mod:`dpcli.tasks.topk.threshold`; docs/commands/topk.md has the budget split and its proof).

Counting is per privacy unit: distinct units per group (τ = 1, the default)
or rows with each unit capped at τ rows per group (ℓ∞ sensitivity τ). A unit
may touch any number of groups (unrestricted sensitivity), which is why only
k groups are ever released.

Cost, in ε_per-bounded-range units (Alg. 5) — each Gumbel selection and each
Laplace(2τ/ε_per) count is ε_per-BR:

=================  ======================  ===============================
domain             with counts             --no-counts
=================  ======================  ===============================
known (--domain)   2k                      k
unknown (unkgumb)  2|o| + 1 − 1{⊥}         |o| + 1
=================  ======================  ===============================

The threshold selection (``--selection threshold``, the default outside ``br`` ledgers) is not
bounded-range as a whole: it is charged as an (ε_sel, δ) thresholding event plus KnownGumb's fixed
guarantee; a ``br`` ledger runs UnkGumb by default and refuses ``--selection threshold``.

|o| counts the released groups plus ⊥ when the list ends early. In a ``br``
ledger the unknown-domain cost is debited at its maximum (2k + 1, or k + 1)
before the run reads, and kept (the actual cost is reported), plus one call. Other
ledgers are charged a fixed guarantee from the papers' theorems:
known domain 3kε_per/2-DP with counts (Lemma 5.2) or kε_per-DP without;
unknown domain ((2k + 1)ε_per, δ)-DP (Theorem 1) or ((k + 1)ε_per, δ) without
counts; zcdp ledgers charge (number of BR units)·ε_per²/8.
"""

from dpcli.tasks.topk.plan import TopKPlan, describe_plan, epsilon_per_for, plan_topk, selection_epsilon, whole_epsilon
from dpcli.tasks.topk.query import DEFAULT_MAX_PARTITIONS, DEFAULT_SELECTION_SHARE, TopKQuery, default_selection
from dpcli.tasks.topk.run import TopKRelease, group_counts, run_topk
from dpcli.tasks.topk.task import TopKTask

__all__ = ["DEFAULT_MAX_PARTITIONS", "DEFAULT_SELECTION_SHARE", "TopKPlan", "TopKQuery", "TopKRelease", "TopKTask",
           "default_selection", "describe_plan", "epsilon_per_for", "group_counts", "plan_topk", "run_topk",
           "selection_epsilon", "whole_epsilon"]

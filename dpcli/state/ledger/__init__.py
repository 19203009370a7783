"""Per-analyst privacy-budget ledgers: lock → read and verify once → check → debit (durable) → unlock.

A ledger is JSON Lines (a header, then one appended line per charge) under a keyed HMAC chain
(:mod:`~dpcli.state.ledger.format`), with a sealed high-water mark that also carries the running
totals (:mod:`~dpcli.state.ledger.mark`), so a charge costs the same at entry 10 and entry 10,000.
A release is debited before it reads data and its completion recorded after; identical releases
are free replays (:mod:`~dpcli.state.ledger.charges`); streams and schedules
debit a reservation once and record each run as a step (:mod:`~dpcli.state.ledger.steps`); old
and moved ledgers are upgraded or resealed by the operator (:mod:`~dpcli.state.ledger.migrate`).
Format, seal, crash safety and what is (not) detected: ``docs/ledger.md``.
"""

from dpcli.state.ledger.charges import (
    charge,
    check_payable,
    close_start,
    debit,
    refusal,
    reserve,
    reserve_series,
    start_step,
)
from dpcli.state.ledger.document import init_ledger, read_ledger, remaining_text, wrote
from dpcli.state.ledger.format import dump_document, load_document, step_digest
from dpcli.state.ledger.migrate import migrate, reseal
from dpcli.state.ledger.model import (
    DEBIT_SUMMARY,
    Ledger,
    Receipt,
    Reservation,
    Step,
    completions,
    debited_before_reading,
    entry_cost,
    recorded_spend,
)
from dpcli.state.ledger.steps import StreamSummary, check_recorded, stream_summaries

__all__ = [
    "DEBIT_SUMMARY", "Ledger", "Receipt", "Reservation", "Step", "StreamSummary", "charge", "check_payable",
    "check_recorded", "close_start", "completions", "debit", "debited_before_reading", "dump_document", "entry_cost",
    "init_ledger", "load_document", "migrate", "read_ledger", "recorded_spend", "refusal", "remaining_text", "reseal",
    "reserve", "reserve_series", "start_step", "step_digest", "stream_summaries", "wrote",
]

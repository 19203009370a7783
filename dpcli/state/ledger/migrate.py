"""Old ledgers: the schema-1 upgrade, the operator's reseal of a moved or restored ledger, and the migration of an
approx ledger to a pld ledger."""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

from dpcli.core.accounting import budget as bud
from dpcli.core.accounting import pld
from dpcli.core.events import PrivacyEvent
from dpcli.errors import StateError, UsageError
from dpcli.state.ledger.costs import MIGRATED
from dpcli.state.ledger.document import (
    check_events,
    document_of,
    header_fields,
    load_ledger,
    parse_ledger,
    read_ledger_bytes,
    verify_chain,
    write_ledger,
)
from dpcli.state.ledger.format import (
    HEADER_FIELDS,
    SCHEMA_VERSION,
    V1_GENESIS,
    hwm_path,
    iso_time,
    load_document,
    parse_time,
    utc_now,
    v1_entry_hash,
)
from dpcli.state.ledger.mark import MarkError, verify_mark
from dpcli.state.ledger.model import Ledger
from dpcli.state.lock import exclusive_lock
from dpcli.state.paths import ledger_path, lock_path


def _upgrade_v1(path: Path, data: dict[str, Any], analyst: str) -> tuple[dict[str, Any], str]:
    """A schema-1 ledger (unkeyed chain) as a schema-2 document, after checking what v1 could check."""
    _limits, _created, _refresh, _delta, owner, entries = header_fields(path, data)
    if owner != analyst:
        raise StateError(f"ledger {path} belongs to analyst {owner!r}, not {analyst!r} (renamed or copied?)")
    verify_chain(path, entries, data.get("genesis", V1_GENESIS), v1_entry_hash)
    check_events(path, entries)
    reason = "upgraded from schema_version 1 (unkeyed)"
    try:
        mark = json.loads(hwm_path(path).read_text())
        if int(mark["count"]) > len(entries):
            reason += f"; its high-water mark recorded {int(mark['count'])} entries, the ledger has {len(entries)}"
    except (OSError, ValueError, KeyError, TypeError):
        reason += "; no readable high-water mark"
    header = {**{f: data.get(f) for f in HEADER_FIELDS}, "schema_version": SCHEMA_VERSION,
              "ledger_id": secrets.token_hex(16), "report_delta": float(data.get("report_delta", 1e-9))}
    entries = [{k: v for k, v in e.items() if k not in ("prev", "hash")} for e in entries]
    return {**header, "genesis": None, "entries": entries}, reason


def reseal(root: Path, analyst: str, lock_timeout: float = 30.0,
           now: datetime | None = None) -> tuple[Ledger, str | None]:
    """Accept the ledger file as it is now (after a deliberate move or restore, or to upgrade schema 1).

    The operator's decision, for what the seal cannot decide: the entries must
    still verify (edits are never accepted), only the high-water mark's
    objections are overridden, and an entry saying so is appended. Returns the
    ledger and the reason, or None when the ledger already verified fully.
    """
    path = ledger_path(root, analyst)
    when = now or utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        raw, ctime = read_ledger_bytes(path, analyst)
        data, _complete = load_document(path, raw)
        if data["schema_version"] == 1:
            doc, reason = _upgrade_v1(path, data, analyst)
        else:
            led = parse_ledger(path, raw, ctime, analyst, root, check_mark=False)
            try:
                return verify_mark(led, ctime, root, raw), None
            except MarkError as exc:
                if exc.entries_missing:
                    raise
                reason = exc.reason
            doc = document_of(led, list(led.entries))
        period = Ledger(path, analyst, doc["ledger_id"], bud.Limits.from_json(doc["limits"]),
                        parse_time(doc["created"]), doc["refresh_days"], doc["report_delta"], ()).period(when)
        doc["entries"].append({"seq": len(doc["entries"]) + 1, "time": iso_time(when), "period": period,
                               "command": "budget reseal", "query_id": "", "seed_id": f"reseal:{secrets.token_hex(8)}",
                               "events": [], "summary": f"the operator accepted the ledger file as it was: {reason}"})
        write_ledger(root, path, doc)
        return load_ledger(root, analyst), reason


def migrate(root: Path, analyst: str, to: str = "pld", lock_timeout: float = 30.0,
            now: datetime | None = None) -> tuple[Ledger, int]:
    """Turn an approx ledger into a pld ledger with the same limits (ε, δ): the operator's decision, recorded.

    Sound because both are basic-composition filters: each earlier charge keeps its (ε, δ) as the approx ledger
    composed it, now recorded as its cost (accounting ``approx``), and the pld ledger goes on composing blocks
    the same way. The ledger keeps its id (streams and schedules reserved in it go on), is verified whole first
    (a tampered or rolled-back ledger is refused, as by any read) and is resealed with an entry saying so.
    Returns the ledger and the number of charges carried over.
    """
    if to != "pld":
        raise UsageError(f"--to must be pld, got {to!r}")
    when = now or utc_now()
    with exclusive_lock(lock_path(root, analyst), lock_timeout):
        led = load_ledger(root, analyst)
        if led.limits.mode != "approx":
            raise UsageError(f"analyst {analyst!r} has a {led.limits.mode} ledger: only an approx ledger becomes a pld "
                             "ledger (its charges compose as their (ε, δ) there too)")
        try:
            limits = bud.Limits("pld", dict(led.limits.values))
        except ValueError:  # δ = 0: a pld ledger states an (ε, δ) guarantee
            raise UsageError(f"analyst {analyst!r}'s approx ledger has δ = 0: a pld ledger needs δ > 0") from None
        doc = document_of(led, list(led.entries))
        doc["limits"] = limits.to_json()
        carried = 0
        for e in doc["entries"]:
            if e["events"]:
                cost = led.accountant.spend(PrivacyEvent.from_json(ev) for ev in e["events"])
                e["cost"] = pld.cost_json(cost.epsilon, cost.delta, MIGRATED)
                carried += 1
        doc["entries"].append({
            "seq": len(doc["entries"]) + 1, "time": iso_time(when), "period": led.period(when),
            "command": "budget migrate", "query_id": "", "seed_id": f"migrate:{secrets.token_hex(8)}", "events": [],
            "summary": f"the operator turned this approx ledger into a pld ledger: its {carried} earlier charge(s) "
                       "keep their (ε, δ)"})
        write_ledger(root, ledger_path(root, analyst), doc)
        return load_ledger(root, analyst), carried

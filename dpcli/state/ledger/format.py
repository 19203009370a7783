"""The bytes of a ledger and of its high-water mark: encoding, keyed seals, appends.

A ledger file is JSON Lines (schema 3): a header line, then one line per entry, each entry
chained to the previous one by an HMAC under a key derived from the secret key. This module
turns documents into those bytes and back, seals them, appends durably and seals the mark's
body; :mod:`dpcli.state.ledger` decides what to write. Details: ``docs/ledger.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpcli.errors import StateError
from dpcli.state import keys

SCHEMA_VERSION = 3


#: Schema versions this dpcli reads (2: one JSON document, rewritten whole at each charge; it becomes 3 at
#: its next write). Schema 1 needs a one-time ``budget verify --reseal``.
READABLE_VERSIONS = (2, 3)


HEADER_FIELDS = ("schema_version", "analyst", "ledger_id", "created", "limits", "refresh_days", "report_delta")


_MAC_LABEL = "ledger-mac/v2"


GENESIS_DOMAIN = b"dpcli/ledger/genesis/v2\x00"


ENTRY_DOMAIN = b"dpcli/ledger/entry/v2\x00"


HWM_DOMAIN = b"dpcli/ledger/hwm/v2\x00"


_STEP_DOMAIN = b"dpcli/ledger/step-input/v1\x00"


V1_GENESIS = "0" * 64


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso_time(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def mac(key: bytes, domain: bytes, obj: Any) -> str:
    return hmac.new(key, domain + _canonical(obj), hashlib.sha256).hexdigest()


def same_mac(a: Any, b: Any) -> bool:
    return isinstance(a, str) and isinstance(b, str) and hmac.compare_digest(a.encode(), b.encode())


def v1_entry_hash(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def mac_keys(root: Path) -> Iterator[bytes]:
    """Ledger seal keys to try: the current key's first, then those of rotated-out keys (newest first)."""
    yield keys.derive_key(keys.load_key(root), _MAC_LABEL)
    for old in keys.archived_keys(root):
        yield keys.derive_key(old, _MAC_LABEL)


def current_mac_key(root: Path) -> bytes:
    return keys.derive_key(keys.load_or_create_key(root), _MAC_LABEL)


def step_digest(secret: bytes, material: dict[str, Any]) -> str:
    """The public digest of a run's input, recorded with its step: HMAC(secret, canonical material).

    ``secret`` is private to the state file (a stream's seed, a schedule's
    random secret), so the digest reveals only whether two inputs are equal.
    """
    return hmac.new(secret, _STEP_DOMAIN + _canonical(material), hashlib.sha256).hexdigest()[:32]


def hwm_path(path: Path) -> Path:
    return path.with_suffix(".hwm")


def dump_document(doc: dict[str, Any]) -> bytes:
    """A sealed ledger document as schema-3 JSON Lines: the header line (with ``genesis``), then one entry per line.

    JSON escapes every control character, so a line never contains a newline: appending an entry is
    appending one line, and a crash mid-append can only leave a torn last line without its newline.
    """
    head = {**{f: doc.get(f) for f in HEADER_FIELDS}, "genesis": doc.get("genesis")}
    return b"".join(json.dumps(obj).encode("ascii") + b"\n" for obj in [head, *doc["entries"]])


def _header_line(first: bytes) -> dict[str, Any] | None:
    """The first line as a schema-3 (or newer: refused by the caller) header line, else None (an older
    whole-file document, or damage)."""
    try:
        head = json.loads(first) if first.startswith(b"{") and first.rstrip().endswith(b"}") else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(head, dict):
        return None
    version = head.get("schema_version")
    return head if isinstance(version, int) and version >= 3 and "entries" not in head else None


def load_document(path: Path, raw: bytes) -> tuple[dict[str, Any], int]:
    """Parse a ledger file (schema 3 lines, or a schema 1/2 document): the document and its complete length.

    A schema-3 file's bytes after its last newline are a torn append (a crash while a charge was being
    written, before it returned: its release was never output) and are ignored; writers cut them off.
    """
    first = raw.split(b"\n", 1)[0]
    head = _header_line(first)
    if head is not None:
        complete = raw.rfind(b"\n") + 1
        try:
            entries = [json.loads(line) for line in raw[len(first) + 1 : complete].split(b"\n")[:-1]]
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateError(f"ledger {path} is corrupt (a line is not valid JSON: {getattr(exc, 'msg', exc)})"
                             ) from None
        return {**head, "entries": entries}, complete
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"ledger {path} is corrupt (not valid JSON: {getattr(exc, 'msg', exc)})") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise StateError(f"ledger {path} is corrupt (no schema_version)")
    return data, len(raw)


def seal(doc: dict[str, Any], key: bytes) -> None:
    """(Re)compute the genesis and every entry's ``prev``/``hash`` of ``doc`` in place."""
    header = {f: doc.get(f) for f in HEADER_FIELDS}
    prev = doc["genesis"] = mac(key, GENESIS_DOMAIN, header)
    for entry in doc["entries"]:
        entry.pop("hash", None)
        entry["prev"] = prev
        prev = entry["hash"] = mac(key, ENTRY_DOMAIN, entry)


def mark_mac(key: bytes, body: dict[str, Any]) -> str:
    """The seal of a high-water mark body; its (long) seeds blob enters by its SHA-256, hashed not JSON-encoded."""
    cache = body.get("cache")
    if isinstance(cache, dict) and isinstance(cache.get("seeds"), str):
        digest = hashlib.sha256(cache["seeds"].encode("utf-8", "surrogatepass")).hexdigest()
        body = {**body, "cache": {**cache, "seeds": f"sha256:{digest}"}}
    return mac(key, HWM_DOMAIN, body)


def seed_tag(seed_id: str) -> str:
    """A fixed-length, escape-free tag of a seed id: 128 bits of SHA-256, so the chance that two of a
    ledger's n seed ids share one is below n²/2^129 (a shared tag would make a release a free replay)."""
    return hashlib.sha256(seed_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def sealed_lines(root: Path, head: str, entries: list[dict[str, Any]]) -> bytes:
    """Chain ``entries`` after the entry hash ``head`` and seal them (in place); their ledger lines."""
    key = current_mac_key(root)
    prev = head
    for entry in entries:
        entry.pop("hash", None)
        entry["prev"] = prev
        prev = entry["hash"] = mac(key, ENTRY_DOMAIN, entry)
    return b"".join(json.dumps(e).encode("ascii") + b"\n" for e in entries)


def append_at(path: Path, at: int, data: bytes) -> int:
    """Write ``data`` at offset ``at`` (the file's verified length) and fsync; the new length.

    Nothing else touches the file first (not even a no-op truncate, which moves its ctime): a crash
    before the first byte lands leaves it exactly as its intent mark describes it.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], at + written)
        os.fsync(fd)
    finally:
        os.close(fd)
    return at + len(data)

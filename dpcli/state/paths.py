"""Where state lives and how it is created.

Resolution order: ``--state-dir`` > ``DPCLI_STATE_DIR`` > ``$XDG_DATA_HOME/dpcli``
> ``~/.local/share/dpcli``. It is *data*, not disposable state: deleting a
ledger silently hands back spent budget.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from dpcli.errors import StateError, UsageError, os_reason

_README = """\
This directory belongs to dpcli (differential privacy CLI).

  secret.key          the secret seed key (0600). Whoever holds it can recompute
                      every noise value dpcli released. Back it up privately.
  ledgers/NAME.json   privacy-budget ledgers, one per analyst. Deleting or editing
                      one hands back spent budget: don't.
  ledgers/NAME.hwm    each ledger's high-water mark. A restored, copied or moved
                      ledger is refused (exit 78); after a deliberate restore or
                      move: dpcli budget verify NAME --reseal (recorded).
  ledgers/NAME.lock   lock files (never delete while dpcli runs).

Do not edit these files by hand. See `dpcli budget --help`.
"""

#: Matched against the *whole* name (``fullmatch``): ``$`` would also accept a trailing newline.
_ANALYST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)


def default_state_dir(environ: dict[str, str] | None = None) -> Path:
    """The state directory when ``--state-dir`` is not given."""
    env = os.environ if environ is None else environ
    if env.get("DPCLI_STATE_DIR"):
        return Path(env["DPCLI_STATE_DIR"]).expanduser()
    if env.get("XDG_DATA_HOME"):
        return Path(env["XDG_DATA_HOME"]).expanduser() / "dpcli"
    return Path.home() / ".local" / "share" / "dpcli"


def validate_analyst(name: object) -> str:
    """Analyst names become file names: ASCII letters, digits, ``_ . -``, at most 64 characters.

    The whole string must match (no trailing newline, no control or other characters).
    """
    if not isinstance(name, str) or not _ANALYST_RE.fullmatch(name):
        raise UsageError(
            f"invalid analyst name {name!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def ensure_state_dir(root: Path) -> Path:
    """Create the state directory (0700) with its README if needed; refuse an insecure one."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (root / "ledgers").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create state directory {root}: {os_reason(exc)}") from exc
    if not root.is_dir():
        raise StateError(f"state directory {root} is not a directory")
    mode = stat.S_IMODE(root.stat().st_mode)
    if mode & 0o022:
        raise StateError(f"state directory {root} is writable by group or others (mode {mode:o}); run: chmod 700 "
                         f"{root}")
    readme = root / "README.txt"
    if not readme.exists():
        from dpcli.state.atomic import atomic_write_bytes

        atomic_write_bytes(readme, _README.encode(), mode=0o600)
    return root


def existing_state_dir(root: Path) -> Path:
    """The state directory of a command that needs a ledger in it: refused (exit 78) when it does not exist,
    never created (a misspelt name would otherwise start an empty state); else :func:`ensure_state_dir`.
    Only ``budget init`` (and ``catalog set``, ``budget key``) create one."""
    if not root.is_dir():
        raise StateError(f"state directory {root} does not exist (is its name right?)",
                         fix="'dpcli budget init NAME' creates it with a ledger")
    return ensure_state_dir(root)


def ledger_path(root: Path, analyst: str) -> Path:
    return root / "ledgers" / f"{validate_analyst(analyst)}.json"


def lock_path(root: Path, analyst: str) -> Path:
    return root / "ledgers" / f"{validate_analyst(analyst)}.lock"

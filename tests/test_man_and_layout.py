"""man/ must match the CLI; the mechanism core must not import the CLI or I/O stacks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_man_pages_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_man.py"), str(ROOT / "man"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_core_does_not_import_typer_rich_or_polars():
    code = (
        "import sys, dpcli.core.samplers, dpcli.core.accounting, dpcli.core.budget, dpcli.core.prf;"
        "bad=[m for m in ('typer','rich','polars') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_no_insecure_randomness_in_package():
    for path in (ROOT / "dpcli").rglob("*.py"):
        text = path.read_text()
        assert "import random" not in text and "np.random" not in text and "numpy.random" not in text, path

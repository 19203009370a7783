"""man/ must match the CLI; the mechanism core must not import the CLI or I/O stacks."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_man_pages_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_man.py"), str(ROOT / "man"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_core_does_not_import_typer_rich_or_polars():
    core = ROOT / "dpcli" / "core"
    modules = sorted("dpcli.core." + ".".join(p.relative_to(core).with_suffix("").parts)
                     for p in core.rglob("*.py") if p.stem != "__init__")
    assert len(modules) >= 11
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}];"
        "bad=[m for m in ('typer','rich','polars') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_the_cli_imports_typer_or_rich():
    for path in (ROOT / "dpcli").rglob("*.py"):
        if "cli" in path.relative_to(ROOT / "dpcli").parts:
            continue
        imports = [line for line in path.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
        assert not [line for line in imports if "typer" in line or "rich" in line], path


def test_architecture_md_names_every_module():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for path in (ROOT / "dpcli").rglob("*.py"):
        if path.stem == "__main__":
            continue
        name = path.parent.name + "/" if path.stem == "__init__" else path.stem
        assert f"`{name}" in text or f"{path.stem}.py" in text or f"`{path.stem}`" in text, path


def test_no_insecure_randomness_in_package():
    for path in (ROOT / "dpcli").rglob("*.py"):
        text = path.read_text()
        assert "import random" not in text and "np.random" not in text and "numpy.random" not in text, path


def test_docs_the_code_points_to_exist():
    for path in (ROOT / "dpcli").rglob("*.py"):
        for name in re.findall(r"docs/([a-z_]+\.md)", path.read_text()):
            assert (ROOT / "docs" / name).exists(), (path, name)

"""Generate roff man pages from the typer app (typer's public ``typer.main.get_command``).

Usage: ``python scripts/gen_man.py man`` writes man/*.1; ``--check`` exits 1 if
any page in the directory differs from what the CLI would generate now.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from dpcli import __version__
from dpcli.cli.app import app
from dpcli.errors import ExitCode

_EXIT_MEANING = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (a bug; please report it), or the Spark driver stopped (out of memory; "
                       "the run is charged: it had begun reading)",
    ExitCode.USAGE: "usage error: bad option or argument, or (service mode) a path or verb the caller may not use",
    ExitCode.DATA: "bad input data (missing column, wrong type, unparsable or empty input); bad records are dropped, "
                   "never an error",
    ExitCode.NO_INPUT: "input file missing or unreadable, or one of dpcli's private files (key, ledger, state)",
    ExitCode.CANT_WRITE: "output cannot be written",
    ExitCode.LOCK_TIMEOUT: "ledger lock not acquired in time (safe to retry)",
    ExitCode.BUDGET: "privacy budget refused (or no ledger for the analyst)",
    ExitCode.STATE: "corrupt, tampered, insecure or newer-version state",
    ExitCode.INTERRUPTED: "interrupted by SIGINT: one line says what the run charged and wrote (a run that had "
                          "begun reading is charged; its rerun is free)",
    ExitCode.TERMINATED: "ended by SIGTERM: the same line and guarantees as 130",
    ExitCode.CLOSED_PIPE: "standard output closed by its reader (| head): a normal end, no message",
}


def _esc(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.splitlines())


ROOT = Path(__file__).resolve().parent.parent
_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def _examples(path: list[str]) -> list[str]:
    """The page's EXAMPLES: the tested shell examples of its docs page (README's quick start for dpcli(1)).

    Every example comes from a block that tests/test_docs_examples.py runs, so it works as shown.
    A budget subcommand's page keeps the commands of docs/commands/budget.md that call it.
    """
    if len(path) == 1:
        text = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    else:
        doc = ROOT / "docs" / "commands" / f"{path[1]}.md"
        if not doc.exists():
            return []
        text = doc.read_text()
    lines = [ln for block in _SH_BLOCK.findall(text) for ln in block.rstrip("\n").splitlines()]
    if len(path) <= 2:
        return lines
    wanted = "dpcli " + " ".join(path[1:]) + " "
    commands: list[list[str]] = []
    for ln in lines:  # keep whole commands (continued with a backslash) that call this subcommand
        if commands and commands[-1][-1].endswith("\\"):
            commands[-1].append(ln)
        else:
            commands.append([ln])
    return [ln for cmd in commands if (cmd[0] + " ").startswith(wanted) for ln in cmd]


def _option(p, argument_name: str | None) -> list[str]:
    """One option's (or argument's) entry: its spellings, its help, and its environment variable,
    default and whether it is required."""
    opts = argument_name or ", ".join(list(p.opts) + list(getattr(p, "secondary_opts", [])))
    help_text = (getattr(p, "help", None) or "").strip()
    extra = []
    if getattr(p, "envvar", None):
        extra.append(f"env: {p.envvar}")
    if p.default not in (None, False, 0, "", ()) and not callable(p.default):
        extra.append(f"default: {p.default}")
    if p.required:
        extra.append("required")
    return [".TP", f".B {_esc(opts)}", _esc(help_text + (f" [{'; '.join(extra)}]" if extra else ""))]


def _page(path: list[str], cmd, parents_params) -> str:
    name = "-".join(path)
    summary = (cmd.help or "").strip().splitlines()[0] if cmd.help else ""
    out = [
        f'.TH "{name.upper()}" "1" "" "dpcli {__version__}" "dpcli manual"',
        ".SH NAME",
        f"{_esc(name)} \\- {_esc(summary)}",
        ".SH SYNOPSIS",
        f".B {_esc(' '.join(path))}",
    ]
    params = [p for p in cmd.params if p.name not in ("help",)]
    args = [p for p in params if not getattr(p, "opts", [""])[0].startswith("-")]
    out.append(_esc(" [OPTIONS]" + "".join(f" {p.name.upper()}" for p in args)))
    subs = getattr(cmd, "commands", {}) or {}
    if subs:
        out.append(_esc(" COMMAND [ARGS]..."))
    out += [".SH DESCRIPTION", _esc((cmd.help or "").strip())]
    if params:
        out.append(".SH OPTIONS")
        for p in params:
            out += _option(p, p.name.upper() if args and p in args else None)
    if subs:
        out.append(".SH COMMANDS")
        for sub_name, sub in sorted(subs.items()):
            first = (sub.help or "").strip().splitlines()[0] if sub.help else ""
            out += [".TP", f".B {_esc(sub_name)}", _esc(first + f" See {name}-{sub_name}(1).")]
    examples = _examples(path)
    if examples:
        out += [".SH EXAMPLES", ".nf", ".RS 4", *(_esc(ln) or "\\&" for ln in examples), ".RE", ".fi"]
    out.append(".SH EXIT STATUS")
    for code, meaning in _EXIT_MEANING.items():
        out += [".TP", f".B {int(code)}", _esc(meaning)]
    if len(path) > 1:
        out += [".SH SEE ALSO", "dpcli(1)"]
    return "\n".join(out) + "\n"


def render_all() -> dict[str, str]:
    """File name → roff text for the root command and every subcommand."""
    pages: dict[str, str] = {}

    def walk(path: list[str], cmd) -> None:
        pages["-".join(path) + ".1"] = _page(path, cmd, [])
        for sub_name, sub in sorted((getattr(cmd, "commands", {}) or {}).items()):
            walk([*path, sub_name], sub)

    walk(["dpcli"], typer.main.get_command(app))
    return pages


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    outdir = Path(args[0] if args else "man")
    pages = render_all()
    if check:
        existing = {p.name for p in outdir.glob("*.1")}
        stale = sorted(n for n, text in pages.items() if not (outdir / n).exists() or (outdir / n).read_text() != text)
        stale += sorted(existing - set(pages))
        if stale:
            print("stale man pages (run `make man`): " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    outdir.mkdir(exist_ok=True)
    for old in outdir.glob("*.1"):
        if old.name not in pages:
            old.unlink()
    for name, text in pages.items():
        (outdir / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``dpcli --install-completion``: what it adds to which files, said first, and asked on a terminal.

typer's installer (pinned range: ``pyproject.toml``) writes a completion script under the home directory and,
for bash and zsh, appends lines to the shell's start-up file. dpcli says which files before anything is
written; on a terminal it asks (``--yes`` skips the question), elsewhere (a script, a Makefile) it goes on, as
asked. ``tests/test_rough_edges_misc.py`` holds the description to what typer then writes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

#: The option that answers the question in advance.
YES = "--yes"


def detected_shell() -> str | None:
    """The shell typer will install for: as typer finds it (shellingham), else ``$SHELL``'s name."""
    try:
        import shellingham

        return str(shellingham.detect_shell()[0]).lower()
    except Exception:  # noqa: BLE001 - detection failing is an answer: no shell found
        shell = os.environ.get("SHELL")
        return Path(shell).name.lower() if shell else None


def what_is_added(shell: str | None, home: Path) -> str | None:
    """What installing completion for ``shell`` writes, in words (None: a shell typer does not install for)."""
    if shell == "bash":
        script = home / ".bash_completions" / "dpcli.sh"
        return f"writes {script} and appends the line source '{script}' to {home / '.bashrc'}"
    if shell == "zsh":
        return (f"writes {home / '.zfunc' / '_dpcli'} and appends to {home / '.zshrc'} the line "
                "fpath+=~/.zfunc; autoload -Uz compinit; compinit (and a zstyle line for menu selection when "
                "the file has none)")
    if shell == "fish":
        return f"writes {home / '.config' / 'fish' / 'completions' / 'dpcli.fish'}"
    if shell in ("powershell", "pwsh"):
        return ("sets PowerShell's execution policy for your user to Unrestricted and appends the script to "
                "your PowerShell profile")
    return None


def confirm_install(args: list[str], ask: Callable[[str], str] | None = None,
                    terminal: bool | None = None) -> list[str]:
    """``args`` without ``--yes``, once the user agreed to what ``--install-completion`` will write (said on
    stderr). On a terminal without ``--yes`` the question is asked (``ask``: :func:`input`), and anything but
    y/yes ends the run with exit 0 and nothing written. Without ``--install-completion``, ``args`` unchanged."""
    if "--install-completion" not in args:
        return args
    yes = YES in args
    rest = [a for a in args if a != YES]
    what = what_is_added(detected_shell(), Path.home())
    if what is None:
        return rest  # typer says the shell is not supported, and writes nothing
    print(f"dpcli: shell completion {what}", file=sys.stderr)
    on_terminal = sys.stdin.isatty() and sys.stderr.isatty() if terminal is None else terminal
    if yes or not on_terminal:
        return rest
    try:
        answer = (ask or input)("Install it? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("dpcli: nothing installed", file=sys.stderr)
        raise SystemExit(0)
    return rest

"""The command line as typer gets it: old option spellings rewritten, and global options moved before the command.

Old option spellings are kept working for one minor release (see docs/vocabulary.md).

Every concept has one name across commands (``--by``, ``--keys``, ``--max-contributions``,
``--bounds``, ``--max-groups``, ``--dry-run``, ``rdp``). The spellings used before 0.2 are
rewritten here, before typer parses the command line, with a one-line deprecation note on
stderr; they appear in no ``--help`` or man page. Only tokens after the command's name are
rewritten, and nothing after a ``--``.

The root's (global) options may also be given after the command (``dpcli histogram … -q``, the way
cron lines and Makefiles append them): :func:`hoist_root_options` moves them before it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Root options that take a value (their value is never a command name).
ROOT_VALUE_OPTIONS = frozenset({"--state-dir", "--analyst", "--lock-timeout"})
#: Root options that take no value: the counted ``-q``/``-v`` (also as ``-qq``, ``-vv``) and their long names.
ROOT_FLAGS = re.compile(r"-[qv]+|--quiet|--verbose")

#: command path → {old flag: new flag}.
RENAMED: dict[tuple[str, ...], dict[str, str]] = {
    ("topk",): {"--domain": "--keys", "--dbar": "--max-groups"},
    ("stream-replay",): {"--key": "--by", "--max-records": "--max-contributions"},
    ("budget", "compose"): {"--calls": "--call-budget"},
}

#: Removed in the release after the one that deprecated them.
REMOVED_IN = "0.3"


def _clamp_to_bounds(value: str) -> list[str]:
    """stream-replay's ``--clamp L`` meant values clamped to [−L, L]: ``--bounds -L:L``."""
    text = value.strip()
    return ["--bounds", f"-{text}:{text}" if not text.startswith("-") else f"{text}:{text[1:]}"]


#: command path → {old flag taking a value: a function of its value giving the new tokens}.
REWRITTEN: dict[tuple[str, ...], dict[str, Callable[[str], list[str]]]] = {
    ("stream-replay",): {"--clamp": _clamp_to_bounds},
}

#: command path → {old value of an option: (option, new value)}.
RENAMED_VALUES: dict[tuple[str, ...], dict[tuple[str, str], str]] = {
    ("budget", "compose"): {("--mode", "rdp-geometric"): "rdp"},
}


def command_path(argv: Sequence[str]) -> tuple[tuple[str, ...], int]:
    """The command path (``("budget", "compose")``) and the index of the first token after it."""
    path: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            break
        if tok.startswith("-"):
            i += 2 if tok in ROOT_VALUE_OPTIONS and not path else 1
            continue
        path.append(tok)
        i += 1
        if path[0] != "budget" or len(path) == 2:
            break
    return tuple(path), i


@dataclass
class _Rewriter:
    """One command's old spellings, and the notes for those met so far (each once, in order)."""

    renamed: dict[str, str]
    rewritten: dict[str, Callable[[str], list[str]]]
    values: dict[tuple[str, str], str]
    notes: list[str] = field(default_factory=list)

    def note(self, old: str, new: str) -> None:
        line = f"dpcli: note: {old!s} is deprecated (removed in {REMOVED_IN}); use {new}"
        if line not in self.notes:
            self.notes.append(line)

    def rewrite(self, args: list[str], i: int) -> tuple[list[str], int]:
        """The tokens ``args[i]`` (with its value, when the old spelling takes one) becomes, and how
        many tokens it used."""
        tok = args[i]
        flag, eq, inline = tok.partition("=")
        if flag in self.renamed:
            self.note(flag, self.renamed[flag])
            return [self.renamed[flag] + eq + inline], 1
        takes_value = flag in self.rewritten or flag in {opt for opt, _ in self.values}
        if takes_value and (eq or i + 1 < len(args)):
            return self._with_value(flag, inline if eq else args[i + 1]), 1 if eq else 2
        return [tok], 1

    def _with_value(self, flag: str, value: str) -> list[str]:
        """``flag value`` in today's spelling: rewritten whole, or the value renamed (or kept)."""
        if flag in self.rewritten:
            new = self.rewritten[flag](value)
            self.note(f"{flag} {value}", " ".join(new))
            return new
        if (flag, value) in self.values:
            self.note(f"{flag} {value}", f"{flag} {self.values[(flag, value)]}")
            value = self.values[(flag, value)]
        return [flag, value]


def expand_aliases(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` with deprecated spellings replaced, and one note per spelling replaced.

    ``dpcli tabulate plan --spec S`` becomes ``dpcli tabulate --dry-run --spec S``.
    """
    args = list(argv)
    path, start = command_path(args)
    out = args[:start]
    rewriter = _Rewriter(RENAMED.get(path, {}), REWRITTEN.get(path, {}), RENAMED_VALUES.get(path, {}))
    if path == ("tabulate",) and start < len(args) and args[start] == "plan":
        rewriter.note("'tabulate plan'", "'tabulate --dry-run'")
        out.append("--dry-run")
        start += 1
    i = start
    while i < len(args):
        if args[i] == "--":
            out.extend(args[i:])
            break
        tokens, used = rewriter.rewrite(args, i)
        out.extend(tokens)
        i += used
    return out, rewriter.notes


def _root_option(token: str) -> int:
    """How many tokens a root option starting at ``token`` takes (``--state-dir DIR``: 2); 0 if it is none."""
    if ROOT_FLAGS.fullmatch(token):
        return 1
    flag, eq, _ = token.partition("=")
    if flag in ROOT_VALUE_OPTIONS:
        return 1 if eq else 2
    return 0


def hoist_root_options(argv: Sequence[str],
                       value_options: Callable[[tuple[str, ...]], frozenset[str]]) -> list[str]:
    """``argv`` with the root's options that follow the command moved before it:
    ``histogram f.csv --by a -q --state-dir S`` becomes ``-q --state-dir S histogram f.csv --by a``.

    A token is the command's when it is the value of the command's option before it
    (``value_options(path)``: the command's options that take a value, asked only when a root option
    may follow the command, since building typer's command costs a few tens of ms), and nothing
    after ``--`` moves. No command shares a name with a root option (``tests/test_small_stumbles.py``).
    """
    args = list(argv)
    path, start = command_path(args)
    tail = args[start:args.index("--") if "--" in args[start:] else len(args)]
    if not path or not any(_root_option(t) for t in tail):
        return args
    takes_value = value_options(path)
    hoisted: list[str] = []
    kept: list[str] = []
    i = start
    while i < start + len(tail):
        size = _root_option(args[i])
        if not size:
            size = 2 if args[i] in takes_value else 1
            kept.extend(args[i:i + size])
        else:
            hoisted.extend(args[i:i + size])
        i += size
    return [*hoisted, *args[:start], *kept, *args[i:]]

"""Reading the query text with sqlglot: one SELECT statement, the paper's marker removed.

Paper 002 writes its DP operator ``SELECT WITH ANONYMIZATION``; plain ``SELECT`` is accepted too
and means the same (every ``dpcli sql`` query is anonymized). The marker is not SQL any parser
knows, so it is removed token by token (whitespace and comments between the words allowed) before
sqlglot parses the text, and only on the outer SELECT. sqlglot's own messages are withheld (they
quote the text around an error, which could be a private file given as ``-f``): a parse error is
reported by its line and column only.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType
from sqlglot.tokens import Tokenizer

from dpcli.errors import UsageError

#: Longest query text accepted (characters).
MAX_QUERY_CHARS = 100_000
#: Deepest syntax tree accepted (levels): every later stage (resolving, compiling, the plan's canonical
#: form) walks the tree recursively, so a deeper query is refused here, as a usage error.
MAX_QUERY_DEPTH = 128
#: The word after ``WITH`` in paper 002's operator.
MARKER = "ANONYMIZATION"


def parse_query(text: str) -> exp.Select:
    """The query's syntax tree: exactly one SELECT statement (refused otherwise, exit 2)."""
    if len(text) > MAX_QUERY_CHARS:
        raise UsageError(f"the query is longer than {MAX_QUERY_CHARS} characters")
    cleaned = strip_marker(text)
    try:
        statements = sqlglot.parse(cleaned)
    except ParseError as exc:
        raise UsageError(f"the query does not parse{_where(exc)}") from None
    except TokenError:
        raise UsageError("the query does not parse (an unterminated string, quote or comment?)") from None
    except RecursionError:
        raise _too_deep() from None
    found = [s for s in statements if s is not None]
    if len(found) != 1:
        raise UsageError(f"give exactly one SELECT statement, not {len(found)}")
    statement = found[0]
    if tree_depth(statement) > MAX_QUERY_DEPTH:
        raise _too_deep()
    if not isinstance(statement, exp.Select):
        raise UsageError(f"the query must be a SELECT (not {statement.key.upper()}: UNION, INSERT and others are "
                         "not supported)")
    return statement


def _too_deep() -> UsageError:
    return UsageError(f"the query nests more than {MAX_QUERY_DEPTH} levels deep (write long AND/OR chains "
                      "as IN lists, or split the query)")


def tree_depth(node: exp.Expr) -> int:
    """The number of levels of ``node``'s syntax tree, counted without recursion."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in current.iter_expressions())
    return deepest


def _where(exc: ParseError) -> str:
    """`` (at line L, column C)`` from a parse error's structured fields (never its text)."""
    for err in exc.errors:
        line, col = err.get("line"), err.get("col")
        if isinstance(line, int) and isinstance(col, int):
            return f" (at line {line}, column {col})"
    return ""


def strip_marker(text: str) -> str:
    """``text`` without paper 002's ``WITH ANONYMIZATION`` after its outer SELECT (refused anywhere else)."""
    try:
        tokens = Tokenizer().tokenize(text)
    except TokenError:
        return text  # the parser reports it
    spans = [(tokens[i + 1].start, tokens[i + 2].end + 1, i) for i in range(len(tokens) - 2)
             if _is_marker(tokens[i], tokens[i + 1], tokens[i + 2])]
    if not spans:
        return text
    outer = _outer_select(tokens)
    if len(spans) > 1 or spans[0][2] != outer:
        raise UsageError("WITH ANONYMIZATION marks the outer SELECT only (sub-queries are never anonymized)")
    start, end, _ = spans[0]
    return text[:start] + " " * (end - start) + text[end:]


def _is_marker(select: Token, with_: Token, word: Token) -> bool:
    return (select.token_type == TokenType.SELECT and with_.token_type == TokenType.WITH
            and word.text.upper() == MARKER)


def _outer_select(tokens: list[Token]) -> int:
    """The index of the first SELECT outside parentheses that follows no CTE list (the outer query's)."""
    depth, last = 0, -1
    for i, t in enumerate(tokens):
        if t.token_type == TokenType.L_PAREN:
            depth += 1
        elif t.token_type == TokenType.R_PAREN:
            depth -= 1
        elif t.token_type == TokenType.SELECT and depth == 0:
            last = i
            break
    return last


def table_names(select: exp.Select) -> list[tuple[str, bool]]:
    """The tables a query names, as (name, quoted), each once, in order; CTE names left out."""
    ctes = {cte.alias.lower() for cte in select.find_all(exp.CTE)}
    found: list[tuple[str, bool]] = []
    for table in select.find_all(exp.Table):
        ident = table.this
        name, quoted = (str(ident.this), bool(ident.quoted)) if isinstance(ident, exp.Identifier) else (table.name,
                                                                                                           False)
        if name.lower() not in ctes and (name, quoted) not in found:
            found.append((name, quoted))
    return found

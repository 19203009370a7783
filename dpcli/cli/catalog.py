"""``dpcli catalog``: the operator's catalog of datasets, public lists, Spark endpoints and output directories."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from dpcli.access import gate
from dpcli.cli._common import emit_json, handles_errors, info, settings
from dpcli.errors import InputMissingError

app = typer.Typer(help="The operator's catalog (service mode): datasets, public lists, Spark endpoints, outputs.",
                  no_args_is_help=True)


@app.command("set")
@handles_errors
def set_catalog(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="The catalog as TOML ('-' reads it from stdin).", show_default=False,
                                               metavar="FILE")],
) -> None:
    """Install FILE as the catalog (the operator's): checked, sealed with the key, kept in the state directory."""
    from dpcli.access.catalog import check_outputs, read_toml, seal_paths, write_catalog
    from dpcli.io.opening import open_binary
    from dpcli.state.paths import ensure_state_dir

    gate().require_operator("catalog set")
    gate().require_public_interpreter("catalog set")
    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        fh, _ = open_binary(file, "catalog file")
        try:
            with fh:
                data = fh.read()
        except OSError:
            raise InputMissingError(f"catalog file {file!r} is not readable") from None
    catalog = read_toml(data)
    check_outputs(catalog, settings(ctx).state_dir)
    root = ensure_state_dir(settings(ctx).state_dir)
    catalog = seal_paths(catalog, root, gate().service)  # locations resolved and checked, outputs pinned
    path = write_catalog(root, catalog)
    counts = ", ".join(f"{len(catalog.sections[s])} {s}" for s in catalog.sections)
    info(ctx, f"catalog installed at {path}: {counts}, {len(catalog.outputs)} output director(ies)")


@app.command("show")
@handles_errors
def show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
) -> None:
    """What the catalog holds: all of it for the operator; for an analyst, the names they may use."""
    g = gate()
    catalog = g.catalog
    if catalog is None:
        typer.echo("no catalog (personal mode: inputs are paths)" if not as_json else "{}")
        return
    doc = catalog.to_json() if g.operator else catalog.view_for(g.analyst)
    if as_json:
        emit_json(doc)
    else:
        typer.echo(_catalog_text(doc, g.operator))


def _catalog_text(doc: dict[str, Any], operator: bool) -> str:
    """The catalog for people: one line per entry and output directory (and the operators, for one)."""
    lines = [_entry_line(section, name, entry) for section in ("datasets", "public", "spark")
             for name, entry in doc[section].items()]
    lines += [_output_line(out) for out in doc["outputs"]]
    if operator and doc.get("operators"):
        lines.append("operators " + ", ".join(doc["operators"]))
    return "\n".join(lines) if lines else "the catalog is empty"


def _entry_line(section: str, name: str, entry: dict[str, Any]) -> str:
    """One named entry: where it lies (or its Spark endpoint) and a dataset's privacy unit (the
    operator's view; an analyst's entries hold neither)."""
    where = entry.get("location") or entry.get("master") or entry.get("remote") or ""
    extra = f"  unit {entry['privacy_unit']}" if "privacy_unit" in entry else ""
    if isinstance(link := entry.get("owned_by"), dict):
        extra = f"  owned by {link['parent']}.{link['key']} through {link['column']}"
    return f"{section:<9} {name:<20} {where}{extra}".rstrip()


def _output_line(out: dict[str, Any] | str) -> str:
    """An output directory: with its analysts (the operator's view), or alone (an analyst's)."""
    if isinstance(out, dict):
        return f"output    {out['directory']}  ({', '.join(out['analysts'])})"
    return f"output    {out}"

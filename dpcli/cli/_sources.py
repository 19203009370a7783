"""The inputs a command names, resolved through the gate (:mod:`dpcli.access`) before anything is read.

A data input is a catalog dataset (by name: its location, format, delimiter, compression and
privacy unit are the operator's), standard input, or in personal mode a path; a public list is a
catalog public entry, standard input, or in personal mode a path.
"""

from __future__ import annotations

from typing import Any, overload

from dpcli.access import Source, gate
from dpcli.errors import UsageError


def data_source(argument: str, privacy_unit: str | None, input_format: str | None = None,
                delimiter: str | None = None) -> Source:
    """The data input ``argument``, resolved, with its privacy unit settled.

    A catalog dataset's privacy unit, format and delimiter are the operator's: in service mode the
    options are refused (naming a unit would tell whether a guess is the unit column), in personal
    mode they must agree with the entry. A path needs ``--privacy-unit``.
    """
    source = gate().dataset(argument)
    if source.entry is None:
        if not privacy_unit:
            raise UsageError("--privacy-unit is required: the column that identifies a person")
        return Source(source.name, source.location, input_format, delimiter, None, privacy_unit)
    refuse_owned(source)
    given = {"--privacy-unit": (privacy_unit, source.privacy_unit), "--input-format": (input_format, source.format),
             "--delimiter": (delimiter, source.delimiter)}
    for flag, (option, declared) in given.items():
        if option is None:
            continue
        if gate().service:
            raise UsageError(f"{flag}: dataset {source.name!r} is read as the operator declared it; drop {flag}")
        if declared is not None and option != declared:
            raise UsageError(f"{flag} {option!r} differs from what the catalog declares for {source.name!r}")
    return Source(source.name, source.location, source.format or input_format, source.delimiter or delimiter,
                  source.compression, source.privacy_unit, source.entry)


def refuse_owned(source: Source) -> None:
    """A catalog dataset owned through another's key (``owned_by``) has no unit of its own: only ``dpcli sql``
    resolves its rows' owners, and any other command would take each record for a person."""
    if source.entry is not None and "owned_by" in source.entry:
        raise UsageError(f"dataset {source.name!r} is owned through another dataset's key (owned_by): only dpcli sql "
                         "reads it")


@overload
def public_source(argument: str, option: str) -> Source: ...
@overload
def public_source(argument: str | None, option: str) -> Source | None: ...
def public_source(argument: str | None, option: str) -> Source | None:
    """A public file named by ``option`` (``--keys``, a spec's block list), resolved; None when absent."""
    return None if argument is None else gate().public(argument, option)


def block_list_source(spec: Any) -> Source | None:
    """A tabulation spec's ``geography.blocks``: a catalog public name (always, in service mode), else a
    path next to the spec; None when the spec names none."""
    g = gate()
    if spec.blocks is None:
        return None
    if g.service or (g.catalog is not None and g.catalog.entry("public", spec.blocks) is not None):
        return g.public(spec.blocks, "geography.blocks")
    return Source(spec.blocks, str(spec.blocks_file), public=True)

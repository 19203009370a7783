"""The operator's locations opened safe from renames (service mode): catalog inputs and output directories.

A catalog location (a dataset, a public list) is opened as :func:`dpcli.access.catalog.seal_paths` stored it: no
component renamable or writable by anyone but root and the service account, no symlink anywhere on the path
(:func:`dpcli.access.walk.open_nofollow`), and the file opened owned and writable by them only (its ``fstat``). An
analyst's output directory is opened from ``/`` the same way and checked to be the directory pinned (device,
inode) when the catalog was sealed; what lies below it is then opened one name at a time without following
symlinks (:func:`dpcli.access.walk.open_dir_below`). A catalog sealed before paths were resolved is checked so
at every use, its locations resolved then. Each refusal is one line (exit 2). These are the gate's steps
(:class:`dpcli.access.Gate`); they hold no state of their own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from dpcli.access.walk import (
    SWAPPED,
    Escape,
    inside,
    open_dir_below,
    open_nofollow,
    trusted_uids,
    unsafe_component,
    unsafe_stat,
)
from dpcli.errors import UsageError

if TYPE_CHECKING:
    from dpcli.access.catalog import OutputEntry


def open_location(location: str, sealed: bool, flags: int, what: str, restricted: bool) -> int:
    """Open a catalog ``location`` (``sealed``: as ``catalog set`` resolved it; else resolved now) with ``flags``,
    checked as the module docstring says; ``what`` names it in the refusal, which gives an analyst
    (``restricted``) neither the path nor the component (they are private)."""
    if not sealed:
        location = os.path.realpath(location)  # (an older catalog: resolved now, checked the same way)
    trusted = trusted_uids()
    try:
        bad = unsafe_component(location, trusted)
    except FileNotFoundError:
        bad = None  # (reported by the open below, as a missing input)
    if bad is None:
        try:
            fd = open_nofollow(location, flags)
        except OSError as exc:
            if exc.errno not in SWAPPED:
                raise
            bad = (location, "a symlink, or below one")
        else:
            why = unsafe_stat(os.fstat(fd), trusted)
            if why is None:
                return fd
            os.close(fd)
            bad = (location, why)
    raise UsageError(unsafe_refusal(what, *bad, restricted=restricted))


def unsafe_refusal(what: str, component: str, why: str, restricted: bool) -> str:
    """The one line refusing an unsafe catalog path: to an analyst (``restricted``) without the path (it is
    private); to an operator the component, why it is unsafe and the fix."""
    if restricted:
        return (f"{what}: its catalog location is no longer safe from renames (a symlink, or a directory or file "
                "others can write, on its path); ask the operator")
    from dpcli.access.catalog import PATH_FIX

    return f"{what}: {component} is {why}: {PATH_FIX}"


def output_root(out: OutputEntry) -> str:
    """Where an output directory lies: as resolved at ``catalog set`` (older catalogs: as given)."""
    return out.get("resolved", out["directory"])


def outside_refusal(what: str) -> str:
    """The refusal of a path outside the analyst's output directories (or led out of them by a symlink)."""
    return f"{what}: in service mode you write only into your output directories (see: dpcli catalog show)"


def open_output_dir(outputs: Iterable[OutputEntry], directory: str, refusal: str) -> int:
    """``directory`` (resolved) opened from the one of ``outputs`` (the analyst's output directories) it lies in;
    the ``refusal`` (exit 2) if it lies in none, or no longer does."""
    for out in outputs:
        if inside(directory, output_root(out)):
            root = open_output_root(out)
            try:
                return open_dir_below(root, directory)
            except Escape:
                break
            finally:
                os.close(root)
    raise UsageError(refusal)


def open_output_root(out: OutputEntry) -> int:
    """The output directory ``out`` opened from ``/`` without following any symlink, and checked to be
    the directory pinned (device, inode) when the catalog was sealed, owned and writable by root and
    the service account only; else refused in one line (exit 2). (An older catalog without a pin: its
    directory resolved and every component checked, at each use.)"""
    root = output_root(out)
    if "resolved" not in out:
        root = os.path.realpath(root)
    trusted = trusted_uids()
    refusal = (f"output directory {out['directory']}: no longer the one the catalog was sealed with (renamed, "
               "replaced, or on a path others can write); ask the operator")
    try:
        if "pin" not in out and unsafe_component(root, trusted) is not None:
            raise UsageError(refusal)
        fd = open_nofollow(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    except OSError:
        raise UsageError(refusal) from None
    st = os.fstat(fd)
    if ("pin" in out and [st.st_dev, st.st_ino] != out["pin"]) or unsafe_stat(st, trusted) is not None:
        os.close(fd)
        raise UsageError(refusal)
    return fd

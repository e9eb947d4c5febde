"""``drafterkit assets fetch|list [NAME ...]``: ``list`` without names also shows everything else under
``$DRAFTERKIT_HOME`` (datastores, feature caches, vLLM's venv, ...) with its size, what removing it costs and the
command that removes it (:mod:`assets.home_usage`), and the folder's total."""

from __future__ import annotations

import argparse
import sys

from rich.table import Table

from drafterkit.assets import pinned as assets
from drafterkit.assets.console import make_console
from drafterkit.assets.home_usage import home_usage


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["fetch", "list"],
                   help="fetch: download, verify and convert; list: show the pinned assets and, without names, "
                        "everything under $DRAFTERKIT_HOME with its size and how to remove it")
    p.add_argument("names", nargs="*", help=f"assets to fetch or list (default: all): {assets.known_names()}")
    p.add_argument("--force", action="store_true", help="re-fetch even when a verified copy is cached")


def format_size(n: int) -> str:
    """Bytes as B / kB / MB / GB (decimal units), never ``0.0 MB`` for a small file."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _print(rows: list[dict]) -> None:
    t = Table(title=f"drafterkit assets in {assets.home()}")
    for c in ("name", "present", "size", "sha256", "path"):
        t.add_column(c, overflow="fold")
    for r in rows:
        size = format_size(r["size_bytes"]) if r["present"] else "-"
        ok = ("yes" if r["verified"] else "CORRUPT") if r["present"] else "no"
        digest = r["sha256"][:16] + "…" if r["sha256"] else "-"
        if r["sha256"] and r.get("sha256_of", r["name"]) != r["name"]:
            digest += f" (of {r['sha256_of']})"
        t.add_row(r["name"], ok, size, digest, r["path"])
    make_console(min_width=120).print(t)


def _print_usage(rows: list[dict]) -> None:
    """Everything under ``$DRAFTERKIT_HOME`` (:func:`assets.home_usage.home_usage`): one row per entry, then the
    total and how to remove an entry."""
    console = make_console(min_width=120)
    t = Table(title=f"everything under {assets.home()} ($DRAFTERKIT_HOME)")
    for c in ("entry", "size", "files", "what", "removed, the next command that needs it"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(r["name"], format_size(r["size_bytes"]), str(r["files"]), r["what"],
                  r["after_removal"] or "-: look inside before removing it")
    console.print(t)
    total = sum(r["size_bytes"] for r in rows)
    print(f"total: {format_size(total)} in {assets.home()}")
    if rows:
        print("remove an entry (each is rebuilt when needed, as the table says):")
        for r in rows:
            print(f"  {r['remove']}    # {format_size(r['size_bytes'])}")


def run(args: argparse.Namespace) -> int:
    """0 on success, 2 on an unknown asset name, 1 when a fetch fails (message on stderr)."""
    try:
        assets.check_names(args.names)
    except assets.AssetError as exc:
        print(f"drafterkit assets: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "fetch":
            assets.fetch_all(args.names or None, force=args.force)
        _print(assets.list_assets(args.names or None))
        if args.action == "list" and not args.names:
            _print_usage(home_usage())
    except assets.AssetError as exc:
        print(f"drafterkit assets: error: {exc}", file=sys.stderr)
        return 1
    return 0

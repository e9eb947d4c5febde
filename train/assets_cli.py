"""``drafterkit assets fetch|list [NAME ...]``."""

from __future__ import annotations

import argparse
import sys

from rich.table import Table

from drafterkit.assets import pinned as assets
from drafterkit.assets.console import make_console


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["fetch", "list"],
                   help="fetch: download, verify and convert; list: show the cache")
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
    except assets.AssetError as exc:
        print(f"drafterkit assets: error: {exc}", file=sys.stderr)
        return 1
    return 0

"""``drafterkit assets fetch|list``."""

from __future__ import annotations

import argparse
import sys

from decode import assets


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["fetch", "list"], help="fetch: download, verify and convert; list: show the cache")
    p.add_argument("names", nargs="*", help=f"assets to fetch (default: all): {sorted(assets.ASSETS)}")
    p.add_argument("--force", action="store_true", help="re-fetch even when a verified copy is cached")


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"drafterkit assets in {assets.home()}")
    for c in ("name", "present", "size", "sha256", "path"):
        t.add_column(c, overflow="fold")
    for r in rows:
        size = f"{r['size_bytes'] / 1e6:.1f} MB" if r["present"] else "-"
        ok = ("yes" if r["verified"] else "CORRUPT") if r["present"] else "no"
        t.add_row(r["name"], ok, size, r["sha256"][:16] + "…" if r["sha256"] else "-", r["path"])
    Console().print(t)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "fetch":
            bad = [n for n in args.names if n not in assets.ASSETS]
            if bad:
                print(f"unknown asset(s) {bad}; known: {sorted(assets.ASSETS)}", file=sys.stderr)
                return 2
            assets.fetch_all(args.names or None, force=args.force)
        _print(assets.list_assets())
    except assets.AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0

"""``python -m streamlab.book.doc_tables PAGE.md ...``: the tables in the docs, rendered from their declarations.

docs/limits.md shows every limit of the server, the proxy and the platform;
docs/server.md every route and each route's fields. Each table stands
between two markers naming what it holds, and is made here from the very
declarations the programs run on, which this module imports and passes to
``streamlab.net.settings.refresh`` (the ground layer renders what it is
given; it does not look the layers above it up by name). The tests fail when
a page is stale; this command writes it again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from streamlab.hops import function_platform, proxy
from streamlab.net.settings import Blocks, markdown_table, rewrite_pages
from streamlab.net.settings import refresh as refresh_with
from streamlab.server import api_docs, config

BLOCKS: Blocks = {
    ("settings", "streamlab.server.config"): lambda: markdown_table(*config.SETTINGS),
    ("settings", "streamlab.hops.proxy"): lambda: markdown_table(*proxy.SETTINGS),
    ("settings", "streamlab.hops.function_platform"): lambda: markdown_table(*function_platform.SETTINGS),
    ("routes", "streamlab.server.api_docs"): api_docs.routes_markdown,
    ("fields", "streamlab.server.api_docs"): api_docs.fields_markdown,
}
REGENERATE = ".venv/bin/python -m streamlab.book.doc_tables"


def refresh(page: str) -> str:
    """``page`` with every table it holds rendered afresh."""
    return refresh_with(page, BLOCKS)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the pages' tables (``--check``: write nothing, exit 1 when one is stale)."""
    p = argparse.ArgumentParser(prog="python -m streamlab.book.doc_tables", description=main.__doc__)
    p.add_argument("pages", nargs="+", type=Path, metavar="PAGE")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = p.parse_args(argv)
    try:
        stale = rewrite_pages(args.pages, BLOCKS, check=args.check)
    except ValueError as err:
        p.error(str(err))
    for page in stale:
        print(f"{page}: {'stale' if args.check else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""The argparse preamble every command-line tool of this repository shares.

A tool's module docstring is its manual: the first line is the description, and the examples
(the docstring from "Examples:" on, or the tool's own EXAMPLES text) are printed verbatim after
the options by --help.
"""

from __future__ import annotations

import argparse


def parser(doc: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser described by DOC's first line, with EPILOG (default: DOC from
    "Examples:" on) kept as written."""
    if epilog is None:
        epilog = "Examples:\n" + doc.split("Examples:\n", 1)[1]
    return argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

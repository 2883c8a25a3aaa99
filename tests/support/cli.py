"""The argparse front of the test-side tools (`python -m support.<tool> --help` shows examples)."""

from __future__ import annotations

import argparse


def parser(doc: str, examples: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A parser whose description is the module docstring's first line and whose epilog is the
    tool's examples, laid out as written."""
    return argparse.ArgumentParser(
        prog=prog,
        description=doc.splitlines()[0],
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

"""The ``fdbqueue`` command: ``main`` (the console script) and its parser. It only calls the
public API; no logic lives only here."""

from fdbqueue.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]

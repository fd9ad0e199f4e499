"""``python -m fdbqueue``: the command line."""

from fdbqueue.cli import main

raise SystemExit(main())

"""What the tests share that is not a fixture (fixtures live in tests/conftest.py).

engines: the engine matrix's URLs and the fdb engine's cluster; fdb_cluster: finding a real
FoundationDB cluster; fdbdouble/: the C-API double the bindings run over without one; faults:
scripted commit outcomes; processes: real OS processes, SIGKILLed; storm_children: the SIGKILL
storm's processes; cli_handlers, cli_broken_handler: handlers named by ``--handler``;
pool_handlers: handlers run in a worker's child processes (``processes=N``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: fdbqueue/, tests/, scripts/, docs/

"""The sim engine's injected commit outcomes: which codes FoundationDB could give a commit.

:class:`~fdbqueue.engines.sim.database.SimDatabase` asks its ``fault_source`` for one outcome per
commit with writes; :mod:`fdbqueue.testing` scripts them, the seeded source draws them.
"""

from __future__ import annotations

from typing import NamedTuple


class CommitInfo(NamedTuple):
    """What decides which faults FoundationDB could give a commit with writes."""

    reads: bool  # read conflict ranges of its own (not the self-conflicting one)
    read_version: bool  # took a read version before commit (else one is taken at commit)


class Fault(NamedTuple):
    """An injected commit outcome: ``code``, and for the maybe-committed ones whether it landed
    (``later``: not yet, but at the start of the next commit with writes on the database)."""

    code: int
    applied: bool = False
    later: bool = False


# Commit outcomes the sim injects. Maybe committed: 1021 and 1039 (fdb_error_predicate
# MAYBE_COMMITTED, bindings/c/fdb_c.cpp), 1031 when the timeout fires during commit (the
# commit may still land: RYWImpl::simulateTimeoutInFlightCommit, fdbclient/ReadYourWrites.cpp),
# 1025 when cancel() comes during commit.
MAYBE_COMMITTED_FAULTS = frozenset({1021, 1039, 1031, 1025})
# Of those, the ones whose commit may still be in flight when the error is raised, and land
# after it. A 1021 is raised only once a dummy commit on the self-conflicting range has
# passed the resolver (commitDummyTransaction in tryCommit, fdbclient/NativeAPI.actor.cpp).
LANDS_LATER_FAULTS = frozenset({1031, 1025})
NOT_COMMITTED_FAULTS = frozenset({1020, 1007})


def fault_possible(code: int, commit: CommitInfo) -> bool:
    """Whether FoundationDB could end ``commit`` with ``code``.

    1020: only with read conflict ranges of its own (the self-conflicting range's key is
    unique: nobody writes it). 1007: only with a read version taken before the commit (one
    taken at commit cannot be too old). The maybe-committed codes: any commit with writes.
    """
    if code == 1020:
        return commit.reads
    if code == 1007:
        return commit.read_version
    return code in MAYBE_COMMITTED_FAULTS

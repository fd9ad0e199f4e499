"""The one writer of message state: every move of a message between its places.

A message is ready ``("r", -priority, index, rand)``, leased ``("f", id)`` with a lease
entry ``("l", deadline, id)``, delayed ``("d", due, id)``, or gone; an id entry finds it away
from home, a TTL entry ``("x", expires, id)`` finds it when it expires, its payload may be
in chunks ``("b", id, n)`` (``layout.py`` has the keys). Every write or clear of those keys,
and of the counters that count them, is made in this package and nowhere else; and after each
move, in the same transaction, what must follow it: the counters, the wake key, the journal, the
work index (``workindex``). That is how FoundationDB's record layer keeps its secondary
indexes: an index maintainer's ``update(old, new)`` runs inside the transaction that
changes the record (FoundationDB Record Layer, "IndexMaintainer"), so no index is ever out
of step with its records.

The modules above decide where a message goes (delivery policies, sweeps, dequeues); they
call the functions here to move it. Every function composes inside the caller's
transaction. The package's modules, each importing only those before it:

- ``core``: what every move shares (``Note``, ``after``, ``remove_message``, the counters
  written as read, chunks copied between queues) and the marks a lease leaves on a record;
- ``places``: a message made ready, delayed, dead-lettered, moved aside as damaged, expired;
- ``leases``: a message put in flight and taken out of it, renewed, counted a batch at once;
- ``arrivals``: new messages written, and their counters;
- ``departures``: a message taken by a dequeue, handed to a staged dequeue's result, or sent
  to another database;
- ``manager``: the queue manager's moves: destroy, purge, delete by id, move and redrive
  between queues.

This package's face names nothing: importers name the module that defines what they use
(tests/architecture/test_surface.py), and tests/architecture/test_one_writer.py holds every
module under ``fdbqueue.ops.moves`` as the one writer.
"""

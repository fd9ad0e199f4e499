"""The journal: one entry per operation on a journaled queue, in commit order.

A queue manager keeps a journal of what happened to every message, for audit and for finding
lost messages (Bernstein & Newcomer, "Principles of Transaction Processing", the queue
manager). Each entry is written in the operation's own transaction, under a versionstamped
key: FoundationDB fills in the commit's version at commit, so entries sort in commit order,
no two transactions' entries conflict, and an aborted operation leaves none (its writes are
never applied). A retry after commit_unknown_result (1021) does not write a second entry:
the layer's receipts make a retried call find its first attempt's commit and write nothing
(``receipts.py``).

Keys (``layout.JournalKeys``): a queue's entries are spread over ``JOURNAL_SHARDS`` ranges by
message id, so that one busy queue's journal is not a single hot range of the cluster (a
storage server serves a contiguous range: FoundationDB's "Developer Guide", hot keys); each
entry also has a pointer under the message id, so that :func:`history` reads one message's
entries without scanning the journal. Reading merges the shards (and the queues) by version.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from fdbqueue.engines.contract import BELL_TEMPLATE, Database, Transaction, Watch, adopt, is_transaction
from fdbqueue.errors import NotJournaledError, QueueError, QueueNotFoundError
from fdbqueue.ops.privileges import check, readable
from fdbqueue.ops.steps import Emit, Run, Steps, Wait, iterate
from fdbqueue.ops.txn import as_database, run_once
from fdbqueue.store.budget import Budget
from fdbqueue.store.clock import now_us
from fdbqueue.store.config import read_config
from fdbqueue.store.guard import acting_for
from fdbqueue.store.layout import DEFAULT_ROOT, JournalKeys, QueueKeys
from fdbqueue.types import JournalEntry

OPS = frozenset(
    [
        "enqueue",
        "dequeue",
        "lease",
        "ack",
        "nack",
        "lease_expired",
        "dead",
        "expired",
        "promote",
        "release",
        "delete",
        "purge",
        "move_out",
        "move_in",
        "forward_out",
        "forward_in",
        "redrive",
        "create",
        "config",
        "state",
        "destroy",
        "grant",
        "revoke",
    ]
)
# A message's arrival in a queue: its history pointer goes under ("h", ...) where many writers
# share a cluster; on an engine of one writer at a time into its queue right after the ready
# range's tail ("ra", inverted id: newest first). Every other operation's pointer goes, on such
# an engine, into its queue beside the ready range's head (_append).
ARRIVALS = frozenset(["enqueue", "move_in", "forward_in", "redrive"])
PAGE = 500  # entries per shard per read of a page: well inside a transaction's budget
# journal(db, None) reads the queues' journals in transactions of at most this many queues
# (JOURNAL_SHARDS range reads each, with the queue's guard and settings): about 200 reads,
# well inside the 5-second window at a cluster's millisecond a read; fewer when the entries
# read reach the scan's share (budget.py SCAN_READ_BYTES, SCAN_SECONDS).
QUEUES_PER_TRANSACTION = 16
# A follower of every queue watches at most this many bells (and the registry's); the bells of
# the other queues are read, in transactions of BELLS_PER_TRANSACTION, every POLL_SECONDS.
# FoundationDB allows 10,000 watches a database by default (too_many_watches, 1032, beyond:
# the database option ``max_watches``, fdbclient/vexillographer/fdb.options).
FOLLOW_WATCHES = 64
BELLS_PER_TRANSACTION = 2_000
POLL_SECONDS = 1.0
_FORMAT = 1


def record(
    tr: Transaction,
    keys: QueueKeys,
    op: str,
    message_id: str | None = None,
    *,
    deliveries: int = 0,
    reason: str | None = None,
    details: Mapping[str, Any] | None = None,
    at_us: int | None = None,
) -> None:
    """Write one journal entry for ``op`` on queue ``keys.name`` in ``tr``; the caller checks
    that the queue is journaled. Composes inside ``tr``: the entry commits or aborts with it.
    ``at_us``: the writer's wall clock when the caller read it already (an enqueue's)."""
    if op not in OPS:
        raise QueueError(f"unknown journal operation {op!r}")
    if at_us is None:
        at_us = now_us()
    principal = acting_for(tr.db)
    if reason is None and not details and deliveries.__class__ is int:
        # encode_entry's common case (a move's entry: no reason, no details), formatted here
        mid = "null" if message_id is None else _quote(message_id)
        value = f'[{_FORMAT},"{op}",{mid},{_quote(principal)},{deliveries},null,{{}},{at_us}]'.encode()
    else:
        value = encode_entry(op, message_id, principal, deliveries, reason, details, at_us)
    _append(tr, keys, message_id, value, op not in ARRIVALS)


def record_short(tr: Transaction, keys: QueueKeys, op: str, message_id: str, deliveries: int) -> None:
    """``record(tr, keys, op, message_id, deliveries=deliveries)`` for a consuming operation
    (``op`` one of OPS, not an arrival) with no reason and no details: the common lease's and
    ack's entry (``leasing.lease_short``, ``delivery.ack_short``), the same rows and bytes.
    The caller checks that the queue is journaled; composes inside ``tr``."""
    who = _quote(acting_for(tr.db))
    value = f'[{_FORMAT},"{op}",{_quote(message_id)},{who},{int(deliveries)},null,{{}},{now_us()}]'.encode()
    _append(tr, keys, message_id, value, True)


def record_enqueue(tr: Transaction, keys: QueueKeys, message_id: str, priority: int, at_us: int) -> None:
    """``record(tr, keys, "enqueue", message_id, details={"priority": priority} if priority
    else None, at_us=at_us)``: a new message's entry, the same rows and bytes, without what
    :func:`record` decides for every operation (which one, whose clock, a reason, details of
    any shape). The caller checks that the queue is journaled."""
    who = _quote(acting_for(tr.db))
    more = f'{{"priority":{int(priority)}}}' if priority else "{}"  # _ENCODER's bytes for it
    value = f'[{_FORMAT},"enqueue",{_quote(message_id)},{who},0,null,{more},{at_us}]'.encode()
    _append(tr, keys, message_id, value, False)


def _append(tr: Transaction, keys: QueueKeys, message_id: str | None, value: bytes, local: bool) -> None:
    """Write the entry ``value`` (about ``message_id``, None for the queue itself) under the
    next order of ``tr``'s attempt, with its history pointer, and the queue's bell once per
    queue and transaction: the rows of :func:`record` and :func:`record_enqueue` alike, in one
    call of the engine (``Transaction.set_journal_entry``). ``local``: not an arrival (the
    pointer may go into the queue's own keys, :func:`history` reads both places)."""
    # _next_order, inline: the attempt's own count (tr.journal_order(): on_error and reset
    # start it afresh), and whether this is its first entry in the queue.
    state = tr.journal_order()
    order = state.entries
    if order > 0xFFFF:
        raise QueueError("one transaction can journal at most 65536 operations")
    state.entries = order + 1
    jk = keys.journal_keys()
    name = keys.name
    # Spread over shards where many writers share a cluster (engine_traits' first); in the
    # queue's own keys on an engine of one writer at a time, where appending beside what the
    # commit writes anyway dirties the fewest pages (JournalKeys.queue_entry_prefix).
    spread = getattr(tr.db, "may_conflict", True)
    # The queue's bell, which followers watch, takes the commit's stamp: a blind write, never
    # a conflict, and no read (an atomic add would cost the embedded engine one); once per
    # queue and transaction. In the queue's keys where its entries are (JournalKeys.queue_bell).
    queues = state.queues
    if name in queues:
        bell = None
    else:
        queues.add(name)
        bell = jk.bell(name) if spread else jk.queue_bell(keys)
    if message_id is None:
        entry = jk.entry_prefix(name, jk.shard(None)) if spread else jk.queue_entry_prefix(keys)
        tr.set_journal_entry(order, entry, value, None, b"", bell)
    else:
        # The entry, and a pointer: history() finds the entry by the same stamp. At sync=full
        # a commit's cost is its pages (each written to the WAL and synced): a pointer under
        # ("h", ...) for a consumed message lands beside its enqueue's, a leaf of its own
        # (often a full one, split), where one in the queue's own keys shares the leaf of the
        # counters and the ready head the commit writes anyway (JournalKeys.queue_prefixes).
        # An arrival's, where one writer appends, right after the ready range's tail
        # (JournalKeys.arrival_prefixes): the leaf the enqueue's record dirties anyway.
        if spread:
            entry, pointer, pointer_value = jk.prefixes(name, message_id, True)
        elif local:
            entry, pointer, pointer_value = jk.queue_prefixes(keys, message_id)
        else:
            entry, pointer, pointer_value = jk.arrival_prefixes(keys, message_id)
        tr.set_journal_entry(order, entry, value, pointer, pointer_value, bell)


def encode_entry(
    op: str,
    message_id: str | None,
    principal: str,
    deliveries: int,
    reason: str | None,
    details: Mapping[str, Any] | None,
    at_us: int,
) -> bytes:
    """An entry's value: exactly ``json.dumps([_FORMAT, op, message_id, principal, deliveries,
    reason, details, at_us], separators=(",", ":"))``, built by formatting with the json
    module's own C string quoting (``json.dumps`` with separators makes a JSONEncoder each
    call); a non-empty ``details`` goes through one shared encoder. ``op`` is one of OPS."""
    mid = "null" if message_id is None else _quote(message_id)
    why = "null" if reason is None else _quote(reason)
    more = _ENCODER.encode(dict(details)) if details else "{}"
    return f'[{_FORMAT},"{op}",{mid},{_quote(principal)},{int(deliveries)},{why},{more},{at_us}]'.encode()


_quote = json.encoder.encode_basestring_ascii  # json.dumps' own quoting (ensure_ascii)
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def register(tr: Transaction, keys: QueueKeys) -> None:
    """Note ``keys``' queue among the journaled ones (``journal(tr, None)`` reads them all);
    called when a queue's journal is turned on. Idempotent, a blind write."""
    jk = JournalKeys.of(keys.root)
    tr.set(jk.registry(keys.name), b"")
    tr.set_versionstamped_value(jk.bell(None), BELL_TEMPLATE)  # wakes journal(None, follow=True)


def decode_entry(queue: str, version: bytes, raw: bytes) -> JournalEntry:
    """The journal entry stored as ``raw`` in ``queue``'s journal at ``version``."""
    return _decode(queue, version, raw)


def _decode(queue: str, version: bytes, raw: bytes) -> JournalEntry:
    fmt, op, mid, principal, deliveries, reason, details, at_us = json.loads(raw)
    if fmt != _FORMAT:
        raise QueueError(f"journal entry of an unknown format {fmt!r}")
    return JournalEntry(version, at_us / 1e6, op, queue, mid, principal, deliveries, reason, details)


def check_version(since: bytes | str | None) -> bytes | None:
    """A journal version given as 12 bytes or 24 hex digits, as bytes (None stays None)."""
    return _check_version(since)


def _check_version(since: bytes | str | None) -> bytes | None:
    if since is None:
        return None
    if isinstance(since, str):
        try:
            since = bytes.fromhex(since)
        except ValueError:
            raise QueueError(
                f"since must be a journal version (12 bytes, or 24 hex digits), got {since!r}"
            ) from None
    if not isinstance(since, bytes) or len(since) != 12:
        raise QueueError(f"since must be a journal version (12 bytes, or 24 hex digits), got {since!r}")
    return since


def journaled_queues(tr: Transaction | Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[str]:
    """The queues of this database that have journal entries (or had: until trimmed away)."""
    jk = JournalKeys.make(root)
    return run_once(
        adopt(tr), lambda t, _: [jk.registry_name(kv.key) for kv in t.get_range(*jk.registry_range())]
    )


def _page(
    t: Transaction, jk: JournalKeys, queues: list[str], since: bytes | None, want: int
) -> list[JournalEntry]:
    """Up to ``want`` entries after ``since`` in commit order, merged over queues and shards."""
    streams: list[list[JournalEntry]] = []
    bound: bytes | None = None  # entries past the smallest last version of a full stream may be missing
    shards = jk.shards(not getattr(t.db, "may_conflict", True))
    for q in queues:
        for shard in shards:
            begin, end = jk.entry_range(q, shard, since)
            kvs = t.get_range(begin, end, want)
            got = [_decode(q, jk.entry_version(kv.key), kv.value) for kv in kvs]
            if len(kvs) == want and got and (bound is None or got[-1].version < bound):
                bound = got[-1].version
            streams.append(got)
    merged = heapq.merge(*streams, key=lambda e: e.version)
    out = [e for e in merged if bound is None or e.version <= bound]
    return out[:want]


def journal(
    tr: Transaction | Database,
    queue: str | None,
    *,
    since: bytes | str | None = None,
    limit: int | None = None,
    follow: bool = False,
    timeout: float | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> Iterator[JournalEntry]:
    """The journal of ``queue`` (None: every journaled queue, merged) in commit order, after
    ``since`` (exclusive), at most ``limit`` entries.

    Given a transaction, read in it; given a Database, read in pages, each its own
    transaction. With ``follow=True`` (a Database only) it then waits on a watch for new
    entries and yields them as they commit, until ``timeout`` seconds pass without one
    (None: for ever); no polling.
    """
    tr = adopt(tr)
    if follow and is_transaction(tr):
        raise QueueError("journal(follow=True) takes a Database: it waits between transactions")
    return iterate(_entries(tr, root, queue, _checked(queue, since, limit, root), limit, follow, timeout))


def journal_steps(
    db: Database,
    queue: str | None,
    *,
    since: bytes | str | None = None,
    limit: int | None = None,
    follow: bool = False,
    timeout: float | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> Steps[None]:
    """:func:`journal` of a Database as steps (``fdbqueue.ops.steps``) emitting its entries: what
    the blocking iterator and ``fdbqueue.aio.journal`` both run."""
    return _entries(as_database(db), root, queue, _checked(queue, since, limit, root), limit, follow, timeout)


def _checked(
    queue: str | None, since: bytes | str | None, limit: int | None, root: tuple[Any, ...]
) -> bytes | None:
    """The arguments of :func:`journal` checked; ``since`` as bytes."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if queue is not None:
        QueueKeys.make(queue, root)  # validates the name
    return _check_version(since)


def _queues(t: Transaction, jk: JournalKeys, root: tuple[Any, ...], queue: str | None) -> list[str]:
    """``[queue]`` if ``t``'s principal may browse it (else AccessDeniedError) and it keeps or
    kept a journal (else NotJournaledError, or QueueNotFoundError when there is no such queue):
    a mistyped or unjournaled name is not an empty journal. For None every journaled queue it
    may browse."""
    if queue is not None:
        keys = QueueKeys.make(queue, root)
        check(t, keys, "browse")
        # The registry names every queue whose journal was ever turned on, destroyed ones
        # whose entries remain included: one point read settles the usual case.
        if t.get(jk.registry(queue)) is None:
            cfg = read_config(t, keys)
            if cfg is None:
                raise QueueNotFoundError(f"no queue named {queue!r}")
            if not cfg.journal:
                raise NotJournaledError(
                    f"queue {queue!r} keeps no journal: turn it on with "
                    f"create_queue(db, {queue!r}, journal=True) (fdbqueue create {queue} --journal)"
                )
        return [queue]
    names = [jk.registry_name(kv.key) for kv in t.get_range(*jk.registry_range())]
    return [q for q in names if readable(t, QueueKeys.make(q, root))]


def _entries(
    tr: Transaction | Database,
    root: tuple[Any, ...],
    queue: str | None,
    since: bytes | None,
    limit: int | None,
    follow: bool,
    timeout: float | None,
) -> Steps[None]:
    jk = JournalKeys.make(root)
    left = limit
    # Every queue, given a Database: transactions of a few queues each (_page_spread), and a
    # bounded set of watches (_arm_spread), whatever the number of journaled queues.
    spread = queue is None and not is_transaction(tr)
    names: list[str] = []
    while True:
        while left is None or left > 0:
            want = PAGE if left is None else min(PAGE, left)
            if spread:
                got, names, seen = yield from _page_spread(as_database(tr), jk, root, since, want)
            else:

                def page(
                    t: Transaction, _: bool, cursor: bytes | None = since, want: int = want
                ) -> list[JournalEntry]:
                    return _page(t, jk, _queues(t, jk, root, queue), cursor, want)

                got = yield Run(partial(run_once, tr, page))
            for e in got:
                yield Emit(e)
            if got:
                since = got[-1].version
                if left is not None:
                    left -= len(got)
            if len(got) < want:
                if spread and (since is None or seen > since):
                    since = seen  # every entry up to it was read: the bells compare with it
                break
        if not follow or (left is not None and left <= 0):
            return
        if not spread:
            # A watch on the journal's bell until an entry after ``since`` may exist (the check
            # and the watch are one transaction: no entry slips between them).
            watches, ready = yield Run(partial(arm_more, as_database(tr), jk, root, queue, since))
            try:
                if not ready and not (yield Wait(watches, timeout)):
                    return
            finally:
                for w in watches:
                    w.cancel()
            continue
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            watches, ready = yield Run(partial(_arm_spread, as_database(tr), jk, names, since))
            try:
                if ready:
                    break
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                polled = len(names) > FOLLOW_WATCHES
                if polled:
                    wait = POLL_SECONDS if wait is None else min(wait, POLL_SECONDS)
                if (yield Wait(watches, wait)):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return
            finally:
                for w in watches:
                    w.cancel()


def _page_spread(
    db: Database, jk: JournalKeys, root: tuple[Any, ...], since: bytes | None, want: int
) -> Steps[tuple[list[JournalEntry], list[str], bytes]]:
    """:func:`_page` over every journaled queue the principal may browse, in transactions of
    at most QUEUES_PER_TRANSACTION queues (a cursor over the registry). Also returns the
    queues read and the version up to which every entry was seen.

    Each transaction reads at its own read version: an entry committed after the first one's
    may be missing from the queues read before it, so the page keeps only entries up to the
    smallest read version (all of them are seen by every later read); the rest come next page.
    """
    kept: list[JournalEntry] = []
    bound: bytes | None = None  # past the smallest last entry of a full stream, some may be missing
    oldest: int | None = None
    names: list[str] = []
    after: bytes | None = None
    while True:

        def chunk(
            t: Transaction, _: bool, after: bytes | None = after
        ) -> tuple[list[tuple[list[JournalEntry], bool]], list[str], bytes | None, int]:
            begin, end = jk.registry_range()
            rows = t.snapshot.get_range(begin if after is None else after, end, QUEUES_PER_TRANSACTION)
            budget = Budget()
            streams: list[tuple[list[JournalEntry], bool]] = []
            readable_here: list[str] = []
            nxt: bytes | None = None
            for i, kv in enumerate(rows):
                q = jk.registry_name(kv.key)
                if readable(t, QueueKeys.make(q, root)):
                    readable_here.append(q)
                    for shard in jk.shards(not getattr(t.db, "may_conflict", True)):
                        kvs = t.get_range(*jk.entry_range(q, shard, since), want)
                        budget.read(kvs)
                        got = [_decode(q, jk.entry_version(k.key), k.value) for k in kvs]
                        streams.append((got, len(kvs) == want))
                if budget.scan_exhausted() and i + 1 < len(rows):
                    nxt = rows[i + 1].key  # the rest of this chunk in the next transaction
                    break
            else:
                if len(rows) == QUEUES_PER_TRANSACTION:
                    nxt = rows[-1].key + b"\x00"
            return streams, readable_here, nxt, int(t.get_read_version())

        streams, found, after, rv = yield Run(partial(run_once, db, chunk))
        names.extend(found)
        oldest = rv if oldest is None else min(oldest, rv)
        for got, full in streams:
            if full and got and (bound is None or got[-1].version < bound):
                bound = got[-1].version
        merged = heapq.merge(kept, *(got for got, _ in streams), key=lambda e: e.version)
        kept = [e for e in merged if bound is None or e.version <= bound][:want]
        if after is None:
            break
    seen = oldest.to_bytes(8, "big") + b"\xff" * 4 if oldest is not None else b""
    return [e for e in kept if e.version <= seen], names, seen


def _arm_spread(
    db: Database, jk: JournalKeys, names: list[str], since: bytes | None
) -> tuple[list[Watch], bool]:
    """Watches on the registry's bell and on the bells of at most FOLLOW_WATCHES of ``names``,
    and whether any of ``names`` has an entry after ``since``: its bell (the stamp of the last
    commit that journaled in it, :func:`record`) is past it. The watched bells are read in the
    watches' transaction (none slips between); the others in further transactions, which a
    follower repeats every POLL_SECONDS."""
    watched = names[:FOLLOW_WATCHES]

    def newer(values: list[bytes | None]) -> bool:
        return any(v is not None and (since is None or v[:10] > since[:10]) for v in values)

    local = not getattr(db, "may_conflict", True)

    def arm(t: Transaction, _: bool) -> tuple[list[Watch], bool]:
        bells = [jk.bell(None), *_bells(jk, watched, local)]
        values = t.snapshot.get_many(bells)
        return [t.watch(b) for b in bells], newer(values[1:])

    watches, ready = run_once(db, arm)
    rest = names[FOLLOW_WATCHES:]
    for i in range(0, len(rest), BELLS_PER_TRANSACTION):
        if ready:
            break
        part = _bells(jk, rest[i : i + BELLS_PER_TRANSACTION], local)
        ready = run_once(db, lambda t, _, part=part: newer(t.snapshot.get_many(part)))  # type: ignore[misc]
    return watches, ready


def arm_more(
    db: Database, jk: JournalKeys, root: tuple[Any, ...], queue: str | None, since: bytes | None
) -> tuple[list[Watch], bool]:
    """Watches on the journal's bells, and whether an entry after ``since`` is there already:
    one transaction, so none slips between the check and the watches (``fdbqueue.aio`` awaits
    them)."""

    def arm(t: Transaction, _: bool) -> tuple[list[Watch], bool]:
        queues = _queues(t, jk, root, queue)
        bells = _bells(jk, queues, not getattr(t.db, "may_conflict", True))
        bells += [jk.bell(None)] if queue is None else []
        return [t.watch(b) for b in bells], bool(_page(t, jk, queues, since, 1))

    return run_once(db, arm)


def _bells(jk: JournalKeys, queues: list[str], local: bool) -> list[bytes]:
    """The bells of ``queues`` a follower watches: each one's ``("jn", queue)``, and where
    ``local`` (the embedded engine) the one in its own keys too, which its journaled commits
    ring since issue 30's ninth pass (``_append``)."""
    if not local:
        return [jk.bell(q) for q in queues]
    return [b for q in queues for b in (jk.bell(q), jk.queue_bell_of(q))]


def history(
    tr: Transaction | Database, message_id: str, *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> list[JournalEntry]:
    """Every journal entry of message ``message_id``, across the queues of this database it
    passed through, in commit order: one range read of its history pointers (on an engine of
    one writer at a time, also two in each journaled queue: an arrival's and a consuming
    operation's pointers live there, ``_append``)."""
    if not isinstance(message_id, str) or not message_id:
        raise QueueError(f"message_id must be a non-empty str, got {message_id!r}")
    jk = JournalKeys.make(root)

    def body(t: Transaction, _: bool) -> list[JournalEntry]:
        found = []
        for kv in t.get_range(*jk.history_range(message_id)):
            # queue name, NUL, the shard's byte
            found.append((kv.value[:-2].decode(), kv.value[-1], jk.history_version(kv.key)))
        if not getattr(t.db, "may_conflict", True):
            # Every journaled queue's (the registry keeps destroyed ones too): a queue the
            # message reached unjournaled has no pointer of its arrival under ("h", ...).
            for reg in t.get_range(*jk.registry_range()):
                q = jk.registry_name(reg.key)
                # its consuming operations' pointers (where issue 30's seventh pass put them
                # too), and its arrivals' since the eighth (those written before: under "h")
                for r in (
                    jk.queue_history_range(q, message_id),
                    jk.earlier_history_range(q, message_id),
                    jk.arrival_range(q, message_id),
                ):
                    for kv in t.get_range(*r):
                        found.append((q, kv.value[0], jk.history_version(kv.key)))  # the shard's byte
            found.sort(key=lambda f: f[2])  # commit order over both places
        mine = {q: readable(t, QueueKeys.make(q, root)) for q, _, _ in found}
        found = [f for f in found if mine[f[0]]]
        values = t.get_many([jk.entry_key(q, shard, v) for q, shard, v in found])
        return [_decode(q, v, raw) for (q, _, v), raw in zip(found, values, strict=True) if raw is not None]

    return run_once(adopt(tr), body)

"""The leased forwarder (``forwarding.py``): the source's messages leased, pending copies on the
destination, tombstones on the source (``ops/transit.py``, ``ops/pending.py``; their keys in
``store/layout.py``). Its steps, as the
:class:`Leased` part of ``Forwarder`` (on top of :class:`Outbox`, the exclusive path and what
both share): lease, install, remove, publish, and ``recover`` for what a crash or a stall left.
``forwarding.py``'s docstring walks through the steps; docs/forwarding.md has the reasoning."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.ops import transit
from fdbqueue.ops.delivery import ack_many_in
from fdbqueue.ops.enqueuing import enqueue_in
from fdbqueue.ops.moves.core import Note
from fdbqueue.ops.pending import (
    as_item,
    install,
    install_parts,
    pendings,
    plain_queue,
    publish_plain,
    read_pending,
    read_plain,
)
from fdbqueue.ops.privileges import check
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.remotededup import carry, layer_keys, there_named
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.outbox import Outbox
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.layout import QueueKeys, forward_marker, forward_marker_range
from fdbqueue.store.meta import Meta, read_meta
from fdbqueue.types import Item, Message


class Leased(Outbox):
    """The leased path of a ``Forwarder`` (``exclusive=False``). The attributes are the
    Forwarder's."""

    _dst_db: Database
    exclusive: bool
    name: str | None
    lease_seconds: float
    _resumed: bool
    _cursor: bytes | None
    _records: list[transit.Record_]
    _tokens: tuple[str, str] | None
    _room: int | None
    _hand: _Hand | None
    _published: list[transit.Entry]
    _recovered_at: float

    # -- before the first step: one store or two, tokens, room -------------------------------------

    def _prepare(self) -> None:
        """Refuse a queue forwarded into itself, whatever the handles or URLs name it: a probe
        written on the source is looked for on the destination (the same store and queue see
        it; a copy of the store made before does not). Learns the tokens and the room."""
        if self._tokens is not None:
            return
        tokens, self._room = transit.prepare(self._src_db, self.src.keys, self._dst_db, self.dst.keys)
        if tokens is None:
            raise QueueError(_ITSELF.format(self.src.name))
        self._tokens = tokens

    # -- the leased path: lease, install, remove, publish --------------------------------------

    def _lease(self, n: int) -> tuple[list[Message], transit.Record_ | None]:
        """Step 1; named: the batch recorded under the name in the leasing transaction."""
        if self.name is None:
            return self.src.lease_many(self.src_db, n, self.lease_seconds, where=self.where), None
        return run_once_confirmed(self.src_db, self.src.keys, lambda t: self._lease_in(t, n))

    def _lease_in(self, t: Transaction, n: int) -> tuple[list[Message], transit.Record_ | None]:
        """Step 1 in the source's transaction ``t``."""
        batch = self.src.lease_many(t, n, self.lease_seconds, where=self.where)
        if self.name is None or not batch:
            return batch, None
        dest = self._token_pair()[1]
        return batch, transit.record_hand(t, self.src.keys, dest, self.name, batch, db_now(t))

    def _take_over(self) -> _Hand | None:
        """A named forwarder's first steps: the oldest batch its namesakes left recorded, taken
        over (``transit.take_over``), as the batch in hand; None when none is left."""
        skeys, (_, dest), name = self.src.keys, self._token_pair(), str(self.name)

        def body(t: Transaction) -> transit.Handover | None:
            check(t, skeys, "dequeue", read_meta(t, skeys))
            return transit.take_over(t, skeys, dest, name, self.lease_seconds, db_now(t), self._cursor)

        got = run_once_confirmed(self.src_db, skeys, body)
        if got is None:
            return None
        self._cursor = got.key
        return _Hand(got.live, lost=list(got.dead), removed=got.removed, record=got.record)

    def _install(self, batch: list[Message]) -> int:
        """Step 2: one destination transaction writes the pending copies; returns how many (the
        exclusive path: installs the messages themselves, see ``_install_marked``)."""
        if self.exclusive:
            return self._install_marked(batch)[1]
        dkeys = self.dst.keys
        layer = layer_keys(self._src_db, self.src.keys, batch)  # dedup keys the source confirms
        big = run_once_confirmed(self.dst_db, dkeys, lambda t: self._install_in(t, batch, layer, None))
        return self._dead_letter(batch, big)

    def _install_in(
        self, t: Transaction, batch: list[Message], layer: Mapping[str, str], meta: Meta | None
    ) -> dict[str, str]:
        """Step 2 in the destination's transaction ``t`` (``meta``: its settings, when read
        already: the publication's transaction, which writes the batch's copies one key a
        batch, ``pending.install_parts``; else one a message); returns the messages too large
        for it, by id (their reasons)."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()
        write = install_parts
        if meta is None:
            meta = read_meta(t, dkeys)
            check(t, dkeys, "enqueue", meta)
            write = install
        big = transit.admissible(dkeys, meta, batch)  # too large for it: dead letters
        write(t, dkeys, source, [m for m in batch if m.id not in big] if big else batch, db_now(t), layer)
        return big

    def _dead_letter(self, batch: list[Message], big: dict[str, str]) -> int:
        if big:  # their leases end there: step 3 finds them gone (lost), with no copy to withdraw
            transit.dead_letter_leased(self._src_db, self.src.keys, batch, big)
        return len(batch) - len(big)

    def _remove(
        self, batch: list[Message], ahead: int = 0
    ) -> tuple[list[Message], list[Message], transit.Record_ | None]:
        """Step 3: one source transaction removes each message whose lease is still ours, with
        its tombstone and acknowledgement; returns those removed, by this call or an earlier
        one that failed without an answer (their tombstones say so). Clears the tombstones of
        the messages published since the last removal. ``ahead``: the same transaction leases
        up to that many more, the next batch (step 1 of it; named: recorded), returned with
        its record: a run's steady state is one source transaction a batch."""
        skeys, (_, dest) = self.src.keys, self._token_pair()
        note = Note("forward_out", None, {"to": self.dst.name})
        published, records = list(self._published), list(self._records)

        def body(t: Transaction) -> tuple[list[Message], list[Message], transit.Record_ | None]:
            # The next batch leased first, while this transaction has written nothing: its
            # range read of the ready set then finds no write of its own to merge, and the
            # embedded engine keeps its writes without a sorted index of them (WriteMap: built
            # at the first range read over writes, then kept up by every later write). The
            # same outcome in either order: the batch in hand is in flight, never among the
            # ready messages leased; one of it whose lease has expired is not acked (its
            # record released by this lease's sweep, or expired: either way lost), as when
            # the ack came first.
            nxt, hand = self._lease_in(t, ahead) if ahead else ([], None)
            now = db_now(t)
            if published:  # before this batch's: a batch is published after its removal
                transit.clear_tombs(t, skeys, dest, published)
            mine = transit.entries_of(batch)
            found = transit.read_tombs(t, skeys, dest, mine) if batch else set()
            earlier = {mid for mid, _ in found}
            rest = [m for m in batch if m.id not in earlier] if earlier else batch
            done = ack_many_in(skeys, t, rest, now, note) if rest else []
            whole = not earlier and len(done) == len(batch)  # the common case: all of it, now
            if done:  # one tombstone for the batch, not one a message
                transit.write_tombs(t, skeys, dest, mine if whole else transit.entries_of(done), found, now)
            self._acknowledge(t, done)
            for record in records:  # named: batches published, nothing left to take over
                transit.clear_record(t, record)
            if whole:
                return list(batch), nxt, hand
            removed = earlier | {m.id for m in done}
            return [m for m in batch if m.id in removed], nxt, hand

        out = run_once_confirmed(self.src_db, skeys, body)
        self._published = self._published[len(published) :]
        self._records = self._records[len(records) :]
        return out

    def _withdraw(self, entries: list[transit.Entry]) -> None:
        """Clear pending copies whose lease ended without a removal: never to be published."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()

        def body(t: Transaction, _: bool) -> None:
            found = read_pending(t, dkeys, source, entries, payloads=False)
            found.drop(t, dkeys, source, set(entries))

        run_once(self.dst_db, body)

    def _publish(
        self, entries: list[transit.Entry], ahead: _Hand | None = None
    ) -> tuple[int, list[transit.Entry]]:
        """Step 4: one destination transaction makes the pending copies of ``entries`` (removed
        from the source) messages, in order, as many as the queue's ``max_size`` has room for;
        returns how many it wrote, and the entries left waiting for room. A copy no longer
        there was published already (by ``recover``); one the destination holds already (an
        exclusive forwarder's marker, a RemoteQueue's enqueue that landed) is dropped.
        ``ahead``: the next batch, leased with this one's removal, installed (step 2) in the
        same transaction while the queue takes enqueues (else by a step of its own, which
        raises why not): a run's steady state is one destination transaction a batch."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()
        layer_ahead = {} if ahead is None else layer_keys(self._src_db, self.src.keys, ahead.batch)

        def install_ahead(t: Transaction, meta: Meta) -> dict[str, str] | None:
            """The next batch installed (step 2) while the queue takes enqueues, else None."""
            if ahead is None or not meta.state.enqueue:
                return None
            return self._install_in(t, ahead.batch, layer_ahead, meta)

        def body(t: Transaction) -> tuple[int, list[transit.Entry], int | None, dict[str, str] | None]:
            meta = read_meta(t, dkeys)
            check(t, dkeys, "enqueue", meta)
            plain, read = read_plain(t, dkeys, source, entries) if plain_queue(meta) else (None, None)
            marks = _marks(t, dkeys, self.origin, entries)
            room = transit.room_of(meta)
            if plain is not None and marks is None and (room is None or room >= len(entries)):
                # The common publication: a run's batch of plain copies, all there, none
                # installed already (no marker; a plain copy has no RemoteQueue key), room
                # for all: their records written as installed (pending.publish_plain). The
                # next batch installed first, while nothing is written: its read of its own
                # parts then meets no write of this transaction (no sorted index of the
                # publication's writes built for it, as in _remove); the two touch no key
                # in common (another lease's parts; no counter).
                big = install_ahead(t, meta)
                wrote = publish_plain(t, dkeys, meta, plain)
                return wrote, [], None if room is None else room - wrote, big
            now = db_now(t)
            pending = read_pending(t, dkeys, source, entries, read=read)
            recs = pending.copies
            # A RemoteQueue's message that may have reached the destination directly (its
            # enqueue there ended without an answer): skipped only as the stores confirm it.
            named = [(rec.id, rec.dk) for rec in recs if rec is not None and rec.dk is not None]
            layer = {rec.id: rec.dk for rec in recs if rec is not None and rec.dk is not None and rec.dkl}
            there = there_named(t, dkeys, named, layer, now)
            big = install_ahead(t, meta)  # before anything is written, as above
            items: list[Item] = []
            left: list[transit.Entry] = []
            handled = 0
            if marks is None and not there and (room is None or room >= len(recs)) and all(recs):
                # The common case: every copy there, none installed already, room for all.
                items = list(map(as_item, recs, repeat(self.origin)))  # type: ignore[arg-type]
                handled = len(entries)
                room = None if room is None else room - len(items)
            else:
                for entry, rec, mark in zip(entries, recs, marks or repeat(None), strict=False):
                    if left or (rec is not None and mark is None and rec.id not in there and room == 0):
                        left.append(entry)  # waits for room, and so do those after it (order)
                        continue
                    handled += 1
                    if rec is None or mark is not None or rec.id in there:
                        continue
                    items.append(as_item(rec, self.origin))
                    room = None if room is None else room - 1
            if items:
                enqueue_in(dkeys, t, items, False, None)
            for it in items:
                if it.id in layer:
                    # The producer's key: a direct enqueue with it finds this message, and
                    # the unanswered remote one, landing late, conflicts (it read the key).
                    carry(t, dkeys, layer[it.id], it.id, now)
            # Each copy handled is cleared by its exact key (a chunked one with its chunks),
            # or taken out of its batch's part: not by a range over every receipt of the id,
            # a statement of its own each. A stale copy of another lease is never published
            # (no tombstone names it): its forwarder withdraws it at its step 3, or
            # ``recover`` once its lease ended.
            pending.drop(t, dkeys, source, set(entries[:handled]))
            return len(items), left, room, big

        wrote, left, self._room, big = run_once_confirmed(self.dst_db, dkeys, body)
        if ahead is not None and big is not None:
            ahead.installed = True
            self._dead_letter(ahead.batch, big)
        if not left:
            self._published += entries
        else:
            done = {mid for mid, _ in left}
            self._published += [e for e in entries if e[0] not in done]
        return wrote, left

    def _publish_all(
        self, entries: list[transit.Entry], *, wait: bool = True, ahead: _Hand | None = None
    ) -> tuple[int, int]:
        """Publish ``entries``, waiting for room (a backoff up to 1 s; ``stop()`` ends the
        wait: what is left stays pending, for ``recover`` to publish); the first transaction
        installs ``ahead`` (see ``_publish``). Returns how many it wrote, and how many are left."""
        wrote, pause = 0, 0.01
        while entries or (ahead is not None and not ahead.installed):
            n, entries = self._publish(entries, ahead)
            ahead = None
            wrote += n
            if entries and (not wait or self._stop.wait(pause)):
                break
            pause = min(1.0, pause * 2)
        return wrote, len(entries)

    def _wait_for_room(self) -> int:
        """How many messages to lease: a batch, or what the destination has room for; while it
        has none, wait (a backoff up to 1 s) until it has, or ``stop()`` (then 0)."""
        pause = 0.01
        while self._room is not None and self._room <= 0:
            if self._stop.wait(pause):
                return 0
            pause = min(1.0, pause * 2)
            self._room = run_once(self.dst_db, lambda t, _: transit.room_of(read_meta(t, self.dst.keys)))
        want = self.batch if self._room is None else min(self.batch, self._room)
        return want if self._cap is None else min(want, self._cap)

    def _token_pair(self) -> tuple[str, str]:
        if self._tokens is None:
            self._prepare()
        assert self._tokens is not None
        return self._tokens

    def recover(self, limit: int = 100) -> int:
        """Finish what a crashed or stalled forwarder left, older than a lease: publish the
        pending copies whose tombstone is on the source (and clear it), withdraw those whose
        lease ended without one (``transit.fates`` decides, on the source, for good). Returns
        how many copies it published or withdrew."""
        (source, dest), skeys, dkeys = self._token_pair(), self.src.keys, self.dst.keys
        age = versions(self.lease_seconds)
        found = run_once(self.src_db, lambda t, _: transit.tombs(t, skeys, dest, limit, db_now(t) - age))
        pend = run_once(self.dst_db, lambda t, _: pendings(t, dkeys, source, limit, db_now(t) - age))

        def fates(t: Transaction) -> list[str]:
            check(t, skeys, "dequeue", read_meta(t, skeys))
            return transit.fates(t, skeys, dest, pend, db_now(t))

        verdicts = run_once_confirmed(self.src_db, skeys, fates) if pend else []
        dead = [e for e, v in zip(pend, verdicts, strict=True) if v == transit.DEAD]
        removed = [e for e, v in zip(pend, verdicts, strict=True) if v == transit.REMOVED]
        if dead:
            self._withdraw(dead)
        todo = list(dict.fromkeys(found + removed))
        n = self._publish_all(todo, wait=False)[0] if todo else 0
        self._recovered_at = time.monotonic()
        return n + len(dead)

    # -- the leased path's turn ----------------------------------------------------------------------

    def _step_leased(self, ahead: bool) -> int:
        """``Forwarder._step`` on the leased path: lease (or take over), install, remove, publish."""
        moved = 0
        while not self._stop.is_set() or self._hand is not None:
            if self._hand is None and not self._resumed:
                self._hand = self._take_over()  # a namesake's batch first
                self._resumed = self._hand is None
            if self._hand is None:
                want = self._wait_for_room()
                batch, record = self._lease(want) if want else ([], None)
                if not batch:
                    return moved
                self._hand = _Hand(batch, record=record)
            h = self._hand  # resumed where it stopped when a step is retried (run)
            if not h.installed:
                if h.batch:
                    self._install(h.batch)
                h.installed = True
            if h.done is None:
                want = self._want_ahead(len(h.batch)) if ahead and h.batch else 0
                h.done, nxt, record = self._remove(h.batch, want) if h.batch else ([], [], None)
                if nxt:
                    h.ahead = _Hand(nxt, record=record)
                if len(h.done) < len(h.batch):  # (done: a part of batch, in its order)
                    kept = {m.id for m in h.done}
                    h.lost += [(m.id, str(m.receipt)) for m in h.batch if m.id not in kept]
            if h.lost:  # leases lost to a stall: another forwarder or a consumer has them
                self._withdraw(h.lost)
                h.lost = []
            entries = h.removed + transit.entries_of(h.done)
            wrote, left = self._publish_all(entries, ahead=h.ahead)
            self._hand = h.ahead  # leased and (unless the destination refused it) installed
            if h.record is not None and not left:
                self._records.append(h.record)  # cleared by the next removal, or at the end
            self.stats.forwarded += wrote
            self.stats.skipped += len(entries) - wrote - left
            self._took(len(entries))
            if h.done:
                self.stats.lag = max(0.0, time.time() - h.done[-1].enqueued_at)
            moved += len(entries)
            if moved and not (self._hand is not None and self._stop.is_set()):
                return moved
        return moved

    def _want_ahead(self, in_hand: int) -> int:
        """How many to lease ahead with the removal of a batch of ``in_hand``: a batch, within
        the room the destination has left once that batch is in and what is left of ``run``'s
        limit; none once stopping (the run ends with nothing in hand)."""
        if self._stop.is_set():
            return 0
        want = self.batch if self._room is None else min(self.batch, self._room - in_hand)
        return max(0, want if self._cap is None else min(want, self._cap - in_hand))


def _marks(
    t: Transaction, dkeys: QueueKeys, origin: str, entries: list[transit.Entry]
) -> list[bytes | None] | None:
    """The exclusive forwarder's markers of ``entries`` in the destination (one there: the
    message was installed already; None: none of them is). One range read of this source's
    markers first: when it holds none (a leased forwarder's common case: an exclusive
    forwarder clears its markers as it goes), none of these is there, and a marker written
    meanwhile conflicts with this read (not a snapshot) as it would with the point reads;
    else each is read."""
    if not t.get_range(*forward_marker_range(dkeys, origin), 1):
        return None
    return t.get_many([forward_marker(dkeys, origin, mid) for mid, _ in entries])


_ITSELF = "forwarding queue {!r} into itself (one store, one queue): it would delete every message"


@dataclass
class _Hand:
    """A leased batch through the steps: installed, then removed (``done``: those whose lease
    was still ours; ``lost``: pending copies of the others, to withdraw), then published.
    Taken over from a namesake: ``removed`` left the source already, published first;
    ``record``: the batch's record under the forwarder's name."""

    batch: list[Message]
    installed: bool = False
    done: list[Message] | None = None
    lost: list[transit.Entry] = field(default_factory=list)
    removed: list[transit.Entry] = field(default_factory=list)
    record: transit.Record_ | None = None
    ahead: _Hand | None = None  # a run's next batch, leased with this one's removal

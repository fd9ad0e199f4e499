"""engine_traits keeps a class's answer only where every instance of it gives the same one."""

from __future__ import annotations

from fdbqueue.engines.contract import engine_traits


class _Pessimistic:
    """An engine database whose class says it never conflicts, with instances that may say
    otherwise (an attribute set per instance, as an engine configured per URL could)."""

    may_conflict = False
    may_commit_unknown = False

    def __init__(self, *, optimistic: bool = False) -> None:
        if optimistic:
            self.may_conflict = True
            self.may_commit_unknown = True


class _Unknown:
    """An engine that says nothing: both True."""


def test_an_instance_that_overrides_its_class_is_answered_for_itself() -> None:
    plain = _Pessimistic()
    assert engine_traits(plain) == (False, False)  # the class's answer, now kept for it
    assert engine_traits(_Pessimistic(optimistic=True)) == (True, True)
    assert engine_traits(plain) == (False, False)
    later = _Pessimistic()
    later.may_commit_unknown = True  # set after the class's answer was kept
    assert engine_traits(later) == (False, True)


def test_an_engine_that_says_nothing_may_do_both() -> None:
    assert engine_traits(_Unknown()) == (True, True)
    assert engine_traits(_Unknown()) == (True, True)


class _Wrapper:
    """A database that hands every other attribute on to the one it wraps (as a counting or
    logging wrapper does): its class says nothing, each instance says what its inner one does."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_wrapper_that_hands_attributes_on_is_answered_for_what_it_wraps() -> None:
    assert engine_traits(_Wrapper(_Pessimistic())) == (False, False)
    assert engine_traits(_Wrapper(_Unknown())) == (True, True)
    assert engine_traits(_Wrapper(_Pessimistic())) == (False, False)

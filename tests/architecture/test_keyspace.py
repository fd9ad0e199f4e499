"""Keys are laid out in one module, ``fdbqueue/store/layout.py``: a forwarding key's tag
(``"fk"``, ``"fn"``, ``"fp"``, ``"ft"``, ``"fh"``, ``"fw"``: the first element of its tuple
under the queue's subspace) appears in no other module of the package, nor in the scripts,
so no key of a forward is built (packed, ranged, or spliced from encoded elements) elsewhere.

Read from the source (``ast``): any string constant equal to a tag counts, whatever builds
the key with it (``q.pack``, ``q.range``, ``enc_str``, a bytes literal of its encoding).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "fdbqueue" / "store" / "layout.py"
FORWARD_TAGS = frozenset({"fk", "fn", "fp", "ft", "fh", "fw"})
# the tags as fdb.tuple encodes a string element (a bytes literal built by hand)
ENCODED = frozenset(b"\x02" + tag.encode() + b"\x00" for tag in FORWARD_TAGS)


def forward_tags_in(path: Path) -> list[str]:
    """Where ``path`` names a forwarding key's tag: ``file:line 'tag'``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant):
            continue
        v = node.value
        if (isinstance(v, str) and v in FORWARD_TAGS) or (
            isinstance(v, bytes) and any(e in v for e in ENCODED)
        ):
            found.append(f"{path}:{node.lineno} {v!r}")
    return found


def test_forwarding_keys_are_built_only_in_the_layout() -> None:
    files = [*sorted((ROOT / "fdbqueue").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
    found = [where for path in files if path != LAYOUT for where in forward_tags_in(path)]
    assert not found, "forwarding keys built outside store/layout.py:\n  " + "\n  ".join(found)


def test_the_check_sees_a_tag_however_the_key_is_built(tmp_path: Path) -> None:
    assert len(forward_tags_in(LAYOUT)) >= len(FORWARD_TAGS)  # the layout names them all
    for text in ('k = q.pack(("fp", s))', 'r = q.range(("ft",))', 'p = enc_str("fh")', 'P = b"\\x02fk\\x00"'):
        bad = tmp_path / "bad.py"
        bad.write_text(text + "\n")
        assert forward_tags_in(bad), text
    fine = tmp_path / "fine.py"
    fine.write_text('k = q.pack(("f", s)); t = "fpx"\n')
    assert forward_tags_in(fine) == []

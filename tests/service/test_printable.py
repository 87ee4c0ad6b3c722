"""Strings from outside the process reach the terminal escaped: no control byte is printed raw."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerbudgetd.service.output import printable
from support.examples import examples


def test_escape_sequences_are_shown_not_obeyed() -> None:
    osc52 = "\x1b]52;c;ZXZpbA==\x07"  # a clipboard write
    assert printable(f"gpu{osc52}0") == "gpu\\x1b]52;c;ZXZpbA==\\x070"
    assert printable("a\nb\tc\x9bd\x7f") == "a\\nb\\tc\\x9bd\\x7f"
    assert printable("Ölpumpe 300 W") == "Ölpumpe 300 W"  # printable text is untouched


@settings(max_examples=examples(500))
@given(st.text())
def test_no_control_character_survives(text: str) -> None:
    out = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    if not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text):
        assert out == text

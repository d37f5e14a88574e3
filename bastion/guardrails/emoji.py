"""Invisible characters that are part of an emoji, which a scan for hidden text must leave alone.

Unicode spells the flags of England, Scotland and Wales (and any subdivision flag) as a black flag, U+1F3F4, followed
by tag characters that spell the region ("gbsct") and the cancel tag U+E007F (UTS #51, emoji tag sequences). The same
tag characters, anywhere else, are the "ASCII smuggling" of tool-poisoning demos. A run is an emoji's only in that
exact shape: after the black flag, two to six lowercase letters or digits, then the cancel tag; too short to carry an
order, so it is not read as smuggled text.
"""

from __future__ import annotations

import re

BLACK_FLAG = "\U0001f3f4"
CANCEL_TAG = "\U000e007f"
_TAG_SPEC = re.compile("[\U000e0030-\U000e0039\U000e0061-\U000e007a]{2,6}")


# The longest run of tags an emoji tag sequence has: six letters or digits and the cancel tag. A run is measured
# only this far each way, so that a text of nothing but tag characters costs a constant per character, not the run.
_LONGEST = 7


def _is_tag(char: str) -> bool:
    return "\U000e0000" <= char <= "\U000e007f"


def in_emoji_tag_sequence(text: str, at: int) -> bool:
    """Whether the tag character at ``text[at]`` belongs to an emoji tag sequence (a subdivision flag)."""
    start, low = at, max(0, at - _LONGEST)
    while start > low and _is_tag(text[start - 1]):
        start -= 1
    end, high = at, min(len(text), at + _LONGEST)
    while end < high and _is_tag(text[end]):
        end += 1
    if end - start > _LONGEST or start == 0 or text[start - 1] != BLACK_FLAG or text[end - 1] != CANCEL_TAG:
        return False
    return _TAG_SPEC.fullmatch(text, start, end - 1) is not None

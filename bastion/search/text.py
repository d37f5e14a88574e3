"""Turning MCP tool definitions and queries into the text each retriever sees.

Only the tool definition itself is used (name, title, description, parameter names and
their descriptions): nothing is learned from queries, so any catalog is handled alike.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

from bm25s.stopwords import STOPWORDS_EN

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SEPARATORS = re.compile(r"[_.\-/:\s]+")
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(STOPWORDS_EN)

# Name words are what the tool *is*; repeating them weighs them above free prose in BM25.
NAME_REPEAT = 2


def split_identifier(name: str) -> str:
    """``getWeather_forecast.v2`` -> ``get weather forecast v2``."""
    spaced = _CAMEL_BOUNDARY.sub(" ", name)
    return _NAME_SEPARATORS.sub(" ", spaced).strip().lower()


def _properties(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _parameter_texts(tool: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for pname, spec in _properties(tool).items():
        desc = spec.get("description", "") if isinstance(spec, dict) else ""
        out.append((split_identifier(str(pname)), desc if isinstance(desc, str) else ""))
    return out


def _str_field(tool: dict[str, Any], key: str) -> str:
    value = tool.get(key)
    return value if isinstance(value, str) else ""


def lexical_text(tool: dict[str, Any]) -> str:
    """All searchable words of a tool, name words weighted up."""
    name = split_identifier(_str_field(tool, "name"))
    parts = [" ".join([name] * NAME_REPEAT), _str_field(tool, "title"), _str_field(tool, "description")]
    for pname, pdesc in _parameter_texts(tool):
        parts.append(pname)
        parts.append(pdesc)
    return " ".join(p for p in parts if p)


def semantic_text(tool: dict[str, Any]) -> str:
    """A sentence-like rendering for the embedding model (it was trained on prose)."""
    name = split_identifier(_str_field(tool, "name"))
    title = _str_field(tool, "title")
    head = f"{name} ({title})" if title and title.lower() != name else name
    text = f"{head}: {_str_field(tool, 'description')}".strip()
    params = _parameter_texts(tool)
    if params:
        text += " Parameters: " + "; ".join(f"{p}: {d}" if d else p for p, d in params)
    return text


def make_stemmer() -> Callable[[list[str]], list[str]] | None:
    """English Snowball stemmer from PyStemmer when installed; plain words otherwise."""
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english").stemWords


def lexical_tokens(text: str, stem: Callable[[list[str]], list[str]] | None) -> list[str]:
    """Lowercased word tokens, camelCase and snake_case split, stemmed; stopwords and bare
    numbers dropped (numbers in a request are argument values, not what the tool does)."""
    spaced = _CAMEL_BOUNDARY.sub(" ", text).lower()
    words = [w for w in _WORD.findall(spaced) if len(w) > 1 and w not in _STOPWORDS and not w.isdigit()]
    return stem(words) if stem is not None else words


def iter_tokens(texts: Iterable[str], stem: Callable[[list[str]], list[str]] | None) -> list[list[str]]:
    return [lexical_tokens(t, stem) for t in texts]

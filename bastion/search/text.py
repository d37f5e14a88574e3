"""Turning MCP tool definitions and queries into the text each retriever sees.

Only the tool definition itself is used (name, title, description, and every parameter's
name, description and allowed values, nested ones too): nothing is learned from queries, so
any catalog is handled alike.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import islice
from typing import Any, Callable, Iterable, NamedTuple

import regex
from bm25s.stopwords import STOPWORDS_EN

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SEPARATORS = re.compile(r"[_.\-/:\s]+")
_WORD = re.compile(r"[a-z0-9]+")
# Beyond ASCII a word is a run of letters, their combining marks (Devanagari's vowel signs, Thai's vowels: without
# them such words fall apart) and digits, of any script.
_UNICODE_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+")
# Scripts written without spaces between words. A run of them is indexed as its overlapping character pairs
# (Lucene's CJK bigrams), and each Han character on its own too (Lucene's unigram option): no dictionary to ship,
# Japanese and Chinese alike. Measured on 30 Chinese tools and colloquial queries (docs/search.md), BM25 found the
# right tool first for 80% of the queries with characters and pairs, 57% with pairs alone and 63% with jieba's
# words; a colloquial query shares single characters with a formal description more often than whole words.
# Mixed into a word, the run is cut out first ("API接口" -> "api", "接口").
_UNSPACED = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}ー]+")
_HAN = regex.compile(r"\p{Han}")
_LETTER = regex.compile(r"\p{L}")
_LATIN_LETTER = regex.compile(r"\p{Latin}")
_STOPWORDS = frozenset(STOPWORDS_EN)

# Name words are what the tool *is*; repeating them weighs them above free prose in BM25.
NAME_REPEAT = 2


def latin_share(text: str) -> float:
    """Share of the letters of ``text`` written in the Latin script (1.0 when it has none)."""
    letters = len(_LETTER.findall(text))
    return len(_LATIN_LETTER.findall(text)) / letters if letters else 1.0


def split_identifier(name: str) -> str:
    """``getWeather_forecast.v2`` -> ``get weather forecast v2``."""
    spaced = _CAMEL_BOUNDARY.sub(" ", name)
    return _NAME_SEPARATORS.sub(" ", spaced).strip().lower()


# Schemas come from servers: the walk into nested objects and array items is bounded.
MAX_PARAMETER_DEPTH = 4
MAX_PARAMETERS = 64
# Allowed values say what a tool can do ("add", "delete", "COOL"). BM25 takes more than the
# sentence model, whose text is cut at a word-piece budget: a long list would push later
# parameters out.
MAX_LEXICAL_CHOICES = 20
MAX_SEMANTIC_CHOICES = 10


class Parameter(NamedTuple):
    name: str  # identifier split into words
    description: str
    choices: tuple[str, ...]  # string enum values, split into words, at most MAX_LEXICAL_CHOICES


def _choices(spec: dict[str, Any]) -> tuple[str, ...]:
    items = spec.get("items")
    enum = spec.get("enum", items.get("enum") if isinstance(items, dict) else None)
    if not isinstance(enum, list):
        return ()
    return tuple(islice((split_identifier(v) for v in enum if isinstance(v, str) and v), MAX_LEXICAL_CHOICES))


def parameters(tool: dict[str, Any]) -> list[Parameter]:
    """Every parameter of the input schema, nested ones included, in schema order.

    A tool whose whole input is one object (``body: {windStrength, coolTargetTemperature}``)
    says what it does only in the names and descriptions inside that object.
    """
    found: list[Parameter] = []

    def walk(schema: Any, depth: int) -> None:
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            return
        for pname, spec in props.items():
            if len(found) >= MAX_PARAMETERS:
                return
            spec = spec if isinstance(spec, dict) else {}
            found.append(Parameter(split_identifier(str(pname)), _str_field(spec, "description"), _choices(spec)))
            if depth < MAX_PARAMETER_DEPTH:
                walk(spec, depth + 1)
                walk(spec.get("items"), depth + 1)

    walk(tool.get("inputSchema"), 0)
    return found


def _str_field(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def lexical_text(tool: dict[str, Any]) -> str:
    """All searchable words of a tool, name words weighted up."""
    name = split_identifier(_str_field(tool, "name"))
    parts = [" ".join([name] * NAME_REPEAT), _str_field(tool, "title"), _str_field(tool, "description")]
    for param in parameters(tool):
        parts.extend((param.name, param.description, " ".join(param.choices)))
    return " ".join(p for p in parts if p)


def semantic_text(tool: dict[str, Any]) -> str:
    """A sentence-like rendering for the embedding model (it was trained on prose)."""
    name = split_identifier(_str_field(tool, "name"))
    title = _str_field(tool, "title")
    head = f"{name} ({title})" if title and title.lower() != name else name
    text = f"{head}: {_str_field(tool, 'description')}".strip()
    rendered = [_render_parameter(p) for p in parameters(tool)]
    if rendered:
        text += " Parameters: " + "; ".join(rendered)
    return text


def _render_parameter(param: Parameter) -> str:
    text = f"{param.name}: {param.description}" if param.description else param.name
    if param.choices:
        text += " (" + ", ".join(param.choices[:MAX_SEMANTIC_CHOICES]) + ")"
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
    numbers dropped (numbers in a request are argument values, not what the tool does).
    Letters and digits of every script are kept; scripts without spaces become character pairs."""
    spaced = _CAMEL_BOUNDARY.sub(" ", text)
    if not spaced.isascii():
        return _unicode_tokens(spaced, stem)
    words = [w for w in _WORD.findall(spaced.lower()) if len(w) > 1 and w not in _STOPWORDS and not w.isdigit()]
    return stem(words) if stem is not None else words


def _unicode_tokens(text: str, stem: Callable[[list[str]], list[str]] | None) -> list[str]:
    # NFKC folds full-width Latin and digits ("ＡＰＩ", "１２") and compatibility forms into the plain ones.
    text = unicodedata.normalize("NFKC", text).casefold()
    words: list[str] = []
    pairs: list[str] = []
    for word in _UNICODE_WORD.findall(text):
        if _UNSPACED.search(word) is None:
            words.append(word)
            continue
        for piece in _UNSPACED.split(word):
            if piece:
                words.append(piece)
        for run in _UNSPACED.findall(word):
            pairs.extend(_character_pairs(run))
    kept = [w for w in words if len(w) > 1 and w not in _STOPWORDS and not w.isdigit()]
    # The pairs are not words of a language a stemmer knows.
    return (stem(kept) if stem is not None else kept) + pairs


def _character_pairs(run: str) -> list[str]:
    """A run of an unspaced script as its overlapping character pairs, then its Han characters one by one (a
    kana or Thai character alone says little); a lone character stands for itself."""
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)] + _HAN.findall(run)


def iter_tokens(texts: Iterable[str], stem: Callable[[list[str]], list[str]] | None) -> list[list[str]]:
    return [lexical_tokens(t, stem) for t in texts]


# A message that asks for several things ("First, convert 5000 yen to dollars. Then, ...")
# needs a tool for each. Sentences, and clauses joined by sequencing words, are taken as
# separate requests; "and" alone is not, since it joins a request's own arguments too.
_SEQUENCING = (r"(?:and then|and also|then|also|additionally|in addition|as well as|after that|afterwards"
               r"|moreover|furthermore|finally|lastly|besides)")
_ORDINAL = r"(?:first|second|third|fourth|fifth|next)(?:ly)?"
_REQUEST_BOUNDARY = re.compile(rf"(?<=[.?!;:])\s+|\n+|,?\s+\b{_SEQUENCING}\b,?\s+|\b{_ORDINAL},\s+", re.IGNORECASE)
# What is left of a boundary at the start of a sentence ("Then, what is ...").
_LEADING_BOUNDARY = re.compile(rf"^(?:{_SEQUENCING}|{_ORDINAL})\b,?\s*", re.IGNORECASE)
_REQUEST_TRIM = " ,.;:?!\"'"
_CONTENT_WORD = re.compile(r"[^\W\d_]{3,}")
# Bounds the work a long message can cause: every request is scored against the catalog.
MAX_REQUESTS = 8


def requests(query: str) -> list[str]:
    """The parts of ``query`` that read as separate requests, in order (at most
    :data:`MAX_REQUESTS`). Fragments with fewer than two words of three letters or more
    ("Thanks.", "Second, 3.") are not requests. A single request comes back alone."""
    parts = (_LEADING_BOUNDARY.sub("", p.strip(_REQUEST_TRIM)).strip(_REQUEST_TRIM) for p in _REQUEST_BOUNDARY.split(query) if p)
    found = [p for p in parts if len(_CONTENT_WORD.findall(p)) >= 2]
    return found[:MAX_REQUESTS]

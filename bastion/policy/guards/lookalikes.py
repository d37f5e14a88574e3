"""Characters that look like a path separator or a dot, and the ASCII a lax reader takes each one for.

No client that means "/" or "." writes one of these in a path: they reach a guard only to be folded onto
path syntax later, by a server that normalises Unicode (NFKC) or maps look-alikes the way Unicode's
confusables table does. The table is every character, other than letters and decimal digits, that NFKC folds
onto text with "/", "\\" or ".", or that Unicode's confusables (TR39) list as a look-alike of one of the
three, plus five that neither lists but that render as one: the combining solidus overlays and the
ideographic full stops. Letters and digits are left out even where TR39 lists them (katakana ノ, Arabic-Indic
zero), since they are ordinary characters of file names. tests/policy/test_path_lookalikes.py derives the
table again from the Unicode data and fails if it drifts.
"""

from __future__ import annotations

import re

SEPARATOR_OR_DOT_LOOKALIKES: dict[str, str] = {
    "\u0337": "/",  # COMBINING SHORT SOLIDUS OVERLAY
    "\u0338": "/",  # COMBINING LONG SOLIDUS OVERLAY
    "\u0701": ".",  # SYRIAC SUPRALINEAR FULL STOP
    "\u0702": ".",  # SYRIAC SUBLINEAR FULL STOP
    "\u1735": "/",  # PHILIPPINE SINGLE PUNCTUATION
    "\u2024": ".",  # ONE DOT LEADER
    "\u2025": "..",  # TWO DOT LEADER
    "\u2026": "...",  # HORIZONTAL ELLIPSIS
    "\u2041": "/",  # CARET INSERTION POINT
    "\u2044": "/",  # FRACTION SLASH
    "\u20e5": "\\",  # COMBINING REVERSE SOLIDUS OVERLAY
    "\u2100": "a/c",  # ACCOUNT OF
    "\u2101": "a/s",  # ADDRESSED TO THE SUBJECT
    "\u2105": "c/o",  # CARE OF
    "\u2106": "c/u",  # CADA UNA
    "\u2215": "/",  # DIVISION SLASH
    "\u2216": "\\",  # SET MINUS
    "\u2488": "1.",  # DIGIT ONE FULL STOP
    "\u2489": "2.",  # DIGIT TWO FULL STOP
    "\u248a": "3.",  # DIGIT THREE FULL STOP
    "\u248b": "4.",  # DIGIT FOUR FULL STOP
    "\u248c": "5.",  # DIGIT FIVE FULL STOP
    "\u248d": "6.",  # DIGIT SIX FULL STOP
    "\u248e": "7.",  # DIGIT SEVEN FULL STOP
    "\u248f": "8.",  # DIGIT EIGHT FULL STOP
    "\u2490": "9.",  # DIGIT NINE FULL STOP
    "\u2491": "10.",  # NUMBER TEN FULL STOP
    "\u2492": "11.",  # NUMBER ELEVEN FULL STOP
    "\u2493": "12.",  # NUMBER TWELVE FULL STOP
    "\u2494": "13.",  # NUMBER THIRTEEN FULL STOP
    "\u2495": "14.",  # NUMBER FOURTEEN FULL STOP
    "\u2496": "15.",  # NUMBER FIFTEEN FULL STOP
    "\u2497": "16.",  # NUMBER SIXTEEN FULL STOP
    "\u2498": "17.",  # NUMBER SEVENTEEN FULL STOP
    "\u2499": "18.",  # NUMBER EIGHTEEN FULL STOP
    "\u249a": "19.",  # NUMBER NINETEEN FULL STOP
    "\u249b": "20.",  # NUMBER TWENTY FULL STOP
    "\u2571": "/",  # BOX DRAWINGS LIGHT DIAGONAL UPPER RIGHT TO LOWER LEFT
    "\u27cb": "/",  # MATHEMATICAL RISING DIAGONAL
    "\u27cd": "\\",  # MATHEMATICAL FALLING DIAGONAL
    "\u29f5": "\\",  # REVERSE SOLIDUS OPERATOR
    "\u29f8": "/",  # BIG SOLIDUS
    "\u29f9": "\\",  # BIG REVERSE SOLIDUS
    "\u2f02": "\\",  # KANGXI RADICAL DOT
    "\u2f03": "/",  # KANGXI RADICAL SLASH
    "\u3002": ".",  # IDEOGRAPHIC FULL STOP
    "\u31d3": "/",  # CJK STROKE SP
    "\u31d4": "\\",  # CJK STROKE D
    "\u33c2": "a.m.",  # SQUARE AM
    "\u33c7": "Co.",  # SQUARE CO
    "\u33d8": "p.m.",  # SQUARE PM
    "\ua60e": ".",  # VAI FULL STOP
    "\ufe19": "...",  # PRESENTATION FORM FOR VERTICAL HORIZONTAL ELLIPSIS
    "\ufe30": "..",  # PRESENTATION FORM FOR VERTICAL TWO DOT LEADER
    "\ufe52": ".",  # SMALL FULL STOP
    "\ufe68": "\\",  # SMALL REVERSE SOLIDUS
    "\uff0e": ".",  # FULLWIDTH FULL STOP
    "\uff0f": "/",  # FULLWIDTH SOLIDUS
    "\uff3c": "\\",  # FULLWIDTH REVERSE SOLIDUS
    "\uff61": ".",  # HALFWIDTH IDEOGRAPHIC FULL STOP
    "\U00010a50": ".",  # KHAROSHTHI PUNCTUATION DOT
    "\U0001d16d": ".",  # MUSICAL SYMBOL COMBINING AUGMENTATION DOT
    "\U0001d20f": "\\",  # GREEK VOCAL NOTATION SYMBOL-16
    "\U0001d23a": "/",  # GREEK INSTRUMENTAL NOTATION SYMBOL-47
    "\U0001d23b": "\\",  # GREEK INSTRUMENTAL NOTATION SYMBOL-48
    "\U0001f100": "0.",  # DIGIT ZERO FULL STOP
}

LOOKALIKE = re.compile("[" + "".join(map(re.escape, SEPARATOR_OR_DOT_LOOKALIKES)) + "]")


def as_ascii(value: str) -> str:
    """``value`` with every look-alike replaced by the ASCII it imitates: the reading of the laxest server."""
    return LOOKALIKE.sub(lambda match: SEPARATOR_OR_DOT_LOOKALIKES[match.group()], value)

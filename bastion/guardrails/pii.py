"""Personal-data detectors: an expression finds candidates, a well-kept validator decides.

The validators are libraries' own: ``python-stdnum`` for payment cards (Luhn), IBANs (ISO 13616 check digits and
each country's length) and national identifiers (each country's checksum and ranges), ``phonenumbers`` (Google's
libphonenumber metadata) for telephone numbers. The candidate expressions are written here because no rule set
publishes them as expressions; each is narrow on purpose, because text that reaches a model is full of numbers
(commit ids, timestamps, sizes, versions) and a checksum alone lets one random number in ten through:

- e-mail: the common address form; reserved example domains (RFC 2606/6761: example.com, .test, .invalid,
  .localhost, .example) and ``git@host`` remote addresses are not personal data.
- payment cards: 13 to 19 digits, optionally in groups, Luhn-valid, and starting with a card network's prefix.
- national identifiers: only formats with a checksum or a distinctive layout: US SSN (ddd-dd-dddd, valid ranges),
  UK National Insurance numbers, Canadian SIN (grouped, Luhn), Spanish DNI/NIE, Italian codice fiscale, French NIR
  (grouped), Brazilian CPF (punctuated), Indian Aadhaar (grouped, Verhoeff), Swedish personnummer, Finnish HETU.
  Bare runs of nine to eleven digits (Dutch BSN, German IdNr, PESEL) are left out: as many ordinary numbers pass
  their checksums as real identifiers appear.
- IBAN: country code, check digits, the national part, validated by stdnum.
- phone numbers: the international form (+country code) and ``tel:`` links, valid for their country by
  libphonenumber; national forms without the country code cannot be told from other digit groups, except under a
  telephone label ("Phone:", a ``mobile`` field of a contact record), where they are tried against the numbering
  plans of a few large regions.
"""

from __future__ import annotations

import functools
import re

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn
from stdnum.br import cpf
from stdnum.ca import sin
from stdnum.es import dni, nie
from stdnum.fi import hetu
from stdnum.fr import nir
from stdnum.in_ import aadhaar
from stdnum.it import codicefiscale
from stdnum.se import personnummer
from stdnum.us import ssn

from bastion.guardrails.matching import Detector

_RESERVED_DOMAIN = re.compile(
    rb"(?i)(?:^|\.)(?:example\.(?:com|net|org)|[^.]+\.(?:test|invalid|localhost|example|local)|localhost)$")
_NOT_A_PERSON = re.compile(rb"(?i)^(?:git|noreply|no-reply|donotreply|do-not-reply)$")


def _email(value: bytes, _match: bytes, _line: bytes) -> bool:
    local, _, domain = value.rpartition(b"@")
    return not _RESERVED_DOMAIN.search(domain) and not _NOT_A_PERSON.match(local)


# A card network's prefix: Visa, Mastercard, American Express, Discover, JCB, Diners Club, UnionPay, Maestro.
_CARD_PREFIX = re.compile(rb"^(?:4|5[1-5]|2(?:2[2-9]|[3-6]|7[01]|720)|3[47]|6(?:011|5|4[4-9]|2)|35(?:2[89]|[3-8])|"
                          rb"3(?:0[0-5]|[68])|5[06-9]|6[37])")


def _card(value: bytes, _match: bytes, _line: bytes) -> bool:
    digits = re.sub(rb"[ -]", b"", value)
    if not 13 <= len(digits) <= 19 or len(set(digits)) < 2:
        return False
    return bool(_CARD_PREFIX.match(digits)) and luhn.is_valid(digits.decode())


def _validated_by(module: object) -> functools.partial[bool]:
    return functools.partial(_stdnum_valid, module)


def _stdnum_valid(module: object, value: bytes, _match: bytes, _line: bytes) -> bool:
    return bool(module.is_valid(value.decode("ascii", "replace")))  # type: ignore[attr-defined]


def _nino(value: bytes, _match: bytes, _line: bytes) -> bool:
    # HMRC's rules: no D, F, I, Q, U, V in either letter, no O second, and never the prefixes BG, GB, NK, KN, TN,
    # NT, ZZ; stdnum has no module for it.
    prefix = value[:2].upper()
    return prefix not in (b"BG", b"GB", b"NK", b"KN", b"TN", b"NT", b"ZZ") and prefix[1:2] != b"O"


def _phone(value: bytes, _match: bytes, _line: bytes) -> bool:
    text = value.decode(errors="replace")
    if text.lower().startswith("tel:"):
        text = text[4:]
    try:
        number = phonenumbers.parse(text, None)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(number)


# Where a number written in its national form (no "+") may be: the regions whose numbering plan a labelled number is
# tried against, most populous markets of the tools' users first. A number valid in none of them is not reported.
_NATIONAL_REGIONS = ("US", "GB", "DE", "FR", "IN", "ES", "IT", "NL", "BR", "AU", "JP", "MX", "SE", "CH", "PL")


_DATE = re.compile(r"(?:19|20)\d\d[-./](?:0[1-9]|1[0-2])[-./]\d\d")  # "tel: 2024-01-05 12:30" is a timestamp


def _labelled_phone(value: bytes, _match: bytes, _line: bytes) -> bool:
    """A number a record labels as a telephone number ("Phone: (415) 555-2671", ``{"mobile": "030 1234567"}``),
    valid in one of ``_NATIONAL_REGIONS``: the label is the context a bare national number lacks."""
    text = value.decode(errors="replace")
    if not 7 <= sum(ch.isdigit() for ch in text) <= 13 or _DATE.match(text):
        return False
    for region in _NATIONAL_REGIONS:
        try:
            number = phonenumbers.parse(text, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True
    return False


_D = r"(?:^|[^\w.+-])"  # what may come before a number: not part of a longer word, number or version
_E = r"(?:$|[^\w@-]|\.(?:$|\D))"  # and after it


def _not_one_group_of_more(data: bytes, start: int, end: int) -> bool:
    """A number written in groups is not one more group away from other digits (the first twelve digits of a card
    are not an Aadhaar number). Checked here: as part of the expression it makes Hyperscan eight times slower."""
    before = data[max(0, start - 2):start]
    after = data[end:end + 2]
    return not (len(before) == 2 and before[1:] in (b" ", b"-") and before[:1].isdigit()) and not (
        len(after) == 2 and after[:1] in (b" ", b"-") and after[1:].isdigit())


# Every identifier, card and number below has digits: a text without any is not scanned for them (see Matcher).
_DIGITS = tuple("0123456789")
# How the expressions below are split into Hyperscan databases: all of them in one scanned 1 MB of source code in
# 1.65 ms, each one alone in about 0.1 ms; the phone numbers and the two date-shaped identifiers are what made the
# combined automaton slow, and in three databases the same text takes 0.63 ms (valgrind: 61 to 52 million
# instructions for the whole scanner). A phone number always has its "+", so its database is read only when one is.
_DATED = "pii-dated"
_PHONE = "pii-phone"

PII_DETECTORS = (
    Detector("pii", "email", "bastion:email",
             r"([A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
             r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*\.[A-Za-z]{2,24})\b",
             group=1, check=_email, shard="pii-email", keywords=("@",)),
    Detector("pii", "payment-card", "bastion:payment-card+luhn",
             _D + r"((?:\d{4}[ -]?){2}\d{4}[ -]?\d{1,7}|\d{4}[ -]?\d{6}[ -]?\d{4,5}|\d{13,19})" + _E,
             group=1, check=_card, context=_not_one_group_of_more, keywords=_DIGITS),
    Detector("pii", "iban", "bastion:iban+stdnum",
             r"\b([A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?)\b", group=1,
             check=_validated_by(stdnum_iban), keywords=_DIGITS),
    Detector("pii", "us-ssn", "bastion:us-ssn+stdnum", _D + r"(\d{3}-\d{2}-\d{4})" + _E, group=1,
             check=_validated_by(ssn), context=_not_one_group_of_more, keywords=_DIGITS),
    Detector("pii", "uk-nino", "bastion:uk-nino",
             r"\b([A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D])\b", group=1, check=_nino, keywords=_DIGITS),
    Detector("pii", "ca-sin", "bastion:ca-sin+stdnum", _D + r"(\d{3}[ -]\d{3}[ -]\d{3})" + _E, group=1,
             check=_validated_by(sin), context=_not_one_group_of_more, keywords=_DIGITS),
    Detector("pii", "es-dni", "bastion:es-dni+stdnum", _D + r"(\d{8}-?[A-HJ-NP-TV-Z])\b", group=1,
             check=_validated_by(dni), keywords=_DIGITS),
    Detector("pii", "es-nie", "bastion:es-nie+stdnum", r"\b([XYZ]-?\d{7}-?[A-HJ-NP-TV-Z])\b", group=1,
             check=_validated_by(nie), keywords=_DIGITS),
    Detector("pii", "it-codice-fiscale", "bastion:it-codice-fiscale+stdnum",
             r"\b([A-Z]{6}\d{2}[A-EHLMPR-T]\d{2}[A-Z]\d{3}[A-Z])\b", group=1, check=_validated_by(codicefiscale), keywords=_DIGITS),
    Detector("pii", "fr-nir", "bastion:fr-nir+stdnum",
             _D + r"([12] ?\d{2} ?(?:0[1-9]|1[0-2]) ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2})" + _E, group=1,
             check=_validated_by(nir), context=_not_one_group_of_more, keywords=_DIGITS),
    Detector("pii", "br-cpf", "bastion:br-cpf+stdnum", _D + r"(\d{3}\.\d{3}\.\d{3}-\d{2})" + _E, group=1,
             check=_validated_by(cpf), keywords=_DIGITS),
    Detector("pii", "in-aadhaar", "bastion:in-aadhaar+stdnum", _D + r"([2-9]\d{3} \d{4} \d{4})" + _E, group=1,
             check=_validated_by(aadhaar), context=_not_one_group_of_more, keywords=_DIGITS),
    Detector("pii", "se-personnummer", "bastion:se-personnummer+stdnum",
             _D + r"((?:19|20)?\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])[-+]\d{4})" + _E, group=1,
             check=_validated_by(personnummer), keywords=_DIGITS, shard=_DATED),
    Detector("pii", "fi-hetu", "bastion:fi-hetu+stdnum",
             r"\b((?:0[1-9]|[12]\d|3[01])(?:0[1-9]|1[0-2])\d{2}[-+A-FU-Y]\d{3}[0-9A-FHJ-NPR-Y])\b", group=1,
             check=_validated_by(hetu), keywords=_DIGITS, shard=_DATED),
    Detector("pii", "phone", "bastion:phone+libphonenumber",
             r"((?:tel:)?\+[1-9]\d{0,2}(?:[ .-]?\(?\d{1,4}\)?){1,2}(?:[ .-]?\d{2,4}){1,4})" + _E, group=1,
             check=_phone, keywords=("+",), shard=_PHONE),
    # A national-form number under a telephone label, in text or as a structured field (read as ``mobile: "..."``):
    # contact records write numbers so, and the label is what tells them from order numbers and dates.
    Detector("pii", "phone", "bastion:phone-labelled+libphonenumber",
             r"(?i)\b(?:phone|telephone|tel|mobile|cell|cellphone|fax|landline|whatsapp)(?:[ _-]?(?:number|no\.?|#))?"
             r"[\"']?[ \t]*[:=][ \t]*[\"']?((?:\(\d{2,5}\)[ .-]?|\d{2,5}[ .-])\d{2,4}(?:[ .-]?\d{2,4}){1,3})" + _E,
             group=1, check=_labelled_phone, keywords=("phone", "tel", "mobile", "cell", "fax", "landline", "whatsapp"),
             shard="pii-phone-labelled"),
)


def pii_kinds() -> frozenset[str]:
    return frozenset(detector.kind for detector in PII_DETECTORS)

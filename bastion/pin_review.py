"""What the pins say of each pinned definition, for people: its status, every reason it is withheld (a changed or
renamed definition, a changed configuration entry that holds the whole server, the metadata scan's finding) and what
lifts each reason. ``bastion pins`` prints it; the web console shows it.

These read a ``PinBook`` already loaded; ``scan_modes`` reads configuration files (the metadata scan's switch)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable


BY_NAME = ""  # --of "-": the pins kept by name alone


def identities(book: Any, name: str | None, of: str | None) -> list[str]:
    """The pinned identities a command means: those of server ``name`` (every one when None) of configuration
    ``of`` (every one when None)."""
    from bastion.guardrails.pin_book import split_id

    chosen = []
    for server in book.servers():
        configuration, own = split_id(server)
        if (name is None or own == name) and (of is None or (configuration or BY_NAME) == of):
            chosen.append(server)
    return chosen


def where(server: str) -> str:
    """Which configuration pinned ``server``, in words."""
    from bastion.guardrails.pin_book import split_id

    configuration = split_id(server)[0]
    return configuration or "no configuration file (pinned by server name alone)"


def rows(book: Any, servers: list[str], name: str | None, *, withheld_only: bool,
          modes: Any = None) -> list[dict[str, Any]]:
    """One row per pinned definition of ``servers`` (``name``'s only, when given) with its status and every reason
    it is withheld (``modes``: the metadata scan's switch of an identity, to find what the scan withholds);
    ``withheld_only``: the withheld ones alone."""
    from bastion.guardrails.pin_book import SINGULAR, judge, split_id

    rows = []
    for (s, kind, key), record in sorted(book.records.items()):
        if s not in servers or (name is not None and key != name):
            continue
        configuration, server_name = split_id(s)
        row: dict[str, Any] = {"server": server_name, "configuration": configuration, "kind": SINGULAR[kind],
                               "name": key, "pinned_at": record.pinned_at}
        reasons = _held_by_entry(book, s, kind) + _content_reasons(record, kind, modes and modes(s))
        if record.offered is None:
            if not (withheld_only and not reasons):
                rows.append({**row, "status": "withheld" if reasons else "pinned", "reasons": reasons,
                             "pinned": record.pinned, "offered": None})
            continue
        verdict = judge(book, s, kind, key, record.offered)
        rows.append({**row, "status": "renamed" if verdict.status == "renamed" else "changed",
                     "offered_at": record.offered_at, "matches": record.matches,
                     "changes": [c.summary for c in verdict.changes], "reasons": [_change_reason(kind, verdict),
                                                                                  *reasons],
                     "pinned": record.pinned if record.pinned is not None else _source(book, s, kind, record.matches),
                     "offered": record.offered})
    return rows


def _change_reason(kind: str, verdict: Any) -> dict[str, str]:
    """The reason a changed definition (or entry, or a rename) is withheld, with its changes."""
    from bastion.guardrails.pin_book import ENTRY_KIND, RENAMED
    from bastion.guardrails.pin_diff import summary

    if kind == ENTRY_KIND:
        reason, what = "changed-configuration", "configuration entry changed"
    elif verdict.status == RENAMED:
        reason, what = "renamed-definition", "a new name for a known definition"
    else:
        reason, what = "changed-definition", "definition changed"
    return {"reason": reason, "text": f"{what}: {summary(list(verdict.changes))}"}


def _held_by_entry(book: Any, server: str, kind: str) -> list[dict[str, str]]:
    """The reason every definition of ``server`` is withheld while its configuration entry's change is."""
    from bastion.guardrails.pin_book import ENTRY_KEY, ENTRY_KIND, judge
    from bastion.guardrails.pin_diff import summary

    entry = book.get(server, ENTRY_KIND, ENTRY_KEY)
    if kind == ENTRY_KIND or entry is None or entry.offered is None or entry.pinned is None:
        return []
    changes = judge(book, server, ENTRY_KIND, ENTRY_KEY, entry.offered).changes
    return [{"reason": "changed-configuration",
             "text": f"the server's configuration entry changed since it was pinned: {summary(list(changes))}; "
                     "everything the server offers is withheld with it"}]


def _content_reasons(record: Any, kind: str, mode: str | None) -> list[dict[str, str]]:
    """The metadata scan's finding in what the server offers now (its changed definition, else the pinned one)."""
    from bastion.guardrails.injection import definition_finding
    from bastion.guardrails.pin_book import ENTRY_KIND

    current = record.offered if record.offered is not None else record.pinned
    if kind == ENTRY_KIND or mode is None or current is None:
        return []
    found = definition_finding(current, mode)
    return [] if found is None else [{"reason": "injection",
                                      "text": f"the metadata scan finds {found} in its definition"}]


_WAY_OUT = ("accepting does not lift a content finding: review the server, then set metadata_injection = \"off\" "
            "(or \"sanitize\", which serves it with the instructions cut out) for it under "
            "[guardrails.servers.{server}] of {where}")


def _quietly(read: Any) -> Any:
    """``read()`` without the notes reading a configuration logs (what each server reads and writes): the command
    reads it for its guardrail switches only."""
    chatty = logging.getLogger("bastion.clients")
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        return read()
    finally:
        chatty.setLevel(level)


def scan_modes(servers: list[str], say: Callable[[str], None]) -> Any:
    """The metadata scan's switch for each identity, read from its configuration file (the defaults when it has
    none or it cannot be read: said once)."""
    from bastion.config import ConfigError, load_config
    from bastion.guardrails.config import GuardrailsConfig
    from bastion.guardrails.pin_book import split_id

    configs: dict[str | None, Any] = {}

    def mode(server: str) -> str:
        configuration, name = split_id(server)
        if configuration not in configs:
            guardrails = GuardrailsConfig()
            if configuration is not None and Path(configuration).exists():
                try:
                    loaded = _quietly(lambda: load_config(Path(configuration), log_notes=False))
                    guardrails = loaded.guardrails
                except ConfigError as exc:
                    say(f"{configuration}: cannot be read ({str(exc).splitlines()[0]}); its servers are scanned "
                         "with the default guardrails")
            configs[configuration] = guardrails
        guardrails = configs[configuration]
        return "off" if guardrails is None else guardrails.switch("metadata_injection", name)

    return mode


def _source(book: Any, server: str, kind: str, key: str | None) -> Any:
    record = book.get(server, kind, key) if key is not None else None
    if record is None:
        return None
    return record.pinned if record.pinned is not None else record.offered


def way_out(book: Any, row: dict[str, Any]) -> str:
    """What lifts each reason of ``row``: accepting the changes (the whole server for a changed entry), and for a
    content finding, the metadata scan's switch of the server."""
    option = "" if len(identities(book, row["server"], None)) < 2 else \
        f" --of {row['configuration'] or '-'}"
    reasons = {reason["reason"] for reason in row["reasons"]}
    ways = []
    if reasons & {"changed-configuration"}:
        ways.append(f"accept it with: bastion pins accept {row['server']}{option}")
    elif reasons & {"changed-definition", "renamed-definition"}:
        ways.append(f"accept it with: bastion pins accept {row['server']}/{row['name']}{option}")
    if "injection" in reasons:
        ways.append(_WAY_OUT.format(server=row["server"], where=row["configuration"] or "its configuration"))
    return "; ".join(ways)

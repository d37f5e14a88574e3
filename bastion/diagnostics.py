"""What ``bastion check`` finds in a configuration: each finding names where it is, what is wrong and the fix.

Findings are things a configuration can load with and still fail at run time (a command that is not on
``PATH``, a remote server that is not sandboxed), or that load differently from what the user may expect.
Errors make ``bastion check`` exit 2; warnings are reported and allowed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from bastion.finding import Finding
from bastion.plaintext import is_loopback_host, is_plaintext_remote
from bastion.launchers.findings import installs_its_package, launcher_findings

if TYPE_CHECKING:
    from bastion.config import GatewayConfig, ServerConfig


def diagnose(config: "GatewayConfig") -> list[Finding]:
    """Every finding about ``config``, errors and warnings, in configuration order."""
    findings: list[Finding] = list(config.load_notes)
    for name, server in config.servers.items():
        if server.enabled and server.url is not None:
            findings.extend(remote_findings(f"{config.servers_key}.{name}", server))
        elif server.enabled:
            where = f"{config.servers_key}.{name}"
            if not installs_its_package(server):  # Bastion runs the package, not the launcher: npx need not exist
                findings.extend(_command_findings(where, server))
            findings.extend(_cwd_findings(where, server))
    findings.extend(launcher_findings(config))
    findings.extend(plain_text_secrets(config))
    findings.extend(state_findings(config))
    return findings


def state_findings(config: "GatewayConfig") -> list[Finding]:
    """``[state]``: where the shared state is, a password written in the file, Redis reached without TLS over a
    network, TLS files that are not files. Nothing is connected here: ``/readyz`` says whether Redis answers."""
    state = config.state
    if state is None:
        return []
    from urllib.parse import urlsplit

    findings = []
    if config.source is not None:
        from bastion.config import ConfigError, written

        try:
            data = written(config.source)
        except ConfigError:
            data = {}
        table = data.get("state") if isinstance(data, dict) else None
        password = table.get("password") if isinstance(table, dict) else None
        if isinstance(password, str) and password and "${" not in password:
            findings.append(Finding("warning", "state.password", "Redis's password is written in plain text in the "
                                    "file (value not shown): anyone who reads or copies the file has it",
                                    'write password = "${env:REDIS_PASSWORD}" (or "${file:PATH}") and set it there'))
    host = urlsplit(state.url).hostname or ""
    if state.url.startswith("redis://") and not is_loopback_host(host):
        findings.append(Finding("warning", "state.url", "Redis is reached without TLS: approvals, rate limits and "
                                "the password cross the network unencrypted",
                                "use rediss:// (with tls_ca_file for a private CA), unless the network path is "
                                "trusted"))
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = getattr(state, key)
        if path is not None and not Path(path).is_file():
            findings.append(Finding("error", f"state.{key}", f"{path} is not a file",
                                    "give a PEM file (relative paths are read from the configuration file's folder)"))
    return findings


def plain_text_secrets(config: "GatewayConfig") -> list[Finding]:
    """A local server's ``env`` value written in the file itself that reads as a credential (the secrets
    guardrail's detectors, told the variable's name as gitleaks is told a key): the fix is the line that takes it
    from the environment instead. Values written as ``${...}`` are not in the file, and never read here."""
    source = config.source
    if source is None:
        return []
    from bastion.config import ConfigError, written
    from bastion.guardrails.matching import Matcher
    from bastion.guardrails.secrets import secret_detectors

    try:
        data = written(source)
    except ConfigError:
        return []
    table = data.get(config.servers_key) if isinstance(data, dict) else None
    if not isinstance(table, dict):
        return []
    toml = source.suffix.lower() == ".toml"
    matcher: Matcher | None = None
    findings = []
    for name, entry in table.items():
        server = config.servers.get(name)
        env = entry.get("env") if isinstance(entry, dict) else None
        if server is None or not server.enabled or server.url is not None or not isinstance(env, dict):
            continue
        for variable, value in env.items():
            if not isinstance(value, str) or "${" in value or not value.strip():
                continue
            matcher = matcher or Matcher(secret_detectors())
            found = matcher.find(f'{variable}="{value}"'.encode())
            if not found:
                continue
            line = (f'{variable} = "${{env:{variable}}}" under [servers.{name}.env]' if toml else
                    f'"{variable}": "${{env:{variable}}}"')
            findings.append(Finding(
                "warning", f"{config.servers_key}.{name}.env.{variable}",
                f"a {found[0].detector.kind} written in plain text in the file (value not shown): anyone who reads or copies "
                "the file has it", f"write {line} and set {variable} in the environment Bastion is started with "
                f"(or keep it in a file of its own: \"${{file:PATH}}\")"))
    return findings


def remote_findings(where: str, server: "ServerConfig") -> list[Finding]:
    """What a remote server is sent, and that nothing confines it: the header names, never their values."""
    assert server.url is not None
    parts = [f"the headers {', '.join(sorted(server.headers))} (values not shown)"] if server.headers else []
    if server.auth is not None:
        parts.append(_AUTH_SENT[server.auth.type])
    if server.client_cert is not None:
        parts.append("Bastion's client certificate")
    sent = " and ".join(parts) or "no headers of its own"
    findings = [Finding(
        "warning", f"{where}.url", f"a remote server: not sandboxed (Bastion does not run it); it is sent the "
        f"requests routed to it with {sent}, never a client's own credentials",
        "nothing to do if you trust that endpoint; keep credentials out of the file with ${env:NAME} or "
        "${file:PATH}")]
    if server.ca_file is not None and not Path(server.ca_file).expanduser().is_file():
        findings.append(Finding("error", f"{where}.ca_file", f"{server.ca_file} is not a file",
                                "give the PEM file of the CA that signs the server's certificate (relative paths "
                                "are read from the configuration file's folder)"))
    for key in ("client_cert", "client_key"):
        path = getattr(server, key)
        if path is not None and not Path(path).expanduser().is_file():
            findings.append(Finding("error", f"{where}.{key}", f"{path} is not a file",
                                    "give the PEM file (relative paths are read from the configuration file's folder)"))
    if is_plaintext_remote(server.url):  # loading refused it unless allow_plaintext is true
        sent = [f"headers ({', '.join(sorted(server.headers))})"] if server.headers else []
        if server.auth is not None:
            sent.append("OAuth tokens")
        findings.append(Finding(
            "warning", f"{where}.allow_plaintext", f"{server.url} is reached in plain text (allowed): "
            f"{' and '.join([*sent, 'every request and result'])} cross the network unencrypted, and the endpoint "
            "is not authenticated", "use an https:// URL and remove allow_plaintext"))
    elif server.allow_plaintext:
        findings.append(Finding("warning", f"{where}.allow_plaintext", "has no effect: the url is https:// or "
                                "loopback", "remove it"))
    return findings


_AUTH_SENT = {
    "client_credentials": "Bastion's own OAuth token (client credentials)",
    "token_exchange": "each caller's token exchanged for one of its own (RFC 8693)",
    "authorization_code": "the token each person granted it (authorization code)",
}


def _cwd_findings(where: str, server: "ServerConfig") -> list[Finding]:
    if server.cwd is None or Path(server.cwd).expanduser().is_dir():
        return []
    return [Finding("error", f"{where}.cwd", f"{server.cwd} is not a directory",
                    "create it, or correct the path (relative paths are read from the configuration file's folder)")]


def _command_findings(where: str, server: "ServerConfig") -> list[Finding]:
    where = f"{where}.command"
    command = server.command
    if os.sep in command or (os.altsep and os.altsep in command):
        path = Path(command)
        if not path.exists():
            return [Finding("error", where, f"{command} does not exist",
                            "give the path of an installed executable (relative paths are read from the "
                            "configuration file's folder)")]
        if path.is_dir() or not os.access(path, os.X_OK):
            return [Finding("error", where, f"{command} is not an executable file",
                            f"make it executable (chmod +x {command}) or point at the program itself")]
        return []
    search_path = server.env.get("PATH", os.environ.get("PATH", ""))
    if shutil.which(command, path=search_path) is None:
        return [Finding("error", where, f"{command!r} is not on PATH",
                        f"install {command}, or give its full path as the command")]
    return []

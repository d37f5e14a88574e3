"""The environment a package client runs in: the one Bastion was given, plus the package-manager settings a client
dropped, so an install sees what the user's own ``npx``/``uvx`` would.

Clients start servers with a small environment (HOME, LOGNAME, PATH, SHELL, TERM, USER). Proxy and CA variables,
registry mirrors and package-client settings a user exports in their login profile are then missing, and an install
that works from a terminal fails (``SELF_SIGNED_CERT_IN_CHAIN`` behind a TLS-inspecting proxy). They are read from
the user's login shell (``$SHELL -l -c '/usr/bin/env -0 > FILE'``: the profile files the terminal that works read), outside the
sandbox, with no stdin and within a time bound, only when a package client is about to run; only the variables
below are taken, and a variable Bastion's own environment has is never replaced.

npm with ``--prefix DIR`` reads its *global* configuration from ``DIR/etc/npmrc`` instead of the one it reads
otherwise (``/usr/etc/npmrc`` on a Debian host, where the CA file may be set); the path npm reports without
``--prefix`` is passed on as ``npm_config_globalconfig``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

log = logging.getLogger("bastion.launchers")

LOGIN_SHELL_TIMEOUT_S = 10.0  # a profile that waits on something (a prompt, a network mount) is given up on
NPM_CONFIG_TIMEOUT_S = 30.0

# Exactly the variables taken from the login environment: proxies, CA files, package indexes and package clients'
# own settings. Nothing else of the profile reaches an install.
_TAKEN = frozenset({
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "PIP_CERT", "PIP_CLIENT_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CONFIG_FILE",
    "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS",  # where pip looks for its user and site configuration files
})
_TAKEN_PREFIXES = ("npm_config_", "NPM_CONFIG_", "UV_")
# uv's index settings, for a user whose uvx is configured by them: Bastion installs with pip.
_UV_TO_PIP = {"UV_INDEX_URL": "PIP_INDEX_URL", "UV_DEFAULT_INDEX": "PIP_INDEX_URL",
              "UV_EXTRA_INDEX_URL": "PIP_EXTRA_INDEX_URL"}
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_CA = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT")


def taken(name: str) -> bool:
    """Whether a login-environment variable is one an install is given."""
    return name in _TAKEN or name.startswith(_TAKEN_PREFIXES)


def parse_env0(output: bytes) -> dict[str, str]:
    """``env -0`` output as a mapping (a value may hold newlines, never NUL)."""
    found: dict[str, str] = {}
    for item in output.decode("utf-8", "replace").split("\0"):
        name, sep, value = item.partition("=")
        if sep and name:
            found[name] = value
    return found


def merged(base: Mapping[str, str], login: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``base`` with the taken variables of ``login`` it lacks, and the names added."""
    env = dict(base)
    added = []
    for name in sorted(login):
        if taken(name) and name not in env:
            env[name] = login[name]
            added.append(name)
    for uv, pip in _UV_TO_PIP.items():
        if uv in env and pip not in env:
            env[pip] = env[uv]
            added.append(f"{pip} (from {uv})")
    return env, tuple(added)


async def login_environment(shell: str | None, home: str | None,
                            timeout_s: float = LOGIN_SHELL_TIMEOUT_S) -> tuple[dict[str, str], str]:
    """The login shell's environment, and a note when it could not be read (then: empty).

    The shell runs in a session of its own with no stdin, so a profile that asks something gets end-of-file, and one
    that hangs is killed with everything it started when the time is up. The environment is written to a file of a
    private folder (a redirection every shell reads alike), so whatever a chatty profile prints is not mixed in."""
    if not shell or not os.path.isabs(shell):
        return {}, "no login shell ($SHELL is not an absolute path)"
    env = {key: value for key, value in (("HOME", home), ("SHELL", shell)) if value}
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    folder = await asyncio.to_thread(tempfile.mkdtemp, prefix="bastion-login-env-")
    target = os.path.join(folder, "env")
    try:
        try:
            process = await asyncio.create_subprocess_exec(
                shell, "-l", "-c", f"/usr/bin/env -0 > {shlex.quote(target)}", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=home or "/",
                start_new_session=True)
        except OSError as exc:
            return {}, f"login shell {shell} could not run: {exc.strerror}"
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except asyncio.TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            return {}, f"login shell {shell} did not finish within {timeout_s:g}s"
        except asyncio.CancelledError:
            _kill_group(process.pid)
            raise
        if process.returncode != 0:
            return {}, f"login shell {shell} exited with status {process.returncode}"
        try:
            output = await asyncio.to_thread(Path(target).read_bytes)
        except OSError:
            return {}, f"login shell {shell} wrote no environment"
        return parse_env0(output), ""
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class InstallEnvironment:
    """The environment installs run in, made once for the installs of one start (or one ``servers update``).

    ``base``: Bastion's own environment. The login shell is read the first time a package client is about to run."""

    base: Mapping[str, str]
    _ready: dict[str, str] | None = None
    _added: tuple[str, ...] = ()
    _note: str = ""
    _npm: dict[str, str] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def for_pip(self) -> dict[str, str]:
        async with self._lock:
            return await self._login_merged()

    async def for_npm(self, npm: str) -> dict[str, str]:
        """The environment for ``npm --prefix DIR``: npm's global and user configuration as npm finds them itself."""
        async with self._lock:
            env = await self._login_merged()
            if not self._npm:
                self._npm = await _npm_config_files(npm, env)
            return {**env, **{f"npm_config_{key}": value for key, value in self._npm.items()}}

    async def _login_merged(self) -> dict[str, str]:
        if self._ready is None:
            login, self._note = await login_environment(self.base.get("SHELL"), self.base.get("HOME"))
            self._ready, self._added = merged(self.base, login)
            if self._added or self._note:
                log.info("package installs take from the login environment: %s%s", ", ".join(self._added) or "nothing",
                         f" ({self._note})" if self._note else "")
        return self._ready

    def describe(self, ecosystem: str) -> str:
        """What configuration an install used, for a failure's message."""
        env = self._ready if self._ready is not None else dict(self.base)
        parts = []
        if ecosystem == "npm":
            parts.append(f"npm global config {self._npm.get('globalconfig', '(not read)')}, user config "
                         f"{self._npm.get('userconfig', '(not read)')}")
        else:
            parts.append(f"pip config files {', '.join(pip_config_files(env)) or 'none'}")
        proxy = next((f"{name}={_without_credentials(env[name])}" for name in _PROXIES if env.get(name)), "none")
        ca = [name for name in _CA if env.get(name)]
        parts.append(f"proxy: {proxy}")
        parts.append(f"CA variables: {', '.join(ca) or 'none'}")
        login = f"from the login shell: {', '.join(self._added) or 'nothing'}"
        parts.append(f"{login} ({self._note})" if self._note else login)
        return "; ".join(parts)


def _without_credentials(url: str) -> str:
    """A proxy URL as a log may show it: ``http://user:secret@proxy:3128`` -> ``http://…@proxy:3128``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "…@" + authority.rsplit("@", 1)[1]
    return f"{scheme}{sep}{authority}{slash}{path}"


async def _npm_config_files(npm: str, env: Mapping[str, str]) -> dict[str, str]:
    """npm's global and user configuration files as npm reports them run as the user would (no --prefix)."""
    try:
        process = await asyncio.create_subprocess_exec(
            npm, "config", "get", "globalconfig", "userconfig", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=dict(env), cwd="/")
        output, _ = await asyncio.wait_for(process.communicate(), NPM_CONFIG_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return {}
    found = {}
    for line in output.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("globalconfig", "userconfig") and value.strip():
            found[key.strip()] = value.strip()
    return found


def pip_config_files(env: Mapping[str, str]) -> list[str]:
    """The pip configuration files that exist, in the order pip reads them (site-wide, user, environment)."""
    home = Path(env.get("HOME") or "~").expanduser()
    dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    candidates = [*(Path(d) / "pip" / "pip.conf" for d in dirs), Path("/etc/pip.conf"), home / ".pip" / "pip.conf",
                  config_home / "pip" / "pip.conf", Path(sys.prefix) / "pip.conf"]
    if env.get("PIP_CONFIG_FILE"):
        candidates.append(Path(env["PIP_CONFIG_FILE"]))
    return [str(path) for path in candidates if path.is_file()]

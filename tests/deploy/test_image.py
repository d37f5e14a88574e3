"""deploy/image/Dockerfile read as a file: two stages, the locked requirements installed with their hashes, a slim
runtime with bubblewrap and nothing else, a numeric non-root user, volumes for everything Bastion writes, nothing
fetched by URL and no secret baked in. The image itself is not built here: no Docker engine runs on the test machine
and no registry is reachable (docs/deploy.md, "The container image")."""

from __future__ import annotations

import re
import shlex
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.dockerfile import DOCKERFILE, ENTRYPOINT, ROOT, stages

PREAMBLE, STAGES = stages(DOCKERFILE.read_text())
BUILDER, RUNTIME = STAGES if len(STAGES) == 2 else (None, None)


def run_text(stage) -> str:
    return "\n".join(i.arguments for i in stage.all("RUN"))


def test_two_stages_on_one_base():
    assert [s.name for s in STAGES] == ["builder", "runtime"]
    # The venv copied from the builder links the builder's interpreter: both stages must be the same base.
    assert BUILDER.base == RUNTIME.base == "${PYTHON_IMAGE}"
    (default,) = [i.arguments for i in PREAMBLE if i.keyword == "ARG"]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim-\w+(@sha256:[0-9a-f]{64})?", default)
    # The locks are made for CPython 3.11 (Makefile: LOCK_FLAGS).
    assert "--python-version 3.11" in (ROOT / "Makefile").read_text()


def test_the_builder_installs_the_locks_with_their_hashes():
    runs = run_text(BUILDER)
    assert "pip install --require-hashes --no-deps -r /src/requirements.lock" in runs
    assert "pip install --require-hashes --no-deps -r /src/build-requirements.lock" in runs
    # Bastion's own wheel is built without build isolation, so pip fetches no unhashed setuptools for it.
    assert "--no-build-isolation" in runs and "pip install --no-deps /src/dist/" in runs
    copied = {word for i in BUILDER.all("COPY") for word in i.words()[:-1]}
    assert {"requirements.lock", "deploy/image/build-requirements.lock", "pyproject.toml", "README.md",
            "bastion"} <= copied
    for source in copied:
        assert (ROOT / source).exists(), source


def test_the_build_lock_pins_what_pyproject_builds_with():
    lock = (ROOT / "deploy" / "image" / "build-requirements.lock").read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", lock, re.M)
    assert entries, "no pinned entry with hashes"
    pinned = {name.lower(): Version(version) for name, version, _ in entries}
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, build):
        assert requirement.name.lower() in pinned, requirement
        assert requirement.specifier.contains(pinned[requirement.name.lower()]), requirement
    # every requirement line of the lock has hashes (a bare pin would make pip refuse --require-hashes anyway)
    assert len(re.findall(r"^[A-Za-z0-9_.-]+==", lock, re.M)) == len(entries)


def test_the_runtime_has_bubblewrap_and_nothing_else():
    runs = run_text(RUNTIME)
    (install,) = re.findall(r"apt-get install (.*?)(?:&&|$)", runs)
    words = shlex.split(install)
    assert "--no-install-recommends" in words
    assert [w for w in words if not w.startswith("-")] == ["bubblewrap", "libseccomp2"]
    assert "rm -rf /var/lib/apt/lists/*" in runs
    assert not RUNTIME.all("ADD")
    copies = [i.arguments for i in RUNTIME.all("COPY")]
    assert copies == ["--from=builder /opt/bastion /opt/bastion",
                      "deploy/image/entrypoint.sh /usr/local/bin/bastion-entrypoint"]


def test_a_numeric_non_root_user():
    (user,) = RUNTIME.all("USER")
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0 and int(gid) != 0
    assert RUNTIME.instructions.index(user) > max(RUNTIME.instructions.index(i) for i in RUNTIME.all("RUN"))


def test_everything_bastion_writes_is_on_a_volume():
    env = RUNTIME.env()
    (volume,) = RUNTIME.all("VOLUME")
    volumes = volume.words()
    assert "/tmp" in volumes
    for variable in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "HOME"):
        assert any(env[variable] == v or env[variable].startswith(v + "/") for v in volumes), variable
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # no .pyc written next to the read-only code
    # The volume's folder belongs to the image's user, made before the USER line.
    uid = RUNTIME.all("USER")[0].arguments
    assert f"chown {uid} /var/lib/bastion" in run_text(RUNTIME)


def test_no_url_fetched_and_no_secret_baked_in():
    for stage in STAGES:
        assert not stage.all("ADD"), "ADD fetches URLs and unpacks archives: COPY only"
        for instruction in stage.all("RUN"):  # what runs at build time fetches nothing by URL (pip: the locks)
            assert not re.search(r"\b(curl|wget)\b|https?://", instruction.arguments), instruction
        for instruction in stage.all("ENV") + stage.all("ARG"):
            for word in shlex.split(instruction.arguments):
                name = word.partition("=")[0]
                assert not re.search(r"KEY|TOKEN|PASSWORD|SECRET|CREDENTIAL", name, re.I), name
        for instruction in stage.all("COPY"):
            assert not re.search(r"\.env\b|\.key\b|\.pem\b|api_keys|credentials", instruction.arguments), instruction
    assert not re.search(r"--mount=type=secret", DOCKERFILE.read_text())


def test_entrypoint_healthcheck_and_default_command():
    (entrypoint,) = RUNTIME.all("ENTRYPOINT")
    assert entrypoint.words() == ["/usr/local/bin/bastion-entrypoint"]
    (command,) = RUNTIME.all("CMD")
    words = command.words()
    assert words[:2] == ["serve", "/etc/bastion/bastion.toml"]
    listen = words[words.index("--http") + 1]
    port = listen.rpartition(":")[2]
    assert [i.arguments for i in RUNTIME.all("EXPOSE")] == [port]
    (health,) = RUNTIME.all("HEALTHCHECK")
    assert f"http://127.0.0.1:{port}/healthz" in health.arguments
    script = ENTRYPOINT.read_text()
    assert script.startswith("#!/bin/sh\n") and "bastion sandbox doctor" in script and 'exec bastion "$@"' in script
    assert ENTRYPOINT.stat().st_mode & 0o111


def test_the_build_context_is_only_what_is_copied():
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"  # everything excluded, then the few files let back in
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    copied = {word for stage in STAGES for i in stage.all("COPY") if not i.arguments.startswith("--from=")
              for word in i.words()[:-1]}
    assert allowed == copied

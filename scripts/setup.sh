#!/usr/bin/env bash
# Installs everything Bastion and its tests need on a fresh Debian machine: system packages, a virtual
# environment with Bastion and its Python dependencies, and the reference MCP servers from npm.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in git bubblewrap libseccomp2 iproute2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    else
        sudo apt-get update -qq >&2 && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    python3 -m venv .venv >&2
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing Python packages" >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q -e '.[dev]' >&2
    touch "$stamp"
fi
if [ ! -d node_modules ] || [ package.json -nt node_modules ] || [ package-lock.json -nt node_modules ]; then
    echo "setup: installing reference servers from npm" >&2
    npm ci --no-audit --no-fund --loglevel=error >&2
    touch node_modules
fi

# What the launcher tests install offline (npx and uvx servers of a stock client file, through Bastion's own
# installs): `npm ci` caches tarballs but not the registry documents a fresh `npm install PKG` resolves with, so
# one throwaway install per package puts both in ~/.npm; the Python server's wheels go into a wheelhouse.
launcher_stamp=.cache/launchers.stamp
if [ ! -f "$launcher_stamp" ] || [ scripts/setup.sh -nt "$launcher_stamp" ]; then
    echo "setup: caching the launcher tests' npm packages and Python wheels" >&2
    mkdir -p .cache
    for spec in @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-memory \
                @modelcontextprotocol/server-everything @modelcontextprotocol/server-memory@2026.7.4; do
        rm -rf .cache/npm-warm
        npm install --prefix .cache/npm-warm --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "$spec" >&2
    done
    rm -rf .cache/npm-warm
    .venv/bin/python -m pip download -q -d .cache/wheelhouse --only-binary=:all: mcp-server-time==2026.10.19 >&2
    touch "$launcher_stamp"
fi

# What the packaging test installs offline into fresh virtual environments: wheels of every dependency of the
# package (built here where only a source archive is published), the build backend, and pip for pipx's own venv.
packaging_stamp=.cache/packaging.stamp
if [ ! -f "$packaging_stamp" ] || [ pyproject.toml -nt "$packaging_stamp" ] || [ scripts/setup.sh -nt "$packaging_stamp" ]; then
    echo "setup: wheels for the packaging test (fresh installs of Bastion, offline)" >&2
    rm -rf .cache/wheelhouse-packaging
    .venv/bin/python -m pip wheel -q -w .cache/wheelhouse-packaging . 'setuptools>=77' pip >&2
    rm -f .cache/wheelhouse-packaging/mcp_bastion-*.whl  # the test builds its own, from the tree as it is then
    touch "$packaging_stamp"
fi

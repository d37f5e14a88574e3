#!/usr/bin/env bash
# Installs everything Bastion and its tests need on a fresh Debian machine: system packages, a virtual
# environment with Bastion and its Python dependencies, and the reference MCP servers from npm.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in git bubblewrap libseccomp2 iproute2 chromium redis-server haproxy faketime runsc util-linux; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# kubectl for the manifests' offline checks (tests/deploy): Debian's kubernetes-client where the release has it and
# no kubectl is on PATH already (another package's /usr/bin/kubectl, such as the Google Cloud SDK's, collides with it).
if ! command -v kubectl >/dev/null 2>&1 && apt-cache show kubernetes-client >/dev/null 2>&1; then
    missing+=(kubernetes-client)
fi
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

# The official Python SDK's conformance "everything" server, which the conformance tests serve directly and behind
# Bastion: it ships only in the source archive of the SDK release Bastion depends on (pyproject.toml pins mcp), not in
# its wheel. pip fetches the archive, its digest must be the one below, and only the server's package is kept.
everything_version=2.3.0
everything_sha256=8b147a50441cf059dc88c684e0aeed3687f0aa0f39c6cde7b90330effd2b34d8
everything_dir=.cache/mcp-everything-server
if [ ! -f "$everything_dir/sha256-$everything_sha256" ]; then
    echo "setup: the SDK's conformance everything-server (mcp $everything_version source archive)" >&2
    rm -rf .cache/mcp-sdist "$everything_dir"
    mkdir -p .cache/mcp-sdist "$everything_dir"
    .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d .cache/mcp-sdist "mcp==$everything_version" >&2
    archive=.cache/mcp-sdist/mcp-$everything_version.tar.gz
    echo "$everything_sha256  $archive" | sha256sum --check --quiet >&2
    tar -xzf "$archive" -C "$everything_dir" --strip-components=4 \
        "mcp-$everything_version/examples/servers/everything-server/mcp_everything_server" \
        "mcp-$everything_version/examples/servers/everything-server/README.md"
    tar -xzf "$archive" -C "$everything_dir" --strip-components=1 "mcp-$everything_version/LICENSE"
    rm -rf .cache/mcp-sdist
    touch "$everything_dir/sha256-$everything_sha256"
fi

# What the launcher tests install offline (npx and uvx servers of a stock client file, through Bastion's own
# installs): `npm ci` caches tarballs but not the registry documents a fresh `npm install PKG` resolves with, so
# one throwaway install per package puts both in ~/.npm; the Python servers' wheels go into a wheelhouse.
launcher_stamp=.cache/launchers.stamp
if [ ! -f "$launcher_stamp" ] || [ scripts/setup.sh -nt "$launcher_stamp" ]; then
    echo "setup: caching the launcher tests' npm packages and Python wheels" >&2
    mkdir -p .cache
    for spec in @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-memory \
                @modelcontextprotocol/server-everything @modelcontextprotocol/server-memory@2026.7.4 \
                @modelcontextprotocol/server-sequential-thinking; do
        rm -rf .cache/npm-warm
        npm install --prefix .cache/npm-warm --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "$spec" >&2
    done
    rm -rf .cache/npm-warm
    .venv/bin/python -m pip download -q -d .cache/wheelhouse --only-binary=:all: mcp-server-time==2026.10.19 >&2
    # sqlite's server needs the SDK before 2.0 (uvx --with 'mcp<2'), which time's cannot share: resolved apart
    .venv/bin/python -m pip download -q -d .cache/wheelhouse --only-binary=:all: mcp-server-sqlite==2025.4.25 \
        'mcp[cli]<2' >&2
    # A Cursor-style file's web server (the prompt counts of docs/policy.md run it, offline).
    .venv/bin/python -m pip download -q -d .cache/wheelhouse --only-binary=:all: mcp-server-fetch==2026.10.24 >&2
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

"""`make audit`: pip-audit over the lock files, failing loudly when any pinned package could not be checked.

pip-audit reports a package it could not look up as skipped and still exits 0 ("No known vulnerabilities found"),
which would read as a clean audit when nothing was audited at all. Here a skipped package is a failure, with
pip-audit's own reason for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PIP_AUDIT = Path(sys.executable).parent / "pip-audit"


def audit(service: str, lock: Path) -> int:
    """Audit one lock file; print what was found to stderr; return the exit status it deserves."""
    run = subprocess.run([str(PIP_AUDIT), "--disable-pip", "--requirement", str(lock), "--format", "json",
                          "--progress-spinner", "off", "--vulnerability-service", service], capture_output=True, text=True, check=False)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        lines = run.stderr.strip().splitlines() or ["no output"]
        print(f"audit: {lock}: pip-audit failed (exit {run.returncode}): {lines[-1]}", file=sys.stderr)
        return 1
    dependencies = report["dependencies"]
    skipped = [d for d in dependencies if "skip_reason" in d]
    vulnerable = [d for d in dependencies if d.get("vulns")]
    for dependency in vulnerable:
        ids = ", ".join(v["id"] for v in dependency["vulns"])
        print(f"audit: {lock}: {dependency['name']} {dependency['version']}: {ids}", file=sys.stderr)
    if skipped:
        print(f"audit: {lock}: {len(skipped)} of {len(dependencies)} pinned packages could not be audited; "
              f"the first: {skipped[0]['skip_reason']}", file=sys.stderr)
    if vulnerable or skipped or run.returncode not in (0, 1):
        return 1
    print(f"audit: {lock}: {len(dependencies)} pinned packages, no known vulnerabilities", file=sys.stderr)
    return 0


def main(service: str, locks: list[str]) -> int:
    statuses = [audit(service, Path(lock)) for lock in locks]
    return max(statuses, default=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))

"""Run one harness under libFuzzer: ``python -m tests.fuzz.run TARGET [libFuzzer flags] [corpus dirs]``.

Only Bastion's own modules are instrumented (``bastion.*``): coverage is Bastion's code reached, not that of the
libraries under it. The harness module is imported inside the instrumentation so that the Bastion modules it
imports are instrumented as they load."""

from __future__ import annotations

import importlib
import sys

import atheris


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tests.fuzz.run TARGET [libFuzzer flags] [corpus dirs]")
    target = sys.argv.pop(1)
    with atheris.instrument_imports(include=["bastion"]):
        harness = importlib.import_module(f"tests.fuzz.fuzz_{target}")
    setup = getattr(harness, "setup", None)
    if setup is not None:
        setup()
    atheris.Setup(sys.argv, harness.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

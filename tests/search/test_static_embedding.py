"""Static token vectors: the file format, pooling, the packaged model and its integrity check."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bastion.search.static_embedding import StaticEncoder, load_static_encoder, read_safetensor

from .conftest import REPO, installed


@pytest.fixture(scope="module")
def static():
    return installed(load_static_encoder(), "static model")


def write_safetensors(path, name, array):
    header = json.dumps({name: {"dtype": "F16", "shape": list(array.shape), "data_offsets": [0, array.nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + array.tobytes())


def test_read_safetensor_returns_the_stored_tensor(tmp_path):
    stored = np.arange(12, dtype=np.float16).reshape(3, 4) / 4
    write_safetensors(tmp_path / "t.safetensors", "embedding.weight", stored)
    got = read_safetensor(tmp_path / "t.safetensors", "embedding.weight")
    assert got.dtype == np.float16 and got.shape == (3, 4)
    assert np.array_equal(got, stored)


def test_vectors_are_unit_length_and_empty_text_is_zero(static):
    vecs = static.encode(["send an email to a colleague", "", "weather in Paris"])
    assert vecs.shape == (3, static.dim)
    assert np.allclose(np.linalg.norm(vecs[[0, 2]], axis=1), 1.0, atol=1e-5)
    assert not vecs[1].any()


def test_pooling_is_the_mean_of_the_token_vectors(static):
    text = "convert currency"
    ids = static._tokenizer.encode(text, add_special_tokens=False).ids
    mean = static._table[ids].astype(np.float64).mean(axis=0)
    assert np.allclose(static.encode([text])[0], mean / np.linalg.norm(mean), atol=1e-5)


def test_batches_give_the_same_vectors_as_single_texts(static):
    texts = [f"tool number {i} does thing {i % 7}" for i in range(600)]  # more than one chunk
    batch = static.encode(texts)
    assert np.allclose(batch[[0, 300, 599]], np.vstack([static.encode([texts[i]]) for i in (0, 300, 599)]), atol=1e-6)


def test_related_texts_are_closer_than_unrelated_ones(static):
    mail, notify, weather = static.encode(["send an email message", "mail a note to my boss", "temperature forecast for a city"])
    assert mail @ notify > mail @ weather


def test_a_tampered_weights_file_is_refused(tmp_path, static):
    import importlib.util

    original = next(iter(importlib.util.find_spec("wordllama").submodule_search_locations))
    fake = tmp_path / "wordllama"
    (fake / "weights").mkdir(parents=True)
    shutil.copytree(f"{original}/tokenizers", fake / "tokenizers")
    (fake / "__init__.py").write_text("")
    write_safetensors(fake / "weights" / "l2_supercat_256.safetensors", "embedding.weight", np.zeros((4, 256), np.float16))
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from bastion.search.static_embedding import load_static_encoder
        print(load_static_encoder())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "EncoderUnavailable" in proc.stdout and "expected 16,384,096 bytes" in proc.stdout  # refused unread


def test_static_encoder_is_a_text_encoder(static):
    assert isinstance(static, StaticEncoder)
    assert static.model_id.startswith("wordllama-l2-256-")

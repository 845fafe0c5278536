"""Byte-level tokenisation shared by Text (IMDb) and Retrieval (AAN).

LRA encodes documents with ``tfds.deprecated.text.ByteTextEncoder()``: the raw UTF-8 bytes, each
shifted by one so that 0 is free for padding (ids 1..256, vocabulary 257). Documents are truncated
to ``max_len`` bytes and padded with 0 at the end.
"""
from __future__ import annotations

import numpy as np

PAD = 0
VOCAB_SIZE = 257


def as_bytes(text: str | bytes | np.ndarray) -> bytes:
    """tfds gives ``bytes`` (or ``str`` in mocked data); a str is encoded as UTF-8 (what tf does)."""
    if isinstance(text, np.ndarray):
        text = text.item()
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


def byte_ids(doc: bytes, max_len: int) -> np.ndarray:
    """``doc[:max_len]`` as ids ``byte + 1`` (int16)."""
    return np.frombuffer(doc[:max_len], dtype=np.uint8).astype(np.int16) + 1


def encode_into(ids: np.ndarray, lengths: np.ndarray, row: int | tuple, doc: bytes) -> None:
    """Write one document's ids into ``ids[row]`` (already zero = padded) and its length."""
    enc = byte_ids(doc, ids.shape[-1])
    ids[row][: len(enc)] = enc
    lengths[row] = len(enc)


def encode(docs: list[bytes], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``[M, max_len]`` int16 ids and ``[M]`` lengths."""
    ids = np.zeros((len(docs), max_len), dtype=np.int16)
    lengths = np.zeros(len(docs), dtype=np.int32)
    for i, d in enumerate(docs):
        encode_into(ids, lengths, i, d)
    return ids, lengths


def decode(ids: np.ndarray) -> bytes:
    """Inverse of :func:`byte_ids` (padding dropped); for tests and debugging."""
    ids = np.asarray(ids)
    return (ids[ids > 0] - 1).astype(np.uint8).tobytes()

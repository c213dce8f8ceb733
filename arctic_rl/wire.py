"""Tensors over HTTP: a JSON tree plus one safetensors blob. Never pickle.

Message layout: 8-byte little-endian length N, N bytes of UTF-8 JSON, then safetensors bytes.
In the JSON tree a tensor is {"__tensor__": "<key in the blob>"}; everything else is plain JSON
(dicts with string keys, lists, str, int, float, bool, None).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from arctic_rl.errors import ProtocolError

CONTENT_TYPE = "application/x-arctic-rl"
MAX_DEPTH = 32


def encode(obj: Any) -> bytes:
    tensors: dict[str, torch.Tensor] = {}

    def walk(x, depth=0):
        if depth > MAX_DEPTH:
            raise ProtocolError(f"message nests deeper than {MAX_DEPTH} levels")
        if isinstance(x, torch.Tensor):
            key = f"t{len(tensors)}"
            # safetensors refuses shared or strided storage: give it a compact private copy.
            tensors[key] = x.detach().cpu().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(x, dict):
            return {str(k): walk(v, depth + 1) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, depth + 1) for v in x]
        if x is None or isinstance(x, (str, int, float, bool)):
            return x
        raise ProtocolError(f"cannot send a value of type {type(x).__name__} (only tensors and JSON values)")

    tree = json.dumps(walk(obj), allow_nan=True).encode()
    blob = st_save(tensors) if tensors else b""
    return struct.pack("<Q", len(tree)) + tree + blob


def decode(data: bytes, max_bytes: int | None = None) -> Any:
    if max_bytes is not None and len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) < 8:
        raise ProtocolError(f"message too short ({len(data)} bytes): expected an 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ProtocolError(f"header length {n} exceeds the message ({len(data) - 8} bytes after the prefix)")
    try:
        tree = json.loads(data[8 : 8 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"message header is not valid JSON: {e}") from None
    blob = data[8 + n :]
    try:
        tensors = st_load(blob) if blob else {}
    except Exception as e:  # safetensors raises its own error types for corrupt blobs
        raise ProtocolError(f"tensor blob is not valid safetensors: {e}") from None

    def walk(x, depth=0):
        if depth > MAX_DEPTH:
            raise ProtocolError(f"message nests deeper than {MAX_DEPTH} levels")
        if isinstance(x, dict):
            if set(x) == {"__tensor__"}:
                key = x["__tensor__"]
                if key not in tensors:
                    raise ProtocolError(f"message refers to tensor {key!r}, which the blob does not hold")
                return tensors[key]
            return {k: walk(v, depth + 1) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, depth + 1) for v in x]
        return x

    return walk(tree)

"""Tensors over HTTP: a JSON tree plus one safetensors blob. Never pickle.

Message layout: 8-byte little-endian length N, N bytes of UTF-8 JSON, then safetensors bytes.
In the JSON tree a tensor is {"__tensor__": "<key in the blob>"}; everything else is plain JSON
(dicts with string keys, lists, str, int, float, bool, None).
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from typing import Any

import torch
from safetensors.torch import save as st_save

from arctic_rl.errors import ProtocolError

CONTENT_TYPE = "application/x-arctic-rl"
MAX_DEPTH = 32
# load_tensors views the message's bytes and copies each tensor out at once: a read-only buffer (a client's
# response) is never written through, so torch's warning about one says nothing here.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


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


def decode(
    data: bytes | bytearray | memoryview, max_bytes: int | None = None, max_json_bytes: int | None = None
) -> Any:
    """A message back to its tree. `max_json_bytes` caps the JSON part: parsing JSON holds the GIL throughout (the
    server's event loop waits meanwhile), unlike the tensors, which torch copies without it."""
    data = memoryview(data).cast("B")
    if max_bytes is not None and len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) < 8:
        raise ProtocolError(f"message too short ({len(data)} bytes): expected an 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ProtocolError(f"header length {n} exceeds the message ({len(data) - 8} bytes after the prefix)")
    if max_json_bytes is not None and n > max_json_bytes:
        raise ProtocolError(
            f"the message's JSON part has {n} bytes, over the limit of {max_json_bytes} (server.max_json_bytes): "
            "send large arrays as tensors"
        )
    try:
        tree = json.loads(bytes(data[8 : 8 + n]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"message header is not valid JSON: {e}") from None
    blob = data[8 + n :]
    try:
        # the tensor part's own JSON header counts against the same cap: it is parsed holding the GIL too
        tensors = load_tensors(blob, None if max_json_bytes is None else max_json_bytes - n, n) if len(blob) else {}
    except ProtocolError:
        raise
    except Exception as e:  # a corrupt header of any shape
        raise ProtocolError(f"tensor blob is not valid safetensors: {type(e).__name__}: {e}") from None

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


DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _naturals(v: Any, lengths) -> bool:
    return isinstance(v, list) and len(v) in lengths and all(type(x) is int and x >= 0 for x in v)


def load_tensors(blob: memoryview, max_header_bytes: int | None = None, tree_bytes: int = 0) -> dict[str, torch.Tensor]:
    """safetensors bytes -> tensors, checked as safetensors checks them (known dtypes, sizes that match the shapes,
    spans that tile the data). Not safetensors.torch.load: it copies every byte holding the GIL, which stalls the
    HTTP server's event loop for seconds on a large body; here torch copies each tensor, releasing the GIL.
    `max_header_bytes`: what is left of server.max_json_bytes after the message's JSON tree (`tree_bytes`), checked
    before the header is parsed."""
    if len(blob) < 8:
        raise ProtocolError(f"tensor blob of {len(blob)} bytes: too short for its header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ProtocolError(f"tensor blob header length {n} exceeds the blob ({len(blob) - 8} bytes)")
    if max_header_bytes is not None and n > max_header_bytes:
        raise ProtocolError(
            f"the message's tensor header has {n} bytes of JSON; with its JSON part's {tree_bytes} bytes that is "
            f"over the limit of {max_header_bytes + tree_bytes} (server.max_json_bytes): send fewer, larger tensors"
        )
    header = json.loads(bytes(blob[8 : 8 + n]).decode())
    if not isinstance(header, dict):
        raise ProtocolError("tensor blob header is not a JSON object")
    data = blob[8 + n :]
    raw = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    out, spans = {}, []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        meta = meta if isinstance(meta, dict) else {}
        dtype = DTYPES.get(str(meta.get("dtype")))
        shape, offsets = meta.get("shape"), meta.get("data_offsets")
        if dtype is None or not _naturals(shape, range(0, 65)) or not _naturals(offsets, (2,)):
            raise ProtocolError(f"tensor {name!r:.60}: bad dtype, shape or data_offsets in the blob header")
        assert isinstance(shape, list) and isinstance(offsets, list)
        begin, end = offsets
        numel = math.prod(shape)
        if not begin <= end <= len(data) or end - begin != numel * dtype.itemsize:
            raise ProtocolError(f"tensor {name!r:.60}: data_offsets {offsets} do not hold shape {shape} of {dtype}")
        spans.append((begin, end))
        out[name] = raw[begin:end].clone().view(dtype).reshape(shape)
    spans.sort()
    if [b for b, _ in spans] != [0] + [e for _, e in spans[:-1]] or (spans[-1][1] if spans else 0) != len(data):
        raise ProtocolError("tensor blob: the tensors' data_offsets do not tile its data")
    return out

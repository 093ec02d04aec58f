"""Minimal safetensors reader/writer on NumPy alone (no torch, no `safetensors` package).

Format (https://github.com/huggingface/safetensors): 8-byte little-endian u64 header length N, then N
bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the byte buffer; offsets are relative to the buffer start, and the buffer has no holes.

Supported dtypes: F32, F16, BF16 (NumPy has no bfloat16: BF16 is converted to/from float32; the
conversion to BF16 rounds to nearest even, NaN stays NaN), plus F64/I64/I32/I16/I8/U8/BOOL for reading
and writing arrays already of that type.

API:
    save_file(tensors, path, dtype=None, metadata=None)   # atomic: temp file + os.replace
    load_file(path, names=None) -> dict[name, np.ndarray]  # BF16 -> float32, F16 -> float16
    read_header(path) -> (header_dict_without_metadata, metadata, data_start)
    f32_to_bf16_bits(a) -> uint16 array; bf16_bits_to_f32(u16) -> float32 array
"""

from __future__ import annotations

import json
import os
import struct
import tempfile

import numpy as np

__all__ = ["save_file", "load_file", "read_header", "f32_to_bf16_bits", "bf16_bits_to_f32",
           "DTYPE_ALIASES", "SafetensorsError"]


class SafetensorsError(ValueError):
    pass


# safetensors dtype -> (numpy storage dtype, element size)
_STORAGE = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_FROM_NUMPY = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
    np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}
# user-facing spellings -> safetensors dtype
DTYPE_ALIASES = {"bf16": "BF16", "bfloat16": "BF16", "f16": "F16", "fp16": "F16", "float16": "F16",
                 "f32": "F32", "fp32": "F32", "float32": "F32", "f64": "F64", "float64": "F64"}


def f32_to_bf16_bits(a) -> np.ndarray:
    """float -> bfloat16 bit patterns (uint16), round to nearest even; NaN -> quiet NaN, keeps sign."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    # u + 0x7FFF + lsb cannot overflow 32 bits for finite/inf inputs (max finite rounds up to inf,
    # which is the IEEE result); NaNs are handled separately.
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_bits_to_f32(u16) -> np.ndarray:
    u16 = np.asarray(u16, dtype=np.uint16)
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _encode(arr: np.ndarray, dtype: str | None) -> tuple[str, np.ndarray]:
    """Return (safetensors dtype, little-endian contiguous storage array)."""
    arr = np.asarray(arr)
    if dtype is not None and arr.dtype.kind == "f":
        st = DTYPE_ALIASES.get(dtype.lower(), dtype.upper())
    elif arr.dtype in _FROM_NUMPY:
        st = _FROM_NUMPY[arr.dtype]
    else:
        raise SafetensorsError(f"unsupported array dtype {arr.dtype}")
    if st == "BF16":
        return st, f32_to_bf16_bits(arr)
    if st not in _STORAGE:
        raise SafetensorsError(f"unsupported safetensors dtype {st}")
    return st, np.ascontiguousarray(arr.astype(_STORAGE[st], copy=False))


def save_file(tensors: dict, path: str, dtype: str | None = None, metadata: dict | None = None) -> int:
    """Write `tensors` (name -> array) to `path` atomically. Float arrays are converted to `dtype`
    ("bf16"/"f16"/"f32"/...) when given, else stored as their own dtype. Returns the file size.

    Tensors are laid out by descending element size, then name, so every tensor's offset is aligned
    to its element size (the header is padded with spaces to a multiple of 8 bytes)."""
    encoded = {}
    for name, arr in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"bad tensor name {name!r}")
        encoded[name] = _encode(arr, dtype)
    order = sorted(encoded, key=lambda n: (-encoded[n][1].dtype.itemsize, n))
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for name in order:
        st, data = encoded[name]
        header[name] = {"dtype": st, "shape": list(np.shape(tensors[name])),
                        "data_offsets": [off, off + data.nbytes]}
        off += data.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(hjson)))
            f.write(hjson)
            for name in order:
                f.write(encoded[name][1].tobytes(order="C"))
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp creates 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return 8 + len(hjson) + off


def read_header(path: str) -> tuple[dict, dict, int]:
    """Return (tensor entries, __metadata__ dict, byte offset of the data buffer), validated."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: truncated (no header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > min(size - 8, 100 << 20):
            raise SafetensorsError(f"{path}: header length {n} exceeds file size {size}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: bad header JSON: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    data_start = 8 + n
    spans = []
    for name, e in header.items():
        st = e.get("dtype")
        if st not in _STORAGE:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {st}")
        b, end = e["data_offsets"]
        nel = int(np.prod(e["shape"], dtype=np.int64))
        if end - b != nel * _STORAGE[st].itemsize:
            raise SafetensorsError(f"{path}: tensor {name}: {end - b} bytes for shape {e['shape']} {st}")
        if data_start + end > size:
            raise SafetensorsError(f"{path}: tensor {name} runs past end of file")
        spans.append((b, end))
    spans.sort()
    pos = 0
    for b, end in spans:
        if b != pos:
            raise SafetensorsError(f"{path}: data buffer has a hole or overlap at byte {pos}")
        pos = end
    return header, meta, data_start


def load_file(path: str, names=None, raw_bf16: bool = False) -> dict:
    """Read tensors (all, or only `names`). BF16 -> float32 (exact) unless raw_bf16 (then uint16
    bit patterns); F16 stays float16; others keep their dtype. Arrays are independent copies."""
    header, _, data_start = read_header(path)
    want = header.keys() if names is None else names
    out = {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        for name in want:
            if name not in header:
                raise SafetensorsError(f"{path}: no tensor named {name}")
            e = header[name]
            b, end = e["data_offsets"]
            a = np.frombuffer(mm[data_start + b:data_start + end].tobytes(), dtype=_STORAGE[e["dtype"]])
            a = a.reshape(e["shape"])
            if e["dtype"] == "BF16" and not raw_bf16:
                a = bf16_bits_to_f32(a)
            out[name] = a
    finally:
        del mm
    return out


def dtype_of(path: str) -> dict:
    """name -> safetensors dtype string, from the header only."""
    header, _, _ = read_header(path)
    return {k: v["dtype"] for k, v in header.items()}

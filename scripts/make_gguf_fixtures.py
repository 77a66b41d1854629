#!/usr/bin/env python3
"""Writes charm's GGUF reader fixtures with the `gguf` Python package.

Run by hand (CI needs no Python: the outputs are committed):

    python3 -m venv /work/gguf-venv
    /work/gguf-venv/bin/pip install gguf==0.19.0 numpy
    /work/gguf-venv/bin/python scripts/make_gguf_fixtures.py

Writes into tests/fixtures/gguf/:

- `types.gguf`: one tensor of every weight type charm reads (F32, F16, BF16,
  Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4, IQ4_NL, IQ4_XS, Q2_K,
  Q3_K), 4 rows x 512
  columns each, plus stacked 3-D expert tensors, 1-D vectors, and metadata
  of every GGUF value type (scalars, strings, arrays, a nested array), with
  `general.alignment = 64`. Written by `gguf.GGUFWriter`.
- `reference.bin`: little-endian f32: first the 512-element activation
  vector `x`, then every tensor's values as `gguf.quants.dequantize` gives
  them (read back from `types.gguf` with `gguf.GGUFReader`).
- `reference.json`: per tensor its type, ggml dims, where its values start in
  `reference.bin` (in f32 elements), and for every row (a tensor viewed as
  `[n_elements / dims[0], dims[0]]`) the float64 dot product of the
  dequantized row with `x[:dims[0]]`, as the hex of the f64 bits.

Types the package can quantize (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, MXFP4) are quantized from random normal data with
`gguf.quants.quantize`; their last row is then overwritten with random but
valid blocks (finite f16 scales; MXFP4 exponents that keep every value and
dot product finite in f32, the subnormal-scale bytes 0 and 1 included), so
that codes the quantizer never writes (e.g. Q8_0's -128, MXFP4's -0) are
covered too. The package cannot quantize Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
Q2_K, Q3_K: those tensors are random valid blocks (finite f16 scales,
including negative, zero and subnormal ones) written as raw bytes with their
type (the last four last, from a generator of their own).
"""

import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
ROWS, COLS = 4, 512
rng = np.random.default_rng(20240611)


def f16_scales(n, g=None):
    """`n` finite f16 scales as uint16 bits: mostly small normals, plus a
    negative, a zero, a subnormal and a larger one (from generator `g`, the
    module's by default)."""
    g = g or rng
    v = (g.normal(size=n) * 0.02).astype(np.float16)
    special = np.array([-0.013, 0.0, 5.96e-8 * 37, 1.5], dtype=np.float16)
    v[: min(n, len(special))] = special[: min(n, len(special))]
    g.shuffle(v)
    return v.view(np.uint16)


def later_tensors():
    """IQ4_NL, IQ4_XS, Q2_K and Q3_K tensors (ROWS x COLS) of random valid
    blocks (the package cannot quantize them): random bytes with finite f16
    scales where each layout keeps them. From a generator of their own, so
    that the tensors and `x` written before they were added keep their
    bytes (and each type its bytes when a later one is added)."""
    g = np.random.default_rng(20261205)
    f16_at = {T.IQ4_NL: [0], T.IQ4_XS: [0], T.Q2_K: [80, 82], T.Q3_K: [108]}
    out = []
    for qtype in (T.IQ4_NL, T.IQ4_XS, T.Q2_K, T.Q3_K):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n = ROWS * COLS // block
        b = g.integers(0, 256, size=(n, size), dtype=np.uint8)
        for at in f16_at[qtype]:
            b[:, at : at + 2] = f16_scales(n, g).view(np.uint8).reshape(n, 2)
        out.append((f"t.{qtype.name.lower()}", np.ascontiguousarray(b.reshape(ROWS, -1)), qtype))
    return out


def random_blocks(qtype, n_blocks):
    """`n_blocks` random but valid blocks of `qtype` (uint8, one row each)."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if qtype == T.MXFP4:
        b[:, 0] = mxfp4_exponents(n_blocks)
        return b
    # Byte offsets of the f16 scales in each block layout.
    f16_at = {
        T.Q4_0: [0],
        T.Q4_1: [0, 2],
        T.Q5_0: [0],
        T.Q5_1: [0, 2],
        T.Q8_0: [0],
        T.Q4_K: [0, 2],
        T.Q5_K: [0, 2],
        T.Q6_K: [208],
    }[qtype]
    for at in f16_at:
        b[:, at : at + 2] = f16_scales(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b


def mxfp4_exponents(n):
    """`n` MXFP4 E8M0 exponent bytes (the block scale is `2^(e - 128)`):
    mostly near the quantizer's own (about 122 for this data), plus the
    subnormal-scale bytes 0 and 1, a 2 and a larger 140."""
    e = rng.integers(112, 132, size=n, dtype=np.uint8)
    special = np.array([0, 1, 2, 140], dtype=np.uint8)
    e[: min(n, len(special))] = special[: min(n, len(special))]
    rng.shuffle(e)
    return e


def quantized(qtype, shape):
    """A tensor of `shape` (numpy order, last = row length) as `qtype` bytes."""
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    n_blocks = shape[-1] // block
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        data = random_blocks(qtype, rows * n_blocks).reshape(rows, -1)
    else:
        w = (rng.normal(size=(rows, shape[-1])) * 0.05).astype(np.float32)
        data = gguf.quants.quantize(w, qtype).reshape(rows, -1)
        data[-1] = random_blocks(qtype, n_blocks).reshape(-1)
    return np.ascontiguousarray(data.reshape(*shape[:-1], -1))


def plain(qtype, shape):
    w = (rng.normal(size=shape) * 0.05).astype(np.float32)
    if qtype == T.F32:
        return w, None
    if qtype == T.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w, T.BF16), T.BF16


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "types.gguf"
    w = gguf.GGUFWriter(str(path), "charm-test")
    w.add_custom_alignment(64)
    # One key per value type; tests/tests/gguf_reader.rs asserts these values.
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", -1.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo, GGUF ✓")
    w.add_uint64("test.u64", (1 << 63) + 5)
    w.add_int64("test.i64", -(1 << 62) - 7)
    w.add_float64("test.f64", 0.1)
    w.add_array("test.array.i32", [1, -2, 3])
    w.add_array("test.array.str", ["a", "", "ü"])
    w.add_array("test.array.f32", [0.5, -0.25])
    w.add_array("test.array.bool", [True, False])
    w.add_key_value("test.array.u8", [0, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.array.u64", [0, (1 << 64) - 1], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("test.array.f64", [2.5, -0.1], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("test.array.nested", [[1, 2], [3]])

    tensors = []  # (name, numpy data, raw_dtype or None)
    for qtype in (T.F32, T.F16, T.BF16):
        data, raw = plain(qtype, (ROWS, COLS))
        tensors.append((f"t.{qtype.name.lower()}", data, raw))
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4):
        tensors.append((f"t.{qtype.name.lower()}", quantized(qtype, (ROWS, COLS)), qtype))
    # Stacked experts [n, rows, cols] (ggml dims [cols, rows, n]).
    tensors.append(("blk.0.ffn_gate_exps.weight", quantized(T.Q4_K, (3, 4, 512)), T.Q4_K))
    tensors.append(("blk.0.ffn_down_exps.weight", quantized(T.Q8_0, (3, 4, 256)), T.Q8_0))
    tensors.append(("blk.0.ffn_up_exps.weight", plain(T.F16, (3, 2, 256))[0], None))
    # 1-D vectors.
    tensors.append(("t.norm", plain(T.F32, (512,))[0], None))
    tensors.append(("t.vec_q8_0", quantized(T.Q8_0, (256,)), T.Q8_0))
    tensors.append(("t.vec_bf16", plain(T.BF16, (64,))[0], T.BF16))
    tensors += later_tensors()
    for name, data, raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # The reference: read the file back with the package and dequantize.
    x = rng.uniform(-1.0, 1.0, size=512).astype(np.float32)
    blob = [x.astype("<f4").tobytes()]
    at = len(x)
    entries = []
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        dims = [int(d) for d in t.shape]
        cols = dims[0]
        rows = deq.reshape(-1, cols).astype(np.float64)
        dots = rows @ x[:cols].astype(np.float64)
        entries.append(
            {
                "name": t.name,
                "type": t.tensor_type.name,
                "dims": dims,
                "ref_offset": at,
                "len": int(deq.size),
                "dots": [struct.pack(">d", float(d)).hex() for d in dots],
            }
        )
        blob.append(deq.astype("<f4").tobytes())
        at += deq.size
    (OUT / "reference.bin").write_bytes(b"".join(blob))
    meta = {
        "generated_by": "scripts/make_gguf_fixtures.py",
        "gguf_package": getattr(gguf, "__version__", None) or package_version(),
        "numpy": np.__version__,
        "file": "types.gguf",
        "x_len": 512,
        "tensors": entries,
    }
    (OUT / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(entries)} tensors to {OUT} ({total} bytes)")


def package_version():
    from importlib.metadata import version

    return version("gguf")


if __name__ == "__main__":
    main()

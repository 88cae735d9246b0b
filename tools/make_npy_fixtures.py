#!/usr/bin/python3
"""Writes the .npy reader fixtures in tests/data/npy/ (every dtype, 0-d, 3-d, zero-size, Fortran order, big-endian, versions 2.0/3.0) and expected.json."""

# Usage (from the repository root): /usr/bin/python3 tools/make_npy_fixtures.py
# expected.json records, per file, what numpy says the file holds: descr, dtype name, shape, order,
# format version, the flat C-order values (for people) and the C-order little-endian bytes as hex
# (for the C++ test, which compares them exactly, NaN payloads and -0.0 included). Which dtypes
# qeval accepts is the C++ test's business, not this script's.

import io
import json
import math
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "npy")


def plain(v):
    """A JSON-safe scalar: NaN and infinities become strings (JSON has no literal for them)."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    expected = {}

    def save(name, arr, version=None, **extra):
        path = os.path.join(OUT, name)
        if version is None:
            np.save(path, arr)  # numpy picks the version, as users' files do
        else:
            with open(path, "wb") as f:
                np.lib.format.write_array(f, arr, version=version)
        with open(path, "rb") as f:
            raw = f.read()
        entry = {
            "descr": np.lib.format.dtype_to_descr(arr.dtype),
            "dtype": arr.dtype.name,
            "shape": list(arr.shape),
            "fortran_order": bool(arr.flags.f_contiguous and not arr.flags.c_contiguous),
            "version": f"{raw[6]}.{raw[7]}",
        }
        if arr.dtype.kind not in "OV":
            c = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"))
            entry["le_hex"] = c.tobytes().hex()
            if arr.dtype.kind in "biuf":
                entry["values"] = [plain(v) for v in c.ravel().tolist()]
        entry.update(extra)
        expected[name] = entry

    r = np.random.default_rng(7)

    # One file per dtype qeval might meet (i2, u4, u8, complex, strings, objects, records included,
    # so the refusals are tested on real numpy output).
    save("f4_2x3.npy", (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1.0))
    save("f4_special.npy", np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4028235e38], dtype=np.float32))
    save("f8_3d.npy", (np.arange(24, dtype=np.float64) / 7.0 - 1.0).reshape(2, 3, 4))
    save("f2_1d.npy", np.array([0.0, 1.0, -2.5, 65504.0, np.inf, np.nan, 6e-8], dtype=np.float16))
    save("i1_1d.npy", np.array([-128, -1, 0, 1, 127], dtype=np.int8))
    save("u1_2d.npy", r.integers(0, 256, size=(3, 4), dtype=np.uint8))
    save("i2_1d.npy", np.array([-32768, -1, 0, 32767], dtype=np.int16))
    save("u2_1d.npy", np.array([0, 1, 256, 65535], dtype=np.uint16))
    save("i4_3d.npy", (np.arange(24, dtype=np.int32) * 1000003 - 7).reshape(2, 3, 4))
    save("u4_1d.npy", np.array([0, 1, 4294967295], dtype=np.uint32))
    save("i8_1d.npy", np.array([-(2 ** 63), -1, 0, 2 ** 63 - 1], dtype=np.int64))
    save("u8_1d.npy", np.array([0, 2 ** 64 - 1], dtype=np.uint64))
    save("b1_2d.npy", np.array([[True, False, True], [False, False, True]]))
    save("c8_1d.npy", np.array([1 + 2j], dtype=np.complex64))
    save("U3_1d.npy", np.array(["abc", "de"]))
    save("object_1d.npy", np.array([1, "two", None], dtype=object), kind="object")
    save("structured_1d.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), kind="structured")

    # Shapes: 0-d, zero-size.
    save("f4_0d.npy", np.array(3.25, dtype=np.float32))
    save("f4_zero_size.npy", np.zeros((0, 3), dtype=np.float32))
    save("i4_zero_size_3d.npy", np.zeros((2, 0, 5), dtype=np.int32))

    # Layout and byte order.
    save("f8_fortran_3d.npy", np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4) + 0.25))
    save("u1_fortran_2d.npy", np.asfortranarray(np.arange(15, dtype=np.uint8).reshape(3, 5)))
    save("f4_big_endian.npy", (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5).astype(">f4"))
    save("i8_big_endian.npy", np.array([-(2 ** 40), -1, 0, 2 ** 62 + 5], dtype=">i8"))
    save("u2_big_endian.npy", np.array([1, 258, 65535], dtype=">u2"))
    save("f2_big_endian.npy", np.array([1.0, -0.5, 65504.0], dtype=">f2"))
    save("i4_big_endian_fortran.npy", np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4) * -3))

    # Format versions numpy only writes when asked (or for huge headers).
    save("f4_v2.npy", np.arange(6, dtype=np.float32).reshape(3, 2) + 0.125, version=(2, 0))
    save("i8_v3.npy", np.array([5, -6], dtype=np.int64), version=(3, 0))

    # Sanity: numpy reads back every file it wrote (object arrays need pickle).
    for name in expected:
        np.load(os.path.join(OUT, name), allow_pickle=True)

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"numpy_version": np.__version__, "files": expected}, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(expected)} fixtures + expected.json to {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()

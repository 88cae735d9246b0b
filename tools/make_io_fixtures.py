#!/usr/bin/python3
"""Writes the image-decoding fixtures in tests/data/images/ (JPEG, palette, gray+alpha, 1-bit, interlaced PNG) and the raw pixels each must decode to."""

# Usage (from the repository root): /usr/bin/python3 tools/make_io_fixtures.py
# Expected pixels go to expected.json as nested lists (H x W x C, as stored in the file), so the
# C++ test compares qeval's decoders against PIL/libjpeg without needing Python at test time.

import io
import json
import os
import struct
import zlib

import numpy as np
import skimage.data
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "images")


def adam7_png(rgb):
    """An 8-bit RGB PNG with Adam7 interlacing, every scanline filter 0."""
    h, w, _ = rgb.shape
    passes = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)]
    raw = b""
    for y0, x0, dy, dx in passes:  # (row start, col start, row step, col step)
        sub = rgb[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for row in sub:
            raw += b"\x00" + row.tobytes()

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def main():
    os.makedirs(OUT, exist_ok=True)
    photo = skimage.data.astronaut()[100:124, 200:232]  # 24 x 32 RGB crop
    expected = {}

    def record(name, img):
        arr = np.asarray(img)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        expected[name] = {"height": arr.shape[0], "width": arr.shape[1], "channels": arr.shape[2],
                          "pixels": arr.astype(int).tolist()}

    # Baseline JPEG (RGB and gray); PIL decodes through libjpeg(-turbo) with the same ISLOW IDCT.
    for name, img in [("photo.jpg", Image.fromarray(photo)),
                      ("photo_gray.jpg", Image.fromarray(photo).convert("L"))]:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        data = buf.getvalue()
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        record(name, Image.open(io.BytesIO(data)))
        if name == "photo.jpg":
            with open(os.path.join(OUT, "photo_truncated.jpg"), "wb") as f:
                f.write(data[: len(data) * 2 // 3])

    # Palette PNG with a transparent entry (tRNS): decodes to RGBA.
    pal = Image.fromarray(photo).quantize(colors=16)
    pal.info["transparency"] = 0
    pal.save(os.path.join(OUT, "palette_trns.png"), transparency=0)
    record("palette_trns.png", Image.open(os.path.join(OUT, "palette_trns.png")).convert("RGBA"))

    # Gray + alpha.
    gray = Image.fromarray(photo).convert("L")
    alpha = Image.fromarray((np.arange(24 * 32).reshape(24, 32) % 256).astype(np.uint8))
    la = Image.merge("LA", (gray, alpha))
    la.save(os.path.join(OUT, "gray_alpha.png"))
    record("gray_alpha.png", la)

    # 1-bit gray: expands to 0/255.
    bw = gray.point(lambda v: 255 if v > 128 else 0).convert("1")
    bw.save(os.path.join(OUT, "bilevel.png"))
    record("bilevel.png", Image.open(os.path.join(OUT, "bilevel.png")).convert("L"))

    # Adam7-interlaced RGB (PIL does not write interlaced PNG; written by hand).
    with open(os.path.join(OUT, "interlaced.png"), "wb") as f:
        f.write(adam7_png(photo))
    record("interlaced.png", photo)

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Synthetic captioned scenes: the Python port of datasets/scenes.cc (same captions, pixels and masks for the same seed)."""

# The grammar, the random draws and the rasterisation rules are documented in docs/scenes.md; this
# file and datasets/scenes.cc implement them line for line and tests/datasets/scenes_test.cc checks
# the C++ side against goldens written by this file (`--goldens`). Change both or neither, and bump
# GENERATOR_VERSION (and datasets::kScenesGeneratorVersion) when any output changes.
#
# Usage (from the repository root):
#   /usr/bin/python3 tools/scenes.py --goldens          # rewrites tests/data/scenes/
#   /usr/bin/python3 tools/scenes.py --prompts          # rewrites prompts/tiny_calib.txt, tiny_eval.txt
#   /usr/bin/python3 tools/scenes.py --show SEED INDEX  # prints one scene's caption and objects
#   /usr/bin/python3 tools/scenes.py --show 6221146 1 --png samples/segment/scene.png \
#       --mask 1 samples/segment/ref.png                 # the `qeval segment` example's files
#
# Needs only numpy (any version >= 1.17); runs on Debian's Python and on the GPU machine's.

import argparse
import os
import struct
import sys
import zlib

import numpy as np

GENERATOR_VERSION = 1

SHAPES = ["circle", "square", "triangle", "ring", "cross", "diamond"]
COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "white", "black"]
SIZES = ["small", "medium", "large"]          # "medium" is not written in captions
STYLES = ["plain", "gradient", "striped"]
# Cells of the 3x3 grid, row-major (cell = 3 * row + column), and their caption phrases.
POSITIONS = ["at the top left", "at the top", "at the top right",
             "on the left", "in the center", "on the right",
             "at the bottom left", "at the bottom", "at the bottom right"]

# Object colors are saturated; backgrounds use muted tones of the same names (see background_tones).
OBJECT_RGB = [
    (220, 40, 40),    # red
    (245, 140, 20),   # orange
    (240, 220, 30),   # yellow
    (40, 170, 60),    # green
    (40, 90, 220),    # blue
    (150, 60, 200),   # purple
    (245, 245, 245),  # white
    (25, 25, 25),     # black
]

SIZE_PERCENT = [7, 10, 13]     # object radius as a percentage of the image side
SUB = 8                        # sub-pixel units per pixel; samples sit at odd units: 4x4 per pixel
SAMPLES = (SUB // 2) ** 2      # 16 samples per pixel
JITTER_PERCENT = 3             # centre jitter (each axis) as a percentage of the image side

MASK64 = (1 << 64) - 1


def mix64(z):
    """splitmix64's finaliser (Stafford's variant 13)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014): state += golden gamma; output = mix64(state)."""

    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        return mix64(self.state)

    def uniform(self, n):
        """An integer in [0, n): the high 32 bits scaled by n (Lemire's multiply, no rejection)."""
        return ((self.next() >> 32) * n) >> 32


def scene_rng(seed, index):
    return SplitMix64(mix64(mix64(seed) ^ (index & MASK64)))


def background_tones(color):
    """The two tones of a background of this color name: (muted, darker muted)."""
    c = OBJECT_RGB[color]
    t0 = tuple((2 * v + 3 * 150) // 5 for v in c)
    t1 = tuple((3 * v) // 4 for v in t0)
    return t0, t1


def article(word):
    return "an" if word[0] in "aeiou" else "a"


def object_phrase(obj):
    words = []
    if obj["size"] != 1:
        words.append(SIZES[obj["size"]])
    words += [COLORS[obj["color"]], SHAPES[obj["shape"]]]
    return article(words[0]) + " " + " ".join(words) + " " + POSITIONS[obj["cell"]]


def caption_of(objects, style, bg_color):
    phrases = [object_phrase(o) for o in objects]
    if len(phrases) == 1:
        head = phrases[0]
    else:
        head = ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return head + " on a " + STYLES[style] + " " + COLORS[bg_color] + " background"


def describe_scene(seed, index, size=64, min_objects=1, max_objects=3):
    """The random draws of one scene (docs/scenes.md, "Draws"), without pixels."""
    if not 16 <= size <= 1024:
        raise ValueError("scene size must be in [16, 1024]")
    if not 1 <= min_objects <= max_objects <= 3:
        raise ValueError("need 1 <= min_objects <= max_objects <= 3")
    rng = scene_rng(seed, index)
    n = min_objects + rng.uniform(max_objects - min_objects + 1)
    style = rng.uniform(len(STYLES))
    bg_color = rng.uniform(len(COLORS))
    cells = list(range(9))
    for i in range(n):
        j = i + rng.uniform(9 - i)
        cells[i], cells[j] = cells[j], cells[i]
    jitter = size * SUB * JITTER_PERCENT // 100
    objects = []
    for i in range(n):
        shape = rng.uniform(len(SHAPES))
        color = rng.uniform(len(COLORS))
        while color == bg_color:
            color = rng.uniform(len(COLORS))
        sz = rng.uniform(len(SIZES))
        dx = rng.uniform(2 * jitter + 1) - jitter
        dy = rng.uniform(2 * jitter + 1) - jitter
        cell = cells[i]
        row, col = divmod(cell, 3)
        objects.append({
            "shape": shape, "color": color, "size": sz, "cell": cell,
            "cx": (2 * col + 1) * size * SUB // 6 + dx,
            "cy": (2 * row + 1) * size * SUB // 6 + dy,
            "r": size * SUB * SIZE_PERCENT[sz] // 100,
        })
    return {"seed": seed, "index": index, "size": size, "style": style, "bg_color": bg_color,
            "objects": objects, "caption": caption_of(objects, style, bg_color)}


def inside(shape, dx, dy, r):
    """Whether offsets (dx, dy) from the centre, in sub-pixel units, lie inside the shape of radius r."""
    ax, ay = np.abs(dx), np.abs(dy)
    name = SHAPES[shape]
    if name == "circle":
        return dx * dx + dy * dy <= r * r
    if name == "square":
        return (ax <= r) & (ay <= r)
    if name == "triangle":  # apex up at (0, -r), base from (-r, r) to (r, r)
        return (dy <= r) & (2 * ax <= dy + r)
    if name == "ring":
        ri = 3 * r // 5
        d2 = dx * dx + dy * dy
        return (d2 <= r * r) & (d2 >= ri * ri)
    if name == "cross":
        w = r // 3
        return ((ax <= w) & (ay <= r)) | ((ay <= w) & (ax <= r))
    if name == "diamond":
        return ax + ay <= r
    raise ValueError(name)


def background_image(size, style, bg_color):
    t0, t1 = (np.array(t, dtype=np.int64) for t in background_tones(bg_color))
    y, x = np.mgrid[0:size, 0:size]
    if STYLES[style] == "plain":
        img = np.broadcast_to(t0, (size, size, 3)).copy()
    elif STYLES[style] == "gradient":  # vertical: t0 on the top row, t1 on the bottom row
        yy = y[..., None]
        img = (t0 * (size - 1 - yy) + t1 * yy + (size - 1) // 2) // (size - 1)
    else:  # diagonal stripes, period 2 * max(2, size // 10) pixels along x + y
        width = max(2, size // 10)
        band = ((x + y) // width) % 2
        img = np.where(band[..., None] == 0, t0, t1)
    return img.astype(np.int64)


def render_scene(desc):
    """Pixels and masks of a described scene: (uint8 [H, W, 3], uint8 [n, H, W] with 0/255)."""
    size = desc["size"]
    k = SUB // 2
    # Sample coordinates in sub-pixel units: pixel p holds samples SUB*p + 1, + 3, + 5, + 7.
    s = np.arange(size * k, dtype=np.int64)
    coord = SUB * (s // k) + 2 * (s % k) + 1
    sy, sx = coord[:, None], coord[None, :]
    top = np.full((size * k, size * k), -1, dtype=np.int64)  # topmost object at each sample
    for i, o in enumerate(desc["objects"]):
        top[inside(o["shape"], sx - o["cx"], sy - o["cy"], o["r"])] = i
    top = top.reshape(size, k, size, k).transpose(0, 2, 1, 3).reshape(size, size, k * k)
    img = background_image(size, desc["style"], desc["bg_color"])
    n_bg = (top == -1).sum(axis=2)
    acc = img * n_bg[..., None]
    masks = np.zeros((len(desc["objects"]), size, size), dtype=np.uint8)
    for i, o in enumerate(desc["objects"]):
        n_i = (top == i).sum(axis=2)
        acc = acc + np.array(OBJECT_RGB[o["color"]], dtype=np.int64) * n_i[..., None]
        masks[i] = np.where(2 * n_i >= SAMPLES, 255, 0)
    img = (acc + SAMPLES // 2) // SAMPLES
    return img.astype(np.uint8), masks


def generate_scene(seed, index, size=64, min_objects=1, max_objects=3):
    desc = describe_scene(seed, index, size, min_objects, max_objects)
    img, masks = render_scene(desc)
    desc["image"], desc["masks"] = img, masks
    return desc


def object_points(masks):
    """Per mask, the (x, y) of its pixel nearest its centroid (first in row-major order on ties), or
    (-1, -1) for an empty mask: the point prompts tiny-sam is evaluated with. Exact integer maths:
    n^2 times the squared distance, (n x - sum x)^2 + (n y - sum y)^2."""
    points = []
    for m in masks:
        ys, xs = np.nonzero(m)
        if len(xs) == 0:
            points.append((-1, -1))
            continue
        n = len(xs)
        d = (n * xs.astype(np.int64) - int(xs.sum())) ** 2 + (n * ys.astype(np.int64) - int(ys.sum())) ** 2
        i = int(np.argmin(d))
        points.append((int(xs[i]), int(ys[i])))
    return points


# ---- Caption parsing (the inverse of caption_of, for prompt-following checks) ----

def parse_caption(text):
    """[{shape, color, size, cell}], style, bg_color from a caption of the grammar; ValueError otherwise."""
    text = " ".join(text.strip().lower().split())
    head, sep, tail = text.rpartition(" on a ")
    if not sep or not tail.endswith(" background"):
        raise ValueError("not a scene caption (no 'on a ... background'): " + text)
    bg_words = tail[: -len(" background")].split(" ")
    if len(bg_words) != 2 or bg_words[0] not in STYLES or bg_words[1] not in COLORS:
        raise ValueError("bad background phrase: " + tail)
    parts = head.split(" and ")
    if len(parts) > 2:
        raise ValueError("too many 'and': " + text)
    phrases = parts[0].split(", ") + parts[1:]
    objects = []
    for p in phrases:
        for cell in sorted(range(9), key=lambda c: -len(POSITIONS[c])):  # longest phrase first
            if p.endswith(" " + POSITIONS[cell]):
                break
        else:
            raise ValueError("no position in object phrase: " + p)
        words = p[: -len(POSITIONS[cell]) - 1].split(" ")
        if len(words) not in (3, 4) or words[0] != article(words[1]):
            raise ValueError("bad object phrase: " + p)
        size = SIZES.index(words[1]) if len(words) == 4 else 1
        if len(words) == 4 and words[1] == "medium":
            raise ValueError("'medium' is never written: " + p)
        if words[-2] not in COLORS or words[-1] not in SHAPES:
            raise ValueError("unknown color or shape: " + p)
        objects.append({"shape": SHAPES.index(words[-1]), "color": COLORS.index(words[-2]),
                        "size": size, "cell": cell})
    return objects, STYLES.index(bg_words[0]), COLORS.index(bg_words[1])


# ---- Prompt sets ----

CALIB_SEED = 0x5EED0C
EVAL_SEED = 0x5EED0E
TRAIN_SEED = 0x5EED07


def prompt_set(seed, count, exclude=()):
    """count distinct captions from scenes (seed, 0), (seed, 1), ... skipping those in exclude."""
    out, seen = [], set(exclude)
    index = 0
    while len(out) < count:
        c = describe_scene(seed, index)["caption"]
        index += 1
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def read_prompts(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


# ---- PNG writing (no imaging library needed) ----

def png_bytes(img):
    img = np.ascontiguousarray(img, dtype=np.uint8)
    if img.ndim == 2:
        h, w = img.shape
        color_type, rows = 0, img
    else:
        h, w, c = img.shape
        color_type = {3: 2, 4: 6}[c]
        rows = img.reshape(h, w * c)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_png(path, img):
    with open(path, "wb") as f:
        f.write(png_bytes(img))


def read_png_rgb8(path):
    """Reads the non-interlaced 8-bit gray/RGB/RGBA PNGs this file writes (filter types 0-4)."""
    data = open(path, "rb").read()
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (n,), tag = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8
            c = {0: 1, 2: 3, 6: 4}[ctype]
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * c
    out = np.zeros((h, stride), dtype=np.int64)
    prev = np.zeros(stride, dtype=np.int64)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(np.int64)
        cur = np.zeros(stride, dtype=np.int64)
        for i in range(stride):
            a = cur[i - c] if i >= c else 0
            b = prev[i]
            cc = prev[i - c] if i >= c else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - cc
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else cc)
            cur[i] = (line[i] + pred) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, c).astype(np.uint8).squeeze()


# ---- Goldens and prompt files ----

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(REPO, "tests", "data", "scenes")
GOLDEN_CASES = [(1234, i, 64, 1, 3) for i in range(16)] + [(77, i, 32, 3, 3) for i in range(4)]


def write_goldens():
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    lines = ["# seed\tindex\tsize\tmin_objects\tmax_objects\tfile\tobjects(shape,color,size,cell,cx,cy,r;...)\tcaption"
             "\tpoints(x,y;...)"]
    for seed, index, size, lo, hi in GOLDEN_CASES:
        s = generate_scene(seed, index, size, lo, hi)
        name = "s%d_i%d_%d" % (seed, index, size)
        write_png(os.path.join(GOLDEN_DIR, name + ".png"), s["image"])
        bits = np.zeros((size, size), dtype=np.uint8)  # bit i set where object i's mask is set
        for i, m in enumerate(s["masks"]):
            bits |= np.where(m > 0, 1 << i, 0).astype(np.uint8)
        write_png(os.path.join(GOLDEN_DIR, name + "_masks.png"), bits)
        objs = ";".join("%d,%d,%d,%d,%d,%d,%d" % (o["shape"], o["color"], o["size"], o["cell"], o["cx"], o["cy"], o["r"])
                        for o in s["objects"])
        points = ";".join("%d,%d" % p for p in object_points(s["masks"]))
        lines.append("\t".join(map(str, [seed, index, size, lo, hi, name, objs, s["caption"], points])))
    with open(os.path.join(GOLDEN_DIR, "scenes.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d scenes to %s" % (len(GOLDEN_CASES), GOLDEN_DIR))


def write_prompts(n_calib=192, n_eval=64):
    eval_prompts = prompt_set(EVAL_SEED, n_eval)
    calib_prompts = prompt_set(CALIB_SEED, n_calib, exclude=eval_prompts)
    d = os.path.join(REPO, "prompts")
    # No header line: prompt files are one prompt a line (prompts/README.md says where they come from).
    with open(os.path.join(d, "tiny_eval.txt"), "w") as f:
        f.write("\n".join(eval_prompts) + "\n")
    with open(os.path.join(d, "tiny_calib.txt"), "w") as f:
        f.write("\n".join(calib_prompts) + "\n")
    print("wrote %d calibration and %d evaluation prompts" % (len(calib_prompts), len(eval_prompts)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--goldens", action="store_true")
    ap.add_argument("--prompts", action="store_true")
    ap.add_argument("--show", nargs=2, type=int, metavar=("SEED", "INDEX"))
    ap.add_argument("--png", help="with --show: write the image here")
    ap.add_argument("--mask", nargs=2, metavar=("K", "PATH"),
                    help="with --show: write object K's mask (0-based, caption order) as a gray PNG here")
    a = ap.parse_args()
    if a.goldens:
        write_goldens()
    if a.prompts:
        write_prompts()
    if a.show:
        s = generate_scene(*a.show)
        print(s["caption"])
        for o in s["objects"]:
            print("  ", SHAPES[o["shape"]], COLORS[o["color"]], SIZES[o["size"]], POSITIONS[o["cell"]],
                  "centre (%.2f, %.2f) px, radius %.2f px" % (o["cx"] / SUB, o["cy"] / SUB, o["r"] / SUB))
        if a.png:
            write_png(a.png, s["image"])
        if a.mask:
            write_png(a.mask[1], s["masks"][int(a.mask[0])])
    if not (a.goldens or a.prompts or a.show):
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

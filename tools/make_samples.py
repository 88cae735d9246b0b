#!/usr/bin/python3
"""Generates the README quick-start image pairs in samples/ref and samples/test (photos from scikit-image with quantization-like distortions)."""

# Usage (from the repository root):  /usr/bin/python3 tools/make_samples.py
#
# Writes samples/ref/<name>.png (the "FP16 output": a photo bundled with
# scikit-image) and samples/test/<name>.png (the "INT8/FP8 output": the same
# photo with the kind of deviation a quantized build of an image model shows:
# colour drift, banding in smooth gradients, fine-texture loss, sub-pixel drift
# of detail, JPEG re-encode).  It also writes samples/README.md, which says
# which distortion each test image has.  All random fields are seeded, so re-running writes
# byte-identical files (given the same numpy/OpenCV/libpng/libjpeg versions).
#
# It also prints, and writes into samples/README.md, the SSIM (skimage,
# Gaussian sigma 1.5, population covariance, channel mean) and PSNR of each pair.

import os
import sys

import cv2
import numpy as np
import scipy.ndimage
import skimage
import skimage.data
import skimage.io
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(REPO, "samples")


# ----------------------------------------------------------------------------
# Source photos (RGB uint8), resized with INTER_AREA or cropped at full resolution
# ----------------------------------------------------------------------------

def _resize(img, h, w):
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)


SOURCES = {
    # name: (how the reference is made, credit / licence as stated in skimage/data/_fetchers.py)
    "astronaut": ("skimage.data.astronaut() (512x512), resized to 320x320 (INTER_AREA)",
                  "Eileen Collins, NASA Great Images database. \"No known copyright restrictions, released "
                  "into the public domain.\""),
    "coffee": ("skimage.data.coffee() (400x600), resized to 256x384",
               "Courtesy of Pikolo Espresso Bar. \"No copyright restrictions. CC0 by the photographer "
               "(Rachel Michetti).\""),
    "rocket": ("skimage.data.rocket() (427x640), resized to 256x384",
               "Launch of DSCOVR on Falcon 9, SpaceX Photos. \"The image was captured by SpaceX and released "
               "in the public domain.\""),
    "retina": ("skimage.data.retina() (1411x1411), crop [90:1320, 90:1320], resized to 320x320",
               "Fundus photograph, Wikimedia Commons (Mikael H\u00e4ggstr\u00f6m). \"This file is made available "
               "under the Creative Commons CC0 1.0 Universal Public Domain Dedication.\""),
    "ihc": ("skimage.data.immunohistochemistry() (512x512), full-resolution crop [96:384, 128:416] (288x288)",
            "Center for Microscopy And Molecular Imaging (CMMI). \"No known copyright restrictions.\""),
    "hubble": ("skimage.data.hubble_deep_field() (872x1000), full-resolution crop [240:560, 380:700] (320x320)",
               "Hubble eXtreme Deep Field, HubbleSite. \"The image was captured by NASA and may be freely used "
               "in the public domain.\""),
    "chelsea": ("skimage.data.chelsea() (300x451), crop [0:300, 20:420], resized to 288x384",
                "Chelsea the cat. \"No copyright restrictions. CC0 by the photographer (Stefan van der Walt).\""),
}


def photos():
    return {
        "astronaut": _resize(skimage.data.astronaut(), 320, 320),
        "coffee": _resize(skimage.data.coffee(), 256, 384),
        "rocket": _resize(skimage.data.rocket(), 256, 384),
        "retina": _resize(skimage.data.retina()[90:1320, 90:1320], 320, 320),
        "ihc": skimage.data.immunohistochemistry()[96:384, 128:416],          # 288x288 full-resolution crop
        "chelsea": _resize(skimage.data.chelsea()[0:300, 20:420], 288, 384),
        "hubble": skimage.data.hubble_deep_field()[240:560, 380:700],          # 320x320 full-resolution crop
    }


# ----------------------------------------------------------------------------
# Quantization-like distortions (float64 RGB in 0..255 -> float64)
# ----------------------------------------------------------------------------

def luma(x):
    return 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]


def colour_drift(x, gain, offset):
    """Per-channel gain/offset drift: out_c = gain_c * x_c + offset_c."""
    return x * np.asarray(gain, dtype=np.float64) + np.asarray(offset, dtype=np.float64)


def smooth_mask(x, std_thresh, win=9):
    """~1 where the local luma std (win x win) is below std_thresh (smooth areas), ~0 in texture."""
    y = luma(x)
    m = scipy.ndimage.uniform_filter(y, win, mode="reflect")
    m2 = scipy.ndimage.uniform_filter(y * y, win, mode="reflect")
    std = np.sqrt(np.maximum(m2 - m * m, 0.0))
    mask = np.clip((2.0 * std_thresh - std) / std_thresh, 0.0, 1.0)  # 1 below thresh, 0 above 2*thresh
    mask = scipy.ndimage.gaussian_filter(mask, 2.0, mode="reflect")
    return mask[..., None]


def banding(x, step, std_thresh):
    """Coarse quantization (step levels) applied only in smooth regions: contour bands in gradients."""
    q = np.floor(x / step) * step + step / 2.0
    m = smooth_mask(x, std_thresh)
    return x + m * (q - x)


def shadow_banding(x, step, luma_thresh):
    """Coarse quantization (step levels) in dark regions (smoothed luma below ~luma_thresh): a flattened,
    posterized noise floor in the shadows."""
    y = scipy.ndimage.gaussian_filter(luma(x), 2.0, mode="reflect")
    m = np.clip((1.5 * luma_thresh - y) / (0.5 * luma_thresh), 0.0, 1.0)[..., None]
    q = np.floor(x / step) * step + step / 2.0
    return x + m * (q - x)


def texture_loss(x, sigma):
    """Fine-detail loss: Gaussian blur (per channel)."""
    return scipy.ndimage.gaussian_filter(x, (sigma, sigma, 0), mode="reflect")


def smooth_warp(x, amp_px, grid, seed):
    """Sub-pixel drift of detail: a smooth random displacement field (max |d| = amp_px), bicubic remap."""
    h, w = x.shape[:2]
    rng = np.random.default_rng(seed)
    fields = []
    for _ in range(2):
        g = rng.normal(0.0, 1.0, (grid, grid)).astype(np.float32)
        f = cv2.resize(g, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float64)
        fields.append(f)
    mag = np.sqrt(fields[0] ** 2 + fields[1] ** 2)
    s = amp_px / mag.max()
    dx, dy = fields[0] * s, fields[1] * s
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    mapx = (xx + dx).astype(np.float32)
    mapy = (yy + dy).astype(np.float32)
    out = cv2.remap(x.astype(np.float32), mapx, mapy, interpolation=cv2.INTER_CUBIC,
                    borderMode=cv2.BORDER_REFLECT_101)
    return out.astype(np.float64)


def jpeg(x, quality):
    """Round to uint8 and re-encode as JPEG (OpenCV/libjpeg, 4:2:0) at the given quality."""
    u8 = to_u8(x)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(u8[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1].astype(np.float64)


def to_u8(x):
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------
# The pairs: (name, description for the README, distortion function)
# ----------------------------------------------------------------------------

PAIRS = [
    ("astronaut",
     "mild: slight colour drift (R gain 1.02 offset +1, G unchanged, B gain 0.97 offset -2), then sub-pixel "
     "drift of detail (smooth random warp, at most 0.4 px), then a JPEG q85 re-encode",
     lambda x: jpeg(smooth_warp(colour_drift(x, (1.02, 1.0, 0.97), (1.0, 0.0, -2.0)), 0.4, 5, 11), 85)),
    ("coffee",
     "mild: fine-texture loss (Gaussian blur sigma 0.6), then banding in smooth regions (step-6 "
     "quantization where the local luma std is below ~3-6)",
     lambda x: banding(texture_loss(x, 0.6), 6.0, 3.0)),
    ("rocket",
     "mild: banding in the smooth sky gradient (step-5 quantization where the local luma std is below "
     "~3-6), then a slight cool colour drift (R gain 0.98, B gain 1.03 offset +2)",
     lambda x: colour_drift(banding(x, 5.0, 3.0), (0.98, 1.0, 1.03), (0.0, 0.0, 2.0))),
    ("retina",
     "mild: sub-pixel drift of detail (smooth random warp, at most 0.4 px), then a JPEG q85 re-encode",
     lambda x: jpeg(smooth_warp(x, 0.4, 6, 12), 85)),
    ("ihc",
     "mild: fine-texture loss (Gaussian blur sigma 0.5), then sub-pixel drift of detail (at most 0.3 px), "
     "then a slight contrast/colour drift (gains 0.98/0.99/1.01, offsets +2/+1/0)",
     lambda x: colour_drift(smooth_warp(texture_loss(x, 0.5), 0.3, 5, 13), (0.98, 0.99, 1.01), (2.0, 1.0, 0.0))),
    ("hubble",
     "mild: fine-texture loss (Gaussian blur sigma 0.4), then a lifted black level (+2), then a posterized "
     "noise floor in the dark background (step-6 quantization where the smoothed luma is below ~30-45)",
     lambda x: shadow_banding(colour_drift(texture_loss(x, 0.4), (1.0, 1.0, 1.0), (2.0, 2.0, 2.0)), 6.0, 30.0)),
    ("chelsea",
     "**degraded, should fail a release gate**: strong warm colour cast (R gain 1.12 offset +12, G gain "
     "1.02, B gain 0.80 offset -6), then drift of detail (smooth random warp, at most 4 px), then texture "
     "loss (Gaussian blur sigma 1.3), then heavy banding (step-20 quantization where the local luma std "
     "is below ~6-12)",
     lambda x: banding(texture_loss(smooth_warp(colour_drift(x, (1.12, 1.02, 0.80), (12.0, 0.0, -6.0)),
                                                4.0, 4, 14), 1.3), 20.0, 6.0)),
]


def ssim_wang(a, b):
    return float(structural_similarity(a.astype(np.float64), b.astype(np.float64), gaussian_weights=True,
                                       sigma=1.5, use_sample_covariance=False, data_range=255,
                                       channel_axis=-1))


def psnr(a, b):
    return float(peak_signal_noise_ratio(a.astype(np.float64), b.astype(np.float64), data_range=255))


def write_png(path, img):
    ok = cv2.imwrite(path, np.ascontiguousarray(img[..., ::-1]), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok, path
    back = skimage.io.imread(path)  # independent decoder: checks the RGB order
    assert np.array_equal(back, img), path


README_HEAD = """# Sample image pairs

Quick start for the image-quality comparison:

```sh
qeval compare-images --ref samples/ref --test samples/test
```

`ref/<name>.png` stands for the output of the FP16 build of an image model and
`test/<name>.png` (same file name) for the output of a quantized (INT8/FP8)
build.  The test images are not model outputs: they are the reference photo
with synthetic, deterministic distortions that imitate what a quantized build
typically does to its output compared to the FP16 one (colour drift, banding
in smooth gradients, loss of fine texture, sub-pixel drift of detail, an extra
lossy re-encode), not random noise.  Six pairs are mild; one pair (`chelsea`)
is clearly degraded and is the one a release gate should flag.

All images are 8-bit sRGB PNGs, 3 channels.  File names do not encode the
distortion; this table does.

## Pairs

Reference values computed with scikit-image %(skimage)s (`structural_similarity`
with `gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
data_range=255`, mean over the R, G, B channels; `peak_signal_noise_ratio`
with `data_range=255`, MSE over all pixels and channels):

| name | size (WxH) | SSIM | PSNR (dB) | distortion of `test/<name>.png` |
|---|---|---|---|---|
"""

README_TAIL = """
## Where the photos come from

All reference photos are sample images bundled with scikit-image
(`skimage.data`, here the Debian package python3-skimage %(skimage)s); scikit-image
itself is BSD-3-Clause.  The `README.txt` in the installed `skimage/data/`
directory carries no licence note; the per-image credit and licence statements
quoted below are those in the docstrings of the `skimage.data` functions
(`skimage/data/_fetchers.py`).

| name | source | credit and licence (quoted from scikit-image) |
|---|---|---|
%(sources)s
## Regenerating

```sh
/usr/bin/python3 tools/make_samples.py
```

rewrites `samples/ref/`, `samples/test/` and this README.  It needs Debian's
Python with numpy, scipy, scikit-image and OpenCV; all random fields are
seeded, so with the same library versions the output is byte-identical.
"""


def main(argv):
    srcs = photos()
    for sub in ("ref", "test"):
        os.makedirs(os.path.join(SAMPLES, sub), exist_ok=True)
    rows = []
    for name, desc, fn in PAIRS:
        ref = np.ascontiguousarray(srcs[name])
        assert ref.dtype == np.uint8 and ref.ndim == 3 and ref.shape[2] == 3
        test = to_u8(fn(ref.astype(np.float64)))
        assert test.shape == ref.shape
        write_png(os.path.join(SAMPLES, "ref", name + ".png"), ref)
        write_png(os.path.join(SAMPLES, "test", name + ".png"), test)
        ss, pp = ssim_wang(ref, test), psnr(ref, test)
        print("%-10s %3dx%-3d ssim_wang=%.4f psnr=%.2f dB" % (name, ref.shape[1], ref.shape[0], ss, pp))
        rows.append("| `%s` | %dx%d | %.3f | %.2f | %s |" % (name, ref.shape[1], ref.shape[0], ss, pp, desc))
    sources = "".join("| `%s` | %s | %s |\n" % (n, SOURCES[n][0], SOURCES[n][1]) for n, _, _ in PAIRS)
    text = (README_HEAD % {"skimage": skimage.__version__} + "\n".join(rows) + "\n"
            + README_TAIL % {"skimage": skimage.__version__, "sources": sources})
    with open(os.path.join(SAMPLES, "README.md"), "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

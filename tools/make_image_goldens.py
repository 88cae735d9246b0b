#!/usr/bin/python3
"""Generates the golden reference values (PSNR/SSIM/MS-SSIM, tensor error metrics) in tests/data/metrics/ for the C++ metric tests."""

# Usage (from the repository root):  /usr/bin/python3 tools/make_image_goldens.py
#
# Needs Debian's Python with numpy, scipy, scikit-image (0.19.x) and OpenCV.
# Everything is seeded, so re-running writes byte-identical files (given the
# same library versions: PNG/JPEG bytes depend on libpng/zlib/libjpeg).
#
# Outputs (all paths in the JSON are relative to tests/data/metrics/):
#   tests/data/metrics/images/*.png            reference and distorted images
#   tests/data/metrics/image_golden.json       per-case PSNR / SSIM / MS-SSIM values
#   tests/data/metrics/tensor_error_golden.json  MSE / SQNR / cosine / max-abs / rel-L2
#
# Conventions (see the definitions in the docstrings of the functions below):
#   * Images are loaded as float64 arrays of the raw integer values, HxWxC.
#   * Every SSIM-type metric is computed per channel, then averaged over channels.
#   * ssim_wang / ssim_skimage_default come from skimage.metrics.structural_similarity.
#   * ssim_matlab / ms_ssim are independent numpy/scipy ports of Wang's ssim.m / msssim.m.

import json
import math
import os
import sys

import cv2
import numpy as np
import scipy
import scipy.ndimage
import scipy.signal
import skimage
import skimage.data
import skimage.io
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, "tests", "data", "metrics")
IMG_DIR = os.path.join(OUT_DIR, "images")

K1, K2 = 0.01, 0.03
MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


# ----------------------------------------------------------------------------
# Image I/O
# ----------------------------------------------------------------------------

def write_png(relpath, img):
    """Write an HxW or HxWx3 (RGB) uint8/uint16 array as PNG; verify it reads back identically."""
    path = os.path.join(OUT_DIR, relpath)
    assert img.dtype in (np.uint8, np.uint16), img.dtype
    arr = img if img.ndim == 2 else np.ascontiguousarray(img[..., ::-1])  # RGB -> BGR for OpenCV
    ok = cv2.imwrite(path, arr, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok, path
    back = read_png_raw(path)
    assert back.dtype == img.dtype and back.shape == img.shape and np.array_equal(back, img), path
    if img.dtype == np.uint8:
        # Independent decoder (imageio/Pillow) as a check of the channel order.
        # (Pillow cannot decode 48-bit RGB PNGs faithfully, so 16-bit is checked with OpenCV only.)
        back2 = skimage.io.imread(path)
        assert np.array_equal(back2, img), path


def read_png_raw(path):
    """Read a PNG with its native bit depth; RGB order for colour."""
    a = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert a is not None, path
    if a.ndim == 3:
        a = np.ascontiguousarray(a[..., ::-1])
    return a


def as_hwc_float(img):
    """Raw integer values as float64 HxWxC."""
    a = img.astype(np.float64)
    if a.ndim == 2:
        a = a[:, :, None]
    return a


# ----------------------------------------------------------------------------
# Distortions (applied to the integer reference; output has the same dtype)
# ----------------------------------------------------------------------------

def jpeg(img, quality):
    """Encode with OpenCV/libjpeg at the given quality (default 4:2:0 chroma) and decode back."""
    assert img.dtype == np.uint8
    arr = img if img.ndim == 2 else np.ascontiguousarray(img[..., ::-1])
    ok, buf = cv2.imencode(".jpg", arr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    assert ok
    dec = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if dec.ndim == 3:
        dec = np.ascontiguousarray(dec[..., ::-1])
    assert dec.shape == img.shape
    return dec


def _to_int(x, dtype):
    maxv = np.iinfo(dtype).max
    return np.clip(np.rint(x), 0, maxv).astype(dtype)


def gaussian_blur(img, sigma):
    """scipy.ndimage.gaussian_filter per channel (mode 'reflect', truncate 4), rounded."""
    sig = (sigma, sigma) if img.ndim == 2 else (sigma, sigma, 0)
    return _to_int(scipy.ndimage.gaussian_filter(img.astype(np.float64), sig, mode="reflect", truncate=4.0), img.dtype)


def gaussian_noise(img, sigma, seed):
    """Additive N(0, sigma^2) noise (numpy default_rng(seed)), rounded half-to-even and clipped."""
    rng = np.random.default_rng(seed)
    return _to_int(img.astype(np.float64) + rng.normal(0.0, sigma, img.shape), img.dtype)


def posterize(img, bits):
    """Keep the top `bits` bits of each sample (like PIL.ImageOps.posterize)."""
    nbits = 8 * img.dtype.itemsize
    mask = ((1 << bits) - 1) << (nbits - bits)
    return (img & np.array(mask, dtype=img.dtype)).astype(img.dtype)


def posterize_one_channel(img, bits, channel):
    out = img.copy()
    out[..., channel] = posterize(img[..., channel], bits)
    return out


# ----------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------

def mse(a, b):
    return float(np.mean((a - b) ** 2))


def psnr_from_mse(m, data_range):
    if m == 0.0:
        return None
    return float(10.0 * math.log10(data_range * data_range / m))


def psnr_skimage(ref, test, data_range):
    """skimage PSNR, None when the inputs are identical (MSE == 0)."""
    if mse(ref, test) == 0.0:
        return None
    return float(peak_signal_noise_ratio(ref, test, data_range=data_range))


def luma_bt601(x):
    """Full-range BT.601 luma on raw values in float64; gray images pass through."""
    if x.shape[2] == 1:
        return x[:, :, 0]
    return 0.299 * x[:, :, 0] + 0.587 * x[:, :, 1] + 0.114 * x[:, :, 2]


def ssim_skimage(ref, test, data_range, **kw):
    """skimage structural_similarity on HxWxC float64 arrays (channel mean for C > 1)."""
    if ref.shape[2] == 1:
        return float(structural_similarity(ref[:, :, 0], test[:, :, 0], data_range=data_range, **kw))
    return float(structural_similarity(ref, test, data_range=data_range, channel_axis=-1, **kw))


def matlab_round(x):
    """MATLAB round(): half away from zero."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def gaussian_window_11():
    """fspecial('gaussian', 11, 1.5): exp(-(x^2+y^2)/(2 sigma^2)) on -5..5, normalised to sum 1."""
    ax = np.arange(-5, 6, dtype=np.float64)
    xx, yy = np.meshgrid(ax, ax, indexing="ij")
    w = np.exp(-(xx * xx + yy * yy) / (2.0 * 1.5 * 1.5))
    return w / w.sum()


WIN = gaussian_window_11()


def filt_valid(x, w=WIN):
    """MATLAB filter2(w, x, 'valid'): explicit 2-D correlation, direct method, float64."""
    return scipy.signal.correlate(x, w, mode="valid", method="direct")


def imfilter_box_symmetric_same(x, f):
    """MATLAB imfilter(x, ones(f,f)/f^2, 'symmetric', 'same') for a 2-D array.

    Centre c = floor((f+1)/2) (1-based), so 0-based output i averages inputs
    i-(c-1) .. i+(f-c) along each axis, with mirror padding that repeats the
    edge sample (numpy pad mode 'symmetric')."""
    if f == 1:
        return x.copy()
    c = (f + 1) // 2
    before, after = c - 1, f - c
    p = np.pad(x, ((before, after), (before, after)), mode="symmetric")
    h, w = x.shape
    acc = np.zeros_like(x, dtype=np.float64)
    for dy in range(f):
        for dx in range(f):
            acc += p[dy:dy + h, dx:dx + w]
    return acc / float(f * f)


def ssim_maps(x, y, data_range):
    """11x11 Gaussian 'valid' SSIM with population covariance: returns (ssim_map, cs_map)."""
    C1 = (K1 * data_range) ** 2
    C2 = (K2 * data_range) ** 2
    mu1 = filt_valid(x)
    mu2 = filt_valid(y)
    mu1_sq = mu1 * mu1
    mu2_sq = mu2 * mu2
    mu1_mu2 = mu1 * mu2
    sigma1_sq = filt_valid(x * x) - mu1_sq
    sigma2_sq = filt_valid(y * y) - mu2_sq
    sigma12 = filt_valid(x * y) - mu1_mu2
    cs_map = (2.0 * sigma12 + C2) / (sigma1_sq + sigma2_sq + C2)
    ssim_map = ((2.0 * mu1_mu2 + C1) * (2.0 * sigma12 + C2)) / ((mu1_sq + mu2_sq + C1) * (sigma1_sq + sigma2_sq + C2))
    return ssim_map, cs_map


def ssim_matlab_factor(h, w):
    return max(1, matlab_round(min(h, w) / 256.0))


def ssim_matlab_channel(x, y, data_range):
    """Port of Wang's ssim.m: f x f box pre-filter + subsample by f, then 11x11 Gaussian 'valid' SSIM."""
    h, w = x.shape
    f = ssim_matlab_factor(h, w)
    if f > 1:
        x = imfilter_box_symmetric_same(x, f)[0::f, 0::f]
        y = imfilter_box_symmetric_same(y, f)[0::f, 0::f]
    ssim_map, _ = ssim_maps(x, y, data_range)
    return float(np.mean(ssim_map))


def ssim_matlab(ref, test, data_range):
    return float(np.mean([ssim_matlab_channel(ref[:, :, c], test[:, :, c], data_range) for c in range(ref.shape[2])]))


def downsample2_matlab(x):
    """imfilter(x, ones(2)/4, 'symmetric', 'same') then x(1:2:end, 1:2:end): output ceil(N/2)."""
    return imfilter_box_symmetric_same(x, 2)[0::2, 0::2]


def ms_ssim_channel(x, y, data_range):
    """Wang 2003 MS-SSIM, 5 scales; returns None if scale 5 is smaller than the 11x11 window."""
    mcs = []
    for j in range(5):
        if min(x.shape) < 11:
            return None
        ssim_map, cs_map = ssim_maps(x, y, data_range)
        if j < 4:
            mcs.append(float(np.mean(cs_map)))
            x = downsample2_matlab(x)
            y = downsample2_matlab(y)
        else:
            mssim5 = float(np.mean(ssim_map))
    val = 1.0
    for j in range(4):
        val *= max(mcs[j], 0.0) ** MS_WEIGHTS[j]
    val *= max(mssim5, 0.0) ** MS_WEIGHTS[4]
    return float(val)


def ms_ssim(ref, test, data_range):
    h, w = ref.shape[:2]
    vals = [ms_ssim_channel(ref[:, :, c], test[:, :, c], data_range) for c in range(ref.shape[2])]
    if any(v is None for v in vals):
        assert all(v is None for v in vals)
        note = ("needs at least 161 px on the short side for 5 scales (11x11 window after four 2x downsamplings); "
                "image is %dx%d" % (w, h))
        return None, note
    return float(np.mean(vals)), ""


# ----------------------------------------------------------------------------
# Test images
# ----------------------------------------------------------------------------

def to_u16(img8):
    """Scale 8-bit to 16-bit full range: v * 257 (0 -> 0, 255 -> 65535)."""
    return img8.astype(np.uint16) * np.uint16(257)


def reference_images():
    """name -> (uint8/uint16 array, description). Crops of photos bundled with scikit-image."""
    astronaut = skimage.data.astronaut()
    coffee = skimage.data.coffee()
    chelsea = skimage.data.chelsea()
    rocket = skimage.data.rocket()
    camera = skimage.data.camera()
    ihc = skimage.data.immunohistochemistry()
    refs = {
        # name: (array, source description)
        "astronaut": (astronaut[0:256, 128:384], "skimage.data.astronaut()[0:256, 128:384]"),
        "coffee": (coffee[16:272, 160:416], "skimage.data.coffee()[16:272, 160:416]"),
        "chelsea_201x257": (chelsea[50:251, 100:357], "skimage.data.chelsea()[50:251, 100:357] (H=201, W=257)"),
        "rocket_177x190": (rocket[250:427, 225:415], "skimage.data.rocket()[250:427, 225:415] (H=177, W=190)"),
        "camera": (camera[64:320, 128:384], "skimage.data.camera()[64:320, 128:384] (gray)"),
        "rocket_400x520": (rocket[0:400, 60:580], "skimage.data.rocket()[0:400, 60:580] (H=400, W=520; ssim.m factor 2)"),
        "chelsea_64x64": (chelsea[85:149, 140:204], "skimage.data.chelsea()[85:149, 140:204] (64x64)"),
        "ihc_165x211": (ihc[100:265, 150:361], "skimage.data.immunohistochemistry()[100:265, 150:361] (H=165, W=211)"),
        "camera_u16": (to_u16(camera[40:240, 180:380]), "skimage.data.camera()[40:240, 180:380] * 257 as uint16 (gray, 16-bit)"),
        "coffee_u16_128x144": (to_u16(coffee[100:228, 220:364]), "skimage.data.coffee()[100:228, 220:364] * 257 as uint16 (RGB, 16-bit)"),
    }
    for name, (img, _) in refs.items():
        assert img.dtype in (np.uint8, np.uint16)
        refs[name] = (np.ascontiguousarray(img), refs[name][1])
    return refs


def cases_spec():
    """(case name, ref name, distortion tag, function, description)."""
    S = []

    def add(ref, tag, fn, desc):
        S.append((ref + "_" + tag, ref, tag, fn, desc))

    # Full set of distortions on one RGB image.
    add("astronaut", "jpeg_q10", lambda x: jpeg(x, 10), "JPEG quality 10 (OpenCV/libjpeg, 4:2:0), decoded")
    add("astronaut", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, 4:2:0), decoded")
    add("astronaut", "jpeg_q75", lambda x: jpeg(x, 75), "JPEG quality 75 (OpenCV/libjpeg, 4:2:0), decoded")
    add("astronaut", "blur_s1", lambda x: gaussian_blur(x, 1.0), "Gaussian blur sigma 1.0 (scipy.ndimage, reflect), rounded")
    add("astronaut", "noise_s5", lambda x: gaussian_noise(x, 5.0, 1001), "Gaussian noise sigma 5, seed 1001, rounded, clipped")
    add("astronaut", "posterize4", lambda x: posterize(x, 4), "posterize to 4 bits (v & 0xF0)")
    add("astronaut", "identical", lambda x: x.copy(), "identical pair")
    add("coffee", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, 4:2:0), decoded")
    add("coffee", "posterize4", lambda x: posterize(x, 4), "posterize to 4 bits (v & 0xF0)")
    add("coffee", "posterize4_blue_only", lambda x: posterize_one_channel(x, 4, 2),
        "posterize to 4 bits in the blue channel only (R and G identical: per-channel PSNR null)")
    add("chelsea_201x257", "jpeg_q75", lambda x: jpeg(x, 75), "JPEG quality 75 (OpenCV/libjpeg, 4:2:0), decoded")
    add("chelsea_201x257", "blur_s1", lambda x: gaussian_blur(x, 1.0), "Gaussian blur sigma 1.0 (scipy.ndimage, reflect), rounded")
    add("rocket_177x190", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, 4:2:0), decoded")
    add("rocket_177x190", "noise_s5", lambda x: gaussian_noise(x, 5.0, 1002), "Gaussian noise sigma 5, seed 1002, rounded, clipped")
    add("camera", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, grayscale), decoded")
    add("camera", "blur_s1", lambda x: gaussian_blur(x, 1.0), "Gaussian blur sigma 1.0 (scipy.ndimage, reflect), rounded")
    add("camera", "noise_s5", lambda x: gaussian_noise(x, 5.0, 1003), "Gaussian noise sigma 5, seed 1003, rounded, clipped")
    add("rocket_400x520", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, 4:2:0), decoded")
    add("rocket_400x520", "blur_s1", lambda x: gaussian_blur(x, 1.0), "Gaussian blur sigma 1.0 (scipy.ndimage, reflect), rounded")
    add("chelsea_64x64", "jpeg_q30", lambda x: jpeg(x, 30), "JPEG quality 30 (OpenCV/libjpeg, 4:2:0), decoded")
    add("chelsea_64x64", "noise_s5", lambda x: gaussian_noise(x, 5.0, 1004), "Gaussian noise sigma 5, seed 1004, rounded, clipped")
    add("ihc_165x211", "jpeg_q10", lambda x: jpeg(x, 10), "JPEG quality 10 (OpenCV/libjpeg, 4:2:0), decoded")
    add("camera_u16", "noise_s5x257", lambda x: gaussian_noise(x, 5.0 * 257, 1005),
        "16-bit: Gaussian noise sigma 1285 (= 5 * 257), seed 1005, rounded, clipped")
    add("camera_u16", "blur_s1", lambda x: gaussian_blur(x, 1.0), "16-bit: Gaussian blur sigma 1.0 (scipy.ndimage, reflect), rounded")
    add("coffee_u16_128x144", "noise_s5x257", lambda x: gaussian_noise(x, 5.0 * 257, 1006),
        "16-bit RGB: Gaussian noise sigma 1285 (= 5 * 257), seed 1006, rounded, clipped")
    return S


def compute_case(name, ref_rel, test_rel, ref_img, test_img, desc):
    bit_depth = 8 * ref_img.dtype.itemsize
    R = float(np.iinfo(ref_img.dtype).max)
    ref = as_hwc_float(ref_img)
    test = as_hwc_float(test_img)
    H, W, C = ref.shape

    psnr_db = psnr_skimage(ref, test, R)
    psnr_ch = [psnr_skimage(ref[:, :, c], test[:, :, c], R) for c in range(C)]
    psnr_y = psnr_from_mse(mse(luma_bt601(ref), luma_bt601(test)), R)

    s_wang = ssim_skimage(ref, test, R, gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    s_default = ssim_skimage(ref, test, R)
    s_matlab = ssim_matlab(ref, test, R)
    f = ssim_matlab_factor(H, W)
    if f == 1:
        # Self-check: with no pre-downsampling, the independent port equals skimage's
        # Gaussian SSIM (which computes the same 11-tap window and crops 5 px per side).
        assert abs(s_matlab - s_wang) <= 1e-9, (name, s_matlab, s_wang)
    else:
        # Self-check for f > 1: skimage's Gaussian SSIM on the box-filtered, subsampled images.
        def pre(a):
            return np.stack([imfilter_box_symmetric_same(a[:, :, c], f)[0::f, 0::f] for c in range(C)], axis=-1)
        s_chk = ssim_skimage(pre(ref), pre(test), R, gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
        assert abs(s_matlab - s_chk) <= 1e-9, (name, s_matlab, s_chk)
    ms, ms_note = ms_ssim(ref, test, R)

    return {
        "name": name,
        "ref": ref_rel,
        "test": test_rel,
        "distortion": desc,
        "height": H,
        "width": W,
        "channels": C,
        "bit_depth": bit_depth,
        "data_range": int(R),
        "psnr_db": psnr_db,
        "psnr_channel_db": psnr_ch,
        "psnr_y_db": psnr_y,
        "ssim_wang": s_wang,
        "ssim_skimage_default": s_default,
        "ssim_matlab": s_matlab,
        "ssim_matlab_downsample_factor": f,
        "ms_ssim": ms,
        "ms_ssim_note": ms_note,
    }


# ----------------------------------------------------------------------------
# Self-checks of the independent ports
# ----------------------------------------------------------------------------

def self_checks():
    # Box filter port vs. scipy.ndimage.uniform_filter for odd f (centred, mode 'reflect' == MATLAB 'symmetric').
    rng = np.random.default_rng(7)
    x = rng.random((23, 31))
    for f in (1, 3, 5):
        ref = scipy.ndimage.uniform_filter(x, size=f, mode="reflect")
        assert np.allclose(imfilter_box_symmetric_same(x, f), ref, atol=1e-12, rtol=0)
    # f = 2: output i averages inputs i, i+1; last one mirrors onto itself.
    d = imfilter_box_symmetric_same(x, 2)
    assert np.allclose(d[:-1, :-1], (x[:-1, :-1] + x[1:, :-1] + x[:-1, 1:] + x[1:, 1:]) / 4)
    assert np.allclose(d[-1, -1], x[-1, -1])
    # Even f: same as scipy's uniform_filter shifted so the window starts at i (origin -1 for f = 2, 4).
    for f in (2, 4):
        ref = scipy.ndimage.uniform_filter(x, size=f, mode="reflect", origin=-1)
        assert np.allclose(imfilter_box_symmetric_same(x, f), ref, atol=1e-12, rtol=0), f
    assert downsample2_matlab(x).shape == (12, 16)
    # MATLAB round.
    assert matlab_round(0.5) == 1 and matlab_round(1.5) == 2 and matlab_round(2.5) == 3 and matlab_round(0.49) == 0
    assert ssim_matlab_factor(400, 520) == 2 and ssim_matlab_factor(256, 256) == 1 and ssim_matlab_factor(64, 64) == 1
    # Identical images: SSIM family == 1.
    y = rng.random((200, 180)) * 255
    assert abs(ssim_matlab_channel(y, y, 255.0) - 1.0) < 1e-12
    assert abs(ms_ssim_channel(y, y, 255.0) - 1.0) < 1e-12


# ----------------------------------------------------------------------------
# Tensor error metrics
# ----------------------------------------------------------------------------

def f32_list(a):
    """float32 values as Python floats (their exact float64 value; repr round-trips)."""
    return [float(v) for v in np.asarray(a, dtype=np.float32).astype(np.float64)]


def fake_quant_int8(ref):
    """Per-tensor symmetric int8 fake quant in float32: s = max|ref|/127, round half-to-even, clamp [-127, 127]."""
    ref = np.asarray(ref, dtype=np.float32)
    s = np.float32(np.max(np.abs(ref)) / np.float32(127.0))
    q = np.clip(np.rint(ref / s), -127, 127).astype(np.float32)
    return (q * s).astype(np.float32), float(s)


def tensor_metrics(ref32, test32):
    """All in float64 from the float32 inputs; sums with math.fsum (correctly rounded)."""
    r = np.asarray(ref32, dtype=np.float32).astype(np.float64)
    t = np.asarray(test32, dtype=np.float32).astype(np.float64)
    d = r - t
    n = r.size
    sum_d2 = math.fsum((d * d).tolist())
    sum_r2 = math.fsum((r * r).tolist())
    sum_t2 = math.fsum((t * t).tolist())
    dot = math.fsum((r * t).tolist())
    norm_r = math.sqrt(sum_r2)
    norm_t = math.sqrt(sum_t2)
    return {
        "mse": sum_d2 / n,
        "sqnr_db": None if sum_d2 == 0.0 else 10.0 * math.log10(sum_r2 / sum_d2),
        "cosine": dot / (norm_r * norm_t),
        "max_abs": float(np.max(np.abs(d))),
        "rel_l2": math.sqrt(sum_d2) / norm_r,
    }


def tensor_cases():
    rng = np.random.default_rng(20240611)
    cases = []

    def add(name, desc, ref, test):
        ref = np.asarray(ref, dtype=np.float32)
        test = np.asarray(test, dtype=np.float32)
        assert ref.shape == test.shape and ref.ndim == 1
        c = {"name": name, "description": desc, "n": int(ref.size)}
        c.update(tensor_metrics(ref, test))
        c["ref"] = f32_list(ref)
        c["test"] = f32_list(test)
        cases.append(c)

    # 1. Normal activations + int8 per-tensor fake-quant.
    ref = rng.normal(0.0, 1.0, 1024).astype(np.float32)
    test, s = fake_quant_int8(ref)
    add("normal_int8_fakequant",
        "N(0,1) float32 activations; test = round(ref/s)*s (half-to-even), s = max|ref|/127 = %r (float32)" % s,
        ref, test)

    # 2. GELU-like skewed activations + int8 fake quant (non-zero mean).
    x = rng.normal(0.0, 1.5, 768)
    ref = (0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))).astype(np.float32)
    test, s = fake_quant_int8(ref)
    add("gelu_int8_fakequant",
        "GELU(N(0,1.5^2)) float32 activations; per-tensor int8 fake quant, s = %r (float32)" % s,
        ref, test)

    # 3. Large magnitude, small relative noise (catches E[x^2]-E[x]^2 style cancellation).
    ref = (1.0e4 + 50.0 * rng.normal(0.0, 1.0, 1024)).astype(np.float32)
    test = (ref.astype(np.float64) * (1.0 + 1.0e-5 * rng.normal(0.0, 1.0, 1024))).astype(np.float32)
    add("large_magnitude_1e4",
        "ref ~ 1e4 + 50*N(0,1); test = ref*(1 + 1e-5*N(0,1)) rounded to float32 (relative error ~1e-5)",
        ref, test)

    # 4. Heavy tail: a few outliers blow up the per-tensor scale.
    ref = rng.normal(0.0, 1.0, 1024)
    idx = rng.choice(1024, size=6, replace=False)
    ref[idx] = rng.choice([-1.0, 1.0], size=6) * rng.uniform(60.0, 200.0, size=6)
    ref = ref.astype(np.float32)
    test, s = fake_quant_int8(ref)
    add("outliers_int8_fakequant",
        "N(0,1) with 6 outliers of magnitude 60..200; per-tensor int8 fake quant, s = %r (float32)" % s,
        ref, test)

    # 5. Identical pair.
    ref = rng.normal(0.0, 2.0, 300).astype(np.float32)
    add("identical", "identical pair (mse 0, sqnr null, cosine 1)", ref, ref.copy())

    # 6. Sign flipped.
    ref = rng.normal(0.25, 1.0, 300).astype(np.float32)
    add("sign_flipped", "test = -ref (cosine -1, sqnr = 10*log10(1/4))", ref, -ref)
    return cases


# ----------------------------------------------------------------------------

def dump_json(path, obj):
    for v in _walk(obj):
        if isinstance(v, float):
            assert math.isfinite(v), path
    text = json.dumps(obj, indent=1, allow_nan=False)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text + "\n")


def _walk(o):
    if isinstance(o, dict):
        for v in o.values():
            yield from _walk(v)
    elif isinstance(o, list):
        for v in o:
            yield from _walk(v)
    else:
        yield o


def main():
    self_checks()
    os.makedirs(IMG_DIR, exist_ok=True)
    # Remove stale PNGs from earlier runs so the directory matches the JSON.
    for fn in sorted(os.listdir(IMG_DIR)):
        if fn.endswith(".png"):
            os.remove(os.path.join(IMG_DIR, fn))

    refs = reference_images()
    ref_paths = {}
    for name, (img, _) in refs.items():
        rel = "images/%s.png" % name
        write_png(rel, img)
        ref_paths[name] = rel

    cases = []
    f1_checked = 0
    for case_name, ref_name, tag, fn, desc in cases_spec():
        ref_img = refs[ref_name][0]
        test_img = fn(ref_img)
        assert test_img.dtype == ref_img.dtype and test_img.shape == ref_img.shape
        test_rel = "images/%s.png" % case_name  # identical pair: a separate file with the same pixels
        write_png(test_rel, test_img)
        # Compute from the files as written (what the C++ side will read).
        r = read_png_raw(os.path.join(OUT_DIR, ref_paths[ref_name]))
        t = read_png_raw(os.path.join(OUT_DIR, test_rel))
        c = compute_case(case_name, ref_paths[ref_name], test_rel, r, t, desc)
        c["ref_source"] = refs[ref_name][1]
        f1_checked += c["ssim_matlab_downsample_factor"] == 1
        cases.append(c)
        print("%-36s %4dx%-4d C=%d %2d-bit psnr=%-8s ssim_wang=%.6f matlab=%.6f ms=%s" % (
            case_name, c["width"], c["height"], c["channels"], c["bit_depth"],
            "null" if c["psnr_db"] is None else "%.3f" % c["psnr_db"],
            c["ssim_wang"], c["ssim_matlab"], "null" if c["ms_ssim"] is None else "%.6f" % c["ms_ssim"]))
    assert f1_checked > 0

    golden = {
        "generator": "tools/make_image_goldens.py",
        "skimage_version": skimage.__version__,
        "numpy_version": np.__version__,
        "scipy_version": scipy.__version__,
        "opencv_version": cv2.__version__,
        "conventions": {
            "loading": "float64 arrays of the raw integer values, HxWxC; SSIM-type metrics per channel then averaged",
            "psnr_db": "skimage peak_signal_noise_ratio(data_range=R), MSE over all pixels and channels; null if identical",
            "psnr_y_db": "Y = 0.299 R + 0.587 G + 0.114 B on raw values (gray: Y = value); null if identical",
            "ssim_wang": "skimage structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False)",
            "ssim_skimage_default": "skimage structural_similarity defaults (7x7 uniform, sample covariance)",
            "ssim_matlab": "Wang ssim.m port: f=max(1,round(min(H,W)/256)) box prefilter ('symmetric','same') + [::f,::f], 11x11 Gaussian sigma 1.5 'valid'",
            "ms_ssim": "Wang 2003, 5 scales, weights (0.0448, 0.2856, 0.3001, 0.2363, 0.1333), 2x2 box ('symmetric','same') + [::2,::2] between scales, max(.,0)",
        },
        "cases": cases,
    }
    dump_json(os.path.join(OUT_DIR, "image_golden.json"), golden)

    tensor = {
        "generator": "tools/make_image_goldens.py",
        "numpy_version": np.__version__,
        "conventions": "ref/test are float32 values written as their exact decimal (float64 repr); metrics in float64 "
                       "with correctly rounded sums: mse = mean((ref-test)^2); sqnr_db = 10*log10(sum(ref^2)/sum((ref-test)^2)) "
                       "(null if identical); cosine = dot/(|ref||test|); max_abs = max|ref-test|; rel_l2 = |ref-test|/|ref|",
        "cases": tensor_cases(),
    }
    dump_json(os.path.join(OUT_DIR, "tensor_error_golden.json"), tensor)
    return 0


if __name__ == "__main__":
    sys.exit(main())

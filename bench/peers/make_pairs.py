#!/usr/bin/python3
"""Writes N pairs of 1024x1024 RGB PNGs (photo crops upscaled, test = JPEG q70 round trip) for the compare-images scaling benchmark."""

import os
import sys

import cv2
import numpy as np
import skimage.data


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    os.makedirs(os.path.join(out, "test"), exist_ok=True)
    photos = [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea(), skimage.data.rocket()]
    for i in range(n):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        s = min(h, w) - 8 * (i // len(photos))
        crop = photo[:s, :s]
        big = cv2.resize(crop, (1024, 1024), interpolation=cv2.INTER_CUBIC)
        bgr = cv2.cvtColor(big, cv2.COLOR_RGB2BGR)
        ok, jpg = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 70])
        test = cv2.imdecode(jpg, cv2.IMREAD_COLOR)
        cv2.imwrite(os.path.join(out, "ref", f"{i:03d}.png"), bgr)
        cv2.imwrite(os.path.join(out, "test", f"{i:03d}.png"), test)


if __name__ == "__main__":
    main()

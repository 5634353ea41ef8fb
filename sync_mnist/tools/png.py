"""The PNG files `sync-mnist predict` takes, checked by their header before they are decoded.

A PNG's header (its IHDR chunk, right after the 8-byte signature) states the image's size and
colour type. Reading it first means that a small file which declares 50,000 x 50,000 pixels (a
decompression bomb) is refused by its header, never decoded. Only 28x28 grayscale passes; the
decoding itself is TensorFlow's (inference.py). This module imports only the standard library.
"""

from __future__ import annotations

import struct

SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZE = 28  # MNIST's digits, and what the model takes
# The IHDR chunk: its length (13) and type, then width, height, bit depth and colour type.
_IHDR_START = b"\x00\x00\x00\x0dIHDR"
_COLOUR_TYPES = {2: "RGB", 3: "palette (indexed colour)", 4: "grayscale with alpha", 6: "RGBA"}


class ImageError(Exception):
    """An image file cannot be classified; the message names every such file."""


def check_header(raw: bytes, path) -> None:
    """Raises ImageError naming `path` unless `raw` begins as a 28x28 grayscale PNG does."""
    if not raw.startswith(SIGNATURE):
        raise ImageError(f"{path}: not a PNG file")
    header = raw[len(SIGNATURE):len(SIGNATURE) + 18]
    if len(header) < 18 or not header.startswith(_IHDR_START):
        raise ImageError(f"{path}: not a readable PNG: no IHDR header after the signature")
    width, height, _, colour_type = struct.unpack(">IIBB", header[len(_IHDR_START):])
    if colour_type != 0:
        kind = _COLOUR_TYPES.get(colour_type, f"colour type {colour_type}")
        raise ImageError(f"{path}: {kind}, expected grayscale (1 channel)")
    if (width, height) != (SIZE, SIZE):
        raise ImageError(f"{path}: {width}x{height} pixels, expected {SIZE}x{SIZE}")

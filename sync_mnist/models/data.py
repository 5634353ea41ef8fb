"""Training data: the MNIST that ships with the package, the user's own files, sharding.

Two datasets, each returned as a `Dataset` of uint8 [n, 784] images and int64 labels:

* ``mnist``: the complete MNIST, 60,000 training and 10,000 test digits. By default the copy
  that ships inside this package (``sync_mnist/models/mnist_files/``, the four IDX .gz files of the
  original database), whose SHA-256 digests are checked on every load; with a data
  directory, the user's own four IDX files (raw or gzip) or a Keras ``mnist.npz``, checked by
  structure.
* ``synthetic``: generated, learnable, and not digits; for tests and smoke runs.

Images stay uint8 until the model scales them in its graph: a worker holds only its own shard
(`Shard` copies its rows), so a task of a 3-worker cluster keeps about 16 MB of training
pixels rather than 188 MB of float32.

`Shard` gives worker ``index`` of ``num_workers`` its own equal-length slice of the
training set and a batch for any global step without iterator state, so a worker that
resumes at step k reads the same batch it would have read without the restart.

This module imports only numpy and the standard library; importing it has no effects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import math
import os
import tempfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sync_mnist.core.shard import DataError

DATASETS = ("mnist", "synthetic")

# The four files, in the order train images, train labels, test images, test labels.
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
NPZ_FILE = "mnist.npz"  # the Keras layout: x_train, y_train, x_test, y_test

# The copy that ships with the package; see its README.md for the origin and the licence.
SHIPPED_DIR = Path(__file__).resolve().parent / "mnist_files"

# SHA-256 of the shipped .gz files. Three are byte-identical to the canonical mirror's;
# train-images was re-compressed (gzip -9 -n) from the canonical uncompressed file, so its
# digest differs from the canonical 440fcabf... while its content is the same.
SHIPPED_SHA256 = {
    "train-images-idx3-ubyte.gz": "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}

IMAGE_SIZE = 28
NUM_PIXELS = IMAGE_SIZE * IMAGE_SIZE
NUM_CLASSES = 10

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_IDX_BYTES = 1 << 30  # MNIST's largest file holds 47 MB of pixels
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: `==` on arrays is elementwise
class Dataset:
    """A train/test split, as pixels.

    Attributes:
        name: "mnist" or "synthetic".
        train_images: uint8 [n, 784], 0..255.
        train_labels: int64 [n], values 0..9.
        test_images: uint8 [m, 784], 0..255.
        test_labels: int64 [m], values 0..9.
        description: one human-readable line saying what the data is and how much.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    description: str

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images = getattr(self, f"{split}_images")
            labels = getattr(self, f"{split}_labels")
            where = f"dataset {self.name!r} {split} split"
            if images.dtype != np.uint8 or images.ndim != 2 or images.shape[1] != NUM_PIXELS:
                raise DataError(
                    f"{where}: images must be uint8 [n, {NUM_PIXELS}], "
                    f"got {images.dtype} {list(images.shape)}"
                )
            if labels.dtype != np.int64 or labels.shape != (len(images),):
                raise DataError(
                    f"{where}: labels must be int64 [{len(images)}] to match the images, "
                    f"got {labels.dtype} {list(labels.shape)}"
                )
            _check_labels(labels, where)


def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1] (the benchmark's MultiWorkerMirroredStrategy feeds
    them so; the built-in models scale in their graph: models/mnist.py)."""
    return images.astype(np.float32) / np.float32(255.0)


# --------------------------------------------------------------------------- IDX files


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an MNIST IDX file of unsigned bytes, raw or gzip-compressed.

    Gzip is recognised by its magic bytes, not by the file name, so a renamed or
    decompressed copy reads the same. The header is checked before the payload is
    trusted: images have magic 2051 and 3 dimensions, labels 2049 and 1, and the payload
    must be exactly as long as the dimensions say.

    Args:
        path: the file.

    Returns:
        A uint8 array: [n, rows, cols] for images, [n] for labels.

    Raises:
        DataError: unreadable, wrong magic, no items, truncated (header, payload or gzip
            stream) or trailing bytes; the message starts with the path.
    """
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            with (gzip.GzipFile(fileobj=raw) if gzipped else contextlib.nullcontext(raw)) as f:
                return _read_idx_stream(f, path)
    except EOFError as exc:
        raise DataError(f"{path}: truncated gzip stream ({exc})") from exc
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip stream ({exc})") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _read_idx_stream(f: BinaryIO, path: Path) -> np.ndarray:
    # Streamed into an array of the declared size, so loading holds one copy of the pixels
    # (47 MB for MNIST's training images), never the file's bytes as well.
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: truncated: {len(head)} bytes is too short for an IDX header")
    magic = int.from_bytes(head, "big")
    if magic == _IDX_IMAGES_MAGIC:
        ndim, kind = 3, "images"
    elif magic == _IDX_LABELS_MAGIC:
        ndim, kind = 1, "labels"
    else:
        raise DataError(
            f"{path}: not an MNIST IDX file: magic number {magic} (0x{magic:08x}), expected "
            f"{_IDX_IMAGES_MAGIC} (uint8 images) or {_IDX_LABELS_MAGIC} (uint8 labels)"
        )
    header_len = 4 + 4 * ndim
    rest = f.read(4 * ndim)
    if len(rest) < 4 * ndim:
        raise DataError(
            f"{path}: truncated: the {kind} header needs {header_len} bytes, "
            f"found {4 + len(rest)}"
        )
    dims = tuple(int.from_bytes(rest[4 * i : 4 + 4 * i], "big") for i in range(ndim))
    if dims[0] == 0:  # an empty split: the chief would evaluate on nothing, after training
        raise DataError(f"{path}: header declares 0 {kind}")
    if ndim == 3 and (dims[1] == 0 or dims[2] == 0):
        raise DataError(f"{path}: header declares empty {dims[1]}x{dims[2]} images")
    expected = math.prod(dims)  # exact: a numpy product of huge dimensions wraps around
    declared = (
        f"{dims[0]} images of {dims[1]}x{dims[2]} ({expected} bytes)"
        if ndim == 3
        else f"{dims[0]} labels"
    )
    if expected > _MAX_IDX_BYTES:
        raise DataError(f"{path}: header declares {declared}, more than any MNIST-like file")
    array = np.empty(dims, dtype=np.uint8)
    view, found = memoryview(array).cast("B"), 0
    # In chunks: GzipFile.readinto of the whole array would decompress into a temporary
    # bytes object of the same size first.
    while found < expected and (n := f.readinto(view[found : found + _CHUNK])):
        found += n
    if found < expected:
        raise DataError(f"{path}: truncated: header says {declared}, found {found} bytes")
    trailing = 0
    while chunk := f.read(_CHUNK):
        trailing += len(chunk)
    if trailing:
        raise DataError(
            f"{path}: {trailing} trailing bytes after the {declared} the header declares"
        )
    return array


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Writes uint8 images [n, rows, cols] or labels [n] as an IDX file.

    The inverse of `read_idx`. Gzip-compressed when the name ends in ".gz" (with a zero
    timestamp, so equal arrays give equal bytes). Written to a temporary file and renamed
    into place, so a reader never sees half a file.

    Args:
        path: the destination.
        array: uint8, 3-dimensional (images) or 1-dimensional (labels).

    Raises:
        DataError: `array` is not uint8 or has another number of dimensions.
    """
    path = Path(path)
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim not in (1, 3):
        raise DataError(
            f"{path}: can only write uint8 images [n, rows, cols] or labels [n], "
            f"got {array.dtype} {list(array.shape)}"
        )
    magic = _IDX_IMAGES_MAGIC if array.ndim == 3 else _IDX_LABELS_MAGIC
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    payload = header + np.ascontiguousarray(array).tobytes()
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    _write_atomically(path, payload)


# ------------------------------------------------------------------ finding and loading


def _locate(data_dir: Path, gz_name: str) -> Path | None:
    for name in (gz_name, gz_name[: -len(".gz")]):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def _either_name(gz_name: str) -> str:
    return gz_name[: -len(".gz")] + "[.gz]"


def find_mnist(data_dir: str | os.PathLike) -> tuple[str, tuple[Path, ...]]:
    """Locates MNIST in `data_dir`: the four IDX files, else a Keras ``mnist.npz``.

    Each IDX file may be gzip-compressed (``train-images-idx3-ubyte.gz``) or raw
    (``train-images-idx3-ubyte``).

    Args:
        data_dir: the directory to look in.

    Returns:
        ("idx", the four files in `MNIST_FILES` order) or ("npz", (the one file,)).

    Raises:
        DataError: neither is there, or some IDX files are present and others missing;
            the message says where it looked and what is missing.
    """
    data_dir = Path(data_dir)
    located = [_locate(data_dir, name) for name in MNIST_FILES]
    if all(located):
        return "idx", tuple(located)
    if any(located):
        missing = [_either_name(n) for n, p in zip(MNIST_FILES, located) if p is None]
        raise DataError(
            f"{data_dir}: incomplete MNIST: missing {', '.join(missing)} "
            f"(found {', '.join(p.name for p in located if p is not None)})"
        )
    if (data_dir / NPZ_FILE).is_file():
        return "npz", (data_dir / NPZ_FILE,)
    names = ", ".join(_either_name(n) for n in MNIST_FILES)
    raise DataError(f"no MNIST in --data-dir {data_dir}: looked for {names} or {NPZ_FILE}")


def check_shipped(directory: Path | None = None) -> None:
    """Checks the shipped MNIST files against their SHA-256 digests.

    Raises:
        DataError: a file is missing or its digest differs; names the file. A damaged
            installation is never trained on.
    """
    directory = SHIPPED_DIR if directory is None else directory
    for name, expected in SHIPPED_SHA256.items():
        path = directory / name
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise DataError(f"{path}: the shipped MNIST file cannot be read "
                            f"({exc.strerror or exc}); reinstall sync_mnist") from exc
        if digest != expected:
            raise DataError(f"{path}: the shipped MNIST file is damaged: SHA-256 {digest}, "
                            f"expected {expected}; reinstall sync_mnist")


def load_mnist(data_dir: str | os.PathLike | None = None) -> Dataset:
    """Loads the complete MNIST: the shipped copy, or the user's files in `data_dir`.

    The shipped copy is checked by digest (`check_shipped`). The user's files are checked
    by structure: IDX magic numbers and lengths, 28x28 images, as many labels as images,
    labels 0..9; so re-compressed copies load too.

    Args:
        data_dir: a directory holding the four IDX files or ``mnist.npz``; None: the
            shipped copy.

    Returns:
        A Dataset named "mnist".

    Raises:
        DataError: a file is damaged, malformed or missing; names the file.
    """
    fmt, paths, source = _mnist_files(data_dir)
    if fmt == "npz":
        train_x, train_y, test_x, test_y = _read_npz(paths[0])
    else:
        train_x, train_y = _read_idx_pair(paths[0], paths[1])
        test_x, test_y = _read_idx_pair(paths[2], paths[3])
    return Dataset(
        name="mnist",
        train_images=train_x.reshape(len(train_x), NUM_PIXELS),
        train_labels=train_y.astype(np.int64),
        test_images=test_x.reshape(len(test_x), NUM_PIXELS),
        test_labels=test_y.astype(np.int64),
        description=f"mnist: {source} ({len(train_y):,} train / {len(test_y):,} test digits)",
    )


def _mnist_files(data_dir) -> tuple[str, tuple[Path, ...], str]:
    if data_dir is None:
        check_shipped()
        paths = tuple(SHIPPED_DIR / name for name in MNIST_FILES)
        return "idx", paths, "the complete MNIST shipped with sync_mnist"
    fmt, paths = find_mnist(data_dir)
    return fmt, paths, f"MNIST from {data_dir} ({paths[0].name}{'' if fmt == 'npz' else ', ...'})"


def load_test(name: str, data_dir: str | os.PathLike | None = None, *,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The test split of `name` alone: uint8 images [m, 784] and int64 labels.

    Raises:
        DataError: as `load_dataset`.
    """
    if name == "mnist":
        fmt, paths, _ = _mnist_files(data_dir)
        if fmt == "npz":
            _, _, images, labels = _read_npz(paths[0])
        else:
            images, labels = _read_idx_pair(paths[2], paths[3])
        return images.reshape(len(images), NUM_PIXELS), labels.astype(np.int64)
    full = load_dataset(name, data_dir, seed=seed)
    return full.test_images, full.test_labels


def _read_idx_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    # Swapped or misnamed files pass read_idx; only the role check catches them.
    if images.ndim != 3:
        raise DataError(f"{images_path}: expected images (IDX magic 2051), found labels")
    if labels.ndim != 1:
        raise DataError(f"{labels_path}: expected labels (IDX magic 2049), found images")
    _check_image_shape(images, images_path)
    if len(images) != len(labels):
        raise DataError(
            f"{images_path} has {len(images)} images but {labels_path} "
            f"has {len(labels)} labels"
        )
    _check_labels(labels, str(labels_path))
    return images, labels


def _read_npz(path: Path) -> tuple[np.ndarray, ...]:
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise DataError(
                    f"{path}: missing arrays {', '.join(missing)} "
                    f"(has {', '.join(npz.files) or 'none'})"
                )
            arrays = tuple(npz[k] for k in keys)
    except DataError:
        raise
    except Exception as exc:  # np.load raises several types for a damaged zip
        raise DataError(f"{path}: cannot read as .npz: {exc}") from exc
    train_x, train_y, test_x, test_y = arrays
    for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        if x.dtype != np.uint8:
            raise DataError(f"{path}: x_{split} must be uint8 pixels, got {x.dtype}")
        _check_image_shape(x, path, f"x_{split}")
        if not len(x):  # an empty split: the chief would evaluate on nothing, after training
            raise DataError(f"{path}: x_{split} holds no images")
        if not np.issubdtype(y.dtype, np.integer):  # 3.7 is no digit: refuse, never truncate
            raise DataError(f"{path}: y_{split} must hold integer labels, got {y.dtype}")
        if y.ndim != 1 or len(y) != len(x):
            raise DataError(
                f"{path}: x_{split} has {len(x)} images but y_{split} "
                f"has shape {list(y.shape)}"
            )
        _check_labels(y, f"{path} y_{split}")
    return arrays


def _check_image_shape(images: np.ndarray, path: Path, what: str = "images") -> None:
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise DataError(
            f"{path}: {what} must be [n, {IMAGE_SIZE}, {IMAGE_SIZE}], got {list(images.shape)}"
        )


def _check_labels(labels: np.ndarray, where: str) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= NUM_CLASSES))
    if bad.size:
        raise DataError(
            f"{where}: label {labels[bad[0]]} at index {bad[0]} is outside 0..9 "
            f"({bad.size} bad labels)"
        )


# ------------------------------------------------------------------------ synthetic


def make_synthetic(seed: int = 0, train_size: int = 6000, test_size: int = 1000) -> Dataset:
    """Generates a learnable stand-in for MNIST: noisy copies of 10 random prototypes.

    Each class is a fixed random image; an example is its class prototype plus Gaussian
    noise (sigma 0.35 of the pixel range), clipped to 0..255. The classes are far apart
    relative to the noise, so a small MLP reaches well over 90% within a few hundred
    steps; a model that does not learn stays near 10%.

    Args:
        seed: determines prototypes, labels and noise.
        train_size: number of training examples.
        test_size: number of test examples.

    Returns:
        A Dataset named "synthetic".
    """
    if train_size < 1 or test_size < 1:
        raise DataError(
            f"synthetic dataset sizes must be positive, got train_size={train_size}, "
            f"test_size={test_size}"
        )
    rng = np.random.default_rng(seed)
    prototypes = rng.random((NUM_CLASSES, NUM_PIXELS), dtype=np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, NUM_CLASSES, size=n, dtype=np.int64)
        noise = rng.standard_normal((n, NUM_PIXELS), dtype=np.float32)
        images = np.clip(prototypes[labels] + np.float32(0.35) * noise, 0.0, 1.0)
        return np.rint(images * 255.0).astype(np.uint8), labels

    train_images, train_labels = draw(train_size)
    test_images, test_labels = draw(test_size)
    return Dataset(
        name="synthetic",
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        description=(
            f"synthetic: {train_size:,} train / {test_size:,} test generated images "
            f"(10 noisy random prototypes, seed {seed}), NOT digits"
        ),
    )


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, *,
                 seed: int = 0) -> Dataset:
    """Loads `name`: "mnist" (shipped, or from `data_dir`) or "synthetic" (from `seed`).

    Raises:
        DataError: unknown name, or damaged, malformed or missing files.
    """
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "synthetic":
        return make_synthetic(seed)
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def check_source(name: str, data_dir: str | os.PathLike | None = None) -> None:
    """Cheap check, before any task starts, that `load_dataset` will find its files.

    Raises:
        DataError: as `load_dataset` would for missing or damaged files.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if name == "mnist":
        if data_dir is None:
            check_shipped()
        else:
            find_mnist(data_dir)


def _write_atomically(path: Path, payload: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; the files are data, not secrets
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp_name, path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)

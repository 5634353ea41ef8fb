"""Tests for sync_mnist.models.data: IDX and npz reading, the shipped MNIST, sharding, synthetic data."""

import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from sync_mnist.core.shard import Shard
from sync_mnist.models import data
from sync_mnist.models.data import DataError

SHARED_MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"
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
    assert ds.train_images.shape == (50, 784) and ds.train_images.dtype == np.uint8
    assert ds.test_images.shape == (20, 784)
    assert ds.train_labels.dtype == np.int64 and ds.test_labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train_images, TINY[0].reshape(50, 784))
    np.testing.assert_array_equal(ds.train_labels, TINY[1])
    np.testing.assert_array_equal(ds.test_images, TINY[2].reshape(20, 784))
    np.testing.assert_array_equal(ds.test_labels, TINY[3])
    assert "50 train / 20 test" in ds.description


def test_load_mnist_from_raw_idx_files(tmp_path):
    directory = _write_tiny(tmp_path / "raw", gz=False)
    assert data.find_mnist(directory)[1][0].name == "train-images-idx3-ubyte"
    np.testing.assert_array_equal(data.load_mnist(directory).test_labels, TINY[3])


def test_load_mnist_from_keras_npz(tmp_path):
    np.savez(
        tmp_path / "mnist.npz", x_train=TINY[0], y_train=TINY[1], x_test=TINY[2], y_test=TINY[3]
    )
    assert data.find_mnist(tmp_path)[0] == "npz"
    ds = data.load_mnist(tmp_path)
    np.testing.assert_array_equal(ds.train_images, TINY[0].reshape(50, 784))
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


# Each was accepted before: the chief then divided by zero in its evaluation after training
# (exit 1, and the ps exit 200), `sync-mnist evaluate` printed accuracy=nan, and float
# labels were truncated to digits without a word.

@pytest.mark.parametrize("empty", [TEST_IMAGES, TRAIN_LABELS])
def test_an_idx_file_with_a_count_of_0_is_refused(tmp_path, empty):
    arrays = {TEST_IMAGES: TINY[2][:0], TEST_LABELS: TINY[3][:0]} if empty == TEST_IMAGES \
        else {TRAIN_IMAGES: TINY[0][:0], TRAIN_LABELS: TINY[1][:0]}
    directory = _write_tiny(tmp_path, [arrays.get(n, a) for n, a in zip(data.MNIST_FILES, TINY)])
    kind = "images" if empty == TEST_IMAGES else "labels"
    with pytest.raises(DataError) as err:
        data.load_mnist(directory)
    # The images of each pair are read first: an empty test split is named by its images.
    named = empty if empty == TEST_IMAGES else TRAIN_IMAGES
    assert str(err.value) == f"{directory / named}: header declares 0 images"
    with pytest.raises(DataError, match=rf"^{directory / empty}: header declares 0 {kind}$"):
        data.read_idx(directory / empty)


def test_an_npz_with_an_empty_test_split_is_refused(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=TINY[0], y_train=TINY[1], x_test=TINY[2][:0],
             y_test=TINY[3][:0])
    with pytest.raises(DataError) as err:
        data.load_mnist(tmp_path)
    assert str(err.value) == f"{tmp_path / 'mnist.npz'}: x_test holds no images"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_])
def test_an_npz_with_labels_that_are_not_integers_is_refused(tmp_path, dtype):
    labels = TINY[1].astype(dtype) + (dtype(0.7) if dtype is not np.bool_ else False)
    np.savez(tmp_path / "mnist.npz", x_train=TINY[0], y_train=labels, x_test=TINY[2],
             y_test=TINY[3])
    with pytest.raises(DataError) as err:
        data.load_mnist(tmp_path)
    assert str(err.value) == (f"{tmp_path / 'mnist.npz'}: y_train must hold integer labels, "
                              f"got {np.dtype(dtype)}")


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


@pytest.mark.parametrize("where", ["empty", "does-not-exist"])
def test_no_mnist_in_data_dir_names_it_and_what_was_looked_for(tmp_path, where):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as err:
        data.load_dataset("mnist", tmp_path / where)
    assert str(err.value) == (
        f"no MNIST in --data-dir {tmp_path / where}: looked for train-images-idx3-ubyte[.gz], "
        "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
        "t10k-labels-idx1-ubyte[.gz] or mnist.npz")


def test_write_idx_rejects_non_uint8(tmp_path):
    with pytest.raises(DataError, match=r"x\.gz: can only write uint8 .* got float32 \[2, 784\]"):
        data.write_idx(tmp_path / "x.gz", np.zeros((2, 784), np.float32))


def test_dataset_rejects_wrong_dtype():
    images = np.zeros((3, 784), np.float32)
    with pytest.raises(DataError, match=r"'x' train split: images must be uint8 .*float32"):
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


# ---------------------------------------------------------------- choosing a dataset


def test_load_dataset_synthetic_uses_seed(tmp_path):
    a = data.load_dataset("synthetic", tmp_path, seed=3)
    np.testing.assert_array_equal(a.train_images, data.make_synthetic(3).train_images)


@pytest.mark.parametrize("name", ["auto", "mnist-sample", "fashion"])
def test_unknown_dataset_named_with_choices(name):
    for call in (data.load_dataset, data.check_source):
        with pytest.raises(DataError) as err:
            call(name)
        assert str(err.value) == f"unknown dataset {name!r}; choose one of mnist, synthetic"


# ------------------------------------------------------------------- the shipped MNIST


def test_shipped_mnist_is_the_complete_set():
    ds = data.load_dataset("mnist")
    assert (len(ds.train_labels), len(ds.test_labels)) == (60000, 10000)
    assert ds.train_images.shape == (60000, 784) and ds.train_images.dtype == np.uint8
    assert ds.train_labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert ds.test_labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert np.bincount(ds.test_labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028,
                                                    974, 1009]
    assert ds.description == ("mnist: the complete MNIST shipped with sync_mnist "
                              "(60,000 train / 10,000 test digits)")
    # The pixels are the canonical ones: MD5 of the uncompressed test images (header + pixels).
    header = (2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (10000, 28, 28))
    assert hashlib.md5(header + ds.test_images.tobytes()).hexdigest() == \
        "2646ac647ad5339dbf082846283269ea"


def test_shipped_files_carry_their_licence():
    readme = (data.SHIPPED_DIR / "README.md").read_text()
    assert "CC BY-SA 3.0" in readme and "Yann LeCun" in readme
    for name, digest in data.SHIPPED_SHA256.items():
        assert digest in readme, name


@pytest.mark.parametrize("name", data.MNIST_FILES)
def test_a_flipped_byte_in_a_shipped_file_is_caught_by_name(tmp_path, monkeypatch, name):
    shipped = tmp_path / "mnist"
    shutil.copytree(data.SHIPPED_DIR, shipped)
    damaged = bytearray((shipped / name).read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    (shipped / name).write_bytes(bytes(damaged))
    monkeypatch.setattr(data, "SHIPPED_DIR", shipped)
    for call in (data.check_source, data.load_dataset):
        with pytest.raises(DataError) as err:
            call("mnist")
        assert str(err.value).startswith(f"{shipped / name}: the shipped MNIST file is damaged: "
                                         "SHA-256 ")
        assert data.SHIPPED_SHA256[name] in str(err.value)


def test_a_missing_shipped_file_is_named(tmp_path, monkeypatch):
    shipped = tmp_path / "mnist"
    shutil.copytree(data.SHIPPED_DIR, shipped)
    (shipped / TEST_LABELS).unlink()
    monkeypatch.setattr(data, "SHIPPED_DIR", shipped)
    with pytest.raises(DataError, match=rf"{shipped / TEST_LABELS}: the shipped MNIST file "
                       "cannot be read"):
        data.check_source("mnist")


def test_shards_of_the_real_training_set_are_disjoint_and_equal():
    ds = data.load_dataset("mnist")
    shards = [Shard(ds.train_images, ds.train_labels, index=i, num_workers=3,
                         batch_size=100, seed=0) for i in range(3)]
    assert [s.size for s in shards] == [20000] * 3
    assert [s.batches_per_epoch for s in shards] == [200] * 3
    union = np.concatenate([s.indices for s in shards])
    assert len(np.unique(union)) == 60000
    # Each shard's batch is the rows its indices name, as stored (the model scales them).
    images, labels = shards[1].batch(201)  # epoch 1, second batch
    rows = shards[1].epoch_order(1)[100:200]
    np.testing.assert_array_equal(labels, ds.train_labels[rows])
    np.testing.assert_array_equal(images, ds.train_images[rows])
    assert images.dtype == np.uint8


def test_a_shard_of_dict_features_cuts_every_column_alike():
    labels = np.arange(12, dtype=np.int64)
    features = {"a": np.arange(12) * 10, "b": np.arange(24).reshape(12, 2)}
    shard = Shard(features, labels, index=1, num_workers=2, batch_size=3, seed=4)
    x, y = shard.batch(1)
    np.testing.assert_array_equal(x["a"], y * 10)
    np.testing.assert_array_equal(x["b"][:, 0], y * 2)
    with pytest.raises(data.DataError, match=r"11 rows of features\['b'\] but 12 labels"):
        Shard({"a": features["a"], "b": features["b"][:11]}, labels, index=0,
                   num_workers=2, batch_size=3, seed=4)


# ---------------------------------------------------------------------------- shards


def _indexed(n):
    """Images whose first pixel is the example's index, so batches reveal indices."""
    assert n < 256
    images = np.zeros((n, 784), np.uint8)
    images[:, 0] = np.arange(n)
    return images, np.arange(n) % 10


def _index_of(images):
    """The indices back from a batch, which comes as stored (uint8)."""
    return images[:, 0].astype(int)


def _shards(n, num_workers, batch_size, seed=0):
    images, labels = _indexed(n)
    return [
        Shard(images, labels, index=i, num_workers=num_workers, batch_size=batch_size,
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
            np.testing.assert_array_equal(labels, _index_of(images) % 10)
        return np.concatenate([_index_of(images) for images, _ in batches])

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
        Shard(images, labels, index=2, num_workers=3, batch_size=100, seed=0)
    assert str(err.value) == (
        "batch size 100 is larger than worker 2's shard of 66 examples "
        "(200 examples / 3 workers)"
    )


def test_worker_index_outside_cluster():
    images, labels = _indexed(30)
    expected = r"worker index 5 is outside the cluster \(3 workers: 0-2\)"
    with pytest.raises(DataError, match=expected):
        Shard(images, labels, index=5, num_workers=3, batch_size=2, seed=0)


# ------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_determinism():
    ds = data.make_synthetic(seed=1, train_size=600, test_size=100)
    assert ds.train_images.shape == (600, 784) and ds.train_images.dtype == np.uint8
    assert ds.test_images.shape == (100, 784) and ds.test_labels.dtype == np.int64
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
        data.to_float(ds.train_images), ds.train_labels, data.to_float(ds.test_images),
        ds.test_labels
    )
    assert accuracy > 0.9


def test_a_built_in_models_data_error_is_its_line_alone(tmp_path):
    """Raised by the package's own code (the built-in model reading --data-dir), the error's
    line says it all: no traceback of the package's frames below it (exit 2, one line)."""
    from sync_mnist import api
    from sync_mnist.models import mnist
    from sync_mnist.task import inputs

    _write_tiny(tmp_path)
    path = tmp_path / TRAIN_IMAGES
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-1]))
    with pytest.raises(api.DataError) as raised:
        inputs.call_input_fn("train_input_fn", mnist.train_input_fn,
                             {**mnist.PARAMS, "data_dir": str(tmp_path)})
    assert str(raised.value) == (f"{path}: truncated: header says 50 images of 28x28 (39200 "
                                 "bytes), found 39199 bytes")
    assert type(raised.value) is api.DataError  # its line alone: no traceback below it

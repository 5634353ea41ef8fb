"""sync_mnist: provably synchronous parameter-server training with TensorFlow on CPU."""

__version__ = "0.1.0"

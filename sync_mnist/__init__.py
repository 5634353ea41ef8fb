"""sync_mnist: provably synchronous parameter-server training of MNIST with TensorFlow on CPU."""

__version__ = "0.1.0"

"""`--model SPEC`: a built-in model's name, a module (`pkg.module:NAME`) or a file
(`path/to/file.py:NAME`), resolved to a sync_mnist.api.Model.

Every way it can fail is bad input (ConfigError, exit 2) with one line naming the SPEC and
the problem; an exception raised by the user's own code while it loads is shown below that
line, with its traceback, since that is where its cause is.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

from sync_mnist import models
from sync_mnist.core.config import ConfigError


def check(spec: str) -> None:
    """What can be checked of `spec` without importing it (the launcher, before any task
    starts): its form, and that its file or its module's top package exists."""
    where, name = _parse(spec)
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise ConfigError(f"--model {spec!r}: no such file {where}")
    elif importlib.util.find_spec(where.split(".")[0]) is None:
        raise ConfigError(f"--model {spec!r}: no module named {where.split('.')[0]!r}")


def _parse(spec: str) -> tuple[str, str]:
    where, sep, name = models.BUILT_IN.get(spec, spec).rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(f"--model {spec!r} is neither a built-in model "
                          f"({', '.join(models.BUILT_IN)}) nor MODULE:NAME or FILE.py:NAME")
    return where, name


def resolve(spec: str):
    """The sync_mnist.api.Model that `spec` names; ConfigError naming it otherwise."""
    from sync_mnist import api  # imports TensorFlow: not for `check`

    where, name = _parse(spec)
    module = _load_file(spec, Path(where)) if where.endswith(".py") else _import(spec, where)
    if not hasattr(module, name):
        raise ConfigError(f"--model {spec!r}: {where} has no name {name!r}")
    model = getattr(module, name)
    if not isinstance(model, api.Model):
        raise ConfigError(f"--model {spec!r}: {name} is a {type(model).__name__}, not a "
                          "sync_mnist.api.Model")
    return model


def _load_file(spec: str, path: Path):
    if not path.is_file():
        raise ConfigError(f"--model {spec!r}: no such file {path}")
    # A name of its own per path, so two model files named alike do not replace each other.
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"sync_mnist_user_model_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None:
        raise ConfigError(f"--model {spec!r}: {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(loader_spec)
    # As `python FILE` would: a module beside the file imports, wherever the task started
    # (`python -m sync_mnist`, as the launcher starts it, puts the working directory first, and
    # the `sync-mnist` script its own). Left there, for a model function that imports later.
    beside = str(path.resolve().parent)
    if beside not in sys.path:
        sys.path.insert(0, beside)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[module_name]
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise _raised(spec, str(path), e) from None
    return module


def _import(spec: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ConfigError(f"--model {spec!r}: no module named {e.name!r}") from None
        raise _raised(spec, module_name, e) from None
    except Exception as e:
        raise _raised(spec, module_name, e) from None


def _raised(spec: str, where: str, error: BaseException):
    from sync_mnist import api

    text = " ".join(str(error).split())
    return api.ContractError(f"--model {spec!r}: {where} raised {type(error).__name__} while it "
                             f"loaded{': ' + text if text else ''}", user_traceback(error))


def call(what: str, function, *args, **kwargs):
    """function(*args, **kwargs), a function of a user's model (an input function, its check).
    What it raises for bad input, naming it itself (api.DataError, api.ConfigError), as it is;
    anything else as the model's error (api.ContractError: "WHAT raised TYPE: message", with
    the user's traceback)."""
    from sync_mnist import api

    try:
        return function(*args, **kwargs)
    except (api.DataError, api.ConfigError):
        raise
    except Exception as e:
        raise api.ContractError(f"{what} raised {type(e).__name__}: "
                                f"{' '.join(str(e).split()) or '-'}",
                                user_traceback(e)) from None


def user_traceback(error: BaseException) -> str:
    """The traceback of `error`, from the first frame outside this package on; "" when every
    frame is the package's (a built-in model's data error: its message says it all)."""
    frames = traceback.extract_tb(error.__traceback__)
    package = str(Path(__file__).resolve().parents[1])
    first = next((k for k, f in enumerate(frames)
                  if not f.filename.startswith(package) and "importlib" not in f.filename),
                 None)
    if first is None:
        return ""
    lines = traceback.format_list(frames[first:])
    lines += traceback.format_exception_only(type(error), error)
    return "Traceback (most recent call last):\n" + "".join(lines).rstrip()

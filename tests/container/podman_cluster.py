"""The image of deploy/kubernetes/Dockerfile, built and run as a TFJob's pods, with podman.

Root only. Everything podman stores (images, containers, volumes, network definitions) goes in a
temporary directory of the test's own (`--root`, `--runroot`, and a containers.conf passed with
CONTAINERS_CONF), removed by `Podman.close`; the host's podman storage and /etc/containers are
not touched. What podman writes elsewhere whatever it is told (HOST_DIRS) is removed too if the
test made it, and `Podman.leftovers` checks that nothing is left, iptables rules included. One
thing is kept on purpose, in the checkout's build/ (`make clean` removes it): the Debian 12 root
that mmdebstrap makes (a base image's tarball, about 230 MB), so that a second run does not make
it again. The image itself is built anew in every run, on a storage that goes with the test.

This machine's podman (4.3, Debian 12) needs two settings in containers.conf: the runc runtime
(crun fails: "cgroups in hybrid mode not supported") and no default ulimits ("setrlimit
RLIMIT_NOFILE: Operation not permitted").
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import procs

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "kubernetes" / "Dockerfile"
PACKAGES = ("podman", "runc", "mmdebstrap")
TOOLS = ("podman", "runc", "mmdebstrap")
BASE_SECS = 900  # mmdebstrap: about 25 s here
BUILD_SECS = 1200  # the image: pip downloads TensorFlow; about 60 s here
COMMAND_SECS = 60  # one podman command
# The base: Debian 12's Python 3.11 (with its venv module: the Dockerfile makes a venv) and
# tini, from Debian's packages. python3-pip is not needed: the venv has its own pip.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
BASE_ARGV = ("mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
             "bookworm")
CACHE = ROOT / "build" / "container"
BASE_IMAGE = "localhost/sync-mnist-base:bookworm"
IMAGE = "localhost/sync-mnist:0.1.0"
# The CA bundle this host trusts. pip in the build trusts it too (where this host reaches the
# package registry through a TLS-inspecting proxy, the image's own bundle would not do); it is
# mounted for the build only, so the image keeps nothing of it but an empty /etc/xdg/pip.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# What podman writes on the host whatever --root and --runroot say: netavark's run state (an IP
# allocation database, aardvark-dns's configuration) and the image library's blob-info cache.
# Removed at the end if the test made them.
HOST_DIRS = (Path("/run/containers"), Path("/var/lib/containers"))
NETAVARK_DNS = Path("/run/containers/networks/aardvark-dns")
# Measured figures, printed at the end of the run (conftest.py).
FIGURES: dict[str, str] = {}


def unavailable() -> str | None:
    """Why no containers can be built and run here (after installing podman, runc and
    mmdebstrap where they are missing and this is root), or None if they can."""
    if os.geteuid() != 0:
        return f"needs root to run podman with runc and mmdebstrap (euid is {os.geteuid()})"
    installing = any(not procs.which(tool) for tool in TOOLS)
    started = time.monotonic()
    why = procs.apt_installed(PACKAGES, TOOLS)
    if installing and why is None:
        FIGURES["install"] = (f"apt-get update and install {' '.join(PACKAGES)}: "
                              f"{time.monotonic() - started:.0f} s")
    return why


def _run(argv: list[str], timeout: float, env: dict | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs argv to its end in a process group of its own, killed however it ends; raises
    AssertionError after `timeout` s. Output is text, stderr apart."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`{' '.join(argv)}` did not finish within {timeout} s") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, _quiet(err))


def _quiet(stderr: str) -> str:
    # Podman says this on every command where no syslog runs; it is not an error.
    return "\n".join(line for line in stderr.splitlines()
                     if "failed to connect to syslog" not in line)


def base_tarball() -> Path:
    """The Debian 12 root, made by mmdebstrap unless build/container holds one of this
    recipe (FIGURES says which, and how long it took)."""
    digest = hashlib.sha256("\0".join(BASE_ARGV).encode()).hexdigest()[:12]
    tarball = CACHE / f"debian-bookworm-{digest}.tar"
    if tarball.exists():
        FIGURES["base"] = f"cached ({tarball.relative_to(ROOT)}, {_mb(tarball.stat().st_size)})"
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(f".{os.getpid()}.partial.tar")
    started = time.monotonic()
    try:
        out = _run([*BASE_ARGV, str(partial)], BASE_SECS)
        if out.returncode:
            raise RuntimeError(f"mmdebstrap failed ({out.returncode}):\n{out.stderr[-3000:]}")
        os.replace(partial, tarball)
    finally:
        partial.unlink(missing_ok=True)
    FIGURES["base"] = (f"made by mmdebstrap in {time.monotonic() - started:.0f} s "
                       f"({_mb(tarball.stat().st_size)})")
    return tarball


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


class Podman:
    """podman on a storage of its own, in a temporary directory; `close` removes what it
    started (by id) and then the directory."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="sync-mnist-podman-"))
        conf = self.dir / "containers.conf"
        conf.write_text("[containers]\ndefault_ulimits = []\nlog_driver = \"k8s-file\"\n"
                        "[engine]\nruntime = \"runc\"\nevents_logger = \"file\"\n"
                        f"[network]\nnetwork_config_dir = \"{self.dir / 'networks'}\"\n")
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.argv = [procs.which("podman"), "--root", str(self.dir / "root"),
                     "--runroot", str(self.dir / "runroot")]
        self.containers: list[Container] = []
        self.networks: dict[str, str] = {}  # name: its bridge interface on the host
        self.volumes: list[str] = []
        self.made_host_dirs = [d for d in HOST_DIRS if not d.exists()]
        self.firewall_before = _netavark_firewall()

    def __call__(self, *args: str, timeout: float = COMMAND_SECS, check: bool = True,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
        out = _run([*self.argv, *args], timeout, env=self.env, cwd=cwd)
        if check and out.returncode:
            raise RuntimeError(f"`podman {' '.join(args)}` failed ({out.returncode}): "
                               f"{out.stderr.strip()[-3000:]}")
        return out

    def build_image(self, checkout: Path = ROOT) -> None:
        """The base image from the tarball, then the image from the Dockerfile of `checkout`
        (this one by default) on it; the figures in FIGURES."""
        dockerfile = checkout / DOCKERFILE.relative_to(ROOT)
        tarball = base_tarball()
        self("import", str(tarball), BASE_IMAGE, timeout=300)
        build_mounts = []
        if HOST_CA.exists():
            trust = self.dir / "build-trust"
            trust.mkdir()
            shutil.copy(HOST_CA, trust / "ca.crt")
            (trust / "pip.conf").write_text("[global]\ncert = /etc/xdg/pip/ca.crt\n")
            build_mounts = ["--volume", f"{trust}:/etc/xdg/pip:ro"]
        started = time.monotonic()
        self("build", "--file", str(dockerfile),
             "--ignorefile", str(dockerfile.with_name("Dockerfile.dockerignore")),
             "--build-arg", f"BASE={BASE_IMAGE}", *build_mounts,
             # The host's network for the build's RUN steps: pip reaches the registry as this
             # host does, and no bridge, NAT or firewall rule is made for them.
             "--network", "host", "--tag", IMAGE, ".",
             timeout=BUILD_SECS, cwd=checkout)
        FIGURES["image build"] = f"{time.monotonic() - started:.0f} s (on the imported base)"
        size = int(self("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
        FIGURES["image size"] = f"{_mb(size)} ({size} bytes)"

    def network(self, name: str) -> str:
        """A bridge network, internal (no route out, no NAT rules on the host): the
        containers reach each other by name and alias, through podman's DNS."""
        self("network", "create", "--internal", name)
        self.networks[name] = self("network", "inspect", "--format", "{{.NetworkInterface}}",
                                   name).stdout.strip()
        return name

    def volume(self, name: str) -> str:
        self("volume", "create", name)
        self.volumes.append(name)
        return name

    def run(self, name: str, *options: str, command: tuple[str, ...] = ()) -> Container:
        """`podman run -d`: a container of the image, started now; its id is kept for
        `close`."""
        started = time.monotonic()
        cid = self("run", "--detach", "--name", name, *options, IMAGE, *command).stdout.strip()
        container = Container(self, cid, name, started)
        self.containers.append(container)
        return container

    def remove(self, *containers: Container) -> None:
        """Removes containers this Podman started, by id, killing those still running."""
        if containers:
            self("rm", "--force", "--time", "0", *(c.id for c in containers), check=False)

    def close(self) -> None:
        """Removes every container, network and volume it made, then its whole storage."""
        try:
            self.remove(*self.containers)
            if self.networks:
                self("network", "rm", "--force", *self.networks, check=False)
            if self.volumes:
                self("volume", "rm", "--force", *self.volumes, check=False)
            self("rmi", "--all", "--force", check=False)
        finally:
            for mount in self._mounts():
                subprocess.run(["umount", "--lazy", mount], timeout=COMMAND_SECS,
                               stdin=subprocess.DEVNULL, capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            if not (NETAVARK_DNS.exists() and any(NETAVARK_DNS.iterdir())):  # no network left
                for made in self.made_host_dirs:
                    shutil.rmtree(made, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this Podman is still on the host after `close`: its storage, a process
        that names it (conmon, a container's monitor, does), a mount under it, a network's
        bridge or its DNS entries."""
        left = [f"{self.dir} exists"] if self.dir.exists() else []
        left += [f"mount {m}" for m in self._mounts()]
        left += [f"process {p}" for p in _processes_mentioning(str(self.dir))]
        for name, interface in self.networks.items():
            if interface and Path("/sys/class/net", interface).exists():
                left.append(f"network {name}'s bridge {interface}")
            if (NETAVARK_DNS / name).exists():
                left.append(f"network {name}'s DNS entries in {NETAVARK_DNS}")
        left += [f"{d} (absent before)" for d in self.made_host_dirs if d.exists()]
        left += [f"firewall rule {rule}" for rule in _netavark_firewall() - self.firewall_before]
        return left

    def _mounts(self) -> list[str]:
        prefix = str(self.dir) + "/"
        return [fields[4] for fields in (line.split() for line in
                                         Path("/proc/self/mountinfo").read_text().splitlines())
                if fields[4].startswith(prefix)]


def _netavark_firewall() -> set[str]:
    """The host's iptables chains and rules that netavark made (an internal network needs
    none; a network with a route out adds NAT chains that netavark never removes)."""
    save = procs.which("iptables-save")
    if not save:
        return set()
    out = _run([save], COMMAND_SECS)
    return {line for line in out.stdout.splitlines() if "NETAVARK" in line.upper()}


def _processes_mentioning(text: str) -> list[str]:
    from procs import processes_mentioning

    return processes_mentioning(text)


@dataclasses.dataclass
class Container:
    """A container a Podman started; its log read through `podman logs`."""

    podman: Podman
    id: str
    name: str
    started: float  # time.monotonic() as `podman run` was called

    def logs(self) -> str:
        out = self.podman("logs", self.id, check=False)
        return out.stdout + out.stderr  # the task logs to stderr

    def wait_for_line(self, pattern: str, timeout: float, accept=lambda match: True
                      ) -> tuple[re.Match, float]:
        """Polls the log until a line matches `pattern` and `accept(match)`; (the match, the
        seconds since the container was started). AssertionError after `timeout` s, or once
        the container has exited without such a line."""
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while True:
            running = self.running()
            for match in regex.finditer(self.logs()):
                if accept(match):
                    return match, time.monotonic() - self.started
            if not running or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no line matching {pattern!r} within "
                                     f"{timeout} s ({'running' if running else 'exited'}); "
                                     f"log:\n{self.logs()}")
            time.sleep(0.2)

    def running(self) -> bool:
        return self.podman("inspect", "--format", "{{.State.Running}}", self.id,
                           check=False).stdout.strip() == "true"

    def wait(self, timeout: float) -> int:
        """The container's exit code, once it has exited; AssertionError after `timeout` s."""
        try:
            out = self.podman("wait", self.id, timeout=timeout)
        except AssertionError:
            raise AssertionError(f"{self.name} still running after {timeout} s; log:\n"
                                 f"{self.logs()}") from None
        return int(out.stdout.strip())

    def kill(self) -> None:
        """SIGKILL, as a node lost or an OOM kill ends a pod."""
        self.podman("kill", self.id)

    def stop(self, grace: int) -> None:
        """SIGTERM, then SIGKILL after `grace` s: the kubelet's way of ending a pod."""
        self.podman("stop", "--time", str(grace), self.id, timeout=grace + COMMAND_SECS)


def main(argv: list[str]) -> int:
    """`python tests/container/podman_cluster.py [CHECKOUT]`, from the repository root with
    tests/ on PYTHONPATH, as root: builds the image of CHECKOUT's Dockerfile (this checkout's by
    default) as the tier does, on the same base, and prints its size (docs/kubernetes.md,
    "Image size"); nothing of it is left but the base's tarball in build/container."""
    checkout = Path(argv[0]).resolve() if argv else ROOT
    why = unavailable()
    if why:
        print(f"no podman here: {why}")
        return 1
    podman = Podman()
    try:
        podman.build_image(checkout)
    finally:
        podman.close()
    for name, value in FIGURES.items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))

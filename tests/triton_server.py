"""A real Triton Inference Server for tests: the ``tritonserver`` binary nvidia-pytriton ships (Python backend
only, no GPU needed), started on loopback with free ports on a model repository, stopped at the end."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def triton_home() -> Path | None:
    """Where nvidia-pytriton keeps the server (bin/, backends/, python_backend_stubs/); None if not installed."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    home = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return home if (home / "bin" / "tritonserver").is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backends_dir(home: Path, folder: Path) -> Path:
    """A backend folder whose Python backend has the stub built for this Python."""
    python = folder / "backends" / "python"
    if not python.exists():
        shutil.copytree(home / "backends" / "python", python, ignore=shutil.ignore_patterns("__pycache__"))
        stub = home / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
        shutil.copy2(stub, python / "triton_python_backend_stub")
    return folder / "backends"


class Server:
    def __init__(self, repo: Path, work: Path, *, timeout: float = 240.0):
        self.repo, self.work, self.timeout = Path(repo), Path(work), timeout
        self.proc: subprocess.Popen | None = None
        self.log = self.work / "tritonserver.log"

    def start(self, retry: bool = True) -> "Server":
        """Started and ready. Started once more where the server aborted while its Python backend stubs loaded
        (``boost::interprocess::lock_exception``: the backend's intermittent abort when models load side by side,
        triton-inference-server/server#8882); any other exit, or a second abort, is the test's error."""
        home = triton_home()
        if home is None:
            raise RuntimeError("nvidia-pytriton is not installed")
        self.http, self.grpc, self.metrics = _free_port(), _free_port(), _free_port()
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        # the stub, copied out of the package, finds the libraries bundled beside it through this
        libs = str(home.parents[1] / "nvidia_pytriton.libs")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH")) if p)
        cmd = [str(home / "bin" / "tritonserver"), f"--model-repository={self.repo}",
               f"--backend-directory={backends_dir(home, self.work)}", "--http-address=127.0.0.1",
               f"--http-port={self.http}", "--allow-grpc=false", "--metrics-address=127.0.0.1",
               f"--metrics-port={self.metrics}", "--log-verbose=0", "--exit-timeout-secs=10"]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.url = f"127.0.0.1:{self.http}"
        deadline = time.monotonic() + self.timeout
        import urllib.request

        while time.monotonic() < deadline:
            if "error while loading shared libraries" in self.log.read_text(errors="replace"):
                self.stop()
                raise RuntimeError(f"the Python backend stub did not start:\n{self.log.read_text()[-2000:]}")
            if self.proc.poll() is not None:
                if retry and self._aborted_loading():
                    self.proc = None
                    return self.start(retry=False)
                raise RuntimeError(f"tritonserver exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tritonserver not ready in {self.timeout} s:\n{self.log.read_text()[-4000:]}")

    def _aborted_loading(self) -> bool:
        return self.proc.returncode == -signal.SIGABRT and "lock_exception" in self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

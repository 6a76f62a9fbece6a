"""Start and stop a real `vllm serve` (all three processes) on loopback, for tests and the demo."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# vLLM on this CPU machine: a fixed KV budget (the NUMA memory report is unreliable), internal
# sockets on loopback, no hub.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}
SERVE_ENV = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command() -> list[str]:
    """The `vllm` console script next to this Python (the CLI users type)."""
    beside = Path(sys.executable).with_name("vllm")
    return [str(beside) if beside.exists() else shutil.which("vllm") or "vllm", "serve"]


class Server:
    def __init__(self, model: Path, log_path: Path, *extra_args: str, served_name: str = "tiny"):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log_path
        self.served_name = served_name
        self.args = [*vllm_command(), str(model), "--host", "127.0.0.1", "--port", str(self.port),
                     "--served-model-name", served_name, "--max-model-len", "512", "--enforce-eager",
                     *extra_args]
        self.env = dict(os.environ, **SERVE_ENV)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240) -> "Server":
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout}s:\n{self.log_text()[-4000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""What the soak benches share (soak.py over gRPC, http_soak.py over HTTP):
the CPU worker processes they start and fault, the chaos that kills, stops
and restarts them, and the machine's description for the result line."""

from __future__ import annotations

import collections
import os
import platform
import random
import signal
import subprocess
import threading
import time


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


class Workers:
    """The worker processes: started, killed, stopped and restarted by index."""

    def __init__(self, args, run_dir: str):
        self.args = args
        self.run_dir = run_dir
        self.procs: list[subprocess.Popen | None] = [None, None]
        self.logs = [open(os.path.join(run_dir, f"w{i}.log"), "ab") for i in range(2)]
        self.lock = threading.Lock()
        self.peak_rss_kb = [0, 0]

    def socket(self, i: int) -> str:
        return os.path.join(self.run_dir, f"w{i}.sock")

    def start(self, i: int) -> None:
        cmd = [os.path.join(self.args.bin, "tandem-cpu-worker"), "--synthetic", self.args.model,
               "--synthetic_seed", str(self.args.seed), "--socket", self.socket(i), "--worker_index", str(i),
               "--num_workers", "2", "--division", "split", "--threads", "1", "--arena_slot_mb", "4",
               "--region_prefix", f"/tandem-soak-{os.getpid()}-{i}", "--kernel_plan", "exact", "--exit_with_parent"]
        with self.lock:
            self.procs[i] = subprocess.Popen(cmd, stdout=self.logs[i], stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(self.socket(i)) and time.time() < deadline:
            time.sleep(0.05)

    def pid(self, i: int) -> int:
        with self.lock:
            p = self.procs[i]
            return p.pid if p is not None and p.poll() is None else 0

    def kill(self, i: int, sig: int) -> None:
        with self.lock:
            p = self.procs[i]
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self) -> None:
        for i in range(2):
            self.kill(i, signal.SIGCONT)
            self.kill(i, signal.SIGTERM)


def chaos(workers: Workers, stop: threading.Event, rng: random.Random, faults: collections.Counter,
          interval: tuple[float, float]) -> None:
    """At random intervals, one fault on a random worker, undone a few seconds later."""
    while not stop.wait(rng.uniform(*interval)):
        i = rng.randrange(2)
        action = rng.choice(["kill", "stop", "restart"])
        faults[action] += 1
        if action == "kill":
            workers.kill(i, signal.SIGKILL)
            stop.wait(rng.uniform(1, 5))
            workers.start(i)
        elif action == "stop":
            workers.kill(i, signal.SIGSTOP)
            stop.wait(rng.uniform(1, 8))
            workers.kill(i, signal.SIGCONT)
        else:
            workers.kill(i, signal.SIGTERM)
            workers.start(i)


def cpu_flags() -> str:
    """The SIMD flags that matter to the kernels, as lscpu lists them."""
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16")
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(flag for flag in wanted if flag in have)
    return ""

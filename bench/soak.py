#!/usr/bin/env python3
"""Soak and chaos bench (issue 15): mixed generate and beam-search load from N
clients for a given time against tandem-server with 2 tandem-cpu-worker
processes, while workers are killed (SIGKILL, then restarted), stopped
(SIGSTOP, then SIGCONT) and restarted (SIGTERM, then started) at random.

Prints one JSON object: requests done, failed with a clear status (by gRPC
code), lost (no result and no status: an exception other than the server's
status, a stream cut short, a client still waiting at the end) and wrong (a
greedy generation or beam search that succeeded with other ids than the
reference run taken before the load), which must both be 0; peak and final
RSS of the server and of each worker (sampled every second); the faults done.

    bench/soak.sh --duration_s 1800 --clients 16          # the 30-minute run in docs/BENCHMARKS.md
    bench/soak.sh --duration_s 180 --clients 16           # a short one (--clients up to 256)

Needs the build's programs (--bin) and its Python SDK on PYTHONPATH
(build/python); soak.sh sets both.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from soak_common import Workers, chaos, cpu_flags, cpu_model, rss_kb
from tandem import Client, TandemError


def sample_rss(server: subprocess.Popen, workers: Workers, stop: threading.Event, peak: dict) -> None:
    while not stop.wait(1.0):
        peak["server"] = max(peak["server"], rss_kb(server.pid))
        for i in range(2):
            pid = workers.pid(i)
            if pid:
                workers.peak_rss_kb[i] = max(workers.peak_rss_kb[i], rss_kb(pid))


def run_one(client: Client, kind: str, prompt: list[int], args) -> list[int]:
    """One request; its ids (greedy) or best beam's ids. Raises on failure."""
    if kind == "generate":
        g = client.generate(prompt_ids=prompt, max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                            timeout=args.request_timeout_s).wait()
        if len(g.ids) != args.max_tokens:
            raise RuntimeError(f"stream ended after {len(g.ids)} of {args.max_tokens} tokens without an error")
        return g.ids
    beams = client.beam_search(prompt_ids=prompt, beam_width=args.beam_width, max_tokens=args.max_tokens,
                               ignore_eos=True, timeout=args.request_timeout_s)
    return beams[0].ids


def recovered(client: Client, prompts, reference, args, timeout_s: float = 120) -> tuple[bool, float, str]:
    """After the load, with both workers running again: the server reconnects to a
    restarted worker on its own, and until it has, a request fails with a clear
    status. Retries those; (the answer was right, seconds it took, last error)."""
    start = time.time()
    last_error = ""
    while True:
        try:
            ok = run_one(client, "generate", prompts[0], args) == reference["generate"][0]
            return ok, round(time.time() - start, 1), last_error
        except TandemError as e:
            last_error = str(e)
            if time.time() - start > timeout_s:
                return False, round(time.time() - start, 1), last_error
            time.sleep(1)


def load_client(client: Client, prompts, reference, stop: threading.Event, rng: random.Random, counts, lock,
                args) -> None:
    while not stop.is_set():
        kind = "beam" if rng.random() < args.beam_fraction else "generate"
        k = rng.randrange(len(prompts))
        try:
            ids = run_one(client, kind, prompts[k], args)
            outcome = "done" if ids == reference[kind][k] else "wrong"
            code = None
        except TandemError as e:
            outcome, code = "failed", e.code.name
        except Exception as e:  # noqa: BLE001 - anything else is a request lost without a status
            outcome, code = "lost", f"{type(e).__name__}: {e}"
        with lock:
            counts[outcome] += 1
            counts[f"{outcome}_{kind}"] += 1
            if outcome == "failed":
                counts["codes"][code] += 1
            if outcome in ("lost", "wrong") and len(counts["examples"]) < 10:
                counts["examples"].append({"outcome": outcome, "kind": kind, "prompt": k, "detail": code})
        if outcome == "failed":
            stop.wait(0.2)  # a worker is down: do not spin on it


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--model", default="tiny", help="synthetic preset (tiny | demo)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--duration_s", type=float, default=180)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=16)
    p.add_argument("--beam_width", type=int, default=3)
    p.add_argument("--beam_fraction", type=float, default=0.3)
    p.add_argument("--fault_every_s", type=float, nargs=2, default=(5.0, 15.0))
    p.add_argument("--request_timeout_s", type=float, default=60)
    p.add_argument("--worker_timeout_ms", type=int, default=2000)
    p.add_argument("--rng_seed", type=int, default=1)
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args()
    if not 1 <= args.clients <= 256:
        p.error("--clients must be in [1, 256]")

    rng = random.Random(args.rng_seed)
    run_dir = tempfile.mkdtemp(prefix="tandem-soak-")
    os.chmod(run_dir, 0o700)
    workers = Workers(args, run_dir)
    server = None
    try:
        for i in range(2):
            workers.start(i)
        server_socket = os.path.join(run_dir, "server.sock")
        server_log = open(os.path.join(run_dir, "server.log"), "ab")
        server = subprocess.Popen(
            [os.path.join(args.bin, "tandem-server"), "--synthetic", args.model, "--synthetic_seed", str(args.seed),
             "--workers", f"unix:{workers.socket(0)},unix:{workers.socket(1)}", "--listen", f"unix:{server_socket}",
             "--threads", "1", "--kernel_plan", "exact", "--worker_timeout_ms", str(args.worker_timeout_ms),
             "--max_sequences", str(max(16, args.beam_width * 4)), "--exit_with_parent"],
            stdout=server_log, stderr=subprocess.STDOUT)
        client = Client(f"unix:{server_socket}", connect_timeout=120, call_timeout=30)
        vocab = client.info().vocab_size
        prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(4, 12))] for _ in range(args.prompts)]
        # The reference, before any load or fault: one request at a time.
        reference = {kind: [run_one(client, kind, pr, args) for pr in prompts] for kind in ("generate", "beam")}

        stop = threading.Event()
        lock = threading.Lock()
        counts = collections.Counter()
        counts["codes"] = collections.Counter()
        counts["examples"] = []
        faults = collections.Counter()
        peak = {"server": rss_kb(server.pid)}
        threads = [threading.Thread(target=sample_rss, args=(server, workers, stop, peak), daemon=True),
                   threading.Thread(target=chaos, args=(workers, stop, random.Random(args.rng_seed + 1), faults,
                                                        tuple(args.fault_every_s)), daemon=True)]
        clients = [threading.Thread(target=load_client,
                                    args=(client, prompts, reference, stop, random.Random(args.rng_seed + 2 + c),
                                          counts, lock, args), daemon=True) for c in range(args.clients)]
        start = time.time()
        for t in threads + clients:
            t.start()
        time.sleep(args.duration_s)
        stop.set()
        for t in clients:
            t.join(timeout=args.request_timeout_s + 10)
        still_running = sum(t.is_alive() for t in clients)
        for t in threads:
            t.join(timeout=30)
        elapsed = time.time() - start
        # Every worker back and running before the final figures.
        for i in range(2):
            workers.kill(i, signal.SIGCONT)
            if not workers.pid(i):
                workers.start(i)
        final_check, recovery_s, recovery_error = recovered(client, prompts, reference, args)
        result = {
            "bench": "soak", "model": f"synthetic {args.model} seed {args.seed}", "workers": 2,
            "clients": args.clients, "duration_s": round(elapsed, 1), "max_tokens": args.max_tokens,
            "beam_width": args.beam_width, "beam_fraction": args.beam_fraction,
            "requests_done": counts["done"], "requests_failed": counts["failed"],
            "failed_by_code": dict(counts["codes"]), "requests_lost": counts["lost"] + still_running,
            "requests_wrong": counts["wrong"],
            "by_kind": {f"{o}_{k}": counts[f"{o}_{k}"] for o in ("done", "failed", "lost", "wrong")
                        for k in ("generate", "beam")},
            "examples": counts["examples"], "faults": dict(faults),
            "rss_mb": {"server_peak": round(peak["server"] / 1024, 1), "server_final": round(rss_kb(server.pid) / 1024, 1),
                       "worker_peak": [round(k / 1024, 1) for k in workers.peak_rss_kb],
                       "worker_final": [round(rss_kb(workers.pid(i)) / 1024, 1) for i in range(2)]},
            "served_correctly_after_the_run": final_check, "recovery_s": recovery_s,
            "recovery_last_error": recovery_error,
            "cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        text = json.dumps(result)
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
        client.close()
        ok = result["requests_lost"] == 0 and result["requests_wrong"] == 0 and final_check
        return 0 if ok else 1
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        workers.stop_all()
        shutil.rmtree(run_dir, ignore_errors=True)
        # Regions of a worker killed at the very end (a restarted one removes its predecessor's).
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"tandem-soak-{os.getpid()}-"):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""HTTP soak and chaos bench: N clients against tandem-server's OpenAI HTTP
API (with 2 tandem-cpu-worker processes) for a given time, mixing

  complete     /v1/completions, greedy, not streamed
  stream       the same streamed (server-sent events up to [DONE])
  leave        a request, streamed or not, whose client closes its
               connection after 20-500 ms
  malformed    bad JSON, nesting 10,000 deep, text/plain, a 20 KB header,
               a body over the limit (plain and chunked), a bad field,
               an unknown path: each must get its 4xx
  health       GET /health and /metrics, answered within 5 s

while a worker is killed (SIGKILL, then restarted), stopped (SIGSTOP, then
SIGCONT) or restarted at random, and --slowloris connections trickle a
header byte every 3 s and --idle connections sit open doing nothing (each
reopened when the server closes it). /health's latency is sampled every
second throughout. Prints one JSON object: requests done,
failed with a clear OpenAI-shaped error (by status), wrong (a 200 whose text
is not the reference run's), lost (no response, a reset, a cut stream, a
malformed response, a client still waiting at the end) and malformed
requests not refused as they should be: lost, wrong and misjudged must all
be 0. Also the server's RSS: peak, final, and the growth from the first
tenth of the run to the end (flat memory).

    bench/http_soak.sh --duration_s 1800 --clients 32 --out bench/results/http-soak-zen5-2core.jsonl
    bench/http_soak.sh --duration_s 120 --clients 16      # a short one

Needs the build's tandem-server and tandem-cpu-worker (--bin).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from soak_common import Workers, chaos, cpu_flags, cpu_model, rss_kb

MAX_BODY = 1 << 20  # the server's --http_max_body_bytes here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Outcome(Exception):
    """A request's end that is not success: kind is failed, lost or misjudged."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def clear_error(status: int, body: bytes) -> Outcome:
    """A non-200 answer: failed when it is OpenAI's error shape, else lost."""
    try:
        error = json.loads(body)["error"]
        if isinstance(error.get("message"), str) and error["message"]:
            return Outcome("failed", str(status))
    except (ValueError, KeyError, TypeError):
        pass
    return Outcome("lost", f"HTTP {status} without an error body: {body[:200]!r}")


def completion(port: int, prompt: list[int], args, stream: bool) -> str:
    """One greedy completion; its text. Raises Outcome."""
    body = json.dumps({"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": stream})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=args.request_timeout_s)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise clear_error(r.status, r.read())
        if not stream:
            out = json.loads(r.read())
            if out["usage"]["completion_tokens"] != args.max_tokens:
                raise Outcome("lost", f"{out['usage']['completion_tokens']} of {args.max_tokens} tokens")
            return out["choices"][0]["text"]
        text, done, finished, error = "", False, False, None
        for raw in r:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = event["error"]
                continue
            choice = event["choices"][0]
            text += choice.get("text", "")
            finished = finished or choice.get("finish_reason") is not None
        if not done:
            raise Outcome("lost", "the stream ended without [DONE]")
        if error is not None:
            raise Outcome("failed", f"stream:{error.get('code')}")
        if not finished:
            raise Outcome("lost", "[DONE] without a finish_reason")
        return text
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        raise Outcome("lost", f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()


def leave(port: int, prompt: list[int], rng: random.Random) -> None:
    """A request whose client goes away: only the server's survival counts."""
    body = json.dumps({"prompt": prompt, "max_tokens": 64, "ignore_eos": True, "stream": rng.random() < 0.5})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        time.sleep(rng.uniform(0.02, 0.5))


def raw_exchange(port: int, request: bytes, timeout: float) -> int:
    """Sends bytes, returns the response's status (0 when none came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request)
        except OSError:
            pass  # answered and closed before the whole body was taken
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def malformed(port: int, rng: random.Random) -> None:
    """One bad request; raises Outcome("misjudged") unless refused as it should be."""
    host = f"Host: 127.0.0.1:{port}\r\n"

    def post(body: bytes, content_type: str = "application/json", path: str = "/v1/completions") -> bytes:
        return (f"POST {path} HTTP/1.1\r\n{host}Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    deep = b'{"prompt":' + b"[" * 10000 + b"]" * 10000 + b"}"
    big = b'{"prompt":"' + b"a" * (MAX_BODY + 1000) + b'"}'
    chunked = (f"POST /v1/completions HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + (b"10000\r\n" + b"a" * 0x10000 + b"\r\n") * 24
    cases = {
        "bad_json": (post(b'{"prompt": '), 400),
        "deep": (post(deep), 400),
        "text_plain": (post(b'{"prompt":"hi"}', "text/plain"), 415),
        "big_header": (f"GET /health HTTP/1.1\r\n{host}X-Pad: {'a' * 20000}\r\n\r\n".encode(), 431),
        "big_body": (post(big), 413),
        "big_chunked": (chunked, 413),
        "bad_field": (post(b'{"prompt":"hi","temperature":"hot"}'), 400),
        "unknown_path": (f"GET /v2/nothing HTTP/1.1\r\n{host}\r\n".encode(), 404),
    }
    name = rng.choice(sorted(cases))
    request, want = cases[name]
    try:
        got = raw_exchange(port, request, timeout=30)
    except OSError as e:
        raise Outcome("misjudged", f"{name}: {type(e).__name__}: {e}") from None
    if got != want:
        raise Outcome("misjudged", f"{name}: HTTP {got}, want {want}")


def health(port: int) -> None:
    for path, allowed in (("/health", (200, 503)), ("/metrics", (200,))):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            if r.status not in allowed:
                raise Outcome("lost", f"{path}: HTTP {r.status}")
        except (OSError, http.client.HTTPException) as e:
            raise Outcome("lost", f"{path} not answered in 5 s: {type(e).__name__}: {e}") from None
        finally:
            conn.close()


KINDS = (("complete", 0.35), ("stream", 0.35), ("leave", 0.1), ("malformed", 0.12), ("health", 0.08))


def mix(args) -> dict:
    """The request mix, with malformed requests at --malformed_fraction."""
    weights = dict(KINDS)
    weights["malformed"] = args.malformed_fraction
    return weights


def load_client(port: int, prompts, reference, stop: threading.Event, rng: random.Random, counts, lock,
                args) -> None:
    names = list(mix(args))
    weights = list(mix(args).values())
    while not stop.is_set():
        kind = rng.choices(names, weights)[0]
        k = rng.randrange(len(prompts))
        outcome, detail = "done", None
        try:
            if kind in ("complete", "stream"):
                if completion(port, prompts[k], args, kind == "stream") != reference[k]:
                    outcome = "wrong"
            elif kind == "leave":
                leave(port, prompts[k], rng)
            elif kind == "malformed":
                malformed(port, rng)
            else:
                health(port)
        except Outcome as e:
            outcome, detail = e.kind, e.detail
        except Exception as e:  # noqa: BLE001 - anything else is a request lost without a status
            outcome, detail = "lost", f"{type(e).__name__}: {e}"
        with lock:
            counts[outcome] += 1
            counts[f"{outcome}_{kind}"] += 1
            if outcome == "failed":
                counts["codes"][detail] += 1
            if outcome in ("lost", "wrong", "misjudged") and len(counts["examples"]) < 10:
                counts["examples"].append({"outcome": outcome, "kind": kind, "detail": detail})
        if outcome == "failed":
            stop.wait(0.2)  # a worker is down: do not spin on it


def slowloris(port: int, stop: threading.Event, counts, lock, trickle: bool) -> None:
    """A connection that trickles a header (or sends nothing), reopened when closed."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.settimeout(None)
                if trickle:
                    s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
                while not stop.wait(3.0):
                    if trickle:
                        s.sendall(b"X")  # one byte of a header field that never ends
                    else:
                        s.setblocking(False)
                        try:
                            if s.recv(1) == b"":
                                break
                        except BlockingIOError:
                            pass
                        s.setblocking(True)
            with lock:
                counts["slow_closed" if trickle else "idle_closed"] += 1
        except OSError:
            with lock:
                counts["slow_closed" if trickle else "idle_closed"] += 1
            stop.wait(0.5)


def health_latency(port: int, stop: threading.Event, latencies: list) -> None:
    while not stop.wait(1.0):
        start = time.time()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/health")
            conn.getresponse().read()
            conn.close()
            latencies.append(time.time() - start)
        except (OSError, http.client.HTTPException):
            latencies.append(None)  # not answered within 30 s


def percentile(values: list, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sample_rss(server: subprocess.Popen, stop: threading.Event, samples: list) -> None:
    while not stop.wait(1.0):
        samples.append((time.time(), rss_kb(server.pid)))


def start_server(args, workers: Workers, run_dir: str, port: int) -> subprocess.Popen:
    log = open(os.path.join(run_dir, "server.log"), "ab")
    return subprocess.Popen(
        [os.path.join(args.bin, "tandem-server"), "--synthetic", args.model, "--synthetic_seed", str(args.seed),
         "--workers", f"unix:{workers.socket(0)},unix:{workers.socket(1)}",
         "--listen", f"unix:{os.path.join(run_dir, 'server.sock')}", "--http_listen", f"127.0.0.1:{port}",
         "--http_max_body_bytes", str(MAX_BODY), "--threads", "1", "--kernel_plan", "exact",
         "--worker_timeout_ms", str(args.worker_timeout_ms), "--max_sequences", "16", "--exit_with_parent"],
        stdout=log, stderr=subprocess.STDOUT)


def await_ready(port: int, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            health(port)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except (Outcome, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError("tandem-server did not become ready")


def rss_summary(samples: list, final_kb: int) -> dict:
    if not samples:
        return {}
    tenth = samples[: max(1, len(samples) // 10)]
    early = max(kb for _, kb in tenth)
    return {"server_peak": round(max(kb for _, kb in samples) / 1024, 1),
            "server_first_tenth_peak": round(early / 1024, 1),
            "server_final": round(final_kb / 1024, 1),
            "growth_after_first_tenth": round((final_kb - early) / 1024, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--model", default="tiny", help="synthetic preset (tiny | demo)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--duration_s", type=float, default=120)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=16)
    p.add_argument("--fault_every_s", type=float, nargs=2, default=(5.0, 15.0))
    p.add_argument("--request_timeout_s", type=float, default=60)
    p.add_argument("--worker_timeout_ms", type=int, default=2000)
    p.add_argument("--slowloris", type=int, default=32, help="connections trickling a header byte every 3 s")
    p.add_argument("--idle", type=int, default=32, help="connections open and silent")
    p.add_argument("--malformed_fraction", type=float, default=0.12,
                   help="share of malformed requests (0: none, to compare with servers that crash on them)")
    p.add_argument("--rng_seed", type=int, default=1)
    p.add_argument("--out", default="", help="also append the JSON here")
    args = p.parse_args()
    if not 1 <= args.clients <= 256:
        p.error("--clients must be in [1, 256]")

    rng = random.Random(args.rng_seed)
    run_dir = tempfile.mkdtemp(prefix="tandem-http-soak-")
    os.chmod(run_dir, 0o700)
    workers = Workers(args, run_dir)
    server = None
    try:
        for i in range(2):
            workers.start(i)
        port = free_port()
        server = start_server(args, workers, run_dir, port)
        await_ready(port)
        prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 12))] for _ in range(args.prompts)]
        reference = [completion(port, pr, args, stream=False) for pr in prompts]

        stop = threading.Event()
        lock = threading.Lock()
        counts = collections.Counter()
        counts["codes"] = collections.Counter()
        counts["examples"] = []
        faults = collections.Counter()
        samples: list = []
        latencies: list = []
        threads = [threading.Thread(target=sample_rss, args=(server, stop, samples), daemon=True),
                   threading.Thread(target=health_latency, args=(port, stop, latencies), daemon=True),
                   threading.Thread(target=chaos, args=(workers, stop, random.Random(args.rng_seed + 1), faults,
                                                        tuple(args.fault_every_s)), daemon=True)]
        clients = [threading.Thread(target=load_client,
                                    args=(port, prompts, reference, stop, random.Random(args.rng_seed + 2 + c),
                                          counts, lock, args), daemon=True) for c in range(args.clients)]
        threads += [threading.Thread(target=slowloris, args=(port, stop, counts, lock, True), daemon=True)
                    for _ in range(args.slowloris)]
        threads += [threading.Thread(target=slowloris, args=(port, stop, counts, lock, False), daemon=True)
                    for _ in range(args.idle)]
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
        for i in range(2):
            workers.kill(i, signal.SIGCONT)
            if not workers.pid(i):
                workers.start(i)
        # Served correctly again once both workers are back (the server
        # reconnects on its own; until then a clear 503).
        recovered, recovery_start, last = False, time.time(), ""
        while time.time() - recovery_start < 120 and not recovered:
            try:
                recovered = completion(port, prompts[0], args, stream=True) == reference[0]
            except Outcome as e:
                last = e.detail
                time.sleep(1)
        result = {
            "bench": "http_soak", "model": f"synthetic {args.model} seed {args.seed}", "workers": 2,
            "clients": args.clients, "duration_s": round(elapsed, 1), "max_tokens": args.max_tokens,
            "mix": mix(args),
            "requests_done": counts["done"], "requests_failed": counts["failed"],
            "failed_by_status": dict(counts["codes"]), "requests_lost": counts["lost"] + still_running,
            "requests_wrong": counts["wrong"], "malformed_misjudged": counts["misjudged"],
            "by_kind": {f"{o}_{k}": counts[f"{o}_{k}"] for o in ("done", "failed", "lost", "wrong", "misjudged")
                        for k in mix(args) if counts[f"{o}_{k}"]},
            "examples": counts["examples"], "faults": dict(faults),
            "slowloris": args.slowloris, "idle": args.idle,
            "slow_connections_closed_by_server": counts["slow_closed"],
            "idle_connections_closed_by_server": counts["idle_closed"],
            "health_latency_s": {"samples": len(latencies),
                                 "unanswered": sum(x is None for x in latencies),
                                 "p50": round(percentile([x for x in latencies if x is not None], 0.5), 3),
                                 "p99": round(percentile([x for x in latencies if x is not None], 0.99), 3),
                                 "max": round(max((x for x in latencies if x is not None), default=0.0), 3)},
            "rss_mb": rss_summary(samples, rss_kb(server.pid)),
            "served_correctly_after_the_run": recovered, "recovery_last_error": last,
            "cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        text = json.dumps(result)
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
        ok = (result["requests_lost"] == 0 and result["requests_wrong"] == 0 and
              result["malformed_misjudged"] == 0 and recovered)
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
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"tandem-soak-{os.getpid()}-"):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Concurrent clients against one OpenAI-compatible server: aggregate tok/s.

Drives any server with /v1/completions (tandem-server --http_listen, a
llama.cpp-family llama-server, vLLM) with the same requests: C clients, each
sending R requests one after the other; request i of client c has a prompt
of P token ids drawn from [--min_id, --max_id) with seed (c, i), so every
engine and every run sees the same prompts and no two requests share a
prefix (no prompt cache helps). Greedy, ignore_eos, max_tokens T, not
streamed. Prints one JSON line per client count:

  aggregate_tokens_per_s   completion tokens of all requests / wall time
                           from the first send to the last reply
  request_s_p50/p90        per-request latency (prefill + T decode steps,
                           queueing included)
  unencodable              requests the server generated but could not send:
                           on random-weight models a greedy output may end
                           in bytes that are not UTF-8, which llama.cpp's
                           server refuses with a 500 after generating them;
                           aggregate_tokens_per_s_with_unencodable counts
                           their T tokens too (the figure to compare with)

  bench/serving_clients.py --server http://127.0.0.1:8080 --clients 1,4,16 \
      --requests 4 --prompt_tokens 128 --max_tokens 64 --label tandem
"""
import argparse
import json
import random
import urllib.error
import statistics
import threading
import time
import urllib.request


def prompt_ids(client, index, length, low, high):
    rng = random.Random(client * 1_000_003 + index)
    return [rng.randrange(low, high) for _ in range(length)]


class Unencodable(Exception):
    pass


def complete(url, ids, max_tokens, timeout):
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.load(response)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        if error.code == 500 and "invalid UTF-8" in text:
            raise Unencodable(text) from error
        raise RuntimeError(f"HTTP {error.code}: {text[:200]}") from error
    return int(reply["usage"]["completion_tokens"])


def run(args, clients):
    latencies, tokens, errors, unencodable = [], [0], [], [0]
    lock = threading.Lock()

    def client(c):
        for i in range(args.requests):
            ids = prompt_ids(c, i, args.prompt_tokens, args.min_id, args.max_id)
            start = time.monotonic()
            try:
                n = complete(args.server, ids, args.max_tokens, args.timeout_s)
            except Unencodable:
                with lock:
                    unencodable[0] += 1
                    latencies.append(time.monotonic() - start)
                continue
            except Exception as error:  # reported in the line, never hidden
                with lock:
                    errors.append(f"client {c} request {i}: {error}")
                continue
            with lock:
                latencies.append(time.monotonic() - start)
                tokens[0] += n

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    latencies.sort()
    return {"bench": "serving_clients", "label": args.label, "server": args.server, "clients": clients,
            "requests": clients * args.requests, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens, "completion_tokens": tokens[0], "wall_s": wall,
            "aggregate_tokens_per_s": tokens[0] / wall if wall > 0 else 0.0,
            "unencodable": unencodable[0],
            "aggregate_tokens_per_s_with_unencodable":
                (tokens[0] + unencodable[0] * args.max_tokens) / wall if wall > 0 else 0.0,
            "request_s_p50": statistics.median(latencies) if latencies else None,
            "request_s_p90": latencies[int(0.9 * (len(latencies) - 1))] if latencies else None,
            "errors": errors}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=4, help="per client, one after the other")
    parser.add_argument("--prompt_tokens", type=int, default=128)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--min_id", type=int, default=100)
    parser.add_argument("--max_id", type=int, default=30000)
    parser.add_argument("--timeout_s", type=float, default=1800)
    parser.add_argument("--label", default="")
    parser.add_argument("--warmup", type=int, default=1, help="requests sent alone first, not counted")
    args = parser.parse_args()
    for i in range(args.warmup):
        try:
            complete(args.server, prompt_ids(10_000, i, args.prompt_tokens, args.min_id, args.max_id),
                     args.max_tokens, args.timeout_s)
        except Unencodable:
            pass
    for clients in [int(c) for c in args.clients.split(",")]:
        print(json.dumps(run(args, clients)), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The Python SDK against a running tandem server; run by tests/python_sdk_test.cc,
which starts the server and computes the expected greedy ids in-process.

    test_client.py --target unix:SOCK --prompt_ids 1,2,3 --expected_ids 7,8,9
Exits 0 when every check passes; prints each failure otherwise.
"""

import argparse
import os
import sys
import tempfile

import grpc

from tandem import Client, TandemError

failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def ids(text):
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompt_ids", type=ids, required=True)
    parser.add_argument("--expected_ids", type=ids, required=True, help="greedy ids, ignore_eos, max_tokens = len")
    args = parser.parse_args()

    with Client(args.target) as client:
        info = client.info()
        check(info.vocab_size > 0 and info.num_layers > 0, f"info: vocab {info.vocab_size}, {info.num_layers} layers")

        # Greedy generation equals the in-process engine's, token by token.
        generation = client.generate(prompt_ids=args.prompt_ids, max_tokens=len(args.expected_ids), temperature=0,
                                     ignore_eos=True, logprobs=2)
        streamed = [token.id for token in generation]
        check(streamed == args.expected_ids, f"greedy ids {streamed} == {args.expected_ids}")
        check(generation.ids == streamed and generation.done, "generation.ids after iteration")
        check(generation.finish_reason == "max_tokens", f"finish_reason {generation.finish_reason}")
        check(generation.usage.generated_tokens == len(args.expected_ids) and
              generation.usage.prompt_tokens == len(args.prompt_ids), f"usage {generation.usage}")
        check(all(len(t.top_logprobs) == 2 for t in generation.tokens), "two top logprobs per token")
        check(generation.text == "".join(t.text for t in generation.tokens), "text is the tokens' texts")

        # wait() reads a whole generation without a loop.
        again = client.generate(prompt_ids=args.prompt_ids, max_tokens=len(args.expected_ids), temperature=0,
                                ignore_eos=True).wait()
        check(again.ids == args.expected_ids, "wait() gives the same greedy ids")

        # Beam search returns the requested sequences, best first.
        steps = []
        sequences = client.beam_search(prompt_ids=args.prompt_ids, beam_width=3, max_tokens=4,
                                       num_return_sequences=2, ignore_eos=True, on_progress=steps.append)
        check(len(sequences) == 2, f"beam_search returned {len(sequences)} sequences")
        check(all(len(s.ids) > 0 for s in sequences), "every beam sequence has ids")
        check(all(a.score >= b.score for a, b in zip(sequences, sequences[1:])), "sequences best first")
        check(len(steps) > 0, f"{len(steps)} progress steps")

        # A bad parameter comes back as INVALID_ARGUMENT naming the field.
        try:
            client.generate(prompt_ids=args.prompt_ids, top_p=2.0).wait()
            check(False, "top_p=2 raised TandemError")
        except TandemError as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in e.message, f"top_p=2: {e}")

        # length_penalty beyond [-10, 10] made every score -inf; it is refused.
        try:
            client.beam_search(prompt_ids=args.prompt_ids, beam_width=2, max_tokens=2, length_penalty=-1e30)
            check(False, "length_penalty=-1e30 raised TandemError")
        except TandemError as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and "length_penalty" in e.message,
                  f"length_penalty=-1e30: {e}")

        # timeout=0 means zero seconds, not the default hour: refused, like any timeout <= 0.
        for bad in (0, -1, float("nan")):
            try:
                client.generate(prompt_ids=args.prompt_ids, max_tokens=1, timeout=bad)
                check(False, f"timeout={bad} raised ValueError")
            except ValueError as e:
                check("timeout" in str(e), f"timeout={bad}: {e}")
            try:
                client.info(timeout=bad)
                check(False, f"info(timeout={bad}) raised ValueError")
            except ValueError as e:
                check("timeout" in str(e), f"info(timeout={bad}): {e}")
        check(len(client.generate(prompt_ids=args.prompt_ids, max_tokens=1, timeout=30).wait().ids) == 1,
              "a positive timeout still works")

        if info.has_tokenizer:
            tokens = client.tokenize("The licensee may")
            check(len(tokens) > 1, f"tokenize: {tokens}")
            text = client.detokenize(tokens)
            check("licensee" in text, f"detokenize: {text!r}")

        stats = client.stats()
        check(stats.requests_total >= 3, f"stats: {stats.requests_total} requests")

    # A server that is not there fails fast and says where it looked.
    missing = os.path.join(tempfile.gettempdir(), f"tandem-missing-{os.getpid()}.sock")
    try:
        Client(f"unix:{missing}", connect_timeout=0.5)
        check(False, "connecting to a missing socket raised")
    except TandemError as e:
        check(e.code == grpc.StatusCode.UNAVAILABLE and missing in e.message, f"missing socket: {e}")

    try:
        Client(f"unix:{missing}", connect_timeout=0)
        check(False, "connect_timeout=0 raised ValueError")
    except ValueError as e:
        check("connect_timeout" in str(e), f"connect_timeout=0: {e}")

    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

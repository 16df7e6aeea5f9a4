#!/usr/bin/env python3
"""Streams a generation from a running tandem server.

    PYTHONPATH=build/python python3 client/python/examples/generate.py --prompt "The licensee may" -n 32
"""

import argparse
import sys

from tandem import Client, TandemError, default_target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=default_target(),
                        help="unix:/path/to/server.sock or host:port (default: %(default)s)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("-n", "--max_tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=None, help="0 = greedy (server default: 1.0)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    try:
        with Client(args.target) as client:
            generation = client.generate(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                         seed=args.seed)
            print(args.prompt, end="", flush=True)
            for token in generation:
                print(token.text, end="", flush=True)
            print()
            usage = generation.usage
            print(f"[{usage.generated_tokens} tokens ({generation.finish_reason}), {usage.tokens_per_s:.1f} tok/s, "
                  f"seed {generation.seed}]", file=sys.stderr)
    except TandemError as e:
        print(f"generate.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

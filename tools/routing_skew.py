#!/usr/bin/python3
"""Expert popularity skew per layer from an expert usage profile (tandem-expert-usage/1, the file
`--record_usage` writes): a Markdown table for docs/BENCHMARKS.md.

  tools/routing_skew.py bench/results/usage-tiny-moe-heldout.json

Columns: the most and least used expert's share of the layer's routed tokens (uniform: 1/E),
max/min, the share of the top quarter of experts (uniform: 25%), the normalised entropy
(1: uniform) and the experts in order of use.
"""
import json
import math
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    try:
        with open(path, encoding="utf-8") as f:
            usage = json.load(f)
        tokens = usage["tokens"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"routing_skew.py: {path}: {e}")
    print(f"{usage.get('model', '?')}: {usage.get('num_layers')} layers x {usage.get('num_experts')} experts\n")
    print("| layer | routed | max share | min share | max/min | top 25% share | entropy / log E | experts by use |")
    print("|---|---|---|---|---|---|---|---|")
    for layer, row in enumerate(tokens):
        total, e = sum(row), len(row)
        if total == 0 or e == 0:
            continue
        shares = sorted((c / total for c in row), reverse=True)
        top = sum(shares[: max(1, e // 4)])
        entropy = -sum(p * math.log(p) for p in shares if p > 0) / math.log(e)
        order = sorted(range(e), key=lambda i: -row[i])
        ratio = f"{shares[0] / shares[-1]:.1f}" if shares[-1] > 0 else "inf"
        print(f"| {layer} | {total:g} | {100 * shares[0]:.1f}% | {100 * shares[-1]:.1f}% | {ratio} | {100 * top:.1f}% "
              f"| {entropy:.3f} | {' '.join(map(str, order))} |")


if __name__ == "__main__":
    main()

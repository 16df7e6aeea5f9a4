#!/usr/bin/env python3
"""Markdown table of bench/results/sim-scenarios.jsonl (bench/run_scenarios.sh).

One row per (scenario, profile): each preset's figure — TTFT in ms for the
prefill scenario (fiddler-b, lower is better), end-to-end tokens/s otherwise
(higher is better) — the winner, and ours against the best of the papers' own
policies (fiddler, collab, daop) as a speedup (> 1: ours is faster). Then the
geometric mean of that speedup per scenario family and profile.
"""
import collections
import json
import math
import sys

PRESETS = ["fiddler", "collab", "daop", "offload", "llamacpp", "ours"]
PAPERS = ["fiddler", "collab", "daop"]
TIE = 1e-9
SHORT = {
    "fiddler-env1-quadro-rtx6000-xeon6126": "fiddler-env1",
    "fiddler-env2-rtx6000ada-xeon8480": "fiddler-env2",
    "collab-rtx4090-tr7960x-mixtral": "collab-mixtral",
    "collab-rtx4090-tr7960x-phi35moe": "collab-phi35",
    "daop-a6000-i9-10980xe-mixtral": "daop-a6000",
    "daop-a100-xeon6326-mixtral": "daop-a100",
}


def main(path):
    rows = collections.OrderedDict()
    for line in open(path):
        r = json.loads(line)
        rows.setdefault((r["scenario"], r["profile"]), {})[r["preset"]] = r
    print("| scenario | profile | metric | " + " | ".join(PRESETS) + " | winner | ours / best paper |")
    print("|---|---|---|" + "---|" * len(PRESETS) + "---|---|")
    families = collections.OrderedDict()
    losses = []
    for (scenario, profile), by_preset in rows.items():
        ttft = scenario.startswith("fiddler-b")
        def value(p):
            return by_preset[p]["ttft_ms"] if ttft else by_preset[p]["e2e_tokens_per_s"]
        def speed(p):  # higher is better
            return 1 / value(p) if ttft else value(p)
        present = [p for p in PRESETS if p in by_preset]
        # Within TIE (relative) of the fastest counts as a tie: the prefill
        # rows differ only by floating-point rounding of equal schedules.
        fastest = max(speed(p) for p in present)
        tied = [p for p in present if speed(p) >= fastest * (1 - TIE)]
        winner = "ours" if "ours" in tied else tied[0]
        if len(tied) > 1:
            winner += " (tie: " + ", ".join(tied) + ")"
        best_paper = max(PAPERS, key=speed)
        ratio = speed("ours") / speed(best_paper)
        family = (scenario.split("/")[0], SHORT.get(profile, profile))
        families.setdefault(family, []).append(ratio)
        if ratio < 1 - TIE:
            losses.append((scenario, profile, best_paper, ratio))
        fmt = "{:.0f}" if ttft else "{:.3f}"
        cells = [fmt.format(value(p)) if p in by_preset else "" for p in PRESETS]
        cells = ["**" + c + "**" if p in tied else c for p, c in zip(PRESETS, cells)]
        print(f"| {scenario.split('/', 1)[1]} | {SHORT.get(profile, profile)} | "
              f"{'TTFT ms' if ttft else 'tok/s'} | " + " | ".join(cells) +
              f" | {winner} | {ratio:.3f} ({best_paper}) |")
    print()
    print("| family | profile | scenarios | geomean ours / best paper | min | max |")
    print("|---|---|---|---|---|---|")
    for (family, profile), ratios in families.items():
        g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"| {family} | {profile} | {len(ratios)} | {g:.3f} | {min(ratios):.3f} | {max(ratios):.3f} |")
    print()
    if losses:
        print("ours slower than a paper's policy in:",
              ", ".join(f"{s} on {SHORT.get(p, p)} ({b}: {r:.5f})" for s, p, b, r in losses))
    else:
        print("ours is never slower than a paper's policy.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/sim-scenarios.jsonl")

#!/usr/bin/env python3
"""Greedy tokens and top-k logprobs of tandem against a llama.cpp-family server.

Both engines get the same prompt ids and the same GGUF file: tandem through
tandem-generate --json, the other through its own llama-server's /completion
(/v1/completions with logprobs, temperature 0, ignore_eos), already started by you on FILE (this
repository holds no recipe that builds the other engine). Prints one JSON
line: how many greedy tokens agree, the largest |logprob difference| over
the top-k ids both list at every agreeing position, and where they part,
both engines' gap between their first and second choice (a near-tie parts
engines whose logits differ in the last bits). Also the largest difference of
logprob(token) - logprob(chosen token), which no normaliser enters:
ik_llama.cpp 8337e4cd's server adds the tail past the top n_probs into its
softmax sum twice (get_token_probabilities), so its absolute logprobs sit up
to ln 2 below the model's.

  bench/agree_llama_server.py --server http://127.0.0.1:8089 --model FILE.gguf \
      --prompt_ids 1,415,2201 -n 32 [--tandem build/bin/tandem-generate] [--label q8_0]
"""
import argparse
import json
import os
import subprocess
import urllib.request


def other_engine(url, prompt_ids, n, top):
    # The OpenAI-style endpoint reports ids and log probabilities of the
    # model's own distribution (before sampling).
    body = {"prompt": prompt_ids, "max_tokens": n, "temperature": 0, "logprobs": top, "n_probs": top,
            "ignore_eos": True, "cache_prompt": False}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.load(response)
    steps = []
    for p in reply["choices"][0]["logprobs"]["content"]:
        steps.append({"id": p["id"], "top": {t["id"]: t["logprob"] for t in p["top_logprobs"]}})
    return steps


def tandem(binary, model, prompt_ids, n, top, threads, flags):
    out = subprocess.run([binary, "--model", model, "--prompt_ids", ",".join(map(str, prompt_ids)), "-n", str(n),
                          "--temperature", "0", "--logprobs", str(top), "--ignore_eos", "--json",
                          "--threads", str(threads)] + flags.split(), check=True, capture_output=True,
                         text=True).stdout
    reply = json.loads(out)
    return [{"id": t["id"], "top": {i: lp for i, lp in t["logprobs"]}} for t in reply["tokens"]]


def gap(step):
    values = sorted(step["top"].values(), reverse=True)
    return values[0] - values[1] if len(values) > 1 else float("inf")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt_ids", required=True)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--tandem_flags", default="", help='e.g. "--kernel_plan exact" (f32 activations)')
    parser.add_argument("--tandem", default=os.path.join(here, "..", "build", "bin", "tandem-generate"))
    args = parser.parse_args()
    prompt = [int(x) for x in args.prompt_ids.split(",")]
    theirs = other_engine(args.server, prompt, args.n, args.top)
    ours = tandem(args.tandem, args.model, prompt, args.n, args.top, args.threads, args.tandem_flags)
    same, max_delta, max_relative = 0, 0.0, 0.0
    for a, b in zip(ours, theirs):
        for token, logprob in a["top"].items():
            if token in b["top"]:
                max_delta = max(max_delta, abs(logprob - b["top"][token]))
        if a["id"] != b["id"]:
            break
        # Against the chosen token's own logprob: free of the normaliser.
        for token, logprob in a["top"].items():
            if token in b["top"] and a["id"] in a["top"] and a["id"] in b["top"]:
                max_relative = max(max_relative, abs((logprob - a["top"][a["id"]]) -
                                                     (b["top"][token] - b["top"][a["id"]])))
        same += 1
    line = {"bench": "agreement", "label": args.label, "tandem_flags": args.tandem_flags, "model": args.model,
            "prompt_tokens": len(prompt),
            "generated": args.n, "same_greedy_tokens": same, "max_abs_logprob_delta": max_delta,
            "max_abs_delta_relative_to_chosen": max_relative,
            "tandem_ids": [s["id"] for s in ours], "other_ids": [s["id"] for s in theirs]}
    if same < min(len(ours), len(theirs)):
        line["parted_at"] = same
        line["tandem_top2_gap"] = gap(ours[same])
        line["other_top2_gap"] = gap(theirs[same])
    print(json.dumps(line))


if __name__ == "__main__":
    main()

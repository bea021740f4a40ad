"""What streaming adds: ``Generation`` against a bare loop, and the server from piece to socket.

    python benchmarks/overhead.py [--tokens 64] [--rounds 5] [--tiny]

The real model (the embedded SmolLM2-135M unless STREAMLAB_MODEL says otherwise),
one prompt, in one run: the bare greedy loop and ``Generation`` alternate, and
their medians are compared; then a real server in this process streams the
same prompt over ``/stream`` and ``/ws`` to a client in another process, and
each piece's delay from being made to being received is measured. Targets
(issue 11): first token within 10 ms of the bare loop, tokens/s within 5%
(sampling and detokenizing included), server overhead median < 1 ms and
p99 < 5 ms at one stream. See :mod:`streamlab.lab.overhead` for how.
"""

from __future__ import annotations

import argparse

from streamlab.book.bench import Report
from streamlab.model.loading import load_model
from streamlab.lab.overhead import model_overhead, server_overhead


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test (8 tokens, 1 round)")
    args = parser.parse_args(argv)
    tokens, rounds = (8, 1) if args.tiny else (args.tokens, args.rounds)
    report = Report("overhead", params={"tokens": tokens, "rounds": rounds})
    lm = load_model()
    report.params["model"] = lm.name

    model = model_overhead(lm, tokens=tokens, rounds=rounds)
    report.table("the model side: medians of alternating runs", [
        {"way": name, "first token (ms)": w["ttft_s"] * 1e3, "tokens/s": w["tokens_per_s"]}
        for name, w in model["ways"].items()
    ])
    report.figure("bare_ttft_ms", model["ways"]["bare loop"]["ttft_s"] * 1e3, "ms")
    report.figure("bare_tokens_per_s", model["ways"]["bare loop"]["tokens_per_s"], "tokens/s")
    report.figure("generation_ttft_extra_ms", model["ttft_extra_ms"], "ms", target=10)
    report.ratio("generation_vs_bare_tokens_per_s", model["tokens_per_s_ratio"], target=0.95, op="≥")

    server = server_overhead(lm, tokens=tokens, rounds=max(1, rounds // 2 + 1))
    report.table("the server side: piece made -> client socket got it", [
        {"route": route, "pieces": r["pieces"], "median (ms)": r["median_ms"], "p99 (ms)": r["p99_ms"],
         "max (ms)": r["max_ms"], "runs with a count mismatch": r["mismatched_runs"]}
        for route, r in server["routes"].items()
    ])
    for route, r in server["routes"].items():
        name = route.strip("/")
        report.figure(f"{name}_overhead_median_ms", r["median_ms"], "ms", target=1)
        report.figure(f"{name}_overhead_p99_ms", r["p99_ms"], "ms", target=5)
    report.data["model"] = model
    report.data["server"] = {route: {k: v for k, v in r.items()} for route, r in server["routes"].items()}
    report.save()
    return report


if __name__ == "__main__":
    main()

"""What streaming adds: each way of running the model against a bare loop, and the server from piece to socket.

    python benchmarks/overhead.py [--tokens 48] [--rounds 9] [--latency-rounds 4] [--tiny]

The real model (the embedded SmolLM2-135M unless STREAMLAB_MODEL says otherwise),
one prompt, one run. The tokens/s side (issue 19): a bare greedy loop, ``Generation``
in its thread, the batched engine with this one generation, and one reader of
``/stream`` on a real ``python -m streamlab serve`` process with its default engine
(started here, the same model) take turns, round after round; each way's tokens/s is
divided by the bare loop's of the same round, and the median of those ratios is held
to ≥ 0.95, with their spread printed beside it. The latency side: a server in this
process streams to a client in another over ``/stream`` and ``/ws`` in turn, and
each piece's delay from being made to reaching the reader's socket is measured (a
blocking ``recv``): median ≤ 1 ms, p99 ≤ 5 ms; the library's asyncio client, which
notes each read a few turns of its own loop later, is shown beside it. The machine
is shared: the bare loop's own spread from round to round and the load average say
how noisy the run was. See :mod:`streamlab.lab.experiments.overhead`.
"""

from __future__ import annotations

import argparse
import os

from streamlab.lab.results.measures import Report
from streamlab.lab.experiments.overhead import BARE, BATCHED, GENERATION, READERS, STREAM, model_overhead, server_overhead
from streamlab.lab.setups.runner import serve
from streamlab.model.loading import load_model

KEYS = {GENERATION: "generation", BATCHED: "batched", STREAM: "stream"}


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--latency-rounds", type=int, default=4, help="rounds of /stream and /ws for the latency")
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test (8 tokens, 1 round)")
    args = parser.parse_args(argv)
    tokens, rounds, latency_rounds = (8, 1, 1) if args.tiny else (args.tokens, args.rounds, args.latency_rounds)
    report = Report("overhead", params={"tokens": tokens, "rounds": rounds, "latency_rounds": latency_rounds})
    lm = load_model()
    report.params["model"] = lm.name
    load_before = os.getloadavg()

    with serve() as server:  # the default command line: its default engine
        said = [line for line in server.stderr().splitlines() if "generations:" in line]
        report.params["server"] = said[-1] if said else "?"
        model = model_overhead(lm, tokens=tokens, rounds=rounds, batched=True, stream_port=server.port)
    report.table("tokens/s, one reader: each way over the bare loop's of the same round", [
        {"way": name, "first token (ms)": w["ttft_s"] * 1e3, "tokens/s (median)": w["tokens_per_s"],
         **({"ratio (median)": 1.0, "ratio q1-q3": "", "ratio min-max": ""} if name == BARE else {
             "ratio (median)": model["ratios"][name]["median"],
             "ratio q1-q3": f"{model['ratios'][name]['q1']:.3f}-{model['ratios'][name]['q3']:.3f}",
             "ratio min-max": f"{model['ratios'][name]['min']:.3f}-{model['ratios'][name]['max']:.3f}"}),
         "rounds": len(w["runs"])}
        for name, w in model["ways"].items()
    ])
    bare = model["bare_spread"]
    report.figure("bare_ttft_ms", model["ways"][BARE]["ttft_s"] * 1e3, "ms")
    report.figure("bare_tokens_per_s", bare["median"], "tokens/s",
                  note=f"{bare['min']:.2f}-{bare['max']:.2f} from round to round: the machine's noise")
    report.figure("generation_ttft_extra_ms", model["ttft_extra_ms"], "ms", target=10,
                  rounds=model["ttft_extra_rounds_ms"])
    for name, key in KEYS.items():
        r = model["ratios"][name]
        report.ratio(f"{key}_vs_bare_tokens_per_s", r["median"], target=0.95, op="≥", rounds=r["values"],
                     note=f"median of {len(r['values'])} rounds, q1-q3 {r['q1']:.3f}-{r['q3']:.3f}, "
                          f"min-max {r['min']:.3f}-{r['max']:.3f}")

    server = server_overhead(lm, tokens=tokens, rounds=latency_rounds, readers=READERS)
    report.table("the server side: piece made -> the reader's socket got it", [
        {"route": route, "reader": reader, "pieces": r["pieces"], "median (ms)": r["median_ms"],
         "p99 (ms)": r["p99_ms"], "max (ms)": r["max_ms"],
         "round medians min-max (ms)": f"{r['round_medians_ms']['min']:.2f}-{r['round_medians_ms']['max']:.2f}",
         "runs with a count mismatch": r["mismatched_runs"]}
        for reader, by_route in server["readers"].items() for route, r in by_route.items()
    ])
    for reader, by_route in server["readers"].items():
        for route, r in by_route.items():
            # The targets are the server's: timed at the socket. The library's asyncio client notes each
            # read later (its own loop's turns), shown beside them without a target.
            at_socket = reader == "socket"
            name = route.strip("/") + ("" if at_socket else f"_{reader}_client")
            report.figure(f"{name}_overhead_median_ms", r["median_ms"], "ms", target=1 if at_socket else None,
                          rounds=r["round_medians"])
            report.figure(f"{name}_overhead_p99_ms", r["p99_ms"], "ms", target=5 if at_socket else None,
                          rounds=r["round_p99s"])
    report.params["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    report.data["model"] = model
    report.data["server"] = server["readers"]
    report.save()
    return report


if __name__ == "__main__":
    main()

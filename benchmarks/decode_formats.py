"""Decode formats side by side in one run: first token, tokens per second and perplexity, against float32.

    python benchmarks/decode_formats.py [--formats float32,bfloat16,int8,int4,split-int8,split-int4,split-bfloat16]
        [--rounds 7] [--tokens 64] [--prefill-repeats 3] [--ppl-texts 20] [--threads N] [--tiny]

Every format is made from the same loaded float32 model (streamlab.model.precision)
and measured on the same prompts in the same run. A round takes one prompt of
data/prompts.json in the chat template, as the server would send it, and
measures every format on it, interleaved: the prompt read ``--prefill-repeats``
times a format in turns (the time to the first token: the prompt read, the
first token picked; the fastest read counts), then one greedy decode step a
format in turns, ``--tokens`` times (a bare loop with the KV cache; tokens per
second is one over the median step). Each round rotates which format goes
first. Ratios to float32 are taken within each round, then summarised as the
median and the range over rounds: a busy spell on the shared machine moves
both sides of a ratio alike.

Perplexity is deterministic, so it is measured once per format: the human
continuation of every item of data/prompts.json, teacher-forced after its
prompt, the same token ids for every format (streamlab.model.perplexity).

Where ``make engine`` has built llama.cpp's server (``.venv-engine``), it serves the
very GGUF the default model ships in (its own 4-bit Q4_1 weights and kernels) with
as many threads as torch has, and each round also streams the round's prompt from it
through its OpenAI API, greedy, as many tokens: its first token and tokens/s sit
beside the formats, its ratio to float32 taken within the round. It is a reference,
not a candidate: the server does not run on it (``--no-engine`` leaves it out).

The rule for the default (``streamlab.model.cpu_kinds.pick``): the format that
decodes fastest among those whose first token is at most 10% slower than
float32's and whose perplexity is within 2% of float32's. The rule's figures
depend on the CPU, so they are kept per kind of CPU (AMX, AVX-512, AVX2: see
``streamlab.model.cpu_kinds``): ``--record`` writes this run's for the kind it
ran on into ``streamlab/data/decode_formats.json``, which the server's default
reads. The goal of issue #19: one reader decodes at least 1.6x as fast as
float32 in the format the rule picks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from streamlab.lab.results.measures import Report
from streamlab.lab.outside.llamacpp import (
    LlamaCppServer, LlamaServer, chat_stream_timing, native_unavailable_reason, unavailable_reason,
)
from streamlab.lab.results.measures import load_note
from streamlab.lab.results.records import load_prompts
from streamlab.model import cpu_kinds
from streamlab.model.cpu_kinds import MAX_FIRST_TOKEN_SLOWDOWN, MAX_PERPLEXITY_CHANGE
from streamlab.model.loading import load_model
from streamlab.model.perplexity import encode_pairs, perplexity
from streamlab.model.precision import DecodeRunner, get_format, make_runner, weight_bytes

RECORDED = Path(__file__).resolve().parents[1] / "streamlab" / "data" / cpu_kinds.MEASURED_FILE
FORMATS = ("float32", "bfloat16", "int8", "int4", "split-int8", "split-int4", "split-bfloat16")
GOAL_SPEEDUP = 1.6  # issue #19: one reader's decode against float32's


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt as a chat server reads it: in the model's chat template, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(map(int, ids))


def read_prompt(runner: DecodeRunner, ids: list[int]) -> tuple[float, Any, int]:
    """The time to the first token (the prompt read, the token picked), the cache it leaves, and the token."""
    cache = runner.new_cache()
    started = time.perf_counter()
    out = runner.prefill(ids, cache, logits_to_keep=1)
    token = int(out.logits[0, -1].argmax())
    return time.perf_counter() - started, cache, token


def one_round(runners: dict[str, DecodeRunner], order: list[str], ids: list[int], tokens: int,
              repeats: int) -> dict[str, dict[str, Any]]:
    """One prompt, every format: prompt reads and then decode steps, interleaved format by format.

    The prompt is read ``repeats`` times a format, in turns, and the fastest
    read counts (the machine's other work only ever adds to a latency). Then
    the formats take one decode step each, in turns, ``tokens`` times: a busy
    spell lands on every format alike, and a format's speed is one over its
    median step (a step stretched by a spike does not move it).
    """
    firsts: dict[str, list[float]] = {name: [] for name in order}
    state: dict[str, tuple[Any, list[int]]] = {}
    for _ in range(repeats):
        for name in order:
            seconds, cache, token = read_prompt(runners[name], ids)
            firsts[name].append(seconds)
            state[name] = (cache, [token])
    steps: dict[str, list[float]] = {name: [] for name in order}
    for _ in range(tokens):
        for name in order:
            cache, made = state[name]
            started = time.perf_counter()
            out = runners[name].decode([made[-1]], cache)
            made.append(int(out.logits[0, -1].argmax()))
            steps[name].append(time.perf_counter() - started)
    return {name: {"first": min(firsts[name]), "tokens_per_s": 1 / statistics.median(steps[name]),
                   "step_max_s": max(steps[name]), "made": state[name][1]} for name in order}


def agreement(a: list[int], b: list[int]) -> int:
    """How many tokens two greedy runs share before they first differ."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


ENGINE = "llama.cpp"
LLAMA_CPP_GOAL = 0.75  # issue 34: our default decode at three quarters of llama.cpp's tokens/s or more


def start_engine(leave_out: bool, threads: int) -> LlamaServer | None:
    """llama.cpp's server on the embedded GGUF where ``make engine`` built it; None (and why, printed) elsewhere.

    Its own C++ server (``llama-server``) where built, else llama-cpp-python's: the same llama.cpp decode.
    """
    if leave_out:
        print(f"decode_formats: {ENGINE} not measured: left out (--no-engine)", flush=True)
        return None
    if native_unavailable_reason() is None:
        return LlamaCppServer(threads=threads).start()
    why = unavailable_reason()
    if why:
        print(f"decode_formats: {ENGINE} not measured: {why}", flush=True)
        return None
    return LlamaServer(threads=threads).start()


def engine_row(runs: list[dict[str, float]], base: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """llama.cpp's row of the table: its first token and tokens/s, its decode against float32's round by round."""
    first = spread([run["first"] for run in runs])
    speed = spread([run["tokens_per_s"] for run in runs])
    speedup = spread([run["tokens_per_s"] / b["tokens_per_s"] for run, b in zip(runs, base)])
    slowdown = spread([run["first"] / b["first"] for run, b in zip(runs, base)])
    return {
        "format": ENGINE, "prefill": "Q4_1 (GGUF)", "decode": "Q4_1 (GGUF)", "MB read a token": float("nan"),
        "first token s": first[0], "first min": first[1], "first max": first[2],
        "tokens/s": speed[0], "tok/s min": speed[1], "tok/s max": speed[2],
        "decode speed-up": speedup[0], "speed-up range": f"{speedup[1]:.2f}-{speedup[2]:.2f}",
        "first-token slowdown": slowdown[0], "slowdown range": f"{slowdown[1]:.2f}-{slowdown[2]:.2f}",
        "perplexity": float("nan"), "ppl change %": float("nan"), f"same tokens as f32 (of {tokens + 1})": "",
    }


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens decoded after the first")
    parser.add_argument("--prefill-repeats", type=int, default=3, help="prompt reads a format a round (the best counts)")
    parser.add_argument("--ppl-texts", type=int, default=20, help="human texts scored (of data/prompts.json's 20)")
    parser.add_argument("--ppl-tokens", type=int, default=0, help="score at most this many tokens of each (0: all)")
    parser.add_argument("--threads", type=int, default=0, help="torch's threads for the run (0: its default)")
    parser.add_argument("--no-engine", action="store_true", help="leave llama.cpp out even where make engine built it")
    parser.add_argument("--record", action="store_true",
                        help="write this run's figures as this kind of CPU's in streamlab/data/decode_formats.json")
    parser.add_argument("--tiny", action="store_true", help="a quick run for the test (2 rounds, 4 tokens, 2 short texts)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.rounds, args.tokens, args.prefill_repeats, args.ppl_texts, args.ppl_tokens = 2, 4, 1, 2, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [get_format(n).name for n in args.formats.split(",")]
    if "float32" not in names:
        names.insert(0, "float32")  # every ratio is to float32
    lm = load_model(precision="float32")  # every format is made from the float32 weights
    tok = lm.tokenizer
    items = load_prompts()
    report = Report("decode_formats", params={
        "formats": names, "rounds": args.rounds, "tokens": args.tokens, "prefill_repeats": args.prefill_repeats,
        "ppl_texts": args.ppl_texts,
        "ppl_tokens": args.ppl_tokens, "model": lm.name, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "load_average": round(os.getloadavg()[0], 2),
        "cpu_kind": cpu_kinds.cpu_kind(),
    })
    print(f"model {lm.name}, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"{load_note()}; CPU {cpu_kinds.features_line()}", flush=True)
    runners = {name: make_runner(lm.model, name, cache=lm.narrow_cache) for name in names}
    engine = start_engine(args.no_engine, torch.get_num_threads())
    # llama-server takes llama.cpp's own ignore_eos, so that its answers are as long as the formats' are.
    engine_extra = {"ignore_eos": True} if isinstance(engine, LlamaCppServer) else None

    # First calls pay for allocations and kernel set-up: a prompt of another length, a few steps, untimed.
    one_round(runners, names, chat_ids(tok, items[-1]["prompt"]), 2, 1)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    engine_runs: list[dict[str, float]] = []
    try:
        if engine is not None:
            chat_stream_timing(engine.port, items[-1]["prompt"], 2, extra=engine_extra)  # warms it up, untimed
        for r in range(args.rounds):
            prompt = items[r % len(items)]["prompt"]
            ids = chat_ids(tok, prompt)
            order = names[r % len(names):] + names[: r % len(names)]  # who goes first changes every round
            for name, run in one_round(runners, order, ids, args.tokens, args.prefill_repeats).items():
                runs[name].append(run)
            if engine is not None:
                first, rate, _ = chat_stream_timing(engine.port, prompt, args.tokens + 1, extra=engine_extra)
                engine_runs.append({"first": first, "tokens_per_s": rate})
            print(f"  round {r + 1}/{args.rounds} ({len(ids)}-token prompt): "
                  + ", ".join(f"{name} {runs[name][-1]['tokens_per_s']:.1f} tok/s" for name in names)
                  + (f", {ENGINE} {engine_runs[-1]['tokens_per_s']:.1f} tok/s" if engine_runs else ""), flush=True)
    finally:
        if engine is not None:
            engine.stop()

    texts = []
    for item in items[: args.ppl_texts]:
        human = item["human"]
        if args.ppl_tokens:
            human = tok.decode(tok(human, add_special_tokens=False)["input_ids"][: args.ppl_tokens])
        texts.append((item["prompt"], human))
    pairs = encode_pairs(tok, texts)
    ppl = {}
    for name in names:  # deterministic: once per format
        started = time.perf_counter()
        ppl[name] = perplexity(runners[name], pairs)
        print(f"  perplexity {name}: {ppl[name].value:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)

    base = runs["float32"]
    rows, summary = [], {}
    for name in names:
        fmt = get_format(name)
        first = spread([run["first"] for run in runs[name]])
        speed = spread([run["tokens_per_s"] for run in runs[name]])
        speedup = spread([run["tokens_per_s"] / b["tokens_per_s"] for run, b in zip(runs[name], base)])
        slowdown = spread([run["first"] / b["first"] for run, b in zip(runs[name], base)])
        change = (ppl[name].value / ppl["float32"].value - 1) * 100
        same = statistics.median(agreement(run["made"], b["made"]) for run, b in zip(runs[name], base))
        summary[name] = {"speedup": speedup[0], "first_slowdown": slowdown[0], "ppl_change": change,
                         "speedup_range": (speedup[1], speedup[2]), "first_slowdown_range": (slowdown[1], slowdown[2]),
                         "tokens_per_s": speed[0], "first_token_s": first[0]}
        rows.append({
            "format": name, "prefill": fmt.prefill, "decode": fmt.decode,
            "MB read a token": weight_bytes(runners[name]) / 1e6,
            "first token s": first[0], "first min": first[1], "first max": first[2],
            "tokens/s": speed[0], "tok/s min": speed[1], "tok/s max": speed[2],
            "decode speed-up": speedup[0], "speed-up range": f"{speedup[1]:.2f}-{speedup[2]:.2f}",
            "first-token slowdown": slowdown[0], "slowdown range": f"{slowdown[1]:.2f}-{slowdown[2]:.2f}",
            "perplexity": ppl[name].value, "ppl change %": change,
            f"same tokens as f32 (of {args.tokens + 1})": same,
        })
    if engine_runs:
        rows.append(engine_row(engine_runs, base, args.tokens))
    report.table(f"one reader, median and range over {args.rounds} rounds (ratios to float32 paired within a round); "
                 f"perplexity on {len(pairs)} human texts ({ppl['float32'].tokens} tokens)", rows)
    for name in names:
        row = next(r for r in rows if r["format"] == name)
        report.figure(f"{name}.first_token_s", row["first token s"], "s")
        report.figure(f"{name}.tokens_per_s", row["tokens/s"], "tokens/s")
        report.figure(f"{name}.perplexity", row["perplexity"])
        if name != "float32":
            report.ratio(f"{name}.decode_speedup", row["decode speed-up"])
            report.ratio(f"{name}.first_token_slowdown", row["first-token slowdown"])
            report.figure(f"{name}.perplexity_change", row["ppl change %"], "%")

    if engine_runs:
        row = rows[-1]
        report.figure(f"{ENGINE}.first_token_s", row["first token s"], "s")
        report.figure(f"{ENGINE}.tokens_per_s", row["tokens/s"], "tokens/s")
        report.ratio("llama_cpp_vs_float32_decode", row["decode speed-up"],
                     note=f"llama.cpp's server on the embedded GGUF, {engine.threads} threads, through its OpenAI API")

    chosen = cpu_kinds.pick(summary)
    verdicts = [{
        "format": name,
        f"first token ≤ {MAX_FIRST_TOKEN_SLOWDOWN:.2f}x": "yes" if s["first_slowdown"] <= MAX_FIRST_TOKEN_SLOWDOWN else "no",
        f"perplexity within {MAX_PERPLEXITY_CHANGE:g}%": "yes" if abs(s["ppl_change"]) <= MAX_PERPLEXITY_CHANGE else "no",
        "decode speed-up": s["speedup"], "picked": "<- default" if name == chosen else "",
    } for name, s in summary.items()]
    report.table("the rule: the fastest decode with first token at most 10% slower than float32's "
                 "and perplexity within 2% of it (of formats whose rounds reach the fastest's, the quicker first "
                 "token)", verdicts)
    report.data["default"] = chosen
    report.data["runs"] = {name: [{k: v for k, v in run.items() if k != "made"} for run in runs[name]] for name in names}
    print(f"decode_formats: the rule picks {chosen}", flush=True)
    report.ratio("default_decode_speedup", summary[chosen]["speedup"], target=GOAL_SPEEDUP, op="≥",
                 note=f"the rule's pick, {chosen}",
                 rounds=[run["tokens_per_s"] / b["tokens_per_s"] for run, b in zip(runs[chosen], base)])
    if engine_runs:  # issue 34: our default decode against llama.cpp's on the same GGUF, round by round
        against = [run["tokens_per_s"] / theirs["tokens_per_s"] for run, theirs in zip(runs[chosen], engine_runs)]
        report.ratio("default_vs_llama_cpp_decode", statistics.median(against), target=LLAMA_CPP_GOAL, op="≥",
                     note=f"{chosen} against llama.cpp's {statistics.median(r['tokens_per_s'] for r in engine_runs):.1f}"
                          " tokens/s", rounds=against)
    fastest = max(summary, key=lambda name: summary[name]["speedup"])
    report.ratio("fastest_decode_speedup", summary[fastest]["speedup"], note=f"{fastest}, whatever its first token")
    if args.record:
        if args.tiny or args.rounds < 5 or set(names) != set(FORMATS):
            raise SystemExit("decode_formats: --record takes every format and at least 5 rounds, not --tiny")
        how = (f"{time.strftime('%Y-%m-%d')}, {args.rounds} rounds, {torch.get_num_threads()} threads, "
               f"load average {report.params['load_average']}")
        cpu_kinds.record(report.params["cpu_kind"], how, summary, RECORDED)
        print(f"decode_formats: recorded as the {report.params['cpu_kind']} figures in {RECORDED}", flush=True)
    report.save()
    return report


if __name__ == "__main__":
    main()

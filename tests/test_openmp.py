"""streamlab.model.openmp: the thread that loaded the model frees its idle OpenMP team before another runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_thread_that_ran_parallel_operations_frees_its_team_and_the_next_thread_computes_alike():
    """In a process of its own: the main thread's team freed, a second thread's parallel multiply gives the same sum."""
    lines = run("""
        import threading, torch
        from streamlab.model.openmp import release_idle_team
        x = torch.arange(400_000, dtype=torch.float32)
        before = float(x.mul(2).sum())  # a parallel region on the main thread: its team is made
        gomp = any("libgomp" in line for line in open("/proc/self/maps"))
        print(gomp, release_idle_team(), release_idle_team())
        out = {}
        t = threading.Thread(target=lambda: out.update(sum=float(x.mul(2).sum())))
        t.start(); t.join()
        print(out["sum"] == before, float(x.mul(2).sum()) == before)  # and the main thread's next team works too
    """)
    gomp, first, again, same_in_thread, same_after = lines
    assert (first, again) == ((gomp, gomp) if gomp == "True" else ("False", "False"))
    assert same_in_thread == same_after == "True"


def test_without_torch_loaded_it_does_nothing_and_once_torch_is_there_it_frees():
    said = run("from streamlab.model.openmp import release_idle_team; import sys; "
               "print(release_idle_team(), 'torch' in sys.modules); import torch; torch.ones(400_000).mul(2); "
               "print(release_idle_team() == any('libgomp' in line for line in open('/proc/self/maps')))")
    assert said == ["False", "False", "True"]  # the first answer, before torch, is not kept

"""Chapters 6 to 10's plumbing: tables a reader can read, words from numbers, two figures, what a crash lost."""

from __future__ import annotations

import math
import sqlite3
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from test_plots import drawn, outside, overlaps, stalls  # noqa: E402

from streamlab.book import middle_plots, style  # noqa: E402
from streamlab.book.prose_middle import (  # noqa: E402
    against,
    browser_version,
    compared,
    hop_rows,
    no_ports,
    readable,
    times_over,
    words_for,
)
from streamlab.client import timed  # noqa: E402
from streamlab.lab.experiments import crash_loss  # noqa: E402
from streamlab.server.store.database import Store  # noqa: E402


def test_a_table_shows_no_python_values_no_long_floats_no_code_names():
    table = pd.DataFrame([
        {"way": "a", "server_generated": 0, "complete": True, "statuses": [200, 204], "raised": None,
         "end (s)": 0.018476, "ratio": float("nan"), "says": "origin 'http://127.0.0.1:41153' is not allowed"},
        {"way": "b", "server_generated": 2, "complete": False, "statuses": [], "raised": "APIError",
         "end (s)": 2.381408, "ratio": 1.5, "says": "fine"},
    ]).set_index("way")
    shown = readable(table)
    assert list(shown.columns) == ["server generated", "complete", "statuses", "raised", "end (s)", "ratio", "says"]
    assert list(shown["complete"]) == ["yes", "no"]
    assert list(shown["statuses"]) == ["200, 204", "—"]
    assert list(shown["raised"]) == ["—", "APIError"]
    assert list(shown["end (s)"]) == [0.018, 2.381] and shown["end (s)"].dtype.kind == "f"  # numbers stay numbers
    assert list(shown["ratio"]) == ["—", 1.5]
    assert shown.loc["a", "says"] == "origin 'http://127.0.0.1:PORT' is not allowed"
    assert list(shown["server generated"]) == [0, 2]
    html = shown.to_html()
    for word in ("True", "False", "None", "NaN", "[200", "0.018476", "41153", "server_generated"):
        assert word not in html, word
    assert list(table["complete"]) == [True, False]  # the table itself is left as it was


def test_a_multi_index_and_numpy_booleans_are_read_too():
    table = pd.DataFrame({"server": ["x", "x"], "readers": [1, 8], "waited_in_line": [0, 3],
                          "served": pd.Series([True, False], dtype=bool)}).set_index(["server", "readers"])
    shown = readable(table)
    assert list(shown.columns) == ["waited in line", "served"] and list(shown["served"]) == ["yes", "no"]
    assert shown.index.names == ["server", "readers"]


@pytest.mark.parametrize("name, words", [("browser_saw", "browser saw"), ("median_first_text", "median first text"),
                                         ("first text (s)", "first text (s)"), ("ms", "ms"), ("run_on", "run on")])
def test_code_names_become_words(name, words):
    assert words_for(name) == words


def test_ports_of_loopback_addresses_are_not_shown():
    assert no_ports("new WebSocket(ws://127.0.0.1:42397/ws)") == "new WebSocket(ws://127.0.0.1:PORT/ws)"
    assert no_ports("localhost:8000 and [::1]:9000") == "localhost:PORT and [::1]:PORT"
    assert no_ports("HTTP/1.1 on 127.0.0.1, version 10.127.0.0.1:80") == "HTTP/1.1 on 127.0.0.1, version 10.127.0.0.1:80"


def test_words_against_a_threshold_follow_the_numbers():
    assert against(0.054, 0.2) == "under" and against(0.19, 0.2) == "at about" and against(0.263, 0.2) == "over"
    assert times_over(1.19, 0.2) == "6x" and times_over(0.3, 0.2) == "1.5x"
    assert compared(4.55, 6.33) == "longer" and compared(4.65, 4.63) == "about as long"
    assert compared(2.88, 1.46, longer="later", shorter="sooner", same="about as soon") == "sooner"


def fake_trace(first_byte, first_text, end, pieces):
    times = [first_text + k * (end - first_text) / max(pieces - 1, 1) for k in range(pieces)]
    return SimpleNamespace(first_byte=first_byte, first_text=first_text, end=end, complete=True,
                           gaps=lambda: [b - a for a, b in zip(times, times[1:])])


def test_the_longest_silence_tells_a_buffering_hop_from_a_stream():
    rows = {r["path"]: r for r in hop_rows({"direct": fake_trace(0.01, 0.14, 0.89, 24),
                                            "blocks": fake_trace(0.005, 0.78, 0.78, 24)})}
    assert rows["direct"]["longest silence (s)"] == pytest.approx(0.14)
    assert rows["blocks"]["longest silence (s)"] == pytest.approx(0.78)
    assert rows["blocks"]["first event / end"] == pytest.approx(1.0)


def test_the_browser_version_is_read_from_its_own_words(tmp_path):
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\necho 'Chromium 156.0.8078.114 built on Debian GNU/Linux 12 (bookworm)'\n")
    fake.chmod(0o755)
    assert browser_version(str(fake)) == "Chromium 156"
    assert browser_version(str(tmp_path / "missing")) is None


# -- what a crash lost ------------------------------------------------------------------------------------------


def test_the_answer_being_written_is_read_from_the_file(tmp_path):
    db = tmp_path / "chat.sqlite"
    with Store(db, flush_interval=0.0) as store:
        writer = store.begin_answer(store.new_conversation())
        assert crash_loss.stored_progress(db) == (0, 0, None)  # begun, never written
        writer.append("Hello", 2)
        writer.append(" world", 3)
        tokens, chars, written = crash_loss.stored_progress(db)
        assert (tokens, chars) == (3, 11) and written is not None
        assert crash_loss.stored_progress(db, writer.message_id) == (tokens, chars, written)
        assert crash_loss.stored_progress(db, "no such answer") is None
        writer.finish("completed")
        assert crash_loss.stored_progress(db) is None


def sample(t, made, stored, written):
    return crash_loss.Sample(t, made, made * 4, stored, stored * 4, written)


def test_the_loss_is_what_was_made_since_the_last_write():
    samples = [sample(100.0, 2, 0, None), sample(100.1, 4, 4, 100.05), sample(100.2, 6, 4, 100.05),
               sample(100.3, 9, 8, 100.25), sample(100.4, 11, 8, 100.25)]
    lost = crash_loss.loss(samples, 100.41, {"tokens": 8, "content": "x" * 32})
    assert lost["tokens made by the kill"] == 11 and lost["tokens kept"] == 8 and lost["tokens lost"] == 3
    assert lost["characters lost"] == 12 and lost["last write seen"] is True
    assert lost["last write before the kill (s)"] == pytest.approx(0.16)
    assert lost["writes seen"] == 2 and lost["longest between writes (s)"] == pytest.approx(0.2)
    # A write after the last look: it fell between that look and the kill, so the time since it is at most that span.
    later = crash_loss.loss(samples, 100.41, {"tokens": 11, "content": "x" * 44})
    assert later["tokens lost"] == 0 and later["last write seen"] is False
    assert later["last write before the kill (s)"] == pytest.approx(0.01)


def test_watch_samples_until_the_tokens_and_then_a_while(tmp_path, monkeypatch):
    db = tmp_path / "chat.sqlite"
    sqlite3.connect(db).close()
    made = iter(range(100))
    monkeypatch.setattr(timed, "get_json_sync",
                        lambda port, path: {"tokens": (n := next(made)), "text": "ab" * n})
    monkeypatch.setattr(crash_loss, "stored_progress", lambda path, message_id: None)
    samples = crash_loss.watch(1, "g", db, until_tokens=3, then=0.05, every=0.01)
    assert samples[3].made_tokens == 3 and samples[-1].t - samples[3].t >= 0.05
    assert all(s.stored_tokens == 0 and s.written is None for s in samples) and samples[3].made_chars == 6


# -- the two figures --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draw", [
    lambda: middle_plots.stall_panels(stalls()),
    lambda: middle_plots.crash_writes([sample(100 + 0.05 * k, 2 * k, 2 * (k // 4) * 4 // 2, None) for k in range(20)],
                                      101.0, 30),
], ids=["stall_panels", "crash_writes"])
def test_the_figures_can_be_read_at_the_notebooks_width(draw):
    fig = drawn(draw)
    assert fig.get_figwidth() <= style.NOTEBOOK_WIDTH + 1e-9
    assert overlaps(fig) == [] and outside(fig) == []
    for ax in fig.axes:
        assert ax.get_ylabel().strip()
    assert fig.axes[-1].get_xlabel().strip()


def test_each_stall_panel_names_its_own_band():
    axes = middle_plots.stall_panels(stalls())
    for ax, stall in zip(axes, stalls()):
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        assert any(label.startswith("its long prompt being read") for label in labels)
        assert ax._left_title.get_text() == stall.server
        read = (stall.long_first_text or stall.long_end) - stall.long_sent
        assert any(f"({read:.1f} s)" in label for label in labels) and not math.isnan(read)

"""Settings declared once: the server's flags, ``ServerConfig``, ``--help`` and docs/limits.md cannot drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamlab.book import doc_tables
from streamlab.net.errors import UserError

from streamlab.net import settings
from streamlab.net.settings import Setting, Settings, config_values, make_config, markdown_table, quantity
from streamlab.server import config
from streamlab.server.config import ServerConfig, build_parser, config_from_args, parse_args

ROOT = Path(__file__).resolve().parents[1]
LIMITS_PAGE = ROOT / "docs" / "limits.md"
REGENERATE = f"{doc_tables.REGENERATE} docs/limits.md"
EVERY = [s for group in config.SETTINGS for s in group]
FLAGGED = [s for s in EVERY if s.flag]


def _dataclass_default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# --------------------------------------------------------------------------
# One declaration: the dataclass, the flags and the constants agree
# --------------------------------------------------------------------------


def test_every_config_field_is_one_declaration():
    declared = [s.name for s in settings.fields(*config.CONFIG)]
    assert [f.name for f in dataclasses.fields(ServerConfig)] == declared
    assert len(set(s.name for s in EVERY)) == len(EVERY)


@pytest.mark.parametrize("setting", [s for s in EVERY if s.field], ids=lambda s: s.name)
def test_the_declared_default_is_the_dataclass_default_and_the_flags(setting):
    parser = build_parser()
    field = {f.name: f for f in dataclasses.fields(ServerConfig)}[setting.name]
    assert _dataclass_default(field) == setting.default
    assert getattr(ServerConfig(), setting.name) == setting.default
    assert getattr(config_from_args(parse_args([])), setting.name) == setting.default
    if setting.flag:
        assert setting.from_flag(parser.get_default(setting.dest)) == setting.default


def test_no_flags_give_the_default_config():
    assert config_from_args(parse_args([])) == ServerConfig()


def test_the_constants_are_the_declared_defaults():
    defaults = ServerConfig()
    pairs = {
        "MAX_HEAD": defaults.max_head, "MAX_BODY": defaults.max_body, "HEAD_TIMEOUT": defaults.head_timeout,
        "BODY_TIMEOUT": defaults.body_timeout, "IDLE_TIMEOUT": defaults.idle_timeout,
        "MAX_CONNECTIONS": defaults.max_connections, "LISTEN_BACKLOG": defaults.backlog,
        "MAX_ACTIVE": defaults.max_active, "WS_PING_INTERVAL": defaults.ws_ping_interval,
        "WS_PING_TIMEOUT": defaults.ws_ping_timeout, "WS_IDLE_TIMEOUT": defaults.ws_idle_timeout,
        "MAX_QUEUED": defaults.max_queued, "SLOW_READER_TIMEOUT": defaults.slow_reader_timeout,
        "ENGINE": defaults.engine, "KEEP_GENERATIONS": defaults.keep_generations,
    }
    assert {name: getattr(config, name) for name in pairs} == pairs
    assert config.ENGINES == ("threads", "batched") and config.ENGINE in config.ENGINES
    fixed = {s.name.upper(): s.default for s in config.FIXED}
    assert {name: getattr(config, name) for name in fixed} == fixed


def test_a_config_is_built_by_keyword_and_shares_no_mutable_default():
    one, two = ServerConfig(max_active=3, port=0), ServerConfig()
    assert (one.max_active, one.port, two.max_active) == (3, 0, config.MAX_ACTIVE)
    one.pauses[5] = 1.0
    assert two.pauses == {} and ServerConfig().pauses == {}
    with pytest.raises(TypeError):
        ServerConfig("0.0.0.0")  # keyword-only: the fields' order is the declarations'
    assert ServerConfig.__module__ == "streamlab.server.config" and ServerConfig.__name__ == "ServerConfig"


# --------------------------------------------------------------------------
# The flags that map to a field in their own way keep their behaviour
# --------------------------------------------------------------------------


def test_the_special_flags_map_as_before():
    c = config_from_args(parse_args([
        "--no-accel-header", "--pause-after", "3", "--pause-seconds", "2.5",
        "--allow-origin", "http://localhost:3000", "--allowed-origin", "http://a.test/",
        "--allow-host", "box.lan", "--allow-host", "[::2]", "--db", "/tmp/x.db",
        "--max-queued", "0", "--slow-reader-timeout", "0", "--forget", "--naive",
    ]))
    assert c.accel_header is False and c.pauses == {3: 2.5}
    assert c.allowed_origins == ("http://localhost:3000", "http://a.test/")
    assert c.allowed_hosts == ("box.lan", "[::2]") and c.db_path == "/tmp/x.db"
    assert (c.max_queued, c.slow_reader_timeout, c.forget, c.naive) == (None, None, True, True)
    # A pause needs both flags; a zero-second one is none.
    assert config_from_args(parse_args(["--pause-after", "3"])).pauses == {}
    assert config_from_args(parse_args(["--pause-seconds", "2"])).pauses == {}
    # The Namespace keeps argparse's names for the flags (what scripts read from parse_args).
    args = parse_args(["--db", "x.db", "--allow-origin", "o", "--no-accel-header"])
    assert (args.db, args.allow_origin, args.no_accel_header) == ("x.db", ["o"], True)


def test_the_flags_without_a_field_still_parse():
    args = parse_args(["--model", "m", "--upstream-model", "u", "--exit-on-stdin-eof", "--scripted-rate", "20"])
    assert (args.model, args.upstream_model, args.exit_on_stdin_eof, args.scripted_rate) == ("m", "u", True, 20.0)
    assert not any(hasattr(ServerConfig(), name) for name in ("model", "upstream", "pause_after"))


@pytest.mark.parametrize("argv, message", [
    (["--max-active", "0"], "--max-active, --max-connections and --backlog must be at least 1"),
    (["--backlog", "0"], "--max-active, --max-connections and --backlog must be at least 1"),
    (["--max-queued", "-1"], "cannot be negative (0: no limit)"),
    (["--slow-reader-timeout", "-2"], "cannot be negative (0: no limit)"),
    (["--scripted-rate", "0"], "--scripted-rate takes a positive number"),
    (["--scripted-rate", "5", "--upstream", "http://x"], "and no --upstream"),
    (["--max-head", "0"], "--max-head must be at least 1"),
    (["--engine", "magic"], "invalid choice"),
])
def test_bad_flags_are_refused(argv, message):
    with pytest.raises(UserError) as refused:  # the cli wrapper prints it as one line and exits 2
        parse_args(argv)
    assert message in str(refused.value) and "--help lists every option" in str(refused.value)


# --------------------------------------------------------------------------
# --help shows every default with its unit
# --------------------------------------------------------------------------


def _help_entries(text: str) -> dict[str, str]:
    """Each option's help, whitespace collapsed, keyed by every flag it lists (argparse wraps the lines)."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  -", line):
            current = [line]
            for flag in re.findall(r"(?<![\w-])(--?[\w-]+)", line.split("  ")[1]):
                entries[flag] = current  # type: ignore[assignment]
        elif line.startswith("   ") and current:
            current.append(line)
        else:
            current = []
    return {flag: " ".join(" ".join(lines).split()) for flag, lines in entries.items()}


def test_serve_help_shows_every_default_and_unit():
    out = subprocess.run(
        [sys.executable, "-m", "streamlab", "serve", "--help"], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={**os.environ, "COLUMNS": "100"},
    )
    assert out.returncode == 0, out.stderr
    entries = _help_entries(out.stdout)
    missing = [s.flag for s in FLAGGED if f"(default: {s.shown()})" not in entries.get(s.flag, "")]
    assert not missing, f"flags whose --help shows no default: {missing}\n{out.stdout}"
    assert "(default: 75 s)" in entries["--idle-timeout"] and "(default: 16 KiB)" in entries["--max-head"]
    assert "(default: 256 pieces)" in entries["--max-queued"]
    for s in FLAGGED:
        for alias in s.aliases:
            assert alias in entries


def test_every_flag_has_help():
    bare = [a.option_strings for a in build_parser()._actions if a.option_strings and not (a.help or "").strip()]
    assert not bare


# --------------------------------------------------------------------------
# docs/limits.md is what the declarations render
# --------------------------------------------------------------------------


def test_the_limits_page_is_fresh():
    text = LIMITS_PAGE.read_text(encoding="utf-8")
    assert settings.MARKERS.search(text), "docs/limits.md lost its <!-- settings: ... --> markers"
    assert doc_tables.refresh(text) == text, f"docs/limits.md is stale: regenerate it with `{REGENERATE}`"
    assert REGENERATE.split(" ", 1)[1] in text  # the page says how to regenerate it
    for s in FLAGGED:
        assert f"`{s.usage()}`" in text


def test_the_page_tool_rewrites_and_checks(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# Limits\n\n<!-- settings: streamlab.server.config -->\nSTALE TABLE\n<!-- /settings -->\nafter\n")
    assert doc_tables.main(["--check", str(page)]) == 1 and "STALE TABLE" in page.read_text()
    assert doc_tables.main([str(page)]) == 0
    fresh = page.read_text()
    assert fresh.startswith("# Limits\n") and fresh.endswith("<!-- /settings -->\nafter\n") and "STALE TABLE" not in fresh
    assert markdown_table(*config.SETTINGS) in fresh
    assert doc_tables.main(["--check", str(page)]) == 0
    page.write_text("no markers\n")
    with pytest.raises(SystemExit):
        doc_tables.main([str(page)])
    capsys.readouterr()


# --------------------------------------------------------------------------
# The mechanism itself, as the proxy and the platform will use it
# --------------------------------------------------------------------------


def test_a_setting_derives_its_flag_metavar_and_help():
    s = Setting("idle_timeout", 75.0, "s", "close a kept-alive connection idle for S seconds")
    assert (s.flag, s.dest, s.usage()) == ("--idle-timeout", "idle_timeout", "--idle-timeout S")
    assert s.help_text() == "close a kept-alive connection idle for S seconds (default: 75 s)"
    assert Setting("rate", 5, "%", "at most N%").help_text() == "at most N%% (default: 5 %%)"  # argparse %-formats


def test_quantities_read_as_a_person_writes_them():
    assert quantity(75.0, "s") == "75 s" and quantity(0.25, "s") == "0.25 s"
    assert quantity(16 * 1024, "bytes") == "16 KiB" and quantity(1 << 20, "bytes") == "1 MiB"
    assert quantity(1000, "bytes") == "1000 bytes" and quantity(1, "bytes") == "1 byte"
    assert quantity(1, "connections") == "1 connection" and quantity(1, "s") == "1 s"
    assert quantity(1, "tokens/s") == "1 tokens/s" and quantity(8000, "") == "8000"


def test_a_group_parses_into_a_config():
    group = Settings(
        "Demo",
        Setting("limit", 10, "items", "at most N"),
        Setting("cap", 5, "items", "at most N (0: none)", none_at=0),
        Setting("quiet", True, "", "say things", flag="--loud", switch=True),
        Setting("tags", (), "", "a tag (repeatable)", flag="--tag", aliases=("-t",), repeat=True, type=str),
        Setting("mode", "a", "", "which", choices=("a", "b")),
        Setting("seen", {}, "", "set from Python", flag=None),
        Setting("verbose", False, "", "not kept", switch=True, field=False),
    )
    Config = make_config("Config", group, module=__name__, doc="A demo.")
    assert [f.name for f in dataclasses.fields(Config)] == ["limit", "cap", "quiet", "tags", "mode", "seen"]
    assert Config.__doc__ == "A demo."
    parser = argparse.ArgumentParser()
    group.add_to(parser)
    assert Config(**config_values(parser.parse_args([]), group)) == Config()
    got = Config(**config_values(parser.parse_args(["--cap", "0", "--loud", "-t", "x", "--tag", "y", "--mode", "b"]),
                                 group))
    assert (got.cap, got.quiet, got.tags, got.mode, got.limit) == (None, False, ("x", "y"), "b", 10)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    table = markdown_table(group)
    assert "| `--cap N` | 5 items | at most N (0: none) |" in table
    assert "| `--loud` | off |" in table and "`--tag TAG` (also `-t`)" in table and "`seen` (no flag)" in table


def test_a_name_declared_twice_is_refused():
    with pytest.raises(ValueError):
        Settings("Twice", Setting("a", 1), Setting("a", 2))
    with pytest.raises(ValueError):
        settings.fields(Settings("One", Setting("a", 1)), Settings("Two", Setting("a", 2)))
    with pytest.raises(ValueError):
        Setting("x", False, switch=True, repeat=True)


def test_a_table_cell_cannot_break_the_table():
    table = markdown_table(Settings("Pipes", Setting("sep", "|", "", "a | b")))
    assert "| `--sep SEP` | \\| | a \\| b |" in table

"""The proxy's and the platform's settings declared once: flags, ``ProxyConfig``, ``Billing``, --help, docs/limits.md.

The same guarantees ``test_settings.py`` gives for the server, for
``python -m streamlab proxy`` and ``python -m streamlab platform``, whose
declarations are in ``streamlab/hops/settings.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamlab.net.errors import UserError
from streamlab.hops import function_platform, proxy
from streamlab.hops import settings as hops
from streamlab.hops.function_platform import Billing
from streamlab.hops.proxy import ProxyConfig
from streamlab.net import settings
from streamlab.net.settings import markdown_table

ROOT = Path(__file__).resolve().parents[1]
LIMITS_PAGE = ROOT / "docs" / "limits.md"
MINIMAL = {"proxy": ["--upstream", "8000"], "platform": ["--upstream", "8000", "--max-duration", "2"]}
PROGRAMS = {"proxy": (proxy, hops.PROXY_FLAGS), "platform": (function_platform, hops.PLATFORM_FLAGS)}
CASES = [(name, s) for name, (_, groups) in PROGRAMS.items() for group in groups for s in group]


def _parser(program: str):
    module, _ = PROGRAMS[program]
    return module.build_parser() if program == "platform" else proxy.build_parser()


def _config(program: str) -> ProxyConfig:
    """The config each program runs with when given only the flags it requires."""
    module, _ = PROGRAMS[program]
    return module.config_from_args(module.parse_args(MINIMAL[program]))


def _dataclass_default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# --------------------------------------------------------------------------
# One declaration: the config, the flags and the constants agree
# --------------------------------------------------------------------------


def test_every_proxy_config_field_is_one_declaration():
    declared = {s.name for s in settings.fields(*hops.CONFIG)}
    assert {f.name for f in dataclasses.fields(ProxyConfig)} == declared | {"upstream_port"}
    every = [s for group in (*hops.PROXY_SETTINGS, hops.FUNCTION, hops.BILLING) for s in group]
    assert len({s.name for s in every}) == len(every)
    assert ProxyConfig.__module__ == "streamlab.hops.proxy" and ProxyConfig.__name__ == "ProxyConfig"


def test_proxy_config_is_built_as_before():
    # By position: the upstream's port (no default: wherever the server is) and host; the rest by name.
    params = inspect.signature(ProxyConfig).parameters
    assert list(params)[:2] == ["upstream_port", "upstream_host"]
    assert params["upstream_port"].default is inspect.Parameter.empty
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[2:])
    one = ProxyConfig(8000, "::1", block=1, cut_after=4)
    assert (one.upstream_port, one.upstream_host, one.block, one.cut_after, one.gzip) == (8000, "::1", 1, 4, "off")
    with pytest.raises(TypeError):
        ProxyConfig()


@pytest.mark.parametrize("setting", settings.fields(*hops.CONFIG), ids=lambda s: s.name)
def test_the_declared_default_is_the_proxy_config_default(setting):
    field = {f.name: f for f in dataclasses.fields(ProxyConfig)}[setting.name]
    assert _dataclass_default(field) == setting.default
    assert getattr(ProxyConfig(1), setting.name) == setting.default


@pytest.mark.parametrize("program, setting", CASES, ids=lambda c: c if isinstance(c, str) else c.name)
def test_the_declared_default_is_the_flag_default_and_the_programs_config(program, setting):
    if setting.flag:
        assert setting.from_flag(_parser(program).get_default(setting.dest)) == setting.default
    if setting.field and setting.name not in ("max_duration", "billing"):  # the platform's are given, or made
        assert getattr(_config(program), setting.name) == setting.default


def test_no_flags_give_the_default_config():
    assert _config("proxy") == ProxyConfig(8000)
    # The platform's: the proxy's, but for its one changed default, its limit and its bill.
    assert _config("platform") == ProxyConfig(8000, block=1, max_duration=2.0, billing=Billing())


def test_the_platform_changes_only_the_block_of_the_proxys_settings():
    proxys = {s.name: s for group in hops.PROXY_FLAGS for s in group}
    platforms = {s.name: s for group in hops.PLATFORM_FLAGS for s in group}
    changed = {name for name in proxys if platforms[name] != proxys[name]}
    assert changed == {"block"} and platforms["block"].default == 1 and proxys["block"].default == 8192
    assert [s for group in hops.PLATFORM_SETTINGS[:1] for s in group] == [platforms["block"]]


def test_the_bill_defaults_are_the_declared_ones():
    declared = {s.name: s.default for s in hops.BILLING}
    assert {f.name: f.default for f in dataclasses.fields(Billing)} == declared
    assert function_platform.DEFAULT_MEMORY_MB == declared["memory_mb"] == 1024
    assert function_platform.DEFAULT_PRICE_PER_GB_S == declared["price_per_gb_s"] == 0.0000166667
    assert function_platform.GRANULARITY_MS == declared["granularity_ms"]
    args = function_platform.parse_args([*MINIMAL["platform"], "--memory-mb", "512", "--price-per-gb-s", "0.5"])
    assert function_platform.config_from_args(args).billing == Billing(512, 0.5)


def test_the_proxy_constants_are_the_declared_ones():
    fixed = {s.name.upper(): s.default for s in hops.FIXED}
    assert {name: getattr(proxy, name) for name in fixed} == fixed
    assert proxy.MAX_BODY == 1 << 20 and proxy.HEAD_TIMEOUT == 30.0
    assert proxy.Proxy(ProxyConfig(1)).log.maxlen == proxy.MAX_LOG_RECORDS


# --------------------------------------------------------------------------
# The flags a Setting cannot say alone keep their behaviour
# --------------------------------------------------------------------------


@pytest.mark.parametrize("program, argv, flag", [
    ("proxy", [], "--upstream"),
    ("platform", ["--max-duration", "2"], "--upstream"),
    ("platform", ["--upstream", "8000"], "--max-duration"),  # a platform without a limit is just the proxy
])
def test_a_required_flag_is_required(program, argv, flag):
    module, _ = PROGRAMS[program]
    with pytest.raises(UserError) as refused:  # one line, exit 2, from the cli wrapper
        module.parse_args(argv)
    assert f"the following arguments are required: {flag}" in str(refused.value)
    assert not re.search(rf"\[{flag}[ \]]", _parser(program).format_usage())  # usage shows it unbracketed


def test_the_upstream_host_is_the_flags_else_the_urls_else_the_default():
    parse = proxy.parse_args
    assert parse(["--upstream", "8000"]).upstream_host == "127.0.0.1"
    assert parse(["--upstream", "localhost:8000"]).upstream_host == "localhost"
    assert parse(["--upstream", "localhost:8000", "--upstream-host", "::1"]).upstream_host == "::1"
    assert parse(["--upstream-host", "::1", "--upstream", "http://a.test:80"]).upstream_host == "::1"
    config = proxy.config_from_args(parse(["--upstream", "a.test:81", "--honor", "--gzip", "flush"]))
    assert (config.upstream_port, config.upstream_host, config.honor, config.gzip) == (81, "a.test", True, "flush")


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_flag_has_help(program):
    bare = [a.option_strings for a in _parser(program)._actions if a.option_strings and not (a.help or "").strip()]
    assert not bare


# --------------------------------------------------------------------------
# --help shows every default with its unit
# --------------------------------------------------------------------------


def _help_entries(text: str) -> dict[str, str]:
    """Each option's help, whitespace collapsed, keyed by its flag (argparse wraps the lines)."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = re.match(r"^  (--?[\w-]+)", line)
        if match:
            current = entries.setdefault(match[1], [line])
        elif line.startswith("   ") and current is not None:
            current.append(line)
        else:
            current = None
    return {flag: " ".join(" ".join(lines).split()) for flag, lines in entries.items()}


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_shows_every_default_and_unit(program):
    out = subprocess.run(
        [sys.executable, "-m", "streamlab", program, "--help"], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={**os.environ, "COLUMNS": "100"},
    )
    assert out.returncode == 0, out.stderr
    entries = _help_entries(out.stdout)
    _, groups = PROGRAMS[program]
    flagged = [s for group in groups for s in group if s.flag]
    said = {s.flag: "(required)" if s.required else f"(default: {s.shown()})" for s in flagged}
    missing = [flag for flag, end in said.items() if end not in entries.get(flag, "")]
    assert not missing, f"flags whose --help shows no default: {missing}\n{out.stdout}"
    assert "(default: 127.0.0.1, or the host --upstream names)" in entries["--upstream-host"]
    assert "(default: never)" in entries["--idle-timeout"] and "(default: off)" in entries["--gzip"]
    assert f"(default: {'1 byte' if program == 'platform' else '8 KiB'})" in entries["--block"]
    if program == "platform":
        assert "(default: 1024 MB)" in entries["--memory-mb"]
        assert "(default: 0.0000166667 USD/GB-s)" in entries["--price-per-gb-s"]
        assert entries["--max-duration"].endswith("(required)")


# --------------------------------------------------------------------------
# docs/limits.md renders both programs' declarations
# --------------------------------------------------------------------------


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_limits_page_has_a_fresh_block_for_each_program(program):
    module, groups = PROGRAMS[program]
    text = LIMITS_PAGE.read_text(encoding="utf-8")
    blocks = {match[3]: match[4] for match in settings.MARKERS.finditer(text) if match[2] == "settings"}
    assert module.__name__ in blocks, f"docs/limits.md has no <!-- settings: {module.__name__} --> block"
    assert blocks[module.__name__] == "\n" + markdown_table(*module.SETTINGS) + "\n", (
        "docs/limits.md is stale: regenerate it with `.venv/bin/python -m streamlab.book.doc_tables docs/limits.md`"
    )
    shown = [s for group in groups for s in group if s.flag]
    assert all(f"`{s.usage()}`" in text for s in shown)

"""Every setting of the stand-in proxy and the function platform, declared once: name, default, unit, help.

The proxy (``python -m streamlab proxy``) and the platform (``python -m
streamlab platform``) are one forwarding loop with two command lines, so
their settings are one set of :class:`~streamlab.net.settings.Setting`
declarations, grouped by the program that offers them. ``ProxyConfig``
(made in ``proxy.py`` from ``CONFIG``), both programs' flags and ``--help``
(every default with its unit), ``function_platform.Billing``'s defaults, the
constants the proxy reads (``MAX_BODY``...) and the two tables of
``docs/limits.md`` are all derived from them, so a default changed here
changes everywhere.

Two flags must be given (``--upstream``; the platform's ``--max-duration``):
their declarations say ``required``. A default that another flag may fill in
(``--upstream-host``, which the host in ``--upstream`` supplies when it is
not given) has no place in a :class:`Setting` and is handled here.
"""

from __future__ import annotations

import argparse
import dataclasses
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional, Protocol

from streamlab.hops.compress import GZIP_MODES
from streamlab.hops.forwarders import DEFAULT_BLOCK
from streamlab.net.settings import Setting, Settings, fields, fixed, make_config
from streamlab.protocol import sse

__all__ = [
    "BILLING", "COMMAND", "CONFIG", "FIXED", "FORWARDING", "FUNCTION", "PLATFORM_FLAGS", "PLATFORM_FORWARDING",
    "PLATFORM_SETTINGS", "PROXY_FLAGS", "PROXY_SETTINGS", "REQUIRED", "UPSTREAM", "Billing", "add_flags",
    "make_proxy_config", "upstream_address",
]


class Billing(Protocol):
    """A platform's price list: what one exchange of ``seconds`` costs (``function_platform.Billing``)."""

    def charge(self, seconds: float) -> dict[str, Any]: ...


def upstream_address(text: str) -> tuple[str | None, int]:
    """``8000``, ``127.0.0.1:8000`` or ``http://127.0.0.1:8000``: whatever a reader is likely to paste."""
    if text.isdigit():
        return None, int(text)
    try:
        parts = urllib.parse.urlsplit(text if "//" in text else "//" + text)
        if parts.port is None:
            raise ValueError
        return parts.hostname, parts.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port or http://host:port: {text!r}") from None


UPSTREAM = Settings(
    "Where the proxy listens and forwards",
    # --upstream is parsed into ProxyConfig's upstream_port (and a host, if it names
    # one); a proxy with nowhere to forward is no proxy, so it has no default.
    Setting("upstream", None, "", "the server: PORT, HOST:PORT or http://HOST:PORT", type=upstream_address,
            metavar="PORT", field=False, required=True),
    Setting("upstream_host", "127.0.0.1", "", "the server's host; given, it wins over the one --upstream names",
            metavar="HOST", show="127.0.0.1, or the host --upstream names"),
    Setting("port", 0, "", "listen on this port, on 127.0.0.1 only (0 picks a free one, printed at start)",
            metavar="PORT"),
)

FORWARDING = Settings(
    "How the proxy forwards a body",
    # The reason for 8 KiB is DEFAULT_BLOCK's, in forwarders.py.
    Setting("block", DEFAULT_BLOCK, "bytes", "forward bodies in blocks of N bytes"),
    Setting("honor", False, "", "pass through responses with 'X-Accel-Buffering: no'; never compress"
            " 'no-transform' ones", switch=True),
    # Off by default: the proxy's lesson is buffering, and a cut would hide it. With
    # it, the proxy does what cloud load balancers do to a connection left silent.
    Setting("idle_timeout", None, "s", "cut a connection whose upstream sends nothing for S seconds,"
            " as cloud load balancers do", type=float, show="never"),
    Setting("gzip", "off", "", "compress for readers that accept gzip: buffered (as middlewares do) or with a sync"
            " flush per write", choices=GZIP_MODES),
    Setting("cut_after", None, "events", "end each event stream cleanly (the zero-length chunk) after N whole events,"
            " close the upstream", type=int, show="never"),
    Setting("counts", None, "", "which events count towards cut_after (a function of the event)", flag=None,
            show="every event", annotation=Optional[Callable[[sse.Event], bool]]),
)

FUNCTION = Settings(
    "The function: its limit and its runtime",
    # Every platform has a limit, so the stand-in has no default to offer: a platform
    # without one is just the proxy. In ProxyConfig (the proxy's too), None is none.
    Setting("max_duration", None, "s", "the execution limit: cut any request still running after S seconds",
            type=float, required=True),
    Setting("error_event", False, "", "at the limit, write an SSE 'error' event naming execution_limit before"
            " closing", switch=True),
    Setting("buffer_response", False, "", "a buffering runtime: hold the whole response, head included, until the"
            " handler ends", switch=True),
    Setting("billing", None, "", "the price list each exchange is billed by (--memory-mb and --price-per-gb-s"
            " make it)", flag=None, show="none: no bill", annotation=Optional[Billing]),
)

# A list price of the kind the large platforms publish for x86 functions
# (USD per GB-second; AWS Lambda's first tier was 0.0000166667 in 2024), and
# the memory a small web handler is commonly given.
_PRICE_PER_GB_S = 0.0000166667

BILLING = Settings(
    "The bill",
    Setting("memory_mb", 1024, "MB", "the function's memory: the bill is duration x memory x price",
            metavar="MB", field=False),
    Setting("price_per_gb_s", _PRICE_PER_GB_S, "USD/GB-s", "the price of one GB-second of a function",
            metavar="USD", show=f"{_PRICE_PER_GB_S:.10f}".rstrip("0") + " USD/GB-s", field=False),
    Setting("granularity_ms", 1, "ms", "each invocation is billed in whole steps of this many ms, rounded up",
            flag=None, field=False),
)

COMMAND = Settings(
    "As a program",
    Setting("exit_on_stdin_eof", False, "", "exit when stdin closes (the parent died)", switch=True, field=False),
)


FIXED = Settings(
    "Fixed in the proxy's code",
    fixed("head_timeout", 30.0, "s", "a client must send its whole request, head and body, within this (408)"),
    fixed("max_body", 1 << 20, "bytes", "refuse a request body larger than this (413)"),
    fixed("connect_timeout", 10.0, "s", "give up connecting to the upstream after this (502)"),
    fixed("max_log_records", 1000, "exchanges", "GET /_proxy/log keeps this many, the oldest going first"),
)

# A platform passes each byte on as the function writes it: a runtime that
# buffers holds the whole reply (--buffer-response), never blocks of it.
_PLATFORM_BLOCK = dataclasses.replace(FORWARDING["block"], default=1)
PLATFORM_FORWARDING = Settings(
    FORWARDING.title, *(_PLATFORM_BLOCK if s.name == "block" else s for s in FORWARDING),
)

CONFIG = (UPSTREAM, FORWARDING, FUNCTION)  # the groups ProxyConfig's fields come from
PROXY_FLAGS = (UPSTREAM, FORWARDING, COMMAND)  # python -m streamlab proxy's --help
PROXY_SETTINGS = (*PROXY_FLAGS, FIXED)  # its table in docs/limits.md
PLATFORM_FLAGS = (UPSTREAM, PLATFORM_FORWARDING, FUNCTION, BILLING, COMMAND)  # python -m streamlab platform's --help
# The platform's table lists only what it adds to the proxy's, and the one default it changes.
PLATFORM_SETTINGS = (Settings("The proxy's settings the platform changes", _PLATFORM_BLOCK), FUNCTION, BILLING)
REQUIRED = tuple(s.name for group in PLATFORM_FLAGS for s in group if s.required)  # flags with no default


def add_flags(parser: argparse.ArgumentParser, groups: Iterable[Settings]) -> None:
    """Each group's flags under its title, as ``Settings.add_to`` does (the ``REQUIRED`` ones required)."""
    for group in groups:
        group.add_to(parser)


def make_proxy_config(name: str, groups: Sequence[Settings], *, module: str, doc: str) -> type:
    """The config dataclass: ``upstream_port`` and ``upstream_host`` by position, then every other field by name.

    ``make_config``'s fields are keyword-only, but the proxy has always been
    built as ``ProxyConfig(8000)`` or ``ProxyConfig(port, host, block=1)``,
    and the port has no default (it is wherever the server listens).
    """
    host = UPSTREAM["upstream_host"]
    rest = [s for s in fields(*groups) if s is not host]
    base = make_config(f"_{name}Options", *rest, module=module)
    cls = dataclasses.make_dataclass(
        name, [("upstream_port", int), (host.name, host.field_type(), dataclasses.field(default=host.default))],
        bases=(base,), namespace={"__doc__": doc},
    )
    cls.__module__ = module
    return cls

"""Settings declared once: the flags, the config object and the table of limits all read the same declaration.

A limit written four times (a constant, a dataclass field, a flag, the line
copying one into the other) drifts: a default changed in one place and not
the next, help that says nothing of the default, a doc table nobody updates.
Declared once as a :class:`Setting` (name, default, unit, help), everything
else is derived from it:

    group = Settings("Limits", Setting("idle_timeout", 75.0, "s", "close a connection idle for S seconds"))
    group.add_to(parser)                                 # --idle-timeout S ... (default: 75 s)
    Config = make_config("Config", group)                # a dataclass: Config(idle_timeout=5.0)
    Config(**config_values(parser.parse_args(), group))  # the parsed flags, converted
    markdown_table(group)                                # | `--idle-timeout S` | 75 s | close ... |

A Markdown page keeps a rendered table between two markers that name what
it holds; ``refresh(page, blocks)`` rewrites what stands between them, from
renderers the caller passes (``python -m streamlab.book.doc_tables PAGE.md``
passes every declaration: the server's, the proxy's, the platform's)::

    <!-- settings: streamlab.server.config -->
    ... generated ...
    <!-- /settings -->

Other kinds of block hold what another renderer writes
(``<!-- routes: streamlab.server.api_docs -->``: the server's route table).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from streamlab.net.errors import REQUIRED_NOTE


class _Nothing:
    """"Not given", where None is a meaningful value (``none_at=None`` would be one)."""

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Any = _Nothing()
# Units whose values are counted with N on the command line (a unit of time takes S).
_TIMES = {"s": "S", "ms": "MS"}
_BINARY = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the config field), its default (the config's value), unit, help and flag.

    ``flag`` is derived from the name (``idle_timeout``: ``--idle-timeout``);
    give another (``--db``), or ``None`` for a setting with no flag (a value
    fixed in the code, or one set from Python only). Between the flag's value
    and the config's stand, in order: ``repeat`` (a repeatable flag, collected
    into a tuple), ``switch`` (a flag that takes no value and flips the
    default: ``--forget`` turns ``False`` on, ``--no-accel-header`` turns
    ``True`` off), ``none_at`` (the flag value that means "no limit", stored as
    ``None``: ``--max-queued 0``) and ``convert`` (anything else). ``field``
    is false for a flag the command reads and the config does not keep.
    ``required``: a flag that must be given (its default is what a config
    built in Python holds), shown so in the usage line and in ``--help``.
    """

    name: str
    default: Any
    unit: str = ""  # "s", "bytes", "tokens", "connections"... or "" for a name, a switch, a choice
    help: str = ""
    type: Callable[[str], Any] | None = None  # the default's type, unless given
    choices: tuple[Any, ...] | None = None
    flag: str | None = ""  # "": --the-name; None: no flag
    aliases: tuple[str, ...] = ()
    switch: bool = False
    repeat: bool = False
    none_at: Any = NOTHING
    convert: Callable[[Any], Any] | None = None
    metavar: str | None = None  # "": the unit's (S for seconds, N for counts)
    show: str | None = None  # how to write the default when its value says too little ("$STREAMLAB_MODEL")
    field: bool = True
    annotation: Any = None  # the config field's type, when the derived one is wrong
    required: bool = False

    def __post_init__(self) -> None:
        if self.flag == "":
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))
        if self.switch and (self.repeat or self.choices or self.none_at is not NOTHING):
            raise ValueError(f"{self.name}: a switch takes no value to repeat, choose or turn off")
        if self.flag is None and self.aliases:
            raise ValueError(f"{self.name}: aliases of no flag")
        if self.flag is None and self.required:
            raise ValueError(f"{self.name}: required, but there is no flag to give")
        if self.required and self.switch:
            raise ValueError(f"{self.name}: a switch that must be given would always be on")

    @property
    def dest(self) -> str:
        """The attribute of the parsed ``Namespace``: argparse's own choice, from the flag."""
        return self.flag.lstrip("-").replace("-", "_") if self.flag else self.name

    @property
    def flag_default(self) -> Any:
        """What the flag holds when it is not given: the default, but off for a switch, [] to append to."""
        if self.switch:
            return False
        if self.repeat:
            return []
        return self.default

    def from_flag(self, value: Any) -> Any:
        """The config's value for what the flag parsed to."""
        if self.repeat:
            value = tuple(value)
        if self.switch:
            value = (not self.default) if value else self.default
        if self.none_at is not NOTHING and value == self.none_at:
            value = None
        if self.convert is not None:
            value = self.convert(value)
        return value

    def fresh_default(self) -> Any:
        """The default, copied when it is mutable (a dict shared by every config would be one config's)."""
        return copy.copy(self.default) if self.default.__hash__ is None else self.default

    def shown(self) -> str:
        """The default as help and tables write it: with its unit, or what it means."""
        if self.show is not None:
            return self.show
        if self.required:
            return "required"
        if self.switch:
            return "off"
        value = self.default
        if value is None or (isinstance(value, (tuple, list, dict, set)) and not value):
            return "none"
        if isinstance(value, (tuple, list)):
            return ", ".join(map(str, value))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return str(value)
        return quantity(value, self.unit)

    def usage(self) -> str:
        """The flag as a reader types it: ``--idle-timeout S``."""
        if self.flag is None:
            return ""
        if self.switch:
            return self.flag
        if self.choices:
            return f"{self.flag} {{{','.join(map(str, self.choices))}}}"
        return f"{self.flag} {self._metavar()}"

    def help_text(self) -> str:
        """The help with the default and its unit at the end (or that it must be given), %-escaped for argparse."""
        end = REQUIRED_NOTE.strip() if self.required else f"(default: {self.shown()})"
        text = f"{self.help} {end}" if self.help else end
        return text.replace("%", "%%")

    def field_type(self) -> Any:
        if self.annotation is not None:
            return self.annotation
        base: Any = self.type or (str if self.default is None else type(self.default))
        if self.repeat:
            base = tuple[base, ...]  # type: ignore[valid-type]
        if self.default is None or self.none_at is not NOTHING:
            base = Optional[base]
        return base

    def _metavar(self) -> str:
        if self.metavar:
            return self.metavar
        if self.unit in _TIMES:
            return _TIMES[self.unit]
        if isinstance(self.default, (int, float)) or self.type in (int, float):
            return "N"
        return self.dest.upper()

    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        """Add this setting's flag to ``parser`` (or to an argument group)."""
        if self.flag is None:
            return
        if self.switch:
            parser.add_argument(self.flag, *self.aliases, dest=self.dest, action="store_true",
                                help=self.help_text())
            return
        kind = self.type or (type(self.default) if self.default is not None else str)
        options: dict[str, Any] = {"type": kind, "default": self.flag_default, "help": self.help_text()}
        if self.choices:
            options["choices"] = self.choices
        else:
            options["metavar"] = self._metavar()
        if self.repeat:
            options["action"] = "append"
        if self.required:
            options["required"] = True
        parser.add_argument(self.flag, *self.aliases, dest=self.dest, **options)


def quantity(value: float, unit: str) -> str:
    """``75.0, "s"``: "75 s"; ``1 << 20, "bytes"``: "1 MiB"; ``1, "connections"``: "1 connection"."""
    if unit == "bytes" and isinstance(value, int):
        for size, name in _BINARY:
            if value >= size and value % size == 0:
                return f"{value // size} {name}"
    number = f"{value:g}" if isinstance(value, float) else str(value)
    if not unit:
        return number
    if value == 1 and len(unit) > 2 and unit.endswith("s") and "/" not in unit:
        unit = unit[:-1]
    return f"{number} {unit}"


def fixed(name: str, default: object, unit: str, help: str) -> Setting:
    """A bound with no flag and no field: declared so the table of limits shows every bound a program keeps."""
    return Setting(name, default, unit, help, flag=None, field=False)


class Settings:
    """A titled group of settings: one section of ``--help``, one table, some fields of a config."""

    def __init__(self, title: str, *settings: Setting, description: str = "") -> None:
        self.title = title
        self.description = description
        self.settings = settings
        self._by_name = {s.name: s for s in settings}
        if len(self._by_name) != len(settings):
            raise ValueError(f"{title}: a name declared twice")

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.settings)

    def __len__(self) -> int:
        return len(self.settings)

    def __getitem__(self, name: str) -> Setting:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def default(self, name: str) -> Any:
        return self._by_name[name].default

    def flag(self, name: str) -> str:
        """The flag that sets ``name``, as declared: what a refusal names, so it cannot drift from ``--help``."""
        flag = self._by_name[name].flag
        if flag is None:
            raise ValueError(f"{self.title}: {name} has no flag to name")
        return flag

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add every flag of the group to ``parser``, under the group's title in ``--help``."""
        if not any(s.flag for s in self.settings):
            return
        group = parser.add_argument_group(self.title, self.description or None)
        for setting in self.settings:
            setting.add_to(group)


def flag_of(name: str, *groups: Settings) -> str:
    """The flag of the setting ``name``, in whichever of ``groups`` declares it (``max_body``: ``--max-body``)."""
    for group in groups:
        if name in group:
            return group.flag(name)
    raise KeyError(f"no setting {name!r} in {', '.join(g.title for g in groups)}")


def _flat(groups: Iterable[Settings | Setting]) -> list[Setting]:
    found: list[Setting] = []
    for group in groups:
        found.extend([group] if isinstance(group, Setting) else group)
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise ValueError(f"declared twice: {sorted({n for n in names if names.count(n) > 1})}")
    return found


def fields(*groups: Settings | Setting) -> list[Setting]:
    """The settings that are fields of a config, in declaration order."""
    return [s for s in _flat(groups) if s.field]


def make_config(name: str, *groups: Settings | Setting, module: str | None = None, doc: str | None = None) -> type:
    """A dataclass with one field per setting (``field=True``), its default the declared one.

    Keyword-only: the fields' order is the declarations', which is free to
    change, so a positional call would bind the wrong ones.
    """
    specs = []
    for s in fields(*groups):
        if s.default.__hash__ is None:
            spec = dataclasses.field(default_factory=s.fresh_default)
        else:
            spec = dataclasses.field(default=s.default)
        specs.append((s.name, s.field_type(), spec))
    cls = dataclasses.make_dataclass(name, specs, kw_only=True)
    if module:
        cls.__module__ = module
    cls.__doc__ = doc or cls.__doc__
    return cls


def config_values(args: argparse.Namespace, *groups: Settings | Setting) -> dict[str, Any]:
    """Each config field's value: from its flag when it has one (converted), else its default."""
    return {s.name: s.from_flag(getattr(args, s.dest)) if s.flag else s.fresh_default() for s in fields(*groups)}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(*groups: Settings) -> str:
    """Each group as a titled Markdown table: the flag, the default with its unit, what it bounds."""
    parts = []
    for group in groups:
        rows = [f"### {group.title}", ""]
        if group.description:
            rows += [group.description, ""]
        rows += ["| Flag | Default | What it bounds |", "|---|---|---|"]
        for s in group:
            flag = f"`{s.usage()}`" if s.flag else f"`{s.name}` (no flag)"
            if s.aliases:
                flag += " (also " + ", ".join(f"`{a}`" for a in s.aliases) + ")"
            rows.append(f"| {_cell(flag)} | {_cell(s.shown())} | {_cell(s.help)} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


MARKERS = re.compile(r"(<!-- (\w+): *([\w.]+) *-->\n)(.*?)(<!-- /\2 -->)", re.S)


# What fills one block: ``(kind, name)`` as its marker spells them -> the Markdown it holds now.
Blocks = Mapping[tuple[str, str], Callable[[], str]]


def refresh(page: str, blocks: Blocks) -> str:
    """``page`` with every marked block rendered afresh by ``blocks`` (a marker it does not know: KeyError).

    The declarations are passed in by the caller that knows them
    (``streamlab.book.doc_tables``): this layer renders, it does not go
    looking for the layers above it.
    """

    def render(match: re.Match[str]) -> str:
        key = (match[2], match[3])
        if key not in blocks:
            raise KeyError(f"no renderer for <!-- {key[0]}: {key[1]} -->")
        return match[1] + "\n" + blocks[key]() + "\n" + match[5]

    return MARKERS.sub(render, page)


def rewrite_pages(pages: Sequence[Path], blocks: Blocks, *, check: bool = False) -> list[Path]:
    """Rewrite each page's blocks (``check``: write nothing); the pages that were stale."""
    stale = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if not MARKERS.search(text):
            raise ValueError(f"{page}: no <!-- KIND: MODULE --> ... <!-- /KIND --> block")
        fresh = refresh(text, blocks)
        if fresh != text:
            stale.append(page)
            if not check:
                page.write_text(fresh, encoding="utf-8")
    return stale

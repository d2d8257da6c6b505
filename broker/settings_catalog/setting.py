"""One setting (`Setting`), how its variable is read (`read_variable`, with `NAME_FILE` for
secrets), and the groups settings are declared in (`SettingGroup`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast, overload

from broker.settings_catalog.kinds import ConfigError, Items, Kind, Text

T = TypeVar("T")

# The tables of docs/configuration.md, in the page's order: every setting appears in one.
STORE = "store"
READ_REPLICA = "read-replica"
BROKER = "broker"
GATEWAY = "gateway"
RATE_LIMIT = "rate-limit"
SECTIONS = (STORE, READ_REPLICA, BROKER, GATEWAY, RATE_LIMIT)


class Setting(Generic[T]):
    """One variable, declared as a class attribute of a `SettingGroup` (which names it).

    Read from an instance, it is the value the instance's source gives (Django's settings, the
    environment); read from the class, it is this declaration.
    """

    name: str

    def __init__(
        self,
        kind: Kind[T],
        default: T,
        meaning: str,
        *,
        section: str = "",
        secret: bool = False,
        shown_default: str | None = None,
    ) -> None:
        if secret and not isinstance(kind, Text | Items):
            # Text and Items never fail to parse, so no error message can carry a secret's value.
            raise TypeError("a secret setting must be Text or Items")
        self.kind = kind
        self.default = default
        self.meaning = meaning
        # The table of docs/configuration.md it appears in; "": its group's (SettingGroup).
        self.section = section
        self.secret = secret  # NAME_FILE is accepted too
        self.shown_default = shown_default  # the docs' default, when the value alone misleads

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, instance: SettingGroup, owner: type) -> T: ...
    def __get__(self, instance: SettingGroup | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        return cast(T, instance._read(self))

    def from_environment(self, environ: Mapping[str, str]) -> T:
        return read_variable(environ, self.name, self.kind, self.default, secret=self.secret)


def read_variable(
    environ: Mapping[str, str], name: str, kind: Kind[T], default: T, *, secret: bool = False
) -> T:
    """The variable's value, or `default` when it is unset (or blank, for most kinds)."""
    raw = _raw_secret(environ, name) if secret else environ.get(name)
    if raw is None or (kind.blank_is_unset and not raw.strip()):
        return copy.copy(default)  # a list default is never shared with a caller
    return kind.parse(name, raw)


def _raw_secret(environ: Mapping[str, str], name: str) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (never both)."""
    file_name = environ.get(f"{name}_FILE")
    if file_name and name in environ:
        raise ConfigError(f"Set either {name} or {name}_FILE, not both.")
    if not file_name:
        return environ.get(name)
    try:
        return Path(file_name).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{name}_FILE: cannot read {file_name!r}: {exc}") from exc


class SettingGroup:
    """Settings declared together; an instance reads their values from one source.

    A group's `section` (`class G(SettingGroup, section=BROKER)`) is that of every setting it
    declares without one of its own.
    """

    def __init_subclass__(cls, *, section: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for setting in cls.declared():
            setting.section = setting.section or section
            if setting.section not in SECTIONS:
                raise TypeError(f"{setting.name}: section {setting.section!r} is not in SECTIONS")

    def __init__(self, read: Callable[[Setting[Any]], object]) -> None:
        self._read = read

    @classmethod
    def declared(cls) -> list[Setting[Any]]:
        return [value for value in vars(cls).values() if isinstance(value, Setting)]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Self:
        """Every value parsed now (the first bad one raises ConfigError), then read from them."""
        values = {setting.name: setting.from_environment(environ) for setting in cls.declared()}
        return cls(lambda setting: values[setting.name])

    def values(self) -> dict[str, Any]:
        """Every setting's name and value."""
        return {setting.name: getattr(self, setting.name) for setting in self.declared()}

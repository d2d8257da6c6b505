"""Kinds of value: how a variable's raw string becomes a typed value, what bounds it has, and the
one-line `ConfigError` a bad value raises (naming the variable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting is missing or malformed: one line naming the variable (never a secret's value)."""


class Kind(Generic[T_co]):
    # Numbers, booleans and choices treat a blank value as unset; text and lists keep it (an empty
    # list is a meaningful value: BROKER_GATEWAY_AUTH_EXEMPT_PATHS= exempts nothing).
    blank_is_unset = True

    def parse(self, name: str, raw: str) -> T_co:
        raise NotImplementedError

    def bounds(self) -> str:
        """The allowed values, for the docs ("" when anything of the type goes)."""
        return ""


class Text(Kind[str]):
    blank_is_unset = False

    def parse(self, name: str, raw: str) -> str:
        return raw


class Flag(Kind[bool]):
    def parse(self, name: str, raw: str) -> bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean (use true or false).")


@dataclass(frozen=True)
class Choice(Kind[str]):
    choices: tuple[str, ...]

    def parse(self, name: str, raw: str) -> str:
        value = raw.strip().lower()  # compared in lower case
        if value not in self.choices:
            raise ConfigError(f"{name}={raw!r} is not one of {', '.join(self.choices)}.")
        return value

    def bounds(self) -> str:
        return "one of " + ", ".join(f"`{choice}`" for choice in self.choices)


@dataclass(frozen=True)
class Integer(Kind[int]):
    minimum: int | None = None

    def parse(self, name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer.") from None
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{name}={value} must be at least {self.minimum}.")
        return value

    def bounds(self) -> str:
        return "" if self.minimum is None else f"at least {self.minimum}"


@dataclass(frozen=True)
class Number(Kind[float]):
    minimum: float
    maximum: float

    def parse(self, name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number.") from None
        if not self.minimum <= value <= self.maximum:
            raise ConfigError(f"{name}={value} must be between {self.minimum} and {self.maximum}.")
        return value

    def bounds(self) -> str:
        return f"from {_plain(self.minimum)} to {_plain(self.maximum)}, decimals allowed"


def _plain(number: float) -> str:
    """1000000.0 -> "1000000", 0.1 -> "0.1" (no exponent in the docs)."""
    return str(int(number)) if number.is_integer() else str(number)


class Items(Kind[list[str]]):
    """Comma-separated values; blanks around and between them are dropped."""

    blank_is_unset = False

    def parse(self, name: str, raw: str) -> list[str]:
        return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class Integers(Kind[list[int]]):
    minimum: int = 0
    blank_is_unset = False

    def parse(self, name: str, raw: str) -> list[int]:
        try:
            values = [int(item) for item in Items().parse(name, raw)]
        except ValueError:
            raise ConfigError(f"{name} must be comma-separated integers.") from None
        if any(value < self.minimum for value in values):
            raise ConfigError(f"{name}: every value must be at least {self.minimum}.")
        return values

    def bounds(self) -> str:
        return f"each at least {self.minimum}"

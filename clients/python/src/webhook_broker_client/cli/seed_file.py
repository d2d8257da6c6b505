"""Reading a webhook-broker seed file (docs/data-model.md, "Seed files") without the broker.

The INI sections the broker's `manage.py load_seed` reads, checked the same way before anything
is sent: a file with a mistake is refused whole, naming the section and key. Sections that
configure webhook-broker itself ([rdbms], [http], ...) are ignored.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass, field
from typing import Literal

CHANNELS, CHANNEL_TOKENS = "initial-channels", "initial-channel-tokens"
PRODUCERS, PRODUCER_TOKENS = "initial-producers", "initial-producer-tokens"
PRODUCER_CHANNELS = "initial-producer-channels"
CONSUMERS, CONSUMER_TOKENS = "initial-consumers", "initial-consumer-tokens"
CONSUMER_KEYS = frozenset({"channel", "type", "token", "eventTypes", "maxPerSecond"})


class SeedFileError(ValueError):
    def __init__(self, section: str, key: str | None, problem: str) -> None:
        super().__init__(f"[{section}]{' ' + key if key else ''}: {problem}")


@dataclass(frozen=True)
class SeedResource:
    id: str
    name: str
    token: str | None
    channels: list[str] | None = None  # a producer's [initial-producer-channels] entry


@dataclass(frozen=True)
class SeedConsumer:
    id: str
    channel: str
    callback_url: str
    type: str
    token: str | None
    event_types: list[str] | None = None
    max_per_second: float | Literal[""] | None = None  # "": no limit; None: kept


@dataclass
class Seed:
    channels: list[SeedResource] = field(default_factory=list)
    producers: list[SeedResource] = field(default_factory=list)
    consumers: list[SeedConsumer] = field(default_factory=list)


def parse_seed(text: str) -> Seed:
    parser = configparser.ConfigParser(interpolation=None, strict=True, default_section="\0")
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # IDs are case-sensitive
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise SeedFileError("file", None, exc.message.splitlines()[0]) from None
    channels = _resources(parser, CHANNELS, CHANNEL_TOKENS)
    channel_ids = {channel.id for channel in channels}
    producers = _resources(parser, PRODUCERS, PRODUCER_TOKENS)
    allowed = _producer_channels(parser, {p.id for p in producers}, channel_ids)
    return Seed(
        channels,
        [SeedResource(p.id, p.name, p.token, allowed.get(p.id)) for p in producers],
        _consumers(parser, channel_ids),
    )


def _section(parser: configparser.ConfigParser, name: str) -> dict[str, str]:
    return {key: value.strip() for key, value in parser[name].items()} if name in parser else {}


def _tokens(
    parser: configparser.ConfigParser, section: str, listed: dict[str, str], listed_in: str
) -> dict[str, str]:
    tokens = _section(parser, section)
    for key, token in tokens.items():
        if key not in listed:
            raise SeedFileError(section, key, f"not listed in [{listed_in}]")
        if not token:
            raise SeedFileError(section, key, "empty token")
    return tokens


def _resources(
    parser: configparser.ConfigParser, section: str, token_section: str
) -> list[SeedResource]:
    names = _section(parser, section)
    tokens = _tokens(parser, token_section, names, section)
    return [SeedResource(key, name or key, tokens.get(key)) for key, name in names.items()]


def _producer_channels(
    parser: configparser.ConfigParser, producers: set[str], channels: set[str]
) -> dict[str, list[str]]:
    allowed = {}
    for key, value in _section(parser, PRODUCER_CHANNELS).items():
        if key not in producers:
            raise SeedFileError(PRODUCER_CHANNELS, key, f"not listed in [{PRODUCERS}]")
        listed = list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
        unlisted = [channel for channel in listed if channel not in channels]
        if unlisted:
            raise SeedFileError(
                PRODUCER_CHANNELS, key, f"{unlisted[0]!r} is not listed in [{CHANNELS}]"
            )
        allowed[key] = listed
    return allowed


def _consumers(parser: configparser.ConfigParser, channels: set[str]) -> list[SeedConsumer]:
    urls = _section(parser, CONSUMERS)
    legacy_tokens = _tokens(parser, CONSUMER_TOKENS, urls, CONSUMERS)
    return [
        _consumer(parser, key, url, channels, legacy_tokens.get(key)) for key, url in urls.items()
    ]


def _consumer(
    parser: configparser.ConfigParser,
    key: str,
    url: str,
    channels: set[str],
    legacy_token: str | None,
) -> SeedConsumer:
    if key not in parser:
        raise SeedFileError(CONSUMERS, key, f"no [{key}] section giving its channel")
    options = _section(parser, key)
    unknown = sorted(set(options) - CONSUMER_KEYS)
    if unknown:
        raise SeedFileError(
            key, unknown[0], f"unknown key (expected one of {sorted(CONSUMER_KEYS)})"
        )
    channel = options.get("channel", "")
    if not channel:
        raise SeedFileError(key, "channel", "missing")
    if channel not in channels:
        raise SeedFileError(key, "channel", f"{channel!r} is not listed in [{CHANNELS}]")
    kind = options.get("type") or "push"
    if kind not in ("push", "pull"):
        raise SeedFileError(key, "type", f"{kind!r} is not push or pull")
    event_types = None
    if "eventTypes" in options:
        event_types = [part.strip() for part in options["eventTypes"].split(",") if part.strip()]
    return SeedConsumer(
        key,
        channel,
        url,
        kind,
        options.get("token") or legacy_token or None,
        event_types,
        _rate(key, options.get("maxPerSecond")),
    )


def _rate(key: str, written: str | None) -> float | Literal[""] | None:
    """maxPerSecond: a number (the broker checks its range), blank for no limit."""
    if written is None:
        return None
    if written == "":
        return ""
    try:
        return float(written)
    except ValueError:
        raise SeedFileError(key, "maxPerSecond", f"{written!r} is not a number") from None

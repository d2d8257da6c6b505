"""Seed configuration in webhook-broker's INI format (docs/data-model.md, "Seed files").

    [initial-channels]          channel-id = Channel name
    [initial-channel-tokens]    channel-id = token
    [initial-producers]         producer-id = Producer name
    [initial-producer-tokens]   producer-id = token
    [initial-producer-channels] producer-id = channel-id, channel-id (ours: the channels it may
                                publish to with BROKER_PRODUCER_CHANNELS=bound)
    [initial-consumers]         consumer-id = callback URL
    [consumer-id]               channel = channel-id, type = push|pull, token = ...,
                                eventTypes = order.*, invoice.paid (ours: broker/event_types.py),
                                maxPerSecond = 20 (ours: docs/delivery.md, "Rate limit")

The whole file is parsed and validated before anything is written, then applied in one
transaction: a bad file changes nothing. Loading the same file again changes nothing either (not
even timestamps). Sections that configure webhook-broker itself ([rdbms], [http], [broker], ...)
are ignored, so its whole configuration file can be loaded as it is.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from broker import event_types
from broker.models import Channel, Producer, TokenProtected, validate_resource_id
from broker.stakeholders import (
    InvalidChannelList,
    allowed_channel_ids,
    parse_channel_ids,
    set_allowed_channels,
)
from consumers.callback_url import masked_callback_url, validate_callback_url
from consumers.models import Consumer
from consumers.safety import UnsafeCallback, check_callback_url
from consumers.services import InvalidSetting, parse_max_per_second

CHANNELS, CHANNEL_TOKENS = "initial-channels", "initial-channel-tokens"
PRODUCERS, PRODUCER_TOKENS = "initial-producers", "initial-producer-tokens"
PRODUCER_CHANNELS = "initial-producer-channels"  # ours: Producer.allowed_channels
CONSUMERS, CONSUMER_TOKENS = "initial-consumers", "initial-consumer-tokens"
CONSUMER_KEYS = {"channel", "type", "token", "eventTypes", "maxPerSecond"}


class Unset:
    """A key the section does not give (None is a value: blank, no limit)."""


UNSET = Unset()


class SeedError(ValueError):
    def __init__(self, section: str, key: str | None, problem: str) -> None:
        where = f"[{section}]" + (f" {key}" if key else "")
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class SeedResource:
    id: str
    name: str
    token: str | None
    # A producer's [initial-producer-channels] entry, when the file gives one: the channels it
    # may publish to (None: those it has are kept).
    channels: list[str] | None = None


@dataclass(frozen=True)
class SeedConsumer:
    id: str
    channel: str
    callback_url: str
    type: str
    token: str | None
    event_types: list[str] | None = None  # the `eventTypes` key, when given
    # The `maxPerSecond` key, when given: a number, or None (blank) for no limit.
    max_per_second: float | Unset | None = UNSET


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
        raise _syntax_error(exc, text) from None
    channels = _parse_resources(parser, CHANNELS, CHANNEL_TOKENS)
    channel_ids = {channel.id for channel in channels}
    producers = _parse_resources(parser, PRODUCERS, PRODUCER_TOKENS)
    return Seed(
        channels=channels,
        producers=_with_allowed_channels(parser, producers, channel_ids),
        consumers=_parse_consumers(parser, channel_ids),
    )


def _syntax_error(exc: configparser.Error, text: str) -> SeedError:
    if isinstance(exc, configparser.DuplicateOptionError):
        return SeedError(exc.section, exc.option, f"duplicate key (line {exc.lineno})")
    if isinstance(exc, configparser.DuplicateSectionError):
        return SeedError(exc.section, None, f"duplicate section (line {exc.lineno})")
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return SeedError("file", None, f"line {exc.lineno}: {exc.line!r} is not in any [section]")
    if isinstance(exc, configparser.ParsingError) and exc.errors:
        line_number, line = exc.errors[0]
        section = _section_at(text, line_number)
        return SeedError(section, None, f"line {line_number}: expected key=value, got {line!r}")
    return SeedError("file", None, exc.message)


def _section_at(text: str, line_number: int) -> str:
    """The name of the [section] that a line of the file belongs to."""
    section = "file"
    for line in text.splitlines()[:line_number]:
        if line.strip().startswith("[") and line.strip().endswith("]"):
            section = line.strip()[1:-1]
    return section


def _section(parser: configparser.ConfigParser, name: str) -> dict[str, str]:
    return dict(parser[name]) if parser.has_section(name) else {}


def _check_id(section: str, key: str) -> None:
    try:
        validate_resource_id(key)
    except ValidationError as exc:
        raise SeedError(section, key, f"invalid ID: {exc.messages[0]}") from None


def _check_tokens(section: str, tokens: dict[str, str], known: set[str], listed_in: str) -> None:
    for key, token in tokens.items():
        if key not in known:
            raise SeedError(section, key, f"not listed in [{listed_in}]")
        if not token.strip():
            raise SeedError(section, key, "empty token")


def _parse_resources(
    parser: configparser.ConfigParser, section: str, token_section: str
) -> list[SeedResource]:
    names = _section(parser, section)
    tokens = _section(parser, token_section)
    for key in names:
        _check_id(section, key)
    _check_tokens(token_section, tokens, set(names), section)
    return [
        SeedResource(id=key, name=name.strip() or key, token=tokens.get(key, "").strip() or None)
        for key, name in names.items()
    ]


def _with_allowed_channels(
    parser: configparser.ConfigParser, producers: list[SeedResource], channels: set[str]
) -> list[SeedResource]:
    """The producers, each with its [initial-producer-channels] entry if it has one: channels
    listed in [initial-channels], as a consumer's `channel` must be."""
    entries = _section(parser, PRODUCER_CHANNELS)
    known = {producer.id for producer in producers}
    allowed: dict[str, list[str]] = {}
    for key, value in entries.items():
        if key not in known:
            raise SeedError(PRODUCER_CHANNELS, key, f"not listed in [{PRODUCERS}]")
        try:
            allowed[key] = parse_channel_ids(value)
        except InvalidChannelList as exc:
            raise SeedError(PRODUCER_CHANNELS, key, str(exc)) from None
        unlisted = [channel for channel in allowed[key] if channel not in channels]
        if unlisted:
            raise SeedError(
                PRODUCER_CHANNELS, key, f"{unlisted[0]!r} is not listed in [{CHANNELS}]"
            )
    return [replace(producer, channels=allowed.get(producer.id)) for producer in producers]


def _parse_consumers(parser: configparser.ConfigParser, channels: set[str]) -> list[SeedConsumer]:
    urls = _section(parser, CONSUMERS)
    legacy_tokens = _section(parser, CONSUMER_TOKENS)
    _check_tokens(CONSUMER_TOKENS, legacy_tokens, set(urls), CONSUMERS)
    return [
        _parse_consumer(parser, key, url.strip(), channels, legacy_tokens.get(key))
        for key, url in urls.items()
    ]


def _parse_consumer(
    parser: configparser.ConfigParser,
    key: str,
    url: str,
    channels: set[str],
    legacy_token: str | None,
) -> SeedConsumer:
    _check_id(CONSUMERS, key)
    try:
        validate_callback_url(url)
    except ValidationError as error:
        reason = error.messages[0].rstrip(".")
        # Masked: the error reaches the command's output and the logs of a container's start.
        shown = masked_callback_url(url)
        raise SeedError(
            CONSUMERS, key, f"{shown!r} is not a usable callback URL: it {reason}"
        ) from None
    try:
        check_callback_url(url)
    except UnsafeCallback as exc:
        raise SeedError(CONSUMERS, key, exc.message) from None
    if not parser.has_section(key):
        raise SeedError(CONSUMERS, key, f"no [{key}] section giving its channel")
    options = dict(parser[key])
    unknown = sorted(set(options) - CONSUMER_KEYS)
    if unknown:
        raise SeedError(key, unknown[0], f"unknown key (expected one of {sorted(CONSUMER_KEYS)})")
    channel = options.get("channel", "").strip()
    if not channel:
        raise SeedError(key, "channel", "missing")
    if channel not in channels:
        raise SeedError(key, "channel", f"{channel!r} is not listed in [{CHANNELS}]")
    consumer_type = options.get("type", "").strip() or Consumer.Type.PUSH
    if consumer_type not in Consumer.Type.values:
        raise SeedError(key, "type", f"{consumer_type!r} is not push or pull")
    token = (options.get("token") or legacy_token or "").strip() or None
    return SeedConsumer(
        key,
        channel,
        url,
        consumer_type,
        token,
        _event_types(key, options),
        _max_per_second(key, options),
    )


def _event_types(key: str, options: dict[str, str]) -> list[str] | None:
    if "eventTypes" not in options:
        return None
    try:
        return event_types.parse_patterns(options["eventTypes"])
    except event_types.InvalidEventType as exc:
        raise SeedError(key, "eventTypes", str(exc)) from None


def _max_per_second(key: str, options: dict[str, str]) -> float | Unset | None:
    if "maxPerSecond" not in options:
        return UNSET
    try:
        return parse_max_per_second(options["maxPerSecond"])
    except InvalidSetting as exc:
        raise SeedError(key, "maxPerSecond", str(exc)) from None


@transaction.atomic
def apply_seed(seed: Seed) -> list[str]:
    """Create or update everything the seed names; return one line per resource, and one more
    per token generated for it."""
    report: list[str] = []
    for channel in seed.channels:
        report += _apply_resource(Channel, channel)
    for producer in seed.producers:
        report += _apply_resource(Producer, producer)
    for consumer in seed.consumers:
        report += _apply_consumer(consumer)
    return report


def _generated_token(
    label: str, given: str | None, instance: TokenProtected | Consumer
) -> list[str]:
    """The line showing the token this load generated for the resource, if it generated one.

    Tokens are stored hashed (channels, producers) or encrypted (consumers) and no page shows them:
    without this line nobody could use a resource the file gives no token. `plain_token` is set
    only by set_token, so a resource that kept its token prints nothing on a later load."""
    if given is not None or instance.plain_token is None:
        return []
    return [f"{label}: token {instance.plain_token}"]


def _apply_resource(model: type[Channel] | type[Producer], item: SeedResource) -> list[str]:
    label = f"{model.__name__.lower()} {item.id}"
    instance: TokenProtected | None = model.objects.filter(pk=item.id).first()
    if instance is None:
        instance = model(id=item.id, name=item.name)
        instance.set_token(item.token)
        instance.save(force_insert=True)
        _allow_channels(instance, item)
        return [f"{label}: created", *_generated_token(label, item.token, instance)]
    # A row made without a token (not through the API, the admin or a seed) accepts none: give
    # it one rather than leave it unusable.
    needs_token = item.token is None and not instance.token_hash
    changed = (
        instance.name != item.name
        or (item.token is not None and not instance.check_token(item.token))
        or needs_token
        or _channels_differ(instance, item)
    )
    if not changed:
        return [f"{label}: unchanged"]
    instance.name = item.name
    if item.token is not None or needs_token:
        instance.set_token(item.token)
    instance.save()
    _allow_channels(instance, item)
    return [f"{label}: updated", *_generated_token(label, item.token, instance)]


def _channels_differ(instance: TokenProtected, item: SeedResource) -> bool:
    if item.channels is None or not isinstance(instance, Producer):
        return False
    return set(allowed_channel_ids(instance)) != set(item.channels)


def _allow_channels(instance: TokenProtected, item: SeedResource) -> None:
    """A producer's channels from the file (its channels were created first, in this
    transaction)."""
    if item.channels is not None and isinstance(instance, Producer):
        set_allowed_channels(instance, item.channels)


def _apply_consumer(item: SeedConsumer) -> list[str]:
    label = f"consumer {item.channel}/{item.id}"
    wanted: dict[str, Any] = {"name": item.id, "callback_url": item.callback_url, "type": item.type}
    if item.event_types is not None:
        wanted["event_types"] = item.event_types
    if not isinstance(item.max_per_second, Unset):
        wanted["max_per_second"] = item.max_per_second
    consumer = Consumer.objects.filter(channel_id=item.channel, public_id=item.id).first()
    if consumer is None:
        consumer = Consumer(channel_id=item.channel, public_id=item.id, **wanted)
        consumer.set_token(item.token)  # as the API does: the file's token, else a random one
        consumer.save(force_insert=True)
        return [f"{label}: created", *_generated_token(label, item.token, consumer)]
    if item.token is not None and not consumer.check_token(item.token):
        wanted["token"] = item.token
    changed = {name: value for name, value in wanted.items() if getattr(consumer, name) != value}
    needs_token = item.token is None and not consumer.token  # as for channels: give it one
    if not changed and not needs_token:
        return [f"{label}: unchanged"]
    for name, value in changed.items():
        setattr(consumer, name, value)
    if needs_token:
        consumer.set_token()
    if "max_per_second" in changed:
        consumer.next_slot_at = None  # slots booked at the old rate do not hold the new one back
    consumer.save()
    return [f"{label}: updated", *_generated_token(label, item.token, consumer)]

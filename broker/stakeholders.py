"""What producers, channels and consumers share when they are created or changed through a form
(the API's PUT, the operator UI, the admin), and the channels a producer may publish to (the
API's PUT and the seed file)."""

from __future__ import annotations

from typing import Any

from broker.models import Channel, Producer, is_resource_id


class InvalidChannelList(ValueError):
    """A producer's list of channels names a malformed ID or a channel that does not exist."""


def apply_stakeholder_form(resource: Any, form: dict[str, str], *, default_name: str) -> None:
    """Set name and token from a PUT form (the response shows a token that was set).

    Creating without a token generates one; updating without a token keeps the current one, so a
    rename cannot silently invalidate every client's credentials.
    """
    creating = resource._state.adding
    if "name" in form or creating:
        resource.name = form.get("name") or default_name
    if form.get("token") or creating:
        resource.set_token(form.get("token") or None)


def parse_channel_ids(text: str) -> list[str]:
    """The channel IDs of a comma-separated list, in their order, each once; blank: none.

    InvalidChannelList names the first malformed ID."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    for channel_id in ids:
        if not is_resource_id(channel_id):
            raise InvalidChannelList(
                f"{channel_id[:300]!r} is not a channel ID: use 1 to 255 letters, digits, _ or -."
            )
    return list(dict.fromkeys(ids))


def set_allowed_channels(producer: Producer, channel_ids: list[str]) -> bool:
    """Make these the channels a saved producer may publish to (BROKER_PRODUCER_CHANNELS=bound);
    return whether that changed them. InvalidChannelList, changing nothing, when one of them does
    not exist: only a channel an admin created can be given."""
    wanted = set(channel_ids)
    found = set(Channel.objects.filter(pk__in=wanted).values_list("pk", flat=True))
    missing = [channel_id for channel_id in channel_ids if channel_id not in found]
    if missing:
        raise InvalidChannelList(
            f"No channel {', '.join(repr(channel_id) for channel_id in missing[:20])}: a producer "
            "can be allowed only on channels that exist."
        )
    if wanted == set(allowed_channel_ids(producer)):
        return False
    producer.allowed_channels.set(Channel.objects.filter(pk__in=wanted))
    return True


def allowed_channel_ids(producer: Producer) -> list[str]:
    """The IDs of the channels the producer may publish to, sorted."""
    return sorted(producer.allowed_channels.values_list("pk", flat=True))

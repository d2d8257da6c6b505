"""The consumer pages' forms: a consumer's settings as the operator types them, turned into the
form that consumers/services.py validates for the API, the UI and the admin alike.

The fields are shown in four groups (`FIELDSETS`: where, what, how fast, how safe); a blank
setting's help says what it means as a value ("30 s, 2 min, …", "100"), read from the settings
in effect, not as the name of the environment variable that holds it (`defaults`). A new
consumer's event types can also be ticked in its channel's catalogue (`catalogued_types`); the
ticked ones join the typed patterns and go through the same validation (services.EVENT_TYPES).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from operator import attrgetter
from typing import Any, cast

from django import forms

from broker.conf import broker_settings
from broker.models import Channel, EventType, is_resource_id
from consumers import services
from consumers.models import Consumer
from consumers.services import SettingFormField
from jobs.queue.rules import DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER

# The form's groups, in order: (legend, the fields in it). A field a form lacks (the channel of
# an edit, the secret without the permission to set one) is left out of its group.
FIELDSETS = [
    ("Where", ["channel", "consumer_id", "name", "type", "callback_url"]),
    ("What", ["event_types", "catalogued_types", "ordering"]),
    ("How fast", ["max_in_flight", "max_per_second"]),
    (
        "How safe",
        ["retry_delays", "non_retryable_statuses", "max_job_age", "token", "signing_secret"],
    ),
]
# Bounds of the new-consumer form's suggestions, one query each: channels offered in the
# channel field's list, catalogue entries offered as checkboxes (a bigger catalogue's other types
# are typed).
CHANNELS_SUGGESTED = 500
CATALOGUE_SHOWN = 500
_UNITS = [(86400, "days", "day"), (3600, "h", "h"), (60, "min", "min"), (1, "s", "s")]


def seconds_text(seconds: int) -> str:
    """30 -> "30 s", 120 -> "2 min", 259200 -> "3 days": the largest unit it is a whole number
    of."""
    size, plural, one = next(unit for unit in _UNITS if seconds % unit[0] == 0 or unit[0] == 1)
    count = seconds // size
    return f"{count} {one if count == 1 else plural}"


def defaults() -> dict[str, str]:
    """What a blank setting means, as values: the settings in effect now (docs/configuration.md
    names the variables behind them)."""
    age = broker_settings.BROKER_MAX_JOB_AGE_SECONDS
    return {
        "retry_delays": _retries_text(broker_settings.BROKER_RETRY_DELAYS),
        "max_in_flight": str(DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER),
        "max_job_age": seconds_text(age) if age else "no limit",
    }


def _retries_text(delays: list[int]) -> str:
    if not delays:
        return "no retries (one attempt)"
    return ", ".join(seconds_text(delay) for delay in delays) + f" ({len(delays) + 1} attempts)"


class ConsumerSettingsForm(forms.Form):
    """A consumer's settings, each field checked by its declaration in consumers/services.py,
    as the API's consumer PUT and the admin's form are."""

    name = forms.CharField(required=False, max_length=255, help_text="Blank: the consumer ID.")
    callback_url = SettingFormField(services.CALLBACK_URL, label="Callback URL")
    type = forms.ChoiceField(choices=Consumer.Type.choices, initial=Consumer.Type.PUSH)
    ordering = forms.ChoiceField(
        choices=Consumer.Ordering.choices,
        initial=Consumer.Ordering.NONE,
        help_text="ordered: one message at a time per ordering key, in publish order.",
    )
    retry_delays = SettingFormField(
        services.RETRY_DELAYS,
        required=False,
        help_text="Seconds before each retry, comma-separated. Blank: {retry_delays}.",
    )
    non_retryable_statuses = SettingFormField(
        services.NON_RETRYABLE_STATUSES,
        label="Non-retryable statuses",
        required=False,
        help_text="HTTP statuses that go straight to DEAD, comma-separated.",
    )
    max_in_flight = SettingFormField(
        services.MAX_IN_FLIGHT,
        label="Max in flight",
        required=False,
        help_text="Concurrent push deliveries. Blank: {max_in_flight}.",
    )
    max_per_second = SettingFormField(
        services.MAX_PER_SECOND,
        label="Max per second",
        required=False,
        help_text="Push requests per second at most, across all dispatchers: a decimal number "
        "such as 20 or 0.5. Blank: no limit.",
    )
    max_job_age = SettingFormField(
        services.MAX_JOB_AGE,
        label="Max job age",
        required=False,
        help_text="Seconds a push job may wait undelivered before it expires to the DLQ; 0: no "
        "limit. Blank: {max_job_age}.",
    )
    event_types = SettingFormField(
        services.EVENT_TYPES,
        label="Event types",
        required=False,
        help_text="The event types it receives, comma-separated: order.created, a prefix such as "
        "order.*, or *. Blank: every message. Applies to messages published from now on.",
    )
    token = forms.CharField(
        required=False,
        max_length=255,
        widget=forms.PasswordInput,
        help_text="Sent in every delivery. Blank: keep it (a new consumer gets a random one).",
    )
    signing_secret = SettingFormField(
        services.SIGNING_SECRET,
        label="Import signing secret",
        required=False,
        widget=forms.PasswordInput,
        help_text="whsec_… Replaces the current secret at once, without an overlap. "
        "Blank: keep it.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        values = defaults()
        for name, form_field in self.fields.items():
            if name in values:
                form_field.help_text = str(form_field.help_text).format(**values)

    def fieldsets(self) -> list[Fieldset]:
        """The form's fields in their groups (FIELDSETS), each group with the fields it has."""
        groups = [
            Fieldset(legend, [self[name] for name in names if name in self.fields])
            for legend, names in FIELDSETS
        ]
        return [group for group in groups if group.fields]

    def api_form(self) -> dict[str, Any]:
        """The cleaned settings under the API's field names, as services.save_consumer takes
        them; a blank callback URL (on edit), token or secret is left out, which keeps the
        current one."""
        data = self.cleaned_data
        form = {"name": data["name"], "type": data["type"], "ordering": data["ordering"]}
        for setting in services.SETTINGS:  # the fields are named after the model's
            if setting is not services.CALLBACK_URL:
                form[setting.wire] = data[setting.attribute]
        if data["callback_url"]:
            form["callbackUrl"] = data["callback_url"]
        if data["token"]:
            form["token"] = data["token"]
        if data.get("signing_secret"):  # the field is there for users who may set it
            form["signingSecret"] = data["signing_secret"]
        return form


@dataclass
class Fieldset:
    legend: str
    fields: list[forms.BoundField]


@dataclass
class CatalogueGroup:
    """One channel's entries of the event type catalogue, as the new-consumer form offers them."""

    channel_id: str
    entries: list[EventType]


class NewConsumerForm(ConsumerSettingsForm):
    channel = forms.CharField(
        max_length=255,
        widget=forms.TextInput(attrs={"list": "channel-suggestions", "autocomplete": "off"}),
        help_text="An existing channel's ID: start typing to pick one.",
    )
    consumer_id = forms.CharField(
        label="Consumer ID", max_length=255, help_text="Letters, digits, _ and -; not changeable."
    )
    catalogued_types = forms.MultipleChoiceField(
        label="From the catalogue",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Ticked types are received as well as the patterns typed above.",
    )
    field_order = ["channel", "consumer_id"]
    catalogue_shown = CATALOGUE_SHOWN

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channel_suggestions = list(
            Channel.objects.only("id", "name").order_by("id")[:CHANNELS_SUGGESTED]
        )
        entries = list(
            EventType.objects.only("channel_id", "name", "description").order_by(
                "channel_id", "name"
            )[: CATALOGUE_SHOWN + 1]  # the one more says whether there are more
        )
        self.catalogue_capped = len(entries) > CATALOGUE_SHOWN
        del entries[CATALOGUE_SHOWN:]
        self.catalogue_groups = [
            CatalogueGroup(channel_id, list(group))
            for channel_id, group in groupby(entries, key=attrgetter("channel_id"))
        ]
        # An entry is "channel/type" (EventType's str): a type never holds a "/".
        ticks = cast(forms.MultipleChoiceField, self.fields["catalogued_types"])
        ticks.choices = [(str(entry), entry.name) for entry in entries]

    def clean_channel(self) -> Channel:
        channel = Channel.objects.filter(pk=self.cleaned_data["channel"]).first()
        if channel is None:
            raise forms.ValidationError("No such channel.")
        return channel

    def clean_consumer_id(self) -> str:
        consumer_id: str = self.cleaned_data["consumer_id"]
        if not is_resource_id(consumer_id):
            raise forms.ValidationError("Use 1 to 255 letters, digits, _ or -.")
        return consumer_id

    def clean(self) -> dict[str, Any]:
        """The ticked catalogue entries (values "channel/type", EventType's str) join the typed
        event types, through the one validation of event types; an entry of another channel's
        catalogue is refused."""
        super().clean()
        data = self.cleaned_data
        ticked: list[str] = data.get("catalogued_types") or []
        channel, typed = data.get("channel"), data.get("event_types")
        if not ticked or channel is None or typed is None:
            return data
        names = []
        for value in ticked:
            channel_id, name = value.split("/", 1)
            if channel_id != channel.pk:
                self.add_error(
                    "catalogued_types",
                    f"{name} is in the catalogue of {channel_id}, not {channel.pk}.",
                )
                return data
            names.append(name)
        try:
            data["event_types"] = services.EVENT_TYPES.clean(", ".join([*typed, *names]))
        except forms.ValidationError as error:
            self.add_error("event_types", error)
        return data


class EditConsumerForm(ConsumerSettingsForm):
    """The settings of `consumer`. Its callback URL is never written into the page, where its
    credentials and query would be in clear: the field starts blank, which keeps it, and its help
    shows it masked (Consumer.masked_callback_url)."""

    # The consumer's ChangedAt when the form was rendered (optimistic concurrency, as the API's
    # If-Unmodified-Since but to the microsecond).
    changed_at = forms.CharField(widget=forms.HiddenInput)

    def __init__(self, *args: Any, consumer: Consumer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current_callback_url = consumer.callback_url
        # Checked in clean_callback_url, against the current URL (blank keeps it).
        self.fields["callback_url"] = forms.CharField(
            label="New callback URL",
            required=False,
            max_length=services.MAX_CALLBACK_URL_LENGTH,
            help_text=f"Now: {consumer.masked_callback_url}. Blank: keep it. A new URL is typed "
            "whole: its credentials and query values are never shown again.",
        )

    def clean_callback_url(self) -> str:
        url: str = self.cleaned_data["callback_url"]
        return services.validated(
            lambda value: services.checked_new_callback_url(value, self.current_callback_url), url
        )

    def clean_changed_at(self) -> datetime:
        try:
            return datetime.fromisoformat(self.cleaned_data["changed_at"])
        except ValueError:
            raise forms.ValidationError("Reload the form.") from None

    @classmethod
    def of(cls, consumer: Consumer) -> EditConsumerForm:
        settings = [
            setting for setting in services.SETTINGS if setting is not services.CALLBACK_URL
        ]
        return cls(
            consumer=consumer,
            initial={
                "name": consumer.name,
                "type": consumer.type,
                "ordering": consumer.ordering,
                **{setting.attribute: setting.text_of(consumer) for setting in settings},
                "changed_at": consumer.changed_at.isoformat(),
            },
        )

"""The consumer pages' forms: a consumer's settings as the operator types them, turned into the
form that consumers/services.py validates for the API, the UI and the admin alike."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms

from broker.models import Channel, is_resource_id
from consumers import services
from consumers.models import Consumer
from consumers.services import SettingFormField


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
        help_text="Seconds before each retry, comma-separated. Blank: BROKER_RETRY_DELAYS.",
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
        help_text="Concurrent deliveries. Blank: default.",
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
        "limit. Blank: BROKER_MAX_JOB_AGE_SECONDS.",
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


class NewConsumerForm(ConsumerSettingsForm):
    channel = forms.CharField(max_length=255)
    consumer_id = forms.CharField(
        label="Consumer ID", max_length=255, help_text="Letters, digits, _ and -; not changeable."
    )
    field_order = ["channel", "consumer_id"]

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

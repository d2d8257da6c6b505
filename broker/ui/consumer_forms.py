"""The consumer pages' forms: a consumer's settings as the operator types them, turned into the
form that consumers/services.py validates for the API, the UI and the admin alike."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms

from broker.models import Channel, is_resource_id
from consumers import services
from consumers.models import Consumer


class ConsumerSettingsForm(forms.Form):
    """A consumer's settings, validated by the same functions as the API's consumer PUT."""

    name = forms.CharField(required=False, max_length=255, help_text="Blank: the consumer ID.")
    callback_url = forms.CharField(label="Callback URL", max_length=2048)
    type = forms.ChoiceField(choices=Consumer.Type.choices, initial=Consumer.Type.PUSH)
    ordering = forms.ChoiceField(
        choices=Consumer.Ordering.choices,
        initial=Consumer.Ordering.NONE,
        help_text="ordered: one message at a time per ordering key, in publish order.",
    )
    retry_delays = forms.CharField(
        required=False,
        help_text="Seconds before each retry, comma-separated. Blank: BROKER_RETRY_DELAYS.",
    )
    non_retryable_statuses = forms.CharField(
        label="Non-retryable statuses",
        required=False,
        help_text="HTTP statuses that go straight to DEAD, comma-separated.",
    )
    max_in_flight = forms.CharField(
        label="Max in flight", required=False, help_text="Concurrent deliveries. Blank: default."
    )
    max_per_second = forms.CharField(
        label="Max per second",
        required=False,
        help_text="Push requests per second at most, across all dispatchers: a decimal number "
        "such as 20 or 0.5. Blank: no limit.",
    )
    max_job_age = forms.CharField(
        label="Max job age",
        required=False,
        help_text="Seconds a push job may wait undelivered before it expires to the DLQ; 0: no "
        "limit. Blank: BROKER_MAX_JOB_AGE_SECONDS.",
    )
    event_types = forms.CharField(
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
    signing_secret = forms.CharField(
        label="Import signing secret",
        required=False,
        max_length=256,
        widget=forms.PasswordInput,
        help_text="whsec_… Replaces the current secret at once, without an overlap. "
        "Blank: keep it.",
    )

    def clean_callback_url(self) -> str:
        return services.validated(services.checked_callback_url, self.cleaned_data["callback_url"])

    def clean_retry_delays(self) -> list[int] | None:
        return services.validated(services.parse_retry_delays, self.cleaned_data["retry_delays"])

    def clean_non_retryable_statuses(self) -> list[int]:
        return services.validated(
            services.parse_non_retryable_statuses, self.cleaned_data["non_retryable_statuses"]
        )

    def clean_max_in_flight(self) -> int | None:
        return services.validated(services.parse_max_in_flight, self.cleaned_data["max_in_flight"])

    def clean_max_per_second(self) -> float | None:
        return services.validated(
            services.parse_max_per_second, self.cleaned_data["max_per_second"]
        )

    def clean_max_job_age(self) -> int | None:
        return services.validated(services.parse_max_job_age, self.cleaned_data["max_job_age"])

    def clean_event_types(self) -> list[str]:
        return services.validated(services.parse_event_types, self.cleaned_data["event_types"])

    def clean_signing_secret(self) -> str:
        secret: str = self.cleaned_data["signing_secret"]
        return services.validated(services.checked_signing_secret, secret) if secret else ""

    def api_form(self) -> dict[str, Any]:
        """The cleaned settings under the API's field names, as services.save_consumer takes
        them; a blank callback URL (on edit), token or secret is left out, which keeps the
        current one."""
        data = self.cleaned_data
        form = {
            "name": data["name"],
            "type": data["type"],
            "ordering": data["ordering"],
            "retryDelays": data["retry_delays"],
            "nonRetryableStatuses": data["non_retryable_statuses"],
            "maxInFlight": data["max_in_flight"],
            "maxJobAge": data["max_job_age"],
            "maxPerSecond": data["max_per_second"],
            "eventTypes": data["event_types"],
        }
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
        field = self.fields["callback_url"]
        field.label, field.required = "New callback URL", False
        field.help_text = (
            f"Now: {consumer.masked_callback_url}. Blank: keep it. A new URL is typed whole: its "
            "credentials and query values are never shown again."
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
        return cls(
            consumer=consumer,
            initial={
                "name": consumer.name,
                "type": consumer.type,
                "ordering": consumer.ordering,
                "retry_delays": _joined(consumer.retry_delays),
                "non_retryable_statuses": _joined(consumer.non_retryable_statuses),
                "max_in_flight": consumer.max_in_flight or "",
                "max_job_age": "" if consumer.max_job_age is None else consumer.max_job_age,
                "max_per_second": consumer.max_per_second_text,
                "event_types": ", ".join(consumer.event_types),
                "changed_at": consumer.changed_at.isoformat(),
            },
        )


def _joined(numbers: list[int] | None) -> str:
    return ", ".join(str(number) for number in numbers or [])

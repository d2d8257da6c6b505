from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from broker.api.serializers import PayloadFieldsMixin, payload_fields
from broker.models import Message
from jobs.models import Job


def job_url(job: Job) -> str:
    return (
        f"/channel/{job.consumer.channel_id}/consumer/{job.consumer.public_id}/job/{job.public_id}"
    )


# The two serializers of a claim's jobs write their output out: the fields declared stay the
# schema's, but DRF's walk over them, field by field for up to 100 jobs, cost a claim more than
# its queries (tests/api/test_pull_batch.py checks that output and schema agree).


class QueuedMessageSerializer(PayloadFieldsMixin):
    MessageID = serializers.CharField(source="public_id")
    Headers = serializers.DictField(source="headers", child=serializers.CharField())
    ContentType = serializers.CharField(source="content_type")
    EventType = serializers.CharField(source="event_type", allow_null=True)

    def to_representation(self, instance: Message) -> dict[str, Any]:
        fields = payload_fields(instance)
        error = fields.pop("PayloadError", None)
        return {
            **fields,
            "MessageID": instance.public_id,
            "Headers": {str(name): str(value) for name, value in instance.headers.items()},
            "ContentType": instance.content_type,
            "EventType": instance.event_type,
            **({"PayloadError": error} if error else {}),
        }


class QueuedJobSerializer(serializers.Serializer[Any]):
    """An entry of queued-jobs and claim: the job with its message."""

    ID = serializers.CharField(source="public_id")
    Priority = serializers.IntegerField(source="priority")
    IncrementalTimeout = serializers.IntegerField(source="incremental_timeout")
    Attempts = serializers.IntegerField(source="attempts")
    Message = QueuedMessageSerializer(source="message")

    def to_representation(self, instance: Job) -> dict[str, Any]:
        return {
            "ID": instance.public_id,
            "Priority": instance.priority,
            "IncrementalTimeout": instance.incremental_timeout,
            "Attempts": instance.attempts,
            "Message": self.fields["Message"].to_representation(instance.message),
        }


class QueuedJobsSerializer(serializers.Serializer[Any]):
    Result = QueuedJobSerializer(many=True)


class JobSummarySerializer(serializers.Serializer[Any]):
    """A job as listed with its message: webhook-broker's fields plus extensions."""

    ID = serializers.CharField(source="public_id")
    ListenerEndpoint = serializers.CharField(source="consumer.callback_url")
    ListenerName = serializers.CharField(source="consumer.name")  # as webhook-broker: its name
    Status = serializers.CharField(source="status")
    StatusChangedAt = serializers.DateTimeField(source="status_changed_at")
    Attempts = serializers.IntegerField(source="attempts")
    LastError = serializers.CharField(source="last_error")


class LastAttemptSerializer(serializers.Serializer[Any]):
    """A job's latest delivery attempt (push consumers; pull consumers' jobs have none)."""

    Number = serializers.IntegerField(source="last_attempt_number")
    StartedAt = serializers.DateTimeField(source="last_started_at")
    DurationMs = serializers.FloatField(source="last_duration_ms")
    StatusCode = serializers.IntegerField(
        source="last_status_code", allow_null=True, help_text="null: no answer"
    )
    ErrorClass = serializers.CharField(
        source="last_error_class", help_text="what went wrong without an answer; empty otherwise"
    )


class MessageJobSerializer(JobSummarySerializer):
    """A job in its message's answer, with its latest attempt (extension; null before the first):
    read from jobs annotated by jobs.models.with_last_attempt."""

    LastAttempt = serializers.SerializerMethodField()

    @extend_schema_field(LastAttemptSerializer(allow_null=True))
    def get_LastAttempt(self, job: Job) -> dict[str, Any] | None:  # noqa: N802 (wire name)
        if getattr(job, "last_started_at", None) is None:
            return None
        return dict(LastAttemptSerializer(job).data)


class JobLinksSerializer(JobSummarySerializer):
    """A job as webhook-broker's HyperlinkedDeliveryJobModel, plus extensions."""

    Priority = serializers.IntegerField(source="priority")
    LeaseExpiresAt = serializers.DateTimeField(source="lease_expires_at", allow_null=True)
    MessageURL = serializers.SerializerMethodField()
    ChannelURL = serializers.SerializerMethodField()
    ConsumerURL = serializers.SerializerMethodField()
    ProducerURL = serializers.SerializerMethodField()
    JobRequeueURL = serializers.SerializerMethodField()

    def get_MessageURL(self, job: Job) -> str:  # noqa: N802 (wire name)
        return f"/channel/{job.consumer.channel_id}/message/{job.message.public_id}"

    def get_ChannelURL(self, job: Job) -> str:  # noqa: N802
        return f"/channel/{job.consumer.channel_id}"

    def get_ConsumerURL(self, job: Job) -> str:  # noqa: N802
        return f"/channel/{job.consumer.channel_id}/consumer/{job.consumer.public_id}"

    def get_ProducerURL(self, job: Job) -> str:  # noqa: N802
        return f"/producer/{job.message.producer_id}"

    def get_JobRequeueURL(self, job: Job) -> str:  # noqa: N802
        return f"{job_url(job)}/requeue-dead-job" if job.status == Job.Status.DEAD else ""

"""Broker rights are Django permissions (issue 14 §6; docs/ui.md, "Rights").

Staff status lets a user into the UI; each page and action then needs its permission, which the
group "broker admin" (created by a migration) and superusers have. A staff user without it gets
a 403 page naming it, and the UI hides the buttons of actions the user may not take.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.test import Client

from broker import publish
from broker.models import Message, PeriodicMessage
from broker.periodic_edits import PeriodicMessagePostForm, create_periodic
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import DEAD, QUEUED
from tests.helpers import make_channel, make_consumer, make_operator, make_producer

CONFIRMED = {"confirmed": "yes"}  # the second step of an action that asks first

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CONSUMER = "/ui/consumers/orders/billing"
BROKER_APPS = ("broker", "consumers", "jobs")

# Every page with the permission it needs, as in docs/ui.md.
PAGES = {
    "/ui/": "jobs.view_job",
    "/ui/dead-jobs": "jobs.view_job",
    "/ui/jobs/{job}": "jobs.view_job",
    "/ui/consumers": "consumers.view_consumer",
    CONSUMER: "consumers.view_consumer",
    "/ui/consumers/new": "consumers.add_consumer",
    f"{CONSUMER}/edit": "consumers.change_consumer",
    f"{CONSUMER}/secret/reveal": "broker.manage_signing_secrets",
    f"{CONSUMER}/secret/rotate": "broker.manage_signing_secrets",
    "/ui/messages": "broker.view_message",
    "/ui/messages/{message}": "broker.view_message",
    "/ui/scheduled": "broker.view_message",
    "/ui/scheduled/new": "broker.add_message",
    "/ui/scheduled/orders/later": "broker.view_message",
    "/ui/periodic": "broker.view_periodicmessage",
    "/ui/periodic/new": "broker.add_periodicmessage",
    "/ui/periodic/orders/tick": "broker.view_periodicmessage",
    "/ui/reports": "jobs.view_deliveryreport",
}
VIEW_PERMISSIONS = sorted({name for name in PAGES.values() if ".view_" in name})


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def rows(clock) -> dict[str, int | str]:
    """A consumer with a dead job and a delivered one, a scheduled message and a periodic
    message."""
    channel = make_channel("orders")
    make_producer("shop")
    make_consumer(channel, "billing")
    message = publish(channel, b"{}", producer="shop", message_id="m-1")
    job = Job.objects.get(message=message)
    take_for_pull(job)
    job.mark_dead("for the test")
    delivered = publish(channel, b"{}", producer="shop", message_id="m-2")
    delivered_job = Job.objects.get(message=delivered)
    take_for_pull(delivered_job)
    delivered_job.mark_delivered()
    publish(channel, b"{}", producer="shop", message_id="later", scheduled_for=NOW + timedelta(1))
    periodic = PeriodicMessagePostForm(
        data={"producer": "shop", "payload": "{}", "intervalSeconds": "60"}
    )
    assert periodic.is_valid(), periodic.errors
    create_periodic(channel, "tick", dict(periodic.validated_data))
    return {
        "job": job.public_id,
        "job_pk": job.pk,
        "message": message.pk,
        "delivered": delivered.pk,
    }


def url(template: str, rows: dict[str, int]) -> str:
    return template.format(**rows)


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff(*permissions: str) -> User:
    """A staff user with exactly these permissions ("app.codename")."""
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    for name in permissions:
        app_label, codename = name.split(".")
        permission = Permission.objects.get(content_type__app_label=app_label, codename=codename)
        user.user_permissions.add(permission)
    return User.objects.get(pk=user.pk)  # without the permission cache of the old object


def state() -> tuple[object, ...]:
    """What the refused actions below would change."""
    consumer = Consumer.objects.get(public_id="billing")
    return (
        consumer.paused,
        consumer.name,
        consumer.signing_secret,
        consumer.changed_at,
        sorted(Job.objects.values_list("pk", "status")),
        sorted(Message.objects.values_list("public_id", flat=True)),
        sorted(PeriodicMessage.objects.values_list("public_id", "enabled")),
    )


def actions(rows: dict[str, int]) -> list[tuple[str, dict[str, object]]]:
    """Every action, with a form it would carry out."""
    consumer = Consumer.objects.get(public_id="billing")
    return [
        (f"{CONSUMER}/secret/reveal", {"confirm": "yes"}),
        (f"{CONSUMER}/secret/rotate", {"confirm": "yes"}),
        (f"{CONSUMER}/edit", edit_form(consumer)),
        (f"{CONSUMER}/pause", {}),
        (f"{CONSUMER}/close-circuit", {}),
        (f"{CONSUMER}/test-event", {}),
        ("/ui/consumers/new", {**edit_form(consumer), "channel": "orders", "consumer_id": "new"}),
        (url("/ui/jobs/{job}/requeue", rows), {}),
        ("/ui/dead-jobs/bulk", {"action": "requeue", "job": [rows["job"]], **CONFIRMED}),
        ("/ui/dead-jobs/bulk", {"action": "delete", "job": [rows["job"]], **CONFIRMED}),
        ("/ui/dead-jobs/matching", {"action": "requeue", "consumer": "billing", **CONFIRMED}),
        ("/ui/dead-jobs/matching", {"action": "delete", "consumer": "billing", **CONFIRMED}),
        (
            "/ui/dead-jobs/requeue-since",
            {"channel": "orders", "consumer": "billing", "since": "2029-01-01T00:00", **CONFIRMED},
        ),
        (url("/ui/messages/{message}/replay", rows), {}),
        ("/ui/scheduled/orders/later/cancel", {}),
        ("/ui/periodic/orders/tick/disable", {}),
        ("/ui/periodic/orders/tick/delete", {}),
    ]


def edit_form(consumer: Consumer) -> dict[str, object]:
    return {
        "name": "Renamed",
        "callback_url": "http://127.0.0.1:9/hook",
        "type": "push",
        "ordering": "none",
        "changed_at": consumer.changed_at.isoformat(),
    }


# --- the group ---------------------------------------------------------------------------------


def test_the_broker_admin_group_has_every_permission_of_the_broker():
    group = Group.objects.get(name="broker admin")
    everything = Permission.objects.filter(content_type__app_label__in=BROKER_APPS)

    assert set(group.permissions.all()) == set(everything)
    names = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}
    assert {"broker.administer_broker", "broker.manage_signing_secrets"} <= names
    assert set(PAGES.values()) <= names


def test_every_migrate_makes_the_group_whole_again():
    Group.objects.filter(name="broker admin").delete()
    Permission.objects.create(
        codename="later_right",
        name="A permission of a later version",
        content_type=ContentType.objects.get_for_model(Job),
    )

    call_command("migrate", verbosity=0)

    group = Group.objects.get(name="broker admin")
    assert group.permissions.filter(codename="later_right").exists()
    assert (
        group.permissions.count()
        == Permission.objects.filter(content_type__app_label__in=BROKER_APPS).count()
    )


# --- staff without permissions -----------------------------------------------------------------


def test_staff_without_permissions_get_403_pages_naming_the_permission(rows):
    client = logged_in(staff())

    for template, permission in PAGES.items():
        response = client.get(url(template, rows))
        assert response.status_code == 403, template
        assert f"<code>{permission}</code>" in response.content.decode(), template
        assert "broker admin" in response.content.decode()


def test_staff_without_permissions_can_take_no_action(rows):
    client = logged_in(staff())
    before = state()

    for path, form in actions(rows):
        assert client.post(path, form).status_code == 403, path
    assert state() == before


def test_view_permissions_show_the_pages_without_their_buttons(rows):
    client = logged_in(staff(*VIEW_PERMISSIONS))
    before = state()

    for template, permission in PAGES.items():
        expected = 200 if permission in VIEW_PERMISSIONS else 403
        assert client.get(url(template, rows)).status_code == expected, template
    consumer_page = client.get(CONSUMER).content.decode()
    for button in (">Pause<", ">Edit settings<", ">Reveal secret", ">Rotate secret", ">Send test"):
        assert button not in consumer_page
    job_page = client.get(url("/ui/jobs/{job}", rows)).content.decode()
    assert "Requeue this job" not in job_page
    assert "Delete this job" not in job_page
    dead_jobs = client.get("/ui/dead-jobs").content.decode()
    assert "Requeue selected" not in dead_jobs
    assert 'name="job"' not in dead_jobs  # no row to tick
    assert ">Replay to" not in client.get(url("/ui/messages/{delivered}", rows)).content.decode()
    assert ">Disable<" not in client.get("/ui/periodic/orders/tick").content.decode()
    assert "New consumer" not in client.get("/ui/consumers").content.decode()
    for path, form in actions(rows):
        assert client.post(path, form).status_code == 403, path
    assert state() == before


def test_a_permission_grants_its_action_and_no_other(rows):
    client = logged_in(staff("consumers.view_consumer", "broker.manage_signing_secrets"))
    secret = Consumer.objects.get().signing_secret

    page = client.get(CONSUMER).content.decode()
    assert ">Reveal secret" in page
    assert ">Pause<" not in page
    revealed = client.post(f"{CONSUMER}/secret/reveal", {"confirm": "yes"})
    assert revealed.status_code == 200
    assert secret in revealed.content.decode()
    assert client.post(f"{CONSUMER}/pause").status_code == 403
    assert not Consumer.objects.get().paused


IMPORTED_SECRET = "whsec_" + "A" * 43 + "="  # 32 bytes of base64


def test_editing_a_consumer_sets_no_signing_secret_without_the_secrets_right(rows):
    """A signing secret of one's choosing would let one sign webhooks: change_consumer alone
    shows no secret field, and a secret posted anyway is refused, changing nothing."""
    client = logged_in(staff("consumers.change_consumer"))
    consumer = Consumer.objects.get(public_id="billing")
    before = state()

    form_page = client.get(f"{CONSUMER}/edit").content.decode()
    refused = client.post(
        f"{CONSUMER}/edit", {**edit_form(consumer), "signing_secret": IMPORTED_SECRET}
    )

    assert 'name="signing_secret"' not in form_page
    assert refused.status_code == 403
    assert "broker.manage_signing_secrets" in refused.content.decode()
    assert state() == before
    saved = client.post(f"{CONSUMER}/edit", edit_form(consumer))  # the other settings: fine
    assert saved.status_code == 302
    assert Consumer.objects.get(public_id="billing").name == "Renamed"


def test_the_secrets_right_imports_a_signing_secret_in_the_settings_form(rows):
    client = logged_in(staff("consumers.change_consumer", "broker.manage_signing_secrets"))
    consumer = Consumer.objects.get(public_id="billing")

    saved = client.post(
        f"{CONSUMER}/edit", {**edit_form(consumer), "signing_secret": IMPORTED_SECRET}
    )

    assert saved.status_code == 302
    assert Consumer.objects.get(public_id="billing").signing_secret == IMPORTED_SECRET


def test_requeue_and_delete_are_separate_rights(rows):
    client = logged_in(staff("jobs.view_job", "jobs.change_job"))
    page = client.get("/ui/dead-jobs").content.decode()
    assert "Requeue selected" in page
    assert "Delete selected" not in page

    delete = client.post("/ui/dead-jobs/bulk", {"action": "delete", "job": [rows["job"]]})
    assert delete.status_code == 403
    requeue = client.post(
        "/ui/dead-jobs/bulk", {"action": "requeue", "job": [rows["job"]], **CONFIRMED}
    )
    assert requeue.status_code == 302
    assert Job.objects.get(pk=rows["job_pk"]).status == QUEUED


def test_the_navigation_shows_only_the_pages_the_user_may_open(rows):
    client = logged_in(staff("consumers.view_consumer"))
    nav = client.get("/ui/consumers").content.decode().split("<nav>")[1].split("</nav>")[0]

    assert 'href="/ui/consumers"' in nav
    assert 'href="/ui/dead-jobs"' not in nav
    assert 'href="/ui/reports"' not in nav


# --- full rights -------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["broker admin member", "superuser"])
def test_broker_admins_and_superusers_can_do_everything(rows, who):
    if who == "superuser":
        user = User.objects.create_superuser("root", password="pw")
    else:
        user = make_operator()
    client = logged_in(user)
    consumer = Consumer.objects.get()

    for template in PAGES:
        assert client.get(url(template, rows)).status_code == 200, template
    revealed = client.post(f"{CONSUMER}/secret/reveal", {"confirm": "yes"})
    assert consumer.signing_secret in revealed.content.decode()
    assert client.post(f"{CONSUMER}/edit", edit_form(consumer)).status_code == 302
    assert Consumer.objects.get().name == "Renamed"
    assert client.post(f"{CONSUMER}/secret/rotate", {"confirm": "yes"}).status_code == 302
    assert Consumer.objects.get().signing_secret != consumer.signing_secret
    assert client.post(url("/ui/jobs/{job}/requeue", rows)).status_code == 302
    assert Job.objects.get(pk=rows["job_pk"]).status == QUEUED
    assert ">Replay to" in client.get(url("/ui/messages/{delivered}", rows)).content.decode()
    assert ">Disable<" in client.get("/ui/periodic/orders/tick").content.decode()


def test_users_who_are_not_staff_still_go_to_the_login_page(rows):
    user = User.objects.create_user("someone", password="pw")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobs"))
    response = logged_in(user).get("/ui/dead-jobs")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/ui/dead-jobs")


# --- the Django admin --------------------------------------------------------------------------


def test_admin_actions_need_the_permission_of_what_they_change(rows):
    viewer = logged_in(staff("jobs.view_job", "consumers.view_consumer"))
    assert "requeue_dead" not in viewer.get("/admin/jobs/job/").content.decode()
    assert 'value="pause"' not in viewer.get("/admin/consumers/consumer/").content.decode()
    viewer.post(
        "/admin/jobs/job/",
        {"action": "requeue_dead", "_selected_action": [rows["job_pk"]]},
    )
    assert Job.objects.get(pk=rows["job_pk"]).status == DEAD

    operator = logged_in(make_operator("ops"))
    assert "requeue_dead" in operator.get("/admin/jobs/job/").content.decode()
    assert 'value="pause"' in operator.get("/admin/consumers/consumer/").content.decode()

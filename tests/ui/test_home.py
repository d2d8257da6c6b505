"""`/` points to the UI, the API docs and the health check; UI pages work with a trailing slash."""

from __future__ import annotations

import pytest

LINKS = {"/ui/", "/api/docs/", "/_status"}


def test_home_answers_json_with_the_links(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert set(response.json()["links"].values()) >= LINKS


def test_home_answers_a_browser_with_a_page_of_links(client):
    response = client.get("/", HTTP_ACCEPT="text/html,application/xhtml+xml")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    for link in LINKS:
        assert f'<a href="{link}">' in response.content.decode()


@pytest.mark.parametrize(
    ("asked", "target"),
    [
        ("/ui/dead-jobs/", "/ui/dead-jobs"),
        ("/ui/dead-jobs/?consumer=7", "/ui/dead-jobs?consumer=7"),
        ("/ui/consumers/", "/ui/consumers"),
    ],
)
def test_a_ui_page_with_a_trailing_slash_is_the_page_without_it(client, asked, target):
    response = client.get(asked)
    assert response.status_code == 308
    assert response["Location"] == target


@pytest.mark.django_db
def test_a_form_posted_with_a_trailing_slash_is_posted_again_without_it(admin_user, client):
    client.force_login(admin_user)
    response = client.post("/ui/dead-jobs/bulk/", {"action": "requeue"}, follow=True)
    assert response.redirect_chain[0] == ("/ui/dead-jobs/bulk", 308)


def test_the_redirect_keeps_an_encoded_path_encoded(client):
    response = client.get("/ui/jobs/a%3Fb/")
    assert response["Location"] == "/ui/jobs/a%3Fb"

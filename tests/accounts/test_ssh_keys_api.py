"""`/api/v1/ssh-keys`: list, add, show, delete."""

import time_machine

from accounts.keys import add_ssh_key
from accounts.models import SshKey
from tests.accounts.sshkeys import ed25519_line, keygen_fingerprint, rsa_line


def _post(person, **payload):
    return person.api().post("/api/v1/ssh-keys", payload, content_type="application/json")


def test_it_adds_a_key_and_answers_201_with_it(owner):
    line = ed25519_line("me@laptop")

    with time_machine.travel("2030-05-06 07:08:09Z", tick=False):
        response = _post(owner, name="laptop", public_key=line)

    assert response.status_code == 201
    key = SshKey.objects.get(project=owner.project)
    assert response.json() == {
        "data": {
            "id": key.pk,
            "name": "laptop",
            "type": "ssh-ed25519",
            "fingerprint": keygen_fingerprint(line),
            "public_key": line,
            "owner": "owner@example.com",
            "created_at": "2030-05-06T07:08:09Z",
        }
    }
    assert key.created_by == owner.user


def test_it_names_a_key_after_its_comment_when_no_name_is_given(owner):
    response = _post(owner, public_key=rsa_line(comment="ci@runner"))

    assert response.json()["data"]["name"] == "ci@runner"
    assert response.json()["data"]["type"] == "ssh-rsa"


def test_it_refuses_an_invalid_key_with_422_and_the_message(owner):
    response = _post(owner, name="short", public_key=rsa_line(1024))

    assert response.status_code == 422
    assert response.json() == {
        "error": {
            "code": "invalid_ssh_key",
            "message": "This RSA key is 1024 bits, too short: RSA keys need at least 2048 bits. "
            "Make a new one with 'ssh-keygen -t ed25519'.",
        }
    }
    assert not SshKey.objects.exists()


def test_it_refuses_a_duplicate_with_409(owner):
    line = ed25519_line()
    _post(owner, name="first", public_key=line)

    response = _post(owner, name="second", public_key=line)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "ssh_key_exists"
    assert SshKey.objects.count() == 1


def test_it_refuses_a_body_without_a_public_key(owner):
    response = _post(owner, name="nothing")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert "public_key" in response.json()["error"]["message"]


def test_it_lists_the_projects_keys_with_meta(owner, teammate):
    lines = [ed25519_line() for _ in range(3)]
    for name, line in zip(("b", "a", "c"), lines, strict=True):
        add_ssh_key(project=owner.project, user=teammate.user, name=name, public_key=line)

    response = owner.api().get("/api/v1/ssh-keys?limit=2")

    assert response.status_code == 200
    body = response.json()
    assert [key["name"] for key in body["data"]] == ["a", "b"]
    assert body["data"][0]["fingerprint"] == keygen_fingerprint(lines[1])
    assert set(body["data"][0]) == {
        "id",
        "name",
        "type",
        "fingerprint",
        "public_key",
        "owner",
        "created_at",
    }
    assert body["data"][0]["owner"] == "teammate@example.com"
    assert body["meta"] == {"total": 3, "limit": 2, "offset": 0}
    assert [k["name"] for k in owner.api().get("/api/v1/ssh-keys?offset=2").json()["data"]] == ["c"]


def test_it_refuses_a_limit_out_of_range(owner):
    response = owner.api().get("/api/v1/ssh-keys?limit=0")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_it_lists_keys_in_a_constant_number_of_queries(owner, django_assert_num_queries):
    for index in range(5):
        add_ssh_key(
            project=owner.project, user=owner.user, name=f"k{index}", public_key=ed25519_line()
        )

    # authenticate (1) + last used (1), the page (1) and the count (1)
    with django_assert_num_queries(4):
        owner.api().get("/api/v1/ssh-keys")


def test_it_shows_one_key(owner):
    key = add_ssh_key(project=owner.project, user=owner.user, name="one", public_key=ed25519_line())

    response = owner.api().get(f"/api/v1/ssh-keys/{key.pk}")

    assert response.json()["data"]["fingerprint"] == key.fingerprint


def test_it_deletes_a_key_with_204(owner):
    key = add_ssh_key(project=owner.project, user=owner.user, name="one", public_key=ed25519_line())

    response = owner.api().delete(f"/api/v1/ssh-keys/{key.pk}")

    assert response.status_code == 204
    assert response.content == b""
    assert not SshKey.objects.exists()
    assert owner.api().delete(f"/api/v1/ssh-keys/{key.pk}").status_code == 404

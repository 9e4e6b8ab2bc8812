"""SSH keys on the account page: add, list, remove."""

from accounts.keys import add_ssh_key
from accounts.models import SshKey
from tests.accounts.sshkeys import ed25519_line, keygen_fingerprint, rsa_line


def _add(client, public_key, name="laptop", **headers):
    return client.post(
        "/accounts/ssh-keys/add/", {"name": name, "public_key": public_key}, headers=headers
    )


def test_it_adds_a_key_and_lists_its_name_type_fingerprint_and_date(owner):
    client = owner.browser_client()
    line = ed25519_line("me@laptop")

    response = _add(client, line)

    assert response["Location"] == "/accounts/#ssh-keys"
    key = SshKey.objects.get(project=owner.project)
    assert key.name == "laptop"
    assert key.created_by == owner.user
    content = client.get("/accounts/").content.decode()
    assert "laptop" in content
    assert "ssh-ed25519" in content
    assert keygen_fingerprint(line) in content
    assert key.created_at.strftime("%b %-d, %Y") in content


def test_it_answers_htmx_with_the_ssh_keys_section(owner):
    response = _add(owner.browser_client(), rsa_line(), name="rsa", hx_request="true")

    content = response.content.decode()
    assert content.lstrip().startswith('<section id="ssh-keys"')
    assert "SSH key &#x27;rsa&#x27; added." in content
    assert "ssh-rsa" in content


def test_it_shows_what_is_wrong_with_a_bad_key_beside_the_field_and_saves_nothing(owner):
    bad = ed25519_line()[:50]

    response = _add(owner.browser_client(), bad, hx_request="true")

    content = response.content.decode()
    assert response.status_code == 200
    assert "The key data is truncated" in content
    assert 'id="id_public_key_error"' in content
    assert bad in content, "the pasted text stays in the form to fix"
    assert not SshKey.objects.exists()


def test_it_refuses_a_key_twice_in_a_project(owner):
    client = owner.browser_client()
    line = ed25519_line()
    _add(client, line, name="first")

    response = _add(client, line, name="second")

    assert "already in your project, as &#x27;first&#x27;" in response.content.decode()
    assert list(SshKey.objects.values_list("name", flat=True)) == ["first"]


def test_it_asks_before_removing_without_javascript(owner):
    key = add_ssh_key(project=owner.project, user=owner.user, name="old", public_key=ed25519_line())

    response = owner.browser_client().get(f"/accounts/ssh-keys/{key.pk}/remove/")

    assert "Remove the SSH key &#x27;old&#x27;?" in response.content.decode()
    assert key.fingerprint in response.content.decode()
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_it_removes_a_key(owner):
    key = add_ssh_key(project=owner.project, user=owner.user, name="old", public_key=ed25519_line())

    response = owner.browser_client().post(f"/accounts/ssh-keys/{key.pk}/remove/")

    assert response["Location"] == "/accounts/#ssh-keys"
    assert not SshKey.objects.exists()


def test_it_shows_a_teammates_keys_as_the_projects(owner, teammate):
    add_ssh_key(
        project=owner.project, user=teammate.user, name="teammate box", public_key=ed25519_line()
    )

    assert "teammate box" in owner.browser_client().get("/accounts/").content.decode()


def test_it_points_the_ssh_keys_address_at_the_section(owner):
    response = owner.browser_client().get("/accounts/ssh-keys/")

    assert response["Location"] == "/accounts/#ssh-keys"


def test_it_returns_to_the_page_it_was_sent_from_once_a_key_is_added(owner):
    client = owner.browser_client()

    response = client.get("/accounts/ssh-keys/?next=/clusters/new/%3Foffer%3Dx")
    assert response["Location"] == "/accounts/?next=%2Fclusters%2Fnew%2F%3Foffer%3Dx#ssh-keys"
    page = client.get(response["Location"]).content.decode()
    assert '<input type="hidden" name="next" value="/clusters/new/?offer=x">' in page

    added = client.post(
        "/accounts/ssh-keys/add/",
        {"name": "k", "public_key": ed25519_line(), "next": "/clusters/new/?offer=x"},
    )
    assert added["Location"] == "/clusters/new/?offer=x"

    with_htmx = client.post(
        "/accounts/ssh-keys/add/",
        {"name": "k2", "public_key": ed25519_line(), "next": "/clusters/new/?offer=x"},
        headers={"hx-request": "true"},
    )
    assert with_htmx["HX-Redirect"] == "/clusters/new/?offer=x"
    assert SshKey.objects.count() == 2


def test_it_never_returns_to_another_site(owner):
    client = owner.browser_client()

    response = client.post(
        "/accounts/ssh-keys/add/",
        {"name": "k", "public_key": ed25519_line(), "next": "https://evil.example/"},
    )

    assert response["Location"] == "/accounts/#ssh-keys"
    assert client.get("/accounts/ssh-keys/?next=//evil.example/")["Location"] == (
        "/accounts/#ssh-keys"
    )

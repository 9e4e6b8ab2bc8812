"""The account page holds two forms with a `name` field (an API key's, an SSH key's): every id on
it is unique, and each label focuses its own form's field."""

from collections import Counter
from html.parser import HTMLParser

from accounts.keys import add_ssh_key, issue_api_key
from tests.accounts.sshkeys import ed25519_line


class _Page(HTMLParser):
    """The ids, the labels' targets, and the form (by action) of each input's id."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.label_for: list[str] = []
        self.form_of: dict[str, str] = {}
        self._form = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(str(found["id"]))
            self.form_of[str(found["id"])] = self._form
        if tag == "form":
            self._form = str(found.get("action") or "")
        if tag == "label" and found.get("for"):
            self.label_for.append(str(found["for"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = ""


def _parse(content: bytes) -> _Page:
    page = _Page()
    page.feed(content.decode())
    return page


def _assert_ids_unique_and_labels_aimed(page: _Page) -> None:
    repeated = [name for name, count in Counter(page.ids).items() if count > 1]
    assert not repeated, f"ids used more than once: {repeated}"
    missing = [target for target in page.label_for if target not in page.ids]
    assert not missing, f"labels for no element: {missing}"


def test_every_id_on_the_account_page_is_unique_and_each_name_label_focuses_its_own_form(owner):
    issue_api_key(user=owner.user, project=owner.project, name="laptop")
    add_ssh_key(project=owner.project, user=owner.user, name="work", public_key=ed25519_line())

    page = _parse(owner.browser_client().get("/accounts/").content)

    _assert_ids_unique_and_labels_aimed(page)
    assert page.form_of["id_api_key_name"] == "/accounts/api-keys/"
    assert page.form_of["id_name"] == "/accounts/ssh-keys/add/"
    assert {"id_api_key_name", "id_name"} <= set(page.label_for)


def test_the_ids_stay_unique_when_a_form_comes_back_with_its_errors(owner):
    client = owner.browser_client()

    bad_api_key = client.post("/accounts/api-keys/", {"name": ""})
    bad_ssh_key = client.post("/accounts/ssh-keys/add/", {"name": "x", "public_key": "nonsense"})

    for response in (bad_api_key, bad_ssh_key):
        assert response.status_code == 200
        assert b"errorlist" in response.content
        _assert_ids_unique_and_labels_aimed(_parse(response.content))

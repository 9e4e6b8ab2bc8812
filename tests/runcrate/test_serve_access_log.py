"""The web process's access log (runcrate/gunicorn_conf.py): a password-reset link, a secret in a
query string and a credential header are logged redacted, by gunicorn's own logger as the
Procfile configures it; everything else as it came."""

import shlex
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from gunicorn.config import Config
from honcho.environ import parse_procfile

from runcrate.gunicorn_conf import REDACTED, RedactingLogger, redact

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "c4v8qz-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
RESET = f"/accounts/password-reset/MTI/{TOKEN}/"
EVERY_SECRET_FORMAT = (
    '%(h)s "%(r)s" %(s)s "%(f)s" %(U)s %(q)s {authorization}i {cookie}i {raw_uri}e {path_info}e'
)


def _logged(tmp_path, *, method="GET", path=RESET, query="", headers=()) -> str:
    log = tmp_path / "access.log"
    config = Config()
    config.set("accesslog", str(log))
    config.set("access_log_format", EVERY_SECRET_FORMAT)
    logger = RedactingLogger(config)
    raw_uri = f"{path}?{query}" if query else path
    environ = {
        "REQUEST_METHOD": method,
        "RAW_URI": raw_uri,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_REFERER": f"https://runcrate.example{raw_uri}",
    }
    response = SimpleNamespace(status="302 Found", sent=0, headers=[])
    request = SimpleNamespace(headers=list(headers))
    logger.access(response, request, environ, timedelta(milliseconds=5))
    for handler in logger.access_log.handlers:
        handler.flush()
    return log.read_text()


def test_the_procfile_web_process_logs_through_the_redacting_logger():
    web = shlex.split(parse_procfile((ROOT / "Procfile").read_text()).processes["web"])
    config = Config()
    config.set("logger_class", "runcrate.gunicorn_conf.RedactingLogger")

    assert web[web.index("--config") + 1] == "python:runcrate.gunicorn_conf"
    assert config.logger_class is RedactingLogger


def test_a_password_reset_link_is_logged_without_its_token(tmp_path):
    line = _logged(tmp_path)

    assert TOKEN not in line
    assert "MTI" not in line
    assert f"GET /accounts/password-reset/{REDACTED}/{REDACTED}/ HTTP/1.1" in line
    assert line.count(REDACTED) >= 5  # request line, Referer, path, raw URI, path info


def test_a_secret_in_a_query_string_and_credential_headers_are_redacted(tmp_path):
    line = _logged(
        tmp_path,
        path="/accounts/invite/",
        query="token=invite-secret-1&next=/clusters/&api_key=rc_live_abc",
        headers=[("AUTHORIZATION", "Bearer rc_live_header"), ("COOKIE", "sessionid=s3ss")],
    )

    for secret in ("invite-secret-1", "rc_live_abc", "rc_live_header", "s3ss"):
        assert secret not in line
    assert "next=/clusters/" in line


@pytest.mark.parametrize(
    "path",
    [
        "/accounts/password-reset/",
        "/accounts/password-reset/sent/",
        "/accounts/password-reset/complete/",
        "/accounts/password-reset/MTI/set-password/",
        "/clusters/12/?page=2",
        "/healthz?access-log-probe",
        "/accounts/invitations/12/revoke/",
    ],
)
def test_a_url_without_a_secret_is_logged_as_it_came(path):
    assert redact(f"GET {path} HTTP/1.1") == f"GET {path} HTTP/1.1"


def test_an_invitation_links_token_is_never_logged():
    line = redact("POST /accounts/invitations/Zq3-secret_T0ken/ HTTP/1.1")
    signup = redact("GET /accounts/signup/?next=/accounts/invitations/Zq3-secret_T0ken/ HTTP/1.1")

    assert line == "POST /accounts/invitations/[redacted]/ HTTP/1.1"
    assert "Zq3-secret_T0ken" not in signup

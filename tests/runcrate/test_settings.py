"""Settings come from the environment, with defaults that run the product on a laptop, and a
bad value stops the process at start-up with a message naming the variable."""

import stat
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from runcrate.env import env_bool, env_decimal, env_float, env_int, env_list


@pytest.mark.parametrize(
    ("reader", "raw", "message"),
    [
        (lambda: env_int("RC_VALUE", 3), "three", "RC_VALUE must be a whole number, not 'three'"),
        (lambda: env_int("RC_VALUE", 3), "2.5", "RC_VALUE must be a whole number, not '2.5'"),
        (lambda: env_int("RC_VALUE", 3, minimum=1), "0", "RC_VALUE must be at least 1, not 0"),
        (lambda: env_bool("RC_VALUE", False), "maybe", "RC_VALUE must be true or false"),
        (lambda: env_float("RC_VALUE", 2.0), "soon", "RC_VALUE must be a number, not 'soon'"),
        (lambda: env_float("RC_VALUE", 2.0), "nan", "RC_VALUE must be a finite number"),
        (lambda: env_float("RC_VALUE", 2.0), "inf", "RC_VALUE must be a finite number"),
        (lambda: env_float("RC_VALUE", 2.0), "0", "RC_VALUE must be greater than 0.0, not 0.0"),
        (lambda: env_float("RC_VALUE", 2.0), "-2", "RC_VALUE must be greater than 0.0"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "ten", "RC_VALUE must be a decimal amount"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "NaN", "RC_VALUE must be a decimal amount"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "Infinity", "RC_VALUE must be a decimal"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "1e30", "must be a decimal amount from 0 to"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "-5", "must be a decimal amount from 0 to"),
        (lambda: env_decimal("RC_VALUE", "10.00"), "0.001", "with at most 2 decimals"),
    ],
)
def test_it_refuses_a_bad_value_naming_the_variable(monkeypatch, reader, raw, message):
    monkeypatch.setenv("RC_VALUE", raw)
    with pytest.raises(ImproperlyConfigured, match=message.replace(".", r"\.")):
        reader()


def test_it_reads_good_values_and_falls_back_to_defaults(monkeypatch):
    monkeypatch.delenv("RC_VALUE", raising=False)
    assert env_int("RC_VALUE", 30) == 30
    assert env_float("RC_VALUE", 2.0) == 2.0
    assert env_decimal("RC_VALUE", "10.00") == Decimal("10.00")
    assert env_bool("RC_VALUE", True) is True
    monkeypatch.setenv("RC_VALUE", "")
    assert env_int("RC_VALUE", 30) == 30
    assert env_decimal("RC_VALUE", "10.00") == Decimal("10.00")
    for raw, expected in [("yes", True), ("ON", True), ("1", True), ("off", False), ("0", False)]:
        monkeypatch.setenv("RC_VALUE", raw)
        assert env_bool("RC_VALUE", not expected) is expected
    monkeypatch.setenv("RC_VALUE", "45")
    assert env_int("RC_VALUE", 30, minimum=1) == 45
    monkeypatch.setenv("RC_VALUE", "0.5")
    assert env_float("RC_VALUE", 2.0) == 0.5
    monkeypatch.setenv("RC_VALUE", "12.50")
    assert env_decimal("RC_VALUE", "10.00") == Decimal("12.50")
    monkeypatch.setenv("RC_VALUE", " a.example, b.example ,,")
    assert env_list("RC_VALUE") == ["a.example", "b.example"]


def test_it_runs_on_sqlite_and_the_embedded_broker_when_nothing_is_set(load_settings, tmp_path):
    settings = load_settings()
    var = tmp_path / "var"

    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings.DATABASES["default"]["NAME"] == var / "db.sqlite3"
    assert settings.IS_POSTGRES is False
    assert settings.CELERY_BROKER_URL.startswith("runcrate-fs://")
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    assert options["data_folder_in"] == options["data_folder_out"] == str(var / "broker" / "queue")
    # kombu creates none of its folders; the control folder would otherwise land in the cwd.
    for key, folder in [
        ("data_folder_in", "queue"),
        ("processed_folder", "processed"),
        ("control_folder", "control"),
    ]:
        assert options[key] == str(var / "broker" / folder)
        assert (var / "broker" / folder).is_dir()
    assert settings.CELERY_WORKER_ENABLE_REMOTE_CONTROL is False
    assert settings.CACHES["default"]["BACKEND"].endswith("FileBasedCache")
    assert settings.EMAIL_BACKEND == "django.core.mail.backends.filebased.EmailBackend"
    mail_folder = settings.EMAIL_FILE_PATH
    assert mail_folder == var / "mail"


def test_it_uses_postgresql_and_redis_when_their_urls_are_set(load_settings):
    settings = load_settings(
        DATABASE_URL="postgres://runcrate:secret@db.internal:5432/runcrate",
        REDIS_URL="redis://cache.internal:6379/2",
    )

    database = settings.DATABASES["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["NAME"], database["USER"]) == (
        "db.internal",
        "runcrate",
        "runcrate",
    )
    assert settings.IS_POSTGRES is True
    assert settings.CELERY_BROKER_URL == "redis://cache.internal:6379/2"
    assert settings.CELERY_WORKER_ENABLE_REMOTE_CONTROL is True
    # The cache on the next database: its clear() never flushes queued tasks.
    assert settings.CACHES["default"]["LOCATION"] == "redis://cache.internal:6379/3"
    assert settings.CACHES["default"]["BACKEND"] == "runcrate.cache.ForgivingRedisCache"
    # A visibility timeout longer than any work may run: a dead worker's message comes back
    # only when its work cannot still be running.
    from clusters.lifecycle.rules import LONGEST_WORK_SECONDS

    timeout = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert timeout > LONGEST_WORK_SECONDS
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST


def test_the_cache_can_have_a_redis_of_its_own_and_a_bad_redis_url_is_refused(load_settings):
    own = load_settings(
        REDIS_URL="redis://broker.internal:6379", REDIS_CACHE_URL="redis://cache.internal:6379/5"
    )
    assert own.CELERY_BROKER_URL == "redis://broker.internal:6379"
    assert own.CACHES["default"]["LOCATION"] == "redis://cache.internal:6379/5"
    assert load_settings(REDIS_URL="redis://h:6379", REDIS_CACHE_URL="").CACHES["default"][
        "LOCATION"
    ] == ("redis://h:6379/1")
    with pytest.raises(ImproperlyConfigured, match="must end in a database number"):
        load_settings(REDIS_URL="redis://h:6379/cache")


def test_it_applies_the_operator_settings_and_their_defaults(load_settings):
    defaults = load_settings()
    assert defaults.RUNCRATE_TICK_SECONDS == 2
    assert defaults.RUNCRATE_MIN_STEP_SECONDS == 30
    assert defaults.RUNCRATE_METER_SECONDS == 60
    assert defaults.RUNCRATE_SIM_SPEED == 1

    chosen = load_settings(
        RUNCRATE_TICK_SECONDS="0.5",
        RUNCRATE_MIN_STEP_SECONDS="5",
        RUNCRATE_METER_SECONDS="15",
        RUNCRATE_SIM_SPEED="30",
        RUNCRATE_SALES_EMAIL="deals@example.com",
        STRIPE_SECRET_KEY="sk_test_x",
        ANYMAIL_POSTMARK_SERVER_TOKEN="token",
    )
    assert chosen.RUNCRATE_TICK_SECONDS == 0.5
    assert chosen.RUNCRATE_MIN_STEP_SECONDS == 5
    assert chosen.RUNCRATE_METER_SECONDS == 15
    assert chosen.RUNCRATE_SIM_SPEED == 30
    assert chosen.RUNCRATE_SALES_EMAIL == "deals@example.com"
    assert chosen.STRIPE_SECRET_KEY == "sk_test_x"
    assert chosen.ANYMAIL == {"POSTMARK_SERVER_TOKEN": "token"}


def test_it_stops_at_start_up_on_a_bad_operator_setting(load_settings):
    with pytest.raises(ImproperlyConfigured, match="RUNCRATE_TICK_SECONDS must be a number"):
        load_settings(RUNCRATE_TICK_SECONDS="soon")
    with pytest.raises(ImproperlyConfigured, match="RUNCRATE_MIN_STEP_SECONDS must be at least 1"):
        load_settings(RUNCRATE_MIN_STEP_SECONDS="0")
    with pytest.raises(ImproperlyConfigured, match="DEBUG must be true or false"):
        load_settings(DEBUG="sometimes")


def test_it_keeps_one_generated_secret_key_private_to_its_owner(load_settings, tmp_path):
    first = load_settings().SECRET_KEY
    second = load_settings().SECRET_KEY

    key_file = tmp_path / "var" / "secret_key"
    assert first == second == key_file.read_text().strip()
    assert len(first) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert load_settings(SECRET_KEY="from-the-environment").SECRET_KEY == "from-the-environment"


def test_it_turns_on_the_security_settings_when_debug_is_off(load_settings):
    development = load_settings()
    assert development.DEBUG is True
    assert not getattr(development, "SESSION_COOKIE_SECURE", False)

    production = load_settings(DEBUG="false", SECRET_KEY="x" * 50)
    assert production.DEBUG is False
    assert production.SECURE_SSL_REDIRECT is True
    assert production.SESSION_COOKIE_SECURE is True
    assert production.CSRF_COOKIE_SECURE is True
    assert production.SECURE_HSTS_SECONDS == 31536000


def test_log_lines_carry_the_time_in_utc_the_level_and_the_logger(load_settings):
    import logging
    import logging.config
    import re

    settings = load_settings()
    logging.config.dictConfig(settings.LOGGING)
    formatter = logging.getLogger().handlers[0].formatter
    record = logging.LogRecord(
        "clusters.lifecycle", logging.WARNING, __file__, 1, "stuck", (), None
    )
    line = formatter.format(record)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING clusters\.lifecycle: stuck", line
    ), line


def test_errors_go_to_sentry_only_where_sentry_dsn_is_set(load_settings):
    import sentry_sdk

    load_settings()
    assert not getattr(sentry_sdk.get_client(), "dsn", None)
    try:
        # Nothing listens at 127.0.0.1:9, and nothing is sent unless an error is captured.
        load_settings(SENTRY_DSN="http://public@127.0.0.1:9/1", SENTRY_ENVIRONMENT="ci")
        client = sentry_sdk.get_client()
        assert client.dsn == "http://public@127.0.0.1:9/1"
        assert client.options["environment"] == "ci"
        assert not client.options.get("send_default_pii")  # no personal data
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init(dsn="")  # off again (not even from the environment)
    assert not sentry_sdk.get_client().dsn

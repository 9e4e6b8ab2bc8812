import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's many rounds cost about a second per user made by the fixtures; what these tests
    # check (which password logs in, which link resets it) does not depend on the hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

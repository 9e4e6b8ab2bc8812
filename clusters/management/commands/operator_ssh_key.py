"""`manage.py operator_ssh_key`: the public key every `ssh` host must authorise (SPEC §9).

The private key is RUNCRATE_SSH_KEY_FILE (default $RUNCRATE_VAR_DIR/ssh/id_ed25519), made on
first use; the public key is the last line printed, for scripts.
"""

from django.core.management.base import BaseCommand

from clusters.machines.session import operator_key_file, operator_public_key


class Command(BaseCommand):
    help = "Print the operator's SSH public key, for the authorized_keys of every ssh host."

    def handle(self, *args, **options) -> None:
        path = operator_key_file()
        self.stderr.write(f"Private key: {path} (keep it secret). Authorise this on every host:")
        self.stdout.write(operator_public_key())

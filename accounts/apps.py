from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        from accounts import keys, otp
        from accounts.models import ApiKey, Membership, Project, User

        # The API key cache forgets what changed (accounts/keys.py says why signals).
        post_save.connect(keys.forget_saved_key, sender=ApiKey)
        post_delete.connect(keys.forget_deleted_key, sender=ApiKey)
        post_save.connect(keys.forget_users_keys, sender=User)
        post_save.connect(keys.forget_projects_keys, sender=Project)
        post_save.connect(keys.forget_members_keys, sender=Membership)
        post_delete.connect(keys.forget_members_keys, sender=Membership)
        post_save.connect(otp.refresh_member, sender=Membership)
        post_delete.connect(otp.refresh_member, sender=Membership)

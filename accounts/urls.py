from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from accounts import two_factor_views, views
from accounts.forms import LoginForm, PasswordResetForm

app_name = "accounts"

urlpatterns = [
    path("", views.account, name="account"),
    path("signup/", views.signup, name="signup"),
    path(
        "login/",
        views.LoginView.as_view(
            template_name="accounts/login.html",
            authentication_form=LoginForm,
            redirect_authenticated_user=True,
        ),
        name="login",
    ),
    path("login/verify/", two_factor_views.verify, name="two_factor_verify"),
    path("security/", two_factor_views.security, name="security"),
    path("security/setup/", two_factor_views.setup, name="two_factor_setup"),
    path(
        "security/recovery-codes/",
        two_factor_views.recovery_codes,
        name="two_factor_recovery_codes",
    ),
    path("security/turn-off/", two_factor_views.turn_off, name="two_factor_turn_off"),
    path("security/require/", two_factor_views.require, name="two_factor_require"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password/",
        auth_views.PasswordChangeView.as_view(
            template_name="accounts/password_change.html",
            success_url=reverse_lazy("accounts:password_change_done"),
        ),
        name="password_change",
    ),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(
            template_name="accounts/password_change_done.html"
        ),
        name="password_change_done",
    ),
    path(
        "password-reset/",
        views.PasswordResetView.as_view(
            template_name="accounts/password_reset.html",
            form_class=PasswordResetForm,
            subject_template_name="emails/password-reset-subject.html",
            email_template_name="emails/password-reset-body-text.html",
            html_email_template_name="emails/password-reset-body-html.html",
            success_url=reverse_lazy("accounts:password_reset_sent"),
        ),
        name="password_reset",
    ),
    path(
        "password-reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="accounts/password_reset_sent.html"),
        name="password_reset_sent",
    ),
    path(
        "password-reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(
            template_name="accounts/password_reset_confirm.html",
            success_url=reverse_lazy("accounts:password_reset_complete"),
        ),
        name="password_reset_confirm",
    ),
    path(
        "password-reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(
            template_name="accounts/password_reset_complete.html"
        ),
        name="password_reset_complete",
    ),
    path("api-keys/", views.create_api_key, name="create_api_key"),
    path("api-keys/<int:pk>/revoke/", views.revoke_api_key, name="revoke_api_key"),
    path("ssh-keys/", views.ssh_keys, name="ssh_keys"),
    path("ssh-keys/add/", views.add_ssh_key, name="add_ssh_key"),
    path("ssh-keys/<int:pk>/remove/", views.remove_ssh_key, name="remove_ssh_key"),
    path("members/", views.team, name="members"),
    path("members/invite/", views.invite, name="invite"),
    path("members/<int:pk>/role/", views.change_role, name="change_role"),
    path("members/<int:pk>/remove/", views.remove_member, name="remove_member"),
    path("invitations/<int:pk>/revoke/", views.revoke_invitation, name="revoke_invitation"),
    path("invitations/<str:token>/", views.invitation, name="invitation"),
    path("project/", views.switch_project, name="switch_project"),
]

from django.urls import path

from clusters.web import logs_views, views

app_name = "clusters"

urlpatterns = [
    path("", views.cluster_list, name="list"),
    path("new/", views.cluster_new, name="new"),
    path("<int:pk>/", views.cluster_detail, name="detail"),
    path("<int:pk>/terminate/", views.cluster_terminate, name="terminate"),
    path("<int:pk>/retry-install/", views.cluster_retry_install, name="retry_install"),
    path("<int:pk>/workers/", views.cluster_add_workers, name="add_workers"),
    path("<int:pk>/nodes/<slug:node>/replace/", views.cluster_replace_node, name="replace_node"),
    path("<int:pk>/repair-policy/", views.cluster_repair_policy, name="repair_policy"),
    path("<int:pk>/network-test/", views.cluster_network_test, name="network_test"),
    path("<int:pk>/ssh-config", views.cluster_ssh_config, name="ssh_config"),
    path("<int:pk>/known-hosts", views.cluster_known_hosts, name="known_hosts"),
    path("<int:pk>/hostfile", views.cluster_hostfile, name="hostfile"),
    path("<int:pk>/kubeconfig", views.cluster_kubeconfig, name="kubeconfig"),
    # The Logs & jobs tab's own answers (clusters/web/logs_views.py).
    path("<int:pk>/logs/node/", logs_views.logs_node, name="logs_node"),
    path("<int:pk>/logs/fetch/", logs_views.logs_fetch, name="logs_fetch"),
    path("<int:pk>/logs/jobs/", logs_views.logs_jobs, name="logs_jobs"),
    path(
        "<int:pk>/logs/<slug:node>/<slug:kind>.txt",
        logs_views.logs_download,
        name="logs_download",
    ),
    # The cluster page's other tabs (clusters/web/views.py `TABS`), each its own URL: Connect,
    # Machines, Metrics, Logs & jobs, Events, Billing; an unknown tab is a 404.
    path("<int:pk>/<slug:tab>/", views.cluster_detail, name="tab"),
]

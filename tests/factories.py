"""factory_boy factories for the whole suite. Each builds a valid object with sensible data."""

from decimal import Decimal

import factory

from accounts.models import ApiKey, Environment, Membership, Project, User, hash_api_key
from offers.models import GpuModel, Host, Location, MachineType


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("email",)
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"user{n}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery")

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):  # noqa: N805
        if create:
            obj.save()


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"Project {n}")


class EnvironmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Environment

    project = factory.SubFactory(ProjectFactory)
    name = "default"


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.OWNER


def issue_key(*, user: User, project: Project, name: str = "test") -> str:
    raw = ApiKey.generate()
    ApiKey.objects.create(
        user=user, project=project, name=name, prefix=raw[:12], key_hash=hash_api_key(raw)
    )
    return raw


class GpuModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuModel
        django_get_or_create = ("slug",)

    slug = "h100-sxm"
    name = "H100 SXM 80GB"
    memory_gib = 80


class LocationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Location
        django_get_or_create = ("code",)

    code = factory.Sequence(lambda n: f"loc-{n}")
    name = factory.Sequence(lambda n: f"Location {n}")
    country = "US"
    capacity_reporting = Location.CapacityReporting.COUNT
    ssh_gateway = ""


class MachineTypeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MachineType
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"mt-{n}")
    location = factory.SubFactory(LocationFactory)
    gpu = factory.SubFactory(GpuModelFactory)
    gpus_per_machine = 8
    machine_kind = MachineType.Kind.VM
    interconnect = MachineType.Interconnect.ETHERNET
    community = False
    price_per_hour = Decimal("20.00")
    boot_seconds = 180
    slow_boot = False


class HostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Host

    name = factory.Sequence(lambda n: f"host-{n:05d}")
    machine_type = factory.SubFactory(MachineTypeFactory)
    driver = Host.Driver.SIMULATED
    state = Host.State.FREE


# ---- clusters: ClusterFactory, NodeFactory, EventFactory ------------------------------------
# A cluster is built without touching the lifecycle: `ClusterFactory(machines=True)` adds its
# `size` nodes, each holding a host of the cluster's machine type; `machines__step=...` and
# other `machines__` keywords set the nodes' fields.

from datetime import timedelta  # noqa: E402

from django.utils import timezone  # noqa: E402

from clusters.models import Cluster, Event, Node  # noqa: E402


def _default_environment(cluster) -> Environment:
    environment, _ = Environment.objects.get_or_create(project=cluster.project, name="default")
    return environment


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster
        skip_postgeneration_save = True

    project = factory.SubFactory(ProjectFactory)
    environment = factory.LazyAttribute(_default_environment)
    name = factory.Sequence(lambda n: f"cluster-{n}")
    machine_type = factory.SubFactory(MachineTypeFactory)
    size = 2
    software = Cluster.Software.NONE
    status = Cluster.Status.PROVISIONING
    authorized_keys = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests test@example.com"
    give_up_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=25))

    @factory.post_generation
    def machines(obj, create, extracted, **kwargs):  # noqa: N805
        if not (create and (extracted or kwargs)):
            return
        holds = obj.is_live
        for index in range(obj.size):
            NodeFactory(
                cluster=obj,
                index=index,
                host=HostFactory(
                    machine_type=obj.machine_type,
                    state=Host.State.IN_USE if holds else Host.State.FREE,
                ),
                holds_host=holds,
                **kwargs,
            )


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    index = factory.Sequence(lambda n: n)
    host = factory.SubFactory(
        HostFactory,
        machine_type=factory.SelfAttribute("..cluster.machine_type"),
        state=Host.State.IN_USE,
    )
    holds_host = True
    step = Node.Step.RUNNING
    step_deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=6))


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    cluster = factory.SubFactory(ClusterFactory)
    node = None
    reason = Event.Reason.CREATED
    message = "Cluster created."

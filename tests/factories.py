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

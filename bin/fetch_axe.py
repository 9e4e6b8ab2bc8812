"""Fetch axe-core for the browser tests' accessibility sweep (docs/accessibility.md), with
Python alone: the package's tarball from the npm registry, checked against the integrity hash
pinned in the Makefile, then its axe.min.js and licence unpacked into a folder of the venv.

Written here rather than `npm install` so that `make test` needs no Node.js: what it needs
from the package is one file, and the registry's tarball with its pinned sha512 is all npm
itself would check.

    python bin/fetch_axe.py --version 4.10.3 --integrity sha512-… --into .venv/axe
"""

import argparse
import base64
import hashlib
import io
import sys
import tarfile
from pathlib import Path

import httpx

REGISTRY = "https://registry.npmjs.org"
WANTED = ("package/axe.min.js", "package/LICENSE")


def fetch(version: str, integrity: str, into: Path) -> None:
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512" or not expected:
        sys.exit(f"fetch_axe: the integrity must read sha512-<base64>, not {integrity!r}")
    url = f"{REGISTRY}/axe-core/-/axe-core-{version}.tgz"
    response = httpx.get(url, timeout=60, follow_redirects=True)
    if response.status_code != 200:
        sys.exit(f"fetch_axe: {url} answered {response.status_code}")
    tarball = response.content
    actual = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if actual != expected:
        sys.exit(f"fetch_axe: {url} does not match the pinned integrity (got sha512-{actual})")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for name in WANTED:
            member = archive.extractfile(name)
            if member is None:
                sys.exit(f"fetch_axe: {url} has no {name}")
            (into / Path(name).name).write_bytes(member.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--integrity", required=True)
    parser.add_argument("--into", type=Path, required=True)
    args = parser.parse_args()
    fetch(args.version, args.integrity, args.into)


if __name__ == "__main__":
    main()

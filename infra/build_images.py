"""Build and push trace-rl's container images with the tags pinned in infra/images/kustomization.yaml.

That file is the only place an image tag is written. The Dockerfiles take their base images as
build arguments (no defaults), so `docker build` without this script fails instead of silently
using another tag. `load_images` is also what the pipeline uses to turn an image name into its
pinned reference.

    python infra/build_images.py --dry-run            # print the commands
    python infra/build_images.py --only trace-rl-cpu  # build one image
    python infra/build_images.py --push               # build all, then push them
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
IMAGES_FILE = REPO_ROOT / "infra" / "images" / "kustomization.yaml"

# A tag must name a version: `latest` and other moving tags are refused.
_MOVING_TAGS = {"latest", "stable", "main", "master", "nightly", "edge"}
_TAG_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ImageBuild:
    """How one of the project's images is built."""

    dockerfile: str  # path from the repository root; the build context is the repository root
    base_args: dict[str, str] = field(default_factory=dict)  # build argument -> images-file entry name


# Image name (an entry of the images file) -> its recipe.
BUILDS: dict[str, ImageBuild] = {
    "trace-rl-cpu": ImageBuild("infra/docker/Dockerfile.cpu", {"BASE_IMAGE": "python"}),
    "trace-rl-cuda": ImageBuild(
        "infra/docker/Dockerfile.cuda", {"BASE_IMAGE": "nvidia/cuda", "UV_IMAGE": "ghcr.io/astral-sh/uv"}
    ),
    "trace-rl-mlflow": ImageBuild("infra/docker/Dockerfile.mlflow", {"BASE_IMAGE": "python"}),
}


def load_images(path: Path = IMAGES_FILE) -> dict[str, str]:
    """Map each image name of the images file to its pinned reference `repository:tag`."""
    document = yaml.safe_load(Path(path).read_text())
    entries = document.get("images") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: must hold a non-empty `images:` list")
    refs: dict[str, str] = {}
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: every images entry needs a `name`, got {entry!r}")
        if name in refs:
            raise ValueError(f"{path}: image {name!r} is listed twice; each image is pinned once")
        if "digest" in entry:
            raise ValueError(f"{path}: image {name!r} uses `digest`; pin it with `newTag`")
        tag = str(entry.get("newTag", ""))
        if not _TAG_PATTERN.match(tag) or tag.lower() in _MOVING_TAGS or not re.search(r"\d", tag):
            raise ValueError(f"{path}: image {name!r} must have a versioned `newTag`, got {tag!r}")
        refs[name] = f"{entry.get('newName') or name}:{tag}"
    return refs


def build_commands(
    images: dict[str, str],
    only: list[str] | None = None,
    git_sha: str = "unknown",
    push: bool = False,
    engine: str = "docker",
) -> list[list[str]]:
    """The build (and push) command lines for the selected images, in BUILDS order."""
    selected = list(BUILDS) if not only else only
    unknown = [name for name in selected if name not in BUILDS]
    if unknown:
        raise ValueError(f"only: {unknown} are not built here; choose from {sorted(BUILDS)}")
    commands: list[list[str]] = []
    for name in selected:
        recipe = BUILDS[name]
        missing = [n for n in [name, *recipe.base_args.values()] if n not in images]
        if missing:
            raise ValueError(f"images: {missing} are not pinned in the images file")
        ref = images[name]
        command = [engine, "build", "-f", recipe.dockerfile, "-t", ref]
        build_args = {arg: images[entry] for arg, entry in recipe.base_args.items()}
        build_args |= {"IMAGE_REF": ref, "GIT_SHA": git_sha}
        for arg, value in build_args.items():
            command += ["--build-arg", f"{arg}={value}"]
        commands.append([*command, "."])
        if push:
            commands.append([engine, "push", ref])
    return commands


def _git_sha() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"images to build, of {sorted(BUILDS)}")
    parser.add_argument("--push", action="store_true", help="push each image after building it")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--engine", default="docker", help="docker-compatible CLI (docker, podman, nerdctl)")
    parser.add_argument("--images", type=Path, default=IMAGES_FILE, help="the images file")
    args = parser.parse_args(argv)
    commands = build_commands(load_images(args.images), args.only, _git_sha(), args.push, args.engine)
    for command in commands:
        print("+", shlex.join(command), flush=True)
        if not args.dry_run:
            subprocess.run(command, cwd=REPO_ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

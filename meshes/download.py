"""Download the standard public test models from their original addresses.

Usage::

    python meshes/download.py [--dest FOLDER] [--list] [NAME ...]

Without names every model is fetched. ``FOLDER`` defaults to
``$KDTREE_GPU_MESH_DIR`` (where ``kdtree_gpu.load_mesh`` looks bare names
up) or, when that is unset, ``meshes/downloads`` beside this script. Each
archive is downloaded once into ``FOLDER/archives``, its SHA-256 is checked
against the value pinned below, and the model file is extracted as
``FOLDER/<name><suffix>`` (PLY or OBJ, both read by ``load_mesh``).

Where no checksum is pinned yet (``None``), the script prints the SHA-256 it
computed so that it can be pinned here, instead of failing. A mismatch
against a pinned checksum is an error: the file is removed.

The models and their licenses are listed in ``meshes/README.md``. Only the
standard library is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Model:
    name: str  # output file stem
    url: str  # original address
    sha256: Optional[str]  # of the downloaded archive; None: not pinned yet
    member: Optional[str]  # file inside the archive (None: the download is the file)
    suffix: str  # ".ply" or ".obj"
    note: str = ""


# The checksums below could not be computed without downloading the archives;
# run the script once and pin the printed values.
MODELS = (
    Model("stanford_bunny", "http://graphics.stanford.edu/pub/3Dscanrep/bunny.tar.gz",
          None,  # not pinned yet
          "bunny/reconstruction/bun_zipper.ply", ".ply",
          "Stanford Bunny, full resolution (69,451 triangles)"),
    Model("stanford_dragon",
          "http://graphics.stanford.edu/pub/3Dscanrep/dragon/dragon_recon.tar.gz",
          None,  # not pinned yet
          "dragon_recon/dragon_vrip.ply", ".ply",
          "Stanford Dragon, full resolution (871,414 triangles)"),
    Model("stanford_armadillo",
          "http://graphics.stanford.edu/pub/3Dscanrep/armadillo/Armadillo.ply.gz",
          None,  # not pinned yet
          None, ".ply", "Stanford Armadillo (345,944 triangles), gzip-compressed PLY"),
    Model("happy_buddha", "http://graphics.stanford.edu/pub/3Dscanrep/happy/happy_recon.tar.gz",
          None,  # not pinned yet
          "happy_recon/happy_vrip.ply", ".ply",
          "Happy Buddha, full resolution (1,087,716 triangles)"),
    Model("sponza_dabrovic",
          "https://casual-effects.com/g3d/data10/research/model/dabrovic_sponza/sponza.zip",
          None,  # not pinned yet
          "sponza.obj", ".obj", "Dabrovic Sponza (McGuire Computer Graphics Archive)"),
    Model("sponza_crytek",
          "https://casual-effects.com/g3d/data10/common/model/crytek_sponza/sponza.zip",
          None,  # not pinned yet
          "sponza.obj", ".obj",
          "Crytek Sponza (McGuire Computer Graphics Archive, 262,267 triangles)"),
    Model("conference",
          "https://casual-effects.com/g3d/data10/research/model/conference/conference.zip",
          None,  # not pinned yet; address follows the archive's naming pattern
          "conference.obj", ".obj", "Conference room (McGuire Computer Graphics Archive)"),
)


def default_dest() -> Path:
    value = os.environ.get("KDTREE_GPU_MESH_DIR", "").strip()
    return Path(value) if value else Path(__file__).resolve().parent / "downloads"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(url: str, path: Path) -> None:
    """Fetch ``url`` into ``path`` through a temporary file (no partial files left)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, out, 1 << 20)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def extract(model: Model, archive: Path, target: Path) -> None:
    """Copy the model file out of the downloaded archive to ``target``."""
    name = archive.name
    if model.member is None:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(archive, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    elif name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as tar:
            src = tar.extractfile(model.member)
            if src is None:
                raise FileNotFoundError(f"{model.member} is not a file in {archive}")
            with src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    elif name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            member = next((m for m in z.namelist() if m == model.member
                           or m.endswith("/" + model.member)), None)
            if member is None:
                raise FileNotFoundError(f"{model.member} not found in {archive}")
            with z.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            # OBJ files need their MTL beside them for materials (geometry loads without)
            for m in z.namelist():
                if m.endswith(".mtl"):
                    with z.open(m) as src, open(target.parent / Path(m).name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
    else:
        raise ValueError(f"do not know how to unpack {archive}")


def fetch(model: Model, dest: Path) -> bool:
    """Download, verify and extract one model; True on success."""
    archive = dest / "archives" / (model.name + "__" + model.url.rsplit("/", 1)[-1])
    target = dest / (model.name + model.suffix)
    if target.exists():
        print(f"{model.name}: {target} already there")
        return True
    if not archive.exists():
        print(f"{model.name}: downloading {model.url}")
        try:
            download(model.url, archive)
        except Exception as exc:  # network errors, HTTP errors
            print(f"{model.name}: download failed ({type(exc).__name__}: {exc}); skipped")
            return False
    digest = sha256_of(archive)
    if model.sha256 is None:
        print(f"{model.name}: NOTE no checksum pinned for this archive; its sha256 is {digest} "
              f"(pin it in meshes/download.py after checking the file)")
    elif digest != model.sha256:
        print(f"{model.name}: checksum mismatch: expected {model.sha256}, got {digest}; "
              f"removing {archive}")
        archive.unlink()
        return False
    try:
        extract(model, archive, target)
    except Exception as exc:
        target.unlink(missing_ok=True)
        print(f"{model.name}: could not extract ({type(exc).__name__}: {exc})")
        return False
    print(f"{model.name}: wrote {target}")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="models to fetch (default: all)")
    parser.add_argument("--dest", type=Path, default=None,
                        help="output folder (default: $KDTREE_GPU_MESH_DIR or meshes/downloads)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MODELS}
    if args.list:
        for m in MODELS:
            pinned = m.sha256 or "not pinned"
            print(f"{m.name:20s} {m.note}\n{'':20s} {m.url}\n{'':20s} sha256: {pinned}")
        return 0
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    dest = args.dest or default_dest()
    chosen = [by_name[n] for n in args.names] if args.names else list(MODELS)
    ok = [fetch(m, dest) for m in chosen]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Write meshes/cornell_box.obj and meshes/cornell_box.mtl from kdtree_gpu.scenes.cornell_box().

Usage::

    python meshes/write_cornell_box.py [output_folder]

The OBJ has one group per material (``usemtl``), the triangles in the scene's
order within each group, and keeps the scene's vertex order. The MTL gives
each material its diffuse albedo (``Kd``) and emission (``Ke``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def obj_text(scene, mtl_name: str) -> str:
    """The OBJ file of a scene with materials, as text."""
    lines = ["# Cornell box of kdtree-gpu (kdtree_gpu.scenes.cornell_box)",
             "# room x in [-1, 1], y in [0, 2], z in [-1, 1], open toward +z",
             f"mtllib {mtl_name}"]
    lines += [f"v {x:.9g} {y:.9g} {z:.9g}" for x, y, z in scene.vertices.tolist()]
    for material, name in enumerate(scene.material_names):
        tris = np.flatnonzero(scene.tri_material == material)
        if tris.size == 0:
            continue
        lines += [f"g {name}", f"usemtl {name}"]
        lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in scene.faces[tris].tolist()]
    return "\n".join(lines) + "\n"


def mtl_text(scene) -> str:
    """The MTL file of a scene's material table, as text."""
    lines = ["# materials of the kdtree-gpu Cornell box: Kd albedo, Ke emission (linear RGB)"]
    used = set(np.unique(scene.tri_material).tolist())
    for material, name in enumerate(scene.material_names):
        if material not in used:
            continue
        kd = " ".join(f"{x:.6g}" for x in scene.material_albedo[material].tolist())
        ke = " ".join(f"{x:.6g}" for x in scene.material_emission[material].tolist())
        lines += ["", f"newmtl {name}", "Ka 0 0 0", f"Kd {kd}", "Ks 0 0 0", f"Ke {ke}", "illum 1"]
    return "\n".join(lines) + "\n"


def write_cornell_box(folder) -> tuple:
    """Write ``cornell_box.obj`` and ``cornell_box.mtl`` into ``folder``; return their paths."""
    from kdtree_gpu.scenes import cornell_box

    folder = Path(folder)
    scene = cornell_box()
    obj_path, mtl_path = folder / "cornell_box.obj", folder / "cornell_box.mtl"
    obj_path.write_text(obj_text(scene, mtl_path.name))
    mtl_path.write_text(mtl_text(scene))
    return obj_path, mtl_path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for path in write_cornell_box(out):
        print(f"wrote {path}")

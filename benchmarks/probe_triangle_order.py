"""Does the build's speed depend on the order of the mesh's triangles? One JSON line per
(mesh, order): warm ``kd.build`` ms from CuPy arrays (CUDA events, median of $REPS, default 9,
after two) and the rows of one profiled build that gather triangle data by triangle index
(classification, the subtree stage, the leaf packing, the traversal layout), with the tree's
size and SAH cost (the same tree under every order: the triangles are only renamed).

Orders: ``given`` (as loaded; ``bench_build.subdivide`` puts a face's four children m
triangles apart), ``children`` (a subdivided face's children side by side, as trimesh's
``subdivide`` writes them), ``morton`` (ascending Morton code of the triangles' centroids),
``shuffled`` (a random permutation, seed 0)::

    PYTHONPATH=. python benchmarks/probe_triangle_order.py stanford_armadillo@sub2 [orders...]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import kdtree_gpu as kd  # noqa: E402
from _common import kernels_ms  # noqa: E402
from bench_build import load  # noqa: E402


def morton_order(V, F):
    """The triangles' order by the 63-bit Morton code of their centroids (host, NumPy)."""
    c = V[F].mean(axis=1)
    lo, hi = c.min(axis=0), c.max(axis=0)
    q = ((c - lo) / np.maximum(hi - lo, 1e-30) * ((1 << 21) - 1)).astype(np.uint64)
    code = np.zeros(len(F), dtype=np.uint64)
    for bit in range(21):
        for axis in range(3):
            code |= ((q[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(code, kind="stable")


def children_order(m, levels):
    """``bench_build.subdivide``'s faces regrouped so that each face's four children are
    adjacent, level by level (trimesh's order): after L subdivisions of m0 faces the given
    index is k_L 4^(L-1) m0 + ... + k_1 m0 + i (child k_l at level l of face i), the
    regrouped one i 4^L + k_1 4^(L-1) + ... + k_L."""
    m0 = m // 4 ** levels
    shape = (4,) * levels + (m0,)
    return np.arange(m).reshape(shape).transpose(tuple(reversed(range(levels + 1)))).reshape(-1)


ROWS = ("classify_triangles", "small subtrees", "small subtrees: pack leaves", "traversal layout",
        "split_refs_and_events", "compute_split_costs: costs", "build_levels_grid",
        "create_root_events", "finish tree", "prepare_mesh: morton sort", "rename leaves")


def main():
    spec = sys.argv[1]
    orders = sys.argv[2:] or ["given", "children", "morton", "shuffled"]
    V, F = load(spec, os.environ["KDTREE_GPU_MESH_DIR"])
    levels = int(spec.partition("@sub")[2] or 0)
    reps = int(os.environ.get("REPS", 9))
    for order in orders:
        perm = {"given": lambda: np.arange(len(F)),
                "children": lambda: children_order(len(F), levels),
                "morton": lambda: morton_order(V, F),
                "shuffled": lambda: np.random.default_rng(0).permutation(len(F))}[order]()
        Vd, Fd = cupy.asarray(V), cupy.asarray(np.ascontiguousarray(F[perm]))
        for _ in range(2):
            kd.build(Vd, Fd)
        times = []
        for _ in range(reps):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            kd.build(Vd, Fd)
            b.record()
            b.synchronize()
            times.append(cupy.cuda.get_elapsed_time(a, b))
        tree = kd.build(Vd, Fd, profile=True)
        prof = tree.build_info["profile"]
        stats = tree.stats()
        print(json.dumps({"mesh": spec, "order": order, "ms": round(float(np.median(times)), 3),
                          "range": [round(min(times), 3), round(max(times), 3)],
                          "kernels_ms": round(kernels_ms(prof), 3),
                          "morton_order": tree.build_info.get("morton_order", False),
                          "peak_B_per_tri": round(tree.build_info["peak_device_bytes"] / len(F), 1),
                          **{k: round(prof.get(k, {}).get("total_ms", 0.0), 3) for k in ROWS},
                          **{k: stats[k] for k in ("nodes", "leaves", "sah_cost")}}),
              flush=True)
        del tree, Vd, Fd
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()

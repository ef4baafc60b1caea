"""Wald & Havran (2006) O(N log N) SAH kd-tree builder: the reference.

This package is the oracle for the GPU builder and the CPU baseline in the
benchmarks. It never imports CuPy.

Use
===
``build(vertices, faces, config=None, *, threads=None, progress=None)``
returns a :class:`kdtree_gpu.KdTree`. Subtrees are built on ``threads``
threads (default: every core this process may use); the arrays are the same
for every thread count. ``progress(fraction)`` is called with 0.0, then at
most every 0.2 s with the share finished, then 1.0. ``warm_up()`` compiles
the numba code, or loads it from numba's cache, and returns ``(seconds,
compiled)``; ``build`` calls it, and the first compilation on a machine
prints one line on stderr.

Modules: :mod:`.wald_havran` (``build``), :mod:`.tasks` (threads, stitching),
:mod:`.subtree` (the compiled depth-first kernel), :mod:`.sweep` (best plane),
:mod:`.split` (classification, event splicing), :mod:`.events`, :mod:`.clip`,
:mod:`.warmup`, and :mod:`.naive`, the slow second oracle.

The build rules
===============
Every builder in the project (this one, the naive one in
:mod:`cpu_reference.naive`, and the level-by-level pipeline in
:mod:`kdtree_gpu.builder`) follows these rules, so that under the same
:class:`kdtree_gpu.SAHConfig` they make the same tree.

R1  Input. ``kdtree_gpu.mesh.prepare_mesh`` validates the mesh. Zero-area
    triangles are left out. The root box is the union of the boxes of the
    remaining triangles; the root has depth 0.

R2  Triangle boxes. Without clipping a triangle's box is its float32 AABB, the
    same in every node. With ``clip=True`` it is the box of the triangle
    clipped to the node's box (R9).

R3  Events, per axis k, from a triangle box ``[a, b]`` on k: ``a == b`` gives
    one PLANAR event at ``a``; otherwise an END event at ``b`` and a START
    event at ``a``. Events are ordered by (position, kind, triangle) with
    END < PLANAR < START. They are sorted once at the root; children receive
    their events in the parent's order (no re-sort), which keeps this order.

R4  Leaf tests before any split search: ``N <= leaf_size`` or
    ``depth >= max_depth`` (``SAHConfig.resolved_max_depth(N_root)`` with
    ``N_root`` the number of non-degenerate triangles).

R5  Candidate planes. Axes: all three, or with ``axes="longest"`` only the
    axis of the largest node extent (lowest index on ties). An axis whose
    node extent is 0 has no candidates. On axis k, every distinct event
    position ``p`` with ``lo[k] < p < hi[k]`` (strictly inside the node box)
    is a candidate.

R6  Counts at a candidate ``p`` on axis k, over the node's N triangles:
    ``N_L`` = non-planar triangles with ``a < p`` + planar ones with
    ``a < p``; ``N_R`` = non-planar with ``b > p`` + planar with ``a > p``;
    ``N_P`` = planar with ``a == p``. (The sweep gets these as
    ``N_R -= p- + p|`` before and ``N_L += p+ + p|`` after the plane.)

R7  Cost (``kdtree_gpu.config.split_cost``, float64): child boxes are the node
    box with ``hi[k] = p`` (left) and ``lo[k] = p`` (right). The planar
    triangles are tried on each side: ``C_left = cost(N_L + N_P, N_R)``,
    ``C_right = cost(N_L, N_R + N_P)``. If ``C_left <= C_right`` the plane's
    cost is ``C_left`` and p_side = LEFT, else ``C_right`` and RIGHT.

R8  Best plane: the lowest cost; ties go to the lowest axis, then the lowest
    position. The node becomes a leaf when there is no candidate or when the
    best cost is not below ``K_I * N`` (``leaf_cost``). Otherwise it splits.

R9  Classification for a split (k, p, side): planar at p goes to ``side``;
    otherwise ``b <= p`` goes left only, ``a >= p`` right only, anything else
    both. Without clipping, both children get the triangle's events unchanged.
    With clipping, a "both" triangle is clipped (float64 Sutherland-Hodgman,
    :func:`cpu_reference.clip.clip_triangle_box`) to each child's box; its new
    box is the clipped polygon's box rounded outward to float32 and intersected with
    its previous box and the child's box (if the polygon comes out empty
    through rounding, the previous box intersected with the child's box);
    its new events are sorted and merged with the other triangles' events.
    Rounding to float32 is outward (lower bounds toward -inf, upper bounds
    toward +inf), so a clipped box never loses part of the triangle.

R10 Output. A split appends two adjacent nodes (left, right) and records
    ``(axis, p)``. A leaf records its triangles in ascending index order.
    Node order otherwise is free: trees are compared from the root down
    (``KdTree.compare``).
"""

from .wald_havran import build, warm_up
from kdtree_gpu.warmup import WarmUp

__all__ = ["build", "warm_up", "WarmUp"]

"""Build settings and the SAH cost model, written once for every CPU builder.

The cost of splitting a node ``V`` with a plane into ``V_L`` and ``V_R``
(Wald & Havran 2006, section 3.2, "the SAH with empty-space bonus") is::

    C(p) = lambda(p) * (K_T + K_I * (SA(V_L) * N_L + SA(V_R) * N_R) / SA(V))

with ``lambda(p) = empty_bonus`` when ``N_L == 0`` or ``N_R == 0`` and 1
otherwise. A node stays a leaf when the best cost is not below ``K_I * N``.

The arithmetic is float64 and its order is fixed, so that the NumPy, numba and
CUDA versions round identically and choose the same plane: :func:`split_cost`
here is compiled by numba in ``cpu_reference``, the vectorised NumPy twin in
the level pipeline evaluates the same expression element-wise
(:func:`split_cost_xp`), and
``kdtree_gpu/cuda/sah.cuh`` repeats it with round-to-nearest intrinsics (no
fused multiply-add). A test checks that they agree.

``SA`` is the half surface area ``dx*dy + dy*dz + dz*dx`` (the factor 2 cancels
in the ratio), computed from float32 box bounds converted to float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .encoding import MAX_DEPTH_CAP

# Wald & Havran 2006, section 5 ("we use K_T = 15, K_I = 20 and lambda = 0.8").
DEFAULT_K_TRAVERSAL = 15.0
DEFAULT_K_INTERSECT = 20.0
DEFAULT_EMPTY_BONUS = 0.8
# pbrt-v3/v4 KdTreeAggregate: maxDepth = round(8 + 1.3 * log2(N)); capped at
# encoding.MAX_DEPTH_CAP so that the traversal stack has a fixed upper bound.
AXES_CHOICES = ("all", "longest")


@dataclasses.dataclass(frozen=True)
class SAHConfig:
    """Settings of a full-SAH kd-tree build.

    Parameters
    ----------
    k_traversal : float
        Cost of one traversal step, K_T. Default 15 (Wald & Havran 2006, §5).
    k_intersect : float
        Cost of one ray-triangle test, K_I. Default 20 (Wald & Havran 2006, §5).
    empty_bonus : float
        lambda in (0, 1]: factor applied to the whole split cost when one child
        is empty, favouring planes that cut off empty space. Default 0.8
        (Wald & Havran 2006, §3.2 and §5). 1 disables the bonus.
    leaf_size : int
        A node with ``N <= leaf_size`` triangles becomes a leaf without
        evaluating splits. Default 0: the cost model alone decides, as in
        Wald & Havran (a single triangle may still be split off from empty
        space when that lowers the cost).
    max_depth : int or None
        Nodes at this depth (root = 0) become leaves. ``None`` (default) means
        ``round(8 + 1.3 * log2(N))`` for N non-degenerate triangles, as in
        pbrt, capped at :data:`MAX_DEPTH_CAP`.
    axes : {"all", "longest"}
        ``"all"`` evaluates candidate planes on the three axes (Wald & Havran);
        ``"longest"`` only on the node's longest axis (lowest index on ties),
        as in the GPU method of the GAPT part 11 post.
    clip : bool
        Perfect splits (Wald & Havran §4.3): triangles straddling a split are
        clipped to each child's box and their events recomputed. Default off.
    """

    k_traversal: float = DEFAULT_K_TRAVERSAL
    k_intersect: float = DEFAULT_K_INTERSECT
    empty_bonus: float = DEFAULT_EMPTY_BONUS
    leaf_size: int = 0
    max_depth: Optional[int] = None
    axes: str = "all"
    clip: bool = False

    def __post_init__(self):
        for name in ("k_traversal", "k_intersect"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"SAHConfig.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"SAHConfig.{name} must be finite and > 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        eb = self.empty_bonus
        if not isinstance(eb, (int, float)) or isinstance(eb, bool) or not (0.0 < eb <= 1.0):
            raise ValueError(f"SAHConfig.empty_bonus must be in (0, 1], got {eb!r}")
        object.__setattr__(self, "empty_bonus", float(eb))
        if not _is_int(self.leaf_size) or self.leaf_size < 0:
            raise ValueError(f"SAHConfig.leaf_size must be an integer >= 0, got {self.leaf_size!r}")
        object.__setattr__(self, "leaf_size", int(self.leaf_size))
        if self.max_depth is not None:
            if not _is_int(self.max_depth) or not (0 <= self.max_depth <= MAX_DEPTH_CAP):
                raise ValueError(
                    f"SAHConfig.max_depth must be None or an integer in [0, {MAX_DEPTH_CAP}], "
                    f"got {self.max_depth!r}"
                )
            object.__setattr__(self, "max_depth", int(self.max_depth))
        if self.axes not in AXES_CHOICES:
            raise ValueError(f"SAHConfig.axes must be one of {AXES_CHOICES}, got {self.axes!r}")
        if not isinstance(self.clip, bool):
            raise TypeError(f"SAHConfig.clip must be a bool, got {self.clip!r}")

    def resolved_max_depth(self, num_triangles: int) -> int:
        """Maximum depth used for a mesh of ``num_triangles`` non-degenerate triangles."""
        if self.max_depth is not None:
            return self.max_depth
        n = max(int(num_triangles), 1)
        return min(MAX_DEPTH_CAP, int(round(8 + 1.3 * math.log2(n))))

    def to_dict(self) -> dict:
        """Plain-dict form (for tree files and JSON output)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SAHConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown SAHConfig fields: {sorted(unknown)}")
        return cls(**data)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or (
        hasattr(value, "dtype") and getattr(value, "dtype").kind in "iu"
    )


def box_half_area(dx, dy, dz):
    """Half surface area of a box with extents ``dx, dy, dz`` (float64).

    The evaluation order ``(dx*dy + dy*dz) + dz*dx`` is part of the cost model.
    Works on scalars and on NumPy arrays.
    """
    return (dx * dy + dy * dz) + dz * dx


def split_cost(k_traversal, k_intersect, empty_bonus, area_left, area_right, area_node,
               n_left, n_right):
    """SAH cost of one candidate split (float64, fixed evaluation order).

    Parameters
    ----------
    k_traversal, k_intersect, empty_bonus : float
        From :class:`SAHConfig`.
    area_left, area_right, area_node : float
        Half surface areas of the two children and of the node.
    n_left, n_right : int
        Triangles counted on each side (planar triangles on their chosen side).

    Returns
    -------
    float
        ``lambda * (K_T + K_I * (A_L * N_L + A_R * N_R) / A)``.
    """
    cost = k_traversal + k_intersect * ((area_left * float(n_left) + area_right * float(n_right))
                                        / area_node)
    if n_left == 0 or n_right == 0:
        cost = cost * empty_bonus
    return cost


def split_cost_xp(xp, cfg, area_left, area_right, area_node, n_left, n_right):
    """:func:`split_cost` element-wise on ``xp`` arrays: same operations, same order.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    cfg : SAHConfig
    area_left, area_right, area_node : (k,) float64
    n_left, n_right : (k,) float64
    """
    cost = cfg.k_traversal + cfg.k_intersect * ((area_left * n_left + area_right * n_right)
                                                / area_node)
    empty = (n_left == 0) | (n_right == 0)
    return xp.where(empty, cost * cfg.empty_bonus, cost)


def leaf_cost(k_intersect, n):
    """Cost of keeping ``n`` triangles in a leaf: ``K_I * n`` (float64)."""
    return k_intersect * float(n)

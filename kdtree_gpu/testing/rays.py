"""Random test rays and the comparison of two ray answers: one oracle check.

``kdtree-gpu verify`` and ``demo``, the tests (``tests/kdtree_gpu/trace``)
and the benchmark checks (``benchmarks/gpu_traversal_check.py``) make their
rays with :func:`random_rays` and judge answers with :func:`compare_hits`, so
every check casts the same kind of rays and applies the same tolerance. The
module sits in the package, as ``numpy.testing`` and ``cupy.testing`` do,
because a command of the package (``verify``) uses it.

Everything scales with the scene: ray origins, targets and intervals are
fractions of the box given, and distances are compared relatively, so a
mesh scaled by 1e-9 or 1e15 is tested exactly as it is at size 1.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Union

import numpy as np

from ..arrays import to_numpy

# relative tolerance on the hit distance t: two answers agree on a ray when
# their t differ by at most HIT_RTOL * |t|; two triangles hit at such equal
# distances are a tie (a ray through a shared edge or vertex)
HIT_RTOL = 1e-5

# a flat box (a planar mesh) is widened to this share of its diagonal on its
# flat axes, so that ray origins still spread around the plane
MIN_EXTENT_SHARE = 1e-2

__all__ = ["HIT_RTOL", "HitComparison", "Rays", "assert_same_hits", "compare_hits",
           "random_rays"]


class Rays(NamedTuple):
    """A set of rays (unpacks as ``origins, directions, tmin, tmax``).

    Attributes
    ----------
    origins, directions : (num_rays, 3) float32
    tmin, tmax : (num_rays,) float32
        ``0`` and ``inf`` except for the rays given an interval.
    """

    origins: np.ndarray
    directions: np.ndarray
    tmin: np.ndarray
    tmax: np.ndarray


def random_rays(bounds, num_rays: int, seed: Union[int, np.random.Generator] = 0, *,
                special: float = 0.0, intervals: float = 0.0, unit: bool = True) -> Rays:
    """Random rays in and around a box, most of them hitting what fills it.

    Half the rays start at uniform points of the box and go in uniform
    directions (they enter the traversal at inner nodes); the other half
    start on the sphere of one box diagonal around its center (outside the
    box) and aim at uniform points of the box.

    Parameters
    ----------
    bounds : (2, 3) array_like of float
        The box (a mesh's or a tree's ``bounds``). A flat axis is widened to
        ``MIN_EXTENT_SHARE`` of the diagonal.
    num_rays : int
    seed : int or numpy.random.Generator
    special : float
        Share of the rays, in ``[0, 1]``, given the directions traversal
        code gets wrong: a third along an axis (``+-e_k``), a third with one
        zero component, a third with ``-0.0`` components.
    intervals : float
        Share of the rays, in ``[0, 1]``, given a random finite
        ``[tmin, tmax]``: ``tmin`` up to 0.6 and the length up to 0.8 box
        diagonals (in units of each ray's direction length).
    unit : bool
        Unit-length directions; otherwise lengths are uniform in
        ``[0.5, 2]`` (``t`` is measured in direction lengths).

    Returns
    -------
    Rays
        ``origins, directions`` : (num_rays, 3) float32;
        ``tmin, tmax`` : (num_rays,) float32.

    Raises
    ------
    ValueError
        ``bounds`` not a finite box of positive size, or a share outside [0, 1].
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    box = np.asarray(bounds, dtype=np.float64).reshape(2, 3)
    lo, hi = box
    diagonal = float(np.linalg.norm(hi - lo))
    if not (np.all(np.isfinite(box)) and np.all(hi >= lo) and diagonal > 0):
        raise ValueError(f"bounds must be a finite box of positive size, got {box.tolist()}")
    for name, share in (("special", special), ("intervals", intervals)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be a share in [0, 1], got {share!r}")
    extent = np.maximum(hi - lo, MIN_EXTENT_SHARE * diagonal)
    center = 0.5 * (lo + hi)
    corner = center - 0.5 * extent
    num_inside = num_rays // 2
    num_aimed = num_rays - num_inside

    def unit_vectors(n):
        v = rng.normal(size=(n, 3))
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-300)

    inside_origins = corner + rng.random((num_inside, 3)) * extent
    inside_directions = unit_vectors(num_inside)
    aimed_origins = center + diagonal * unit_vectors(num_aimed)
    targets = corner + rng.random((num_aimed, 3)) * extent
    aimed_directions = targets - aimed_origins
    aimed_directions /= np.linalg.norm(aimed_directions, axis=1, keepdims=True)
    origins = np.concatenate([inside_origins, aimed_origins])
    directions = np.concatenate([inside_directions, aimed_directions])
    num_special = int(round(special * num_rays))
    if num_special:
        _make_special(directions, num_special, rng)
        # zeroed components shortened some directions (-0.0 keeps its sign here)
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    if not unit:
        directions *= rng.uniform(0.5, 2.0, (num_rays, 1))
    tmin = np.zeros(num_rays)
    tmax = np.full(num_rays, np.inf)
    num_intervals = int(round(intervals * num_rays))
    if num_intervals:
        # spread over both halves, so that inside and aimed rays both get intervals
        picked = rng.choice(num_rays, size=num_intervals, replace=False)
        scale = diagonal / np.linalg.norm(directions[picked], axis=1)
        tmin[picked] = rng.uniform(0.0, 0.6, num_intervals) * scale
        tmax[picked] = tmin[picked] + rng.uniform(0.0, 0.8, num_intervals) * scale
    return Rays(origins.astype(np.float32), directions.astype(np.float32),
                tmin.astype(np.float32), tmax.astype(np.float32))


def _make_special(directions, count, rng) -> None:
    # random rays of both halves alike, a third of them of each kind
    picked = rng.choice(directions.shape[0], size=count, replace=False)
    axis_aligned, one_zero, negative_zero = picked[0::3], picked[1::3], picked[2::3]
    axes = rng.integers(0, 3, axis_aligned.size)
    directions[axis_aligned] = np.eye(3)[axes] * rng.choice([-1.0, 1.0], (axis_aligned.size, 1))
    directions[one_zero, rng.integers(0, 3, one_zero.size)] = 0.0
    zeroed = rng.random((negative_zero.size, 3)) < 0.5
    zeroed[zeroed.all(axis=1), 0] = False  # keep a non-zero component
    rows = directions[negative_zero]
    rows[zeroed] = -0.0
    directions[negative_zero] = rows


@dataclasses.dataclass(frozen=True, eq=False)
class HitComparison:
    """How two closest-hit answers for the same rays compare.

    A ray agrees when both answers miss, or both hit at distances within
    ``rtol`` (relative to the expected one). Different triangles at such
    distances are a tie and agree. A ray for which either answer breaks the
    conventions (a miss has ``tri = -1``, ``t = inf`` and ``u = v = 0``; a
    hit a finite ``t``) disagrees.

    Attributes
    ----------
    num_rays : int
    num_hits : int
        Rays the expected answer hits.
    malformed : (num_rays,) bool
        An answer breaks the conventions (say, a hit at ``t = inf``).
    hit_miss : (num_rays,) bool
        One answer hits, the other misses (well-formed answers).
    distance : (num_rays,) bool
        Both hit, at distances beyond ``rtol``.
    surface : (num_rays,) bool
        Both hit the same triangle, but at different ``t``, ``u`` or ``v``
        (bit for bit with ``exact``, else beyond ``rtol``; ``u`` and ``v``
        only when both answers have them).
    tie : (num_rays,) bool
        Both hit, different triangles, distances within ``rtol`` (agrees).
    labels : (str, str)
        Names of the two answers, for :meth:`describe`.
    """

    num_rays: int
    num_hits: int
    malformed: np.ndarray
    hit_miss: np.ndarray
    distance: np.ndarray
    surface: np.ndarray
    tie: np.ndarray
    labels: tuple
    _answers: tuple = dataclasses.field(repr=False)

    @property
    def bad(self) -> np.ndarray:
        """(num_rays,) bool: the rays that disagree."""
        return self.malformed | self.hit_miss | self.distance | self.surface

    @property
    def ok(self) -> bool:
        """Whether every ray agrees."""
        return not self.bad.any()

    @property
    def num_ties(self) -> int:
        return int(self.tie.sum())

    def describe(self) -> Optional[str]:
        """One line naming the disagreements and the first bad ray, or ``None``."""
        bad = self.bad
        if not bad.any():
            return None
        first = int(np.argmax(bad))
        (t_a, tri_a), (t_b, tri_b) = self._answers
        name_a, name_b = self.labels
        return (f"{int(bad.sum())} of {self.num_rays} rays disagree with {name_b} "
                f"({int(self.malformed.sum())} malformed, {int(self.hit_miss.sum())} hit/miss, "
                f"{int(self.distance.sum())} distance, {int(self.surface.sum())} surface point); "
                f"first: ray {first}, "
                f"{name_a} t={float(t_a[first])!r} tri={int(tri_a[first])}, "
                f"{name_b} t={float(t_b[first])!r} tri={int(tri_b[first])}")


def compare_hits(result, expected, rtol: float = HIT_RTOL, exact: bool = False,
                 labels=("tree", "brute force")) -> HitComparison:
    """Compare two closest-hit answers for the same rays.

    Parameters
    ----------
    result, expected : tuple
        ``(t, tri)`` or ``(t, tri, u, v)`` as :meth:`KdTree.intersect`
        returns them (NumPy, CuPy or PyTorch): ``t`` (num_rays,) float
        (``inf`` on a miss), ``tri`` (num_rays,) int (``-1`` on a miss).
    rtol : float
        Relative tolerance on ``t`` (default :data:`HIT_RTOL`).
    exact : bool
        Where both name the same triangle, ``t``, ``u`` and ``v`` must be
        equal bit for bit (two runs of the same ray-triangle test).
    labels : (str, str)
        Names of ``result`` and ``expected`` in :meth:`HitComparison.describe`.

    Returns
    -------
    HitComparison
    """
    a = [to_numpy(x) for x in result]
    b = [to_numpy(x) for x in expected]
    t_a, t_b = np.asarray(a[0], np.float64), np.asarray(b[0], np.float64)
    tri_a, tri_b = np.asarray(a[1]), np.asarray(b[1])
    if not (t_a.shape == t_b.shape == tri_a.shape == tri_b.shape) or t_a.ndim != 1:
        raise ValueError(f"answers must be (num_rays,) arrays of one length, got t "
                         f"{t_a.shape} and {t_b.shape}, tri {tri_a.shape} and {tri_b.shape}")
    has_uv = len(a) >= 4 and len(b) >= 4
    hit_a, hit_b = tri_a >= 0, tri_b >= 0
    malformed = np.zeros(t_a.shape, bool)
    for t, tri, hit, answer in ((t_a, tri_a, hit_a, a), (t_b, tri_b, hit_b, b)):
        malformed |= hit & ~np.isfinite(t)
        malformed |= ~hit & ((t != np.inf) | (tri != -1))
        if has_uv:
            malformed |= ~hit & ((np.asarray(answer[2]) != 0) | (np.asarray(answer[3]) != 0))
    both = hit_a & hit_b & ~malformed
    with np.errstate(invalid="ignore"):  # inf - inf where a side misses
        close = np.abs(t_a - t_b) <= rtol * np.abs(t_b)
    distance = both & ~close
    same = both & (tri_a == tri_b)
    if exact:
        surface = same & (t_a != t_b)
    else:
        surface = same & ~close
    if has_uv:
        u_a, v_a = (np.asarray(x, np.float64) for x in a[2:4])
        u_b, v_b = (np.asarray(x, np.float64) for x in b[2:4])
        if exact:
            surface |= same & ((u_a != u_b) | (v_a != v_b))
        else:
            # barycentrics lie in [0, 1]: rtol serves as an absolute tolerance
            surface |= same & ((np.abs(u_a - u_b) > rtol) | (np.abs(v_a - v_b) > rtol))
    return HitComparison(
        num_rays=int(t_a.size), num_hits=int(hit_b.sum()), malformed=malformed,
        hit_miss=(hit_a != hit_b) & ~malformed, distance=distance, surface=surface & ~distance,
        tie=both & close & (tri_a != tri_b), labels=tuple(labels),
        _answers=((t_a, tri_a), (t_b, tri_b)))


def assert_same_hits(result, expected, rtol: float = HIT_RTOL, exact: bool = False,
                     labels=("result", "expected")) -> HitComparison:
    """:func:`compare_hits`, raising ``AssertionError`` with its description on a disagreement.

    Returns
    -------
    HitComparison
        For further checks (``num_hits``, ``num_ties``).
    """
    comparison = compare_hits(result, expected, rtol=rtol, exact=exact, labels=labels)
    if not comparison.ok:
        raise AssertionError(comparison.describe())
    return comparison

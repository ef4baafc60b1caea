"""Random numbers and the sampling arithmetic shared by the stages.

Random numbers are counter-based: each path has a key hashed from (seed,
sample index, pixel); the number for dimension ``dim`` at depth ``depth`` is
a PCG hash of the key plus a per-(depth, dim) salt. NumPy here and CUDA in
``cuda/render.cu`` (``kd_pcg``, ``kd_uniform``) compute the same bits, so the
same path makes the same choices on both backends until floating-point
rounding sends it elsewhere, and an image does not depend on how samples are
batched into passes.
"""

from __future__ import annotations

import numpy as np

from ..encoding import INV_PI  # noqa: F401  (float32 1/pi, the kernels' KD_INV_PI)

# Random-number dimensions within one depth (16 slots per depth).
DIMS_PER_DEPTH = 16
DIM_PIXEL_X, DIM_PIXEL_Y = 0, 1
DIM_LIGHT_SELECT, DIM_LIGHT_U, DIM_LIGHT_V = 2, 3, 4
DIM_BSDF_PHI, DIM_BSDF_R = 5, 6
DIM_ROULETTE = 7

_U32 = 0xFFFFFFFF


def pcg_hash_scalar(x: int) -> int:
    """PCG-RXS-M-XS 32-bit hash of a host integer (Jarzynski & Olano 2020)."""
    state = (x * 747796405 + 2891336453) & _U32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _U32
    return ((word >> 22) ^ word) & _U32


def pcg_hash(xp, x):
    """:func:`pcg_hash_scalar` element-wise on a uint32 array (wrapping arithmetic)."""
    x = x.astype(np.uint32, copy=False)
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def seed_hash(seed: int) -> np.uint32:
    """``pcg(seed)``: the first step of every path key (the camera kernel takes it)."""
    return np.uint32(pcg_hash_scalar(int(seed) & _U32))


def stream_salt(depth: int, dim: int) -> np.uint32:
    """Salt of random dimension ``dim`` at path depth ``depth``."""
    return np.uint32(pcg_hash_scalar((depth * DIMS_PER_DEPTH + dim) & _U32))


def uniform_from_key(xp, key, salt):
    """(n,) float32 in [0, 1): 24 high bits of ``pcg_hash(key + salt)``."""
    h = pcg_hash(xp, key + np.uint32(salt))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def path_keys(xp, seed: int, sample, pixel):
    """Key of each path: ``pcg(pcg(pcg(seed) + sample) + pixel)`` (uint32)."""
    sample_hash = pcg_hash(xp, sample.astype(np.uint32) + seed_hash(seed))
    return pcg_hash(xp, sample_hash + pixel.astype(np.uint32))


def orthonormal_basis(xp, normal):
    """Tangent and bitangent of unit normals (Duff et al. 2017, branchless).

    Parameters
    ----------
    normal : (k, 3) float32

    Returns
    -------
    tangent, bitangent : (k, 3) float32
    """
    one = np.float32(1)
    nx, ny, nz = normal[:, 0], normal[:, 1], normal[:, 2]
    sign = xp.where(nz >= 0, one, np.float32(-1))
    a = np.float32(-1) / (sign + nz)
    b = nx * ny * a
    tangent = xp.stack([one + sign * nx * nx * a, sign * b, -sign * nx], axis=1)
    bitangent = xp.stack([b, sign + ny * ny * a, -ny], axis=1)
    return tangent.astype(np.float32), bitangent.astype(np.float32)


def power_heuristic(xp, pdf_a, pdf_b):
    """MIS weight of the strategy with ``pdf_a`` against ``pdf_b`` (Veach 1997, beta = 2).

    ``pdf_a^2 / (pdf_a^2 + pdf_b^2)``, 0 where both are 0 (float32).
    """
    a2 = pdf_a * pdf_a
    b2 = pdf_b * pdf_b
    total = a2 + b2
    return xp.where(total > 0, a2 / xp.where(total > 0, total, 1), 0).astype(np.float32)

"""How the GPU builder runs its levels: a settings object, passed in.

The defaults are what the measurements on an H200 chose; tests pass other
settings (tight buffers that every level outgrows, a low event limit that
sends levels to the per-stage kernels, no cooperative launch) to reach every
path of the drivers. None of them changes the tree.
"""

from __future__ import annotations

import dataclasses

from .. import encoding as enc


def default_loop_capacity(num_events: int, num_refs: int) -> tuple:
    """Capacities of the level loop's first buffers, from the start level's sizes.

    Room for the events to grow fourfold and the references eightfold (the
    first levels grow by less than 2x each, the last ones shed events into
    leaves); levels seldom have more nodes than twice the root's references;
    trees hold about 2-8 nodes and leaf entries per triangle. A build that
    outgrows them costs one more launch.

    Returns
    -------
    cap_events, cap_refs, cap_nodes, cap_tree : int
        Events, references and nodes per level; tree nodes and leaf entries.
    """
    return (4 * num_events + 4096, 8 * num_refs + 1024, 2 * num_refs + 1024,
            8 * num_refs + 256)


@dataclasses.dataclass(frozen=True)
class GpuSettings:
    """Settings of the GPU level drivers (:mod:`kdtree_gpu.builder.gpu`).

    Attributes
    ----------
    level_loop : bool
        Run levels in the cooperative level-loop kernel where the device can
        launch it (False: as a device without cooperative launch would, every
        level with one launch per stage).
    loop_max_events : int
        Levels of up to this many events run in the level-loop kernel, larger
        ones with one launch per stage, whose kernels, sized to the level,
        move memory faster than the loop's fixed grid (measured on an H200:
        the loop wins up to a few million events per level and loses about
        20% at tens of millions).
    small_level : int
        Stage levels whose arrays all have fewer items run the block-wide
        kernels (one launch for several stages; launch overhead dominates
        them).
    loop_capacity : callable
        ``(num_events, num_refs) -> (cap_events, cap_refs, cap_nodes,
        cap_tree)``: the first buffers of the level loop
        (:func:`default_loop_capacity`).
    small_refs : int
        A node the level-loop kernel would split that holds at most this
        many references (0 .. ``encoding.SMALL_MAX_REFS``) is deferred, and
        its subtree is built afterwards, one warp per node and one launch per
        level (:mod:`kdtree_gpu.builder.gpu.small`); 0 builds every level in
        the loop (the default: measured on an H200 the subtree kernel's
        per-node search, quadratic in the references, costs more than the
        loop's levels it replaces, 1.1-1.6x the whole build on the bunny,
        armadillo and conference meshes).
    small_records : int
        Records of deferred nodes the first buffer holds (0: a quarter of the
        root's references, at least 1024); the loop stops and is launched
        again with twice what it needs when they run out.
    """

    level_loop: bool = True
    loop_max_events: int = 1 << 23
    small_level: int = 1 << 16
    loop_capacity: object = default_loop_capacity
    small_refs: int = 0
    small_records: int = 0

    def __post_init__(self):
        if (isinstance(self.small_refs, bool) or not isinstance(self.small_refs, int)
                or not 0 <= self.small_refs <= enc.SMALL_MAX_REFS):
            raise ValueError(f"GpuSettings.small_refs must be an integer in "
                             f"[0, {enc.SMALL_MAX_REFS}], got {self.small_refs!r}")


DEFAULT_SETTINGS = GpuSettings()

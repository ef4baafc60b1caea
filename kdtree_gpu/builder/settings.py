"""How the GPU builder runs its levels: a settings object, passed in.

The defaults are what the measurements on an H200 chose; tests pass other
settings (tight buffers that every level outgrows, a low event limit that
sends levels to the per-stage kernels, no cooperative launch) to reach every
path of the drivers. None of them changes the tree.
"""

from __future__ import annotations

import dataclasses

from .. import encoding as enc
from ..config import _is_int


def widest_level(num: int) -> int:
    """The most events (or references) a level below a start level of ``num`` is
    expected to hold: 3.5x (:func:`default_loop_capacity` says where that comes from)."""
    return 7 * num // 2


def default_loop_capacity(num_events: int, num_refs: int, small_refs: int = 0) -> tuple:
    """Capacities of the level loop's first buffers, from the start level's sizes.

    Measured on the meshes of the mesh directory (levels of the identical
    NumPy pipeline), the widest level holds 1.1-3.3x the root's events and
    references (bunny 3.33, happy Buddha 2.89, conference 2.17, armadillo
    1.13) and 0.2-1.1x as many nodes as the root has references; the trees
    hold 2.0-8.1 nodes and 1.4-6.3 leaf entries per triangle. The widest
    levels are deep ones of many small nodes: when the loop defers nodes of
    up to ``small_refs`` references to the small-node stage, its widest level
    holds 1.03-1.80x the root's events with ``small_refs=16``, 1.04-1.56x
    with 32 and 1.03-1.34x with 64 (bunny, happy Buddha, dragon, conference,
    armadillo; measured on an H100), and the buffers are sized for 1.5x
    with ``small_refs >= 48``, 2x with fewer (3.5x without deferral). Nodes
    too: the loop splits only nodes of more than ``small_refs`` references,
    so a level has at most ``2 * refs / (small_refs + 1)`` nodes, and the
    loop writes a small part of the tree: 0.03-0.14 nodes and 1.05-3.17 leaf
    entries per reference of its start level (the subtrees write the rest;
    ``benchmarks/results/subtree_sizes.md``, conference the most of both):
    room for 1 and 4 (each
    node of room is 13 bytes per reference at the loop's peak). A build that
    outgrows them stops and goes on with larger ones (one more launch; the
    smaller buffers go back to the device first).

    Returns
    -------
    cap_events, cap_refs, cap_nodes : int
        Events, references and nodes per level.
    cap_tree : (int, int)
        Tree nodes and leaf entries.
    """
    if not small_refs:
        return (widest_level(num_events) + 4096, widest_level(num_refs) + 1024,
                5 * num_refs // 4 + 1024, (10 * num_refs + 256,) * 2)
    widen = 3 if small_refs >= 48 else 4  # halves
    cap_refs = widen * num_refs // 2 + 1024
    return (widen * num_events // 2 + 4096, cap_refs, 2 * cap_refs // (small_refs + 1) + 1024,
            (num_refs + 256, 4 * num_refs + 256))


def default_small_capacity(deferred_refs: int) -> tuple:
    """The subtree stage's first room, from the deferred nodes' references D.

    Measured on the meshes of the mesh directory
    (``benchmarks/results/subtree_sizes.md``), the subtrees add 0.9-5.2
    nodes and 1.2-4.0 leaf entries per D (conference the fewest, the bunny
    the most), and their widest level holds 0.12-0.63 D records and
    1.06-2.31 D references (the bunny subdivided twice: 5.07 D nodes, 0.66 D
    records and 2.39 D references). A level that finds its room full is run again,
    with the levels after it, with more room: a second page of the tree
    (what the levels from that one on are estimated to write,
    :func:`kdtree_gpu.builder.gpu.small.page_growth`), a larger buffer for
    its children
    (:func:`kdtree_gpu.builder.gpu.small.build_small_subtrees`), and a second
    page made again holds the old one while it is copied. So the first room
    holds the nodes of all but the bunny (4.5 D: the dragon subdivided
    twice writes 4.12 D, and with 4 D its page made again was its peak; the
    build adds the nodes its peak leaves free,
    :func:`kdtree_gpu.builder.gpu.small.room_under_peak`, which hold the
    bunny's) and what every measured mesh but the bunny subdivided twice
    (its records) needs of the rest: 4.5 D leaf entries, 0.65 D records and
    2.4 D references. Each D
    of room costs 13 bytes per node, 4 per leaf entry, 72 per record (two
    buffers) and 8 per reference. The medium nodes' events (16-bit, six per
    reference, two buffers; made only when nodes of more than
    ``encoding.SMALL_MAX_REFS`` references are deferred) get room for 5/4 D
    references: a subtree's first levels are its medium ones, and they hold
    about as many references as its root.

    Returns
    -------
    (tree nodes, leaf entries, records, references, medium events) : tuple of int
    """
    d = int(deferred_refs)
    return (9 * d // 2 + 1024, 9 * d // 2 + 1024, 13 * d // 20 + 1024, 12 * d // 5 + 1024,
            6 * (5 * d // 4 + 1024))


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
    loop_stay_events : int
        A level the loop runs goes on in the loop while its children hold up
        to this many events (at least ``loop_max_events``; 0: 1.5 times it):
        a level whose children grow a little past the entry bound stays in
        one launch instead of going to the stages. Measured on an H100 (warm builds,
        three alternating rounds): the armadillo subdivided once (8.3M root
        events, levels growing to 8.4-8.6M) 31-47 ms with the stay bound at
        the entry bound (9 levels by stages, the host bound) against 25-27 ms
        at 1.5x it (every level in the loop); raising the entry bound to 1.5x
        instead moved a 9-12M-event level of the armadillo subdivided twice
        into the loop, 1.5 ms more GPU time
        (benchmarks/results/loop_stay_h100.md).
    loop_one_block_events : int
        Builds whose root level has at most this many events (and no
        perfect splits) run the level-loop kernel compiled for one block a
        multiprocessor (128 registers, no spills; cheaper grid barriers),
        the others the kernel of two blocks (64 registers; twice the warps to
        hide memory latency on large levels). Measured on an H100 (the
        loop's GPU time, one block against two): bunny (417k root events)
        1.71 against 1.96-2.01 ms, happy Buddha (600k) 2.30 against 2.57,
        conference (1.98M) 9.5 against 8.2, armadillo (2.08M) 6.2 against 5.6
        (benchmarks/results/loop_one_block_h100.md). 0: always two.
    small_level : int
        Stage levels whose arrays all have fewer items run the block-wide
        kernels (one launch for several stages; launch overhead dominates
        them).
    loop_capacity : callable or None
        ``(num_events, num_refs) -> (cap_events, cap_refs, cap_nodes,
        cap_tree)``: the first buffers of the level loop (``cap_tree``: tree
        nodes and leaf entries, a pair or one number for both); None (the default):
        :func:`default_loop_capacity` for ``small_refs``
        (:meth:`loop_capacities`).
    small_refs : int
        A node the level-loop kernel or a level run by stages would split that
        holds at most this many references (0 .. ``encoding.MEDIUM_MAX_REFS``)
        is deferred, and its subtree is built afterwards, one launch per
        level: one block per node of more than ``encoding.SMALL_MAX_REFS``
        references, one warp per smaller node
        (:mod:`kdtree_gpu.builder.gpu.small`); 0 builds every level in the
        loop or by stages. The default,
        ``SMALL_MAX_REFS`` (64), was measured fastest on an H100 (bunny,
        happy Buddha, dragon, armadillo: 0.76-0.93x the build time with 0;
        conference 0.88-1.04x over four runs;
        benchmarks/results/small_nodes_h100.md), and it lets the loop's
        buffers be sized for narrower levels (:func:`default_loop_capacity`).
        Up to 256 was measured no faster on an H100: the block stage spends
        what it takes out of the loop
        (benchmarks/results/medium_nodes_h100.md).
    small_min_refs : int
        Builds (or levels handed back to the level loop) of fewer references
        defer nothing: the subtree stage costs a launch per level that can
        exist, and measured on an H100 that outweighs what it saves below
        tens of thousands of triangles (Cornell box, suzanne, spot: 1.03-1.39x
        the build time; bunny, 69k: 0.89-0.93x).
    small_records : int
        Records of deferred nodes the first buffer holds (0: a quarter of the
        root's references, at least 1024); the loop stops and is launched
        again with twice what it needs when they run out.
    small_grid : bool
        Run the subtree stage's levels in one cooperative launch, with a grid
        barrier between levels, where the device can launch it (False: one
        launch per level that can exist, about 30, most of them for levels
        without nodes, each a launch's host time). Builds that give medium
        nodes a block (``small_refs`` above ``SMALL_MAX_REFS``) keep the
        launch per level.
    small_capacity : callable or None
        ``deferred_refs -> (tree nodes, leaf entries, records, references[,
        medium events])``: the subtree stage's first room (records,
        references and medium nodes' events per level),
        taken as it is; None (the default): :func:`default_small_capacity`,
        with the tree nodes the build's peak leaves free added.
    workspace_block : int
        Allocations of the build of at least this many bytes come from the
        build's own pool, which gives its memory back to the device when the
        build ends (:mod:`kdtree_gpu.builder.gpu.workspace`); smaller ones
        from CuPy's current allocator, which keeps them for the next build
        (making them anew costs about 0.07 ms each on an H200).
    workspace_budget : int
        Bytes per input triangle the build's footprint may reach before a
        device allocation gives the workspace pools' cached blocks back
        (:meth:`kdtree_gpu.builder.gpu.workspace.Workspace.before_device_allocation`;
        above it, they go back wherever the footprint would pass its
        high-water mark). Below it the pools keep what a level freed for
        the next levels. 0: give them back at every new mark, the least
        memory. On an H100, armadillo subdivided twice with 0 made 293
        device allocations and 46 trims a build: warm builds of 117 ms and a
        peak of 211 bytes per triangle; with 256, 87-94 ms and 263
        (benchmarks/results/route_scan_h100.md). Since the staged levels
        store their events' segments (4 bytes an event more), 256 made 24
        trims and 95 device allocations a build (96-103 ms, 273 bytes per
        triangle), 320 the fewest: 83 ms and 336
        (benchmarks/results/staged_segments_h100.md).
    loop_blocks : int
        Blocks of the level-loop kernel's cooperative grid; 0 (the default):
        from the start level's events
        (:func:`kdtree_gpu.builder.gpu.level_loop.loop_grid`), at most as many
        as the device holds at once. Every stage of a level ends at a grid
        barrier, whose cost grows with the blocks: a small mesh's levels
        are mostly barriers, a large mesh's levels are mostly work.
    clip_segment : int
        With perfect splits (``SAHConfig(clip=True)``) the level-loop kernel
        orders each child segment's new events by counting, for each, the
        smaller ones (work quadratic in the segment's count, against a sort
        and a merge by binary search in the per-stage path); a level with a
        child segment of more new events runs with one launch per stage.
    morton_min_triangles : int
        Builds of at least this many triangles number them by the Morton
        code of their boxes' centres and build on those numbers; the tree
        (its leaves named by the given indices, ascending) is the same
        (:mod:`kdtree_gpu.builder.gpu.order`). The classification and the
        subtree stage then gather neighbouring triangle boxes for the
        references of a node instead of rows anywhere in arrays larger than
        L2, and the build's speed no longer depends on the mesh's order.
        On an H200 (warm ``kd.build``, kernels summed): armadillo
        subdivided three times (22M triangles) 230 to 201 ms, twice (5.5M)
        55 to 50 ms; once (1.38M, whose boxes fit in L2) no gain for the
        0.7 ms the order costs, hence the default between the two; the
        dragon subdivided twice (3.2M) 47-49 to 45-47 ms; a mesh whose own
        order already keeps neighbours together pays the order's cost
        (conference subdivided twice, 5.3M: 71-73 ms either way, about 1.4
        ms of it the order) (benchmarks/results/triangle_order_h200.md).
        0: every build; a number above any mesh: none. Builds with perfect
        splits (``SAHConfig(clip=True)``) keep the given order.
    keep_workspace : bool
        Keep the workspace's blocks cached when the build ends (False: give
        them back). Making them anew costs each build a few allocations
        and frees of the device: 0.4-2.2 ms per build on an H200 from the
        bunny to a 5.5M-triangle mesh (benchmarks/results/build_memory_h200.md);
        keeping them holds up to the build's peak until
        :func:`kdtree_gpu.builder.gpu.workspace.release_cached`. For
        repeated builds (animation) rather than one.
    """

    level_loop: bool = True
    loop_max_events: int = 1 << 23
    loop_stay_events: int = 0
    loop_one_block_events: int = 1 << 20
    small_level: int = 1 << 16
    loop_capacity: object = None
    small_refs: int = enc.SMALL_MAX_REFS
    small_min_refs: int = 32768
    small_records: int = 0
    small_grid: bool = True
    small_capacity: object = None
    workspace_block: int = 4 << 20
    workspace_budget: int = 320
    loop_blocks: int = 0
    clip_segment: int = 8192
    morton_min_triangles: int = 1 << 21
    keep_workspace: bool = False

    def loop_stay_bound(self) -> int:
        """The most events the children of a level the loop runs may hold
        (``loop_stay_events``)."""
        return max(self.loop_max_events, self.loop_stay_events or 3 * self.loop_max_events // 2)

    def small_refs_for(self, num_refs: int) -> int:
        """``small_refs`` for levels run from a start level of ``num_refs``
        references: 0 below ``small_min_refs``."""
        return self.small_refs if num_refs >= self.small_min_refs else 0

    def loop_capacities(self, num_events: int, num_refs: int, small_refs: int) -> tuple:
        """The level loop's first buffers for a start level of these sizes, deferring
        nodes of up to ``small_refs`` references: ``(cap_events, cap_refs,
        cap_nodes, cap_tree)`` (``loop_capacity``)."""
        if self.loop_capacity is None:
            return default_loop_capacity(num_events, num_refs, small_refs)
        return self.loop_capacity(num_events, num_refs)

    def small_capacities(self, deferred_refs: int) -> tuple:
        """The subtree stage's first room for ``deferred_refs`` deferred references:
        ``(tree nodes, leaf entries, records, references, medium events)``, each
        at least 1 (a ``small_capacity`` of four numbers gets the default
        events' room)."""
        make = self.small_capacity or default_small_capacity
        caps = tuple(make(deferred_refs))
        if len(caps) == 4:
            caps += default_small_capacity(deferred_refs)[4:]
        return tuple(max(1, int(n)) for n in caps)

    def __post_init__(self):
        limits = {"small_refs": (0, enc.MEDIUM_MAX_REFS), "small_min_refs": (0, None),
                  "loop_one_block_events": (0, None), "loop_stay_events": (0, None),
                  "small_records": (0, None),
                  "workspace_block": (1, None), "workspace_budget": (0, None),
                  "loop_blocks": (0, None),
                  "clip_segment": (0, None), "morton_min_triangles": (0, None)}
        for name, (lo, hi) in limits.items():
            value = getattr(self, name)
            if not _is_int(value) or value < lo or (hi is not None and value > hi):
                bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise ValueError(f"GpuSettings.{name} must be an integer {bound}, "
                                 f"got {value!r}")
        for name in ("keep_workspace", "small_grid"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GpuSettings.{name} must be True or False, "
                                 f"got {getattr(self, name)!r}")


DEFAULT_SETTINGS = GpuSettings()

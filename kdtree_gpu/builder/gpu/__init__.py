"""The GPU builder's drivers: root preparation, the level loop, one launch per stage.

:func:`build_levels_cuda` runs the levels of one build:

* :mod:`.root`: mesh preparation and the sorted root events on the device;
* :mod:`.level_loop`: levels of up to ``GpuSettings.loop_max_events``
  events in cooperative launches of the level-loop kernel (a few launches
  for all of them, every size kept on the device);
* :mod:`.level_stages`: larger levels (and every level on devices without
  cooperative launch) with one launch per stage;
* :mod:`.small`: the subtrees of the small nodes the level loop deferred, one
  warp each;
* :mod:`.output`: the tree's node records and leaf lists on the device;
* :mod:`.order`: a large build's own triangle order (Morton), and the
  leaves' triangles named by their given indices again;
* :mod:`.workspace`: the build's temporaries, in a pool given back to the
  device when the build ends;
* finally the traversal layout, packed on the device
  (:func:`kdtree_gpu.trace.gpu.pack_layout`): the tree stays on the GPU.

The stages are the same in all three: the device functions of
``cuda/build_stages.cuh``, whose NumPy twins are the stage functions of
:mod:`kdtree_gpu.builder.stages` (the GPU tests compare the two).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ... import encoding as enc
from ...device import cooperative_launch
from ...compile_ahead import ModuleSpec, compile_modules
from ...launch import stage
from ...primitives.scan import PRIMITIVES_SOURCE
from ...trace.gpu import TRACE_NAME_EXPRESSIONS, TRAVERSE_SOURCE, pack_layout
from ..soa import EventSoA, NodeSoA, RefSoA
from ..settings import DEFAULT_SETTINGS
from .level_costs import CANDIDATE_MODULE, STAGE_MODULE
from .level_loop import build_levels_grid, level_loop_kernel, loop_module, root_loop_buffers
from .level_stages import CLIP_MODULE, build_level_stages
from .order import rename_leaves_cuda
from .output import TreeOutput, grown
from .root import create_root_events_cuda, prepare_mesh_cuda, root_event_count
from .small import build_small_subtrees, subtree_modules
from .workspace import Workspace, pooled, uploaded


@dataclasses.dataclass
class LoopState:
    """Where the level loop stands: the current level and what is written."""

    events: EventSoA
    refs: RefSoA
    nodes: NodeSoA
    level: int = 0
    level_base: int = 0  # tree nodes written
    leaf_ref_base: int = 0  # leaf_tris entries written
    level_sizes: list = dataclasses.field(default_factory=list)
    done: bool = False
    workspace: object = None  # Workspace: the build's device memory
    launches: int = 0  # launches of the level-loop kernel
    loop_blocks: list = dataclasses.field(default_factory=list)  # the grid of each launch
    loop_buffers: int = 0  # level buffers the loop made (a launch again may reuse them)
    stage_levels: list = dataclasses.field(default_factory=list)  # levels run by stages
    # level -> (child references / references, child events / events) of the
    # levels run by stages (level_stages.child_room guesses the next from them)
    growth: dict = dataclasses.field(default_factory=dict)
    scatter_relaunches: int = 0  # levels whose guess of the counts fell short
    # (capacity, SMALL_RECORD) int32: small nodes deferred by the loop and the stages
    deferred: object = None
    num_deferred: int = 0
    deferred_refs: int = 0  # the deferred nodes' references, all of them
    small_refs: int = 0  # the levels run by stages defer nodes of up to this many references
    # runs of the subtree levels that found buffers full: (first such level, SMALL_FULL_* bits)
    small_runs_full: list = dataclasses.field(default_factory=list)
    small_level_sizes: list = dataclasses.field(default_factory=list)
    small_launches: int = 0  # launches of the subtree levels' kernels (one per run in a grid)
    # the medium nodes of each subtree level (a block each)
    medium_level_sizes: list = dataclasses.field(default_factory=list)
    # the level loop's first buffers when the start level was decoded into them
    buffers: object = None

    def room_for_deferred(self, cp, need: int, rows: int) -> None:
        """Make ``deferred`` hold at least ``need`` records: made with ``rows`` rows
        when there is none, grown to ``rows`` (the records written kept) when it
        is smaller; with the allocator of the caller's context."""
        if self.deferred is None:
            self.deferred = cp.empty((rows, enc.SMALL_RECORD), dtype=np.int32)
        elif self.deferred.shape[0] < need:
            self.deferred = grown(cp, self.deferred, rows, self.num_deferred)


def build_modules(cfg, settings, num_triangles: int, grid: bool, cooperative: bool) -> tuple:
    """The modules a build of ``num_triangles`` triangles runs, as far as they are
    known before its first kernel (:func:`kdtree_gpu.compile_ahead.compile_modules`
    compiles those a machine lacks side by side).

    The root's events are taken as six a triangle (fewer where triangles are
    flat or degenerate), which picks the level loop's kernel and whether
    levels run by stages; a build that then runs another module compiles it
    when it asks for it, as without this list.

    Parameters
    ----------
    grid : bool
        The level loop runs (a cooperative device, ``settings.level_loop``).
    cooperative : bool
        The device launches cooperatively (the subtree stage's one launch).

    Returns
    -------
    tuple of kdtree_gpu.compile_ahead.ModuleSpec
    """
    events = 6 * int(num_triangles)
    specs = [ModuleSpec(PRIMITIVES_SOURCE), STAGE_MODULE,
             # (the traversal layout's)
             ModuleSpec(TRAVERSE_SOURCE, name_expressions=TRACE_NAME_EXPRESSIONS)]
    if grid:
        specs.append(loop_module(cfg.clip, events <= settings.loop_one_block_events))
    if not grid or events > settings.loop_max_events:
        specs.append(CANDIDATE_MODULE)
    if cfg.clip:
        specs.append(CLIP_MODULE)  # (the loop hands levels of large new segments to it)
    elif settings.small_refs_for(num_triangles):
        specs += subtree_modules(settings, cooperative)
    return tuple(specs)


def build_levels_cuda(cp, cfg, V, F, loop: str = "grid", settings=DEFAULT_SETTINGS):
    """The level loop on the GPU.

    Same stages, same rules and same outputs as
    :func:`kdtree_gpu.builder.pipeline.build_levels_xp`.

    Parameters
    ----------
    cp : module
        ``cupy``.
    cfg : SAHConfig
    V : (num_vertices, 3) float32, F : (num_triangles, 3) int32
        Host arrays from :func:`kdtree_gpu.mesh.coerce_mesh`, or CuPy arrays
        from :func:`.root.coerce_mesh_cuda`.
    loop : {"grid", "stages"}
        ``"grid"`` runs levels in the level-loop kernel where the device (and
        ``settings.level_loop``) allows; ``"stages"`` runs every level with
        one launch per stage.
    settings : GpuSettings

    Returns
    -------
    arrays : dict
        The tree on the device, at its exact sizes: node_axis, node_split,
        node_child, node_count, leaf_tris, the mesh (vertices, faces) and
        its box (bounds, (2, 3) float32).
    layout : TraversalLayout
        Packed for the traversal kernel (:mod:`kdtree_gpu.trace.gpu`), so
        that the first query launches nothing else.
    info : dict
        levels, level_sizes, level_loop ("grid" when the level-loop kernel
        ran, else "stages"), loop_launches, loop_blocks (the cooperative
        grid of each launch), loop_buffers (the level buffers the loop
        made: a launch again from a level whose children fit reuses them),
        loop_kernel (the level-loop kernel's name, None
        when it did not run), stage_levels (the levels run with
        one launch per stage), scatter_relaunches (of those, the levels whose
        scatter, launched before their counts were read, ran again because
        the guess of the counts fell short), small_subtrees (the deferred nodes,
        whose subtrees the subtree stage built), medium_subtrees (those of
        more than ``encoding.SMALL_MAX_REFS`` references: a block took
        each), medium_level_sizes (the nodes of each level of the subtrees
        that a block took), small_runs_full (for each run of the subtree levels that
        found buffers full: the first level that did, from which the levels
        ran again, and the ``encoding.SMALL_FULL_*`` bits of the buffers),
        small_level_sizes (nodes and references of each level of the
        subtrees, the deferred nodes first), small_launches (launches of the
        subtree levels' kernels: one a run where the device runs them in one
        cooperative launch, ``GpuSettings.small_grid``), depth, num_degenerate, bounds,
        morton_order (the build numbered the triangles in Morton order:
        ``GpuSettings.morton_min_triangles``, :mod:`.order`),
        peak_device_bytes (the most device memory the build held at once,
        mesh and tree included:
        :class:`.workspace.Workspace`).

    Memory: large temporaries come from the build's workspace pool and go
    back to the device when the build ends; what the call leaves in the
    caller's pool is the tree, its traversal layout, the mesh and the small
    blocks CuPy keeps for the next build.
    """
    # The mesh is part of the result: the caller's allocator, as the tree.
    V_d, F_d = cp.asarray(V), cp.asarray(F)
    workspace = Workspace(cp, settings.workspace_block, keep=settings.keep_workspace,
                          budget=settings.workspace_budget * int(F_d.shape[0]))
    with workspace:
        m = int(F_d.shape[0])
        cooperative = cooperative_launch(cp.cuda.Device().id)
        grid = loop == "grid" and settings.level_loop and cooperative
        # A machine's first build compiles the modules it will run side by side,
        # not one by one as each is first asked for (which loop kernel runs is
        # chosen from the root's events, below; build_modules guesses it)
        compile_modules(build_modules(cfg, settings, m, grid, cooperative))
        # A build the loop runs from the root (at most 6 events per triangle)
        # defers into records cut from the triangles' boxes' block, as many as
        # the loop would make (build_levels_grid).
        records = 0
        if grid and 6 * m <= settings.loop_max_events \
                and settings.small_refs_for(m) and not cfg.clip:
            records = settings.small_records or max(1024, m // 4)
        # The triangles' boxes and the root level are temporaries of every size
        # from the workspace pool: made in the caller's, they stayed cached
        # there after the build (H100, bunny: the end of the build was its
        # peak, 128 bytes per triangle beside the tree, its layout and the mesh).
        # A large build numbers the triangles in Morton order (.order; not with
        # perfect splits, whose kernels read the mesh's faces by triangle).
        morton = m >= settings.morton_min_triangles and not cfg.clip
        with stage(xp=cp, description="prepare_mesh"), pooled():
            _, _, tri_lo, tri_hi, refs, nodes, bounds, planar, num_degenerate, deferred, order = \
                prepare_mesh_cuda(cp, V_d, F_d, records, morton)
        # The tree's box, uploaded now from pinned memory (queued: at the end, a
        # pageable upload waited for the whole build)
        with workspace.outputs():
            bounds_d, bounds_staged = uploaded(cp, bounds)
        num_root = refs.size
        max_depth = cfg.resolved_max_depth(num_root)
        root_events = root_event_count(num_root, planar)
        # small levels: the kernel of one block a multiprocessor (settings)
        # (the two-block kernel when the one-block one cannot be resident)
        grid_loop = None
        if grid:
            small = root_events <= settings.loop_one_block_events
            grid_loop = (small and level_loop_kernel(cp, cfg.clip, one_block=True)) \
                or level_loop_kernel(cp, cfg.clip)
        # The root events go straight into the level loop's buffers when it runs from the root.
        first = None
        if grid_loop is not None:
            first = root_loop_buffers(cp, cfg, settings, root_events, num_root, grid_loop[1])
        # (a root the stages run stores its events' segments: staged_segments)
        with stage(xp=cp, description="create_root_events"):
            events = create_root_events_cuda(cp, tri_lo, tri_hi, refs.ref_tri, planar,
                                             out=first and first[1], scratch=first and first[2],
                                             segments=cfg.clip or first is None)
        # (the small-node kernel does not clip: with clip=True no node is deferred)
        state = LoopState(events, refs, nodes, workspace=workspace,
                          buffers=first and first[0], deferred=deferred,
                          small_refs=0 if cfg.clip else settings.small_refs_for(num_root))
        del events, refs, nodes, first, deferred  # the state holds them while they are needed
        # grown as levels are written (the level loop reserves its share up front),
        # from room for a node per four triangles (13 bytes a node: 3 per triangle)
        out = TreeOutput(cp, first_nodes=num_root // 4)
        while not state.done:
            if grid_loop is not None and state.events.size <= settings.loop_max_events:
                state = build_levels_grid(cp, cfg, tri_lo, tri_hi, state, out, max_depth,
                                          grid_loop, settings, (V_d, F_d))
                if state.done:
                    break
                # The loop stopped at a level whose children are too large for it
                # (or, clipping, whose new events it leaves to the stages' sort).
            state = build_level_stages(cp, cfg, tri_lo, tri_hi, state, out, max_depth, settings,
                                       (V_d, F_d))
        state.events = state.refs = state.nodes = None
        small_depth = build_small_subtrees(cp, cfg, tri_lo, tri_hi, state, out, max_depth,
                                           settings)
        del tri_lo, tri_hi
        state.deferred = None  # in the workspace: it must be free when the workspace is given back
        # the subtree stage's buffers go back before the tree is copied out of its
        # output where they would hold the peak beside the copies (a trim waits
        # for the GPU: 0.11 ms of the bunny's host time, H200)
        workspace.make_room(out.copy_bytes(state.level_base, state.leaf_ref_base))
        with stage(xp=cp, description="finish tree"), workspace.outputs():
            arrays = out.finish(state.level_base, state.leaf_ref_base,
                                keep_below=workspace.min_block)
        del out
        if order is not None:  # the leaves named by the given indices again
            with stage(xp=cp, description="rename leaves"):
                rename_leaves_cuda(cp, arrays, order)
            del order
    # The workspace went back to the device: the layout can use its memory.
    with stage(xp=cp, description="traversal layout"):
        layout = pack_layout(cp, *(arrays[name] for name in (
            "node_axis", "node_split", "node_child", "node_count", "leaf_tris")), V_d, F_d, bounds)
    workspace.sample()
    del bounds_staged  # (the build's reads passed its copy)
    arrays.update(vertices=V_d, faces=F_d, bounds=bounds_d)
    info = {"levels": state.level, "level_sizes": state.level_sizes,
            "level_loop": "grid" if state.launches else "stages",
            "loop_launches": state.launches, "loop_blocks": state.loop_blocks,
            "loop_buffers": state.loop_buffers,
            "loop_kernel": grid_loop[0].name if grid_loop is not None and state.launches
            else None,
            "stage_levels": state.stage_levels,
            "scatter_relaunches": state.scatter_relaunches,
            "small_subtrees": state.num_deferred,
            "medium_subtrees": (state.medium_level_sizes or [0])[0],  # (level 0's)
            "small_runs_full": state.small_runs_full,
            "small_level_sizes": state.small_level_sizes,
            "small_launches": state.small_launches,
            "medium_level_sizes": state.medium_level_sizes,
            "depth": max(state.level - 1, small_depth),
            "bounds": bounds, "num_degenerate": num_degenerate, "morton_order": morton,
            # the workspace's and the caller's pool's high-water mark, and the mesh
            "peak_device_bytes": int(workspace.high_water + V_d.nbytes + F_d.nbytes)}
    return arrays, layout, info

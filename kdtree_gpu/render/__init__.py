"""Wavefront path tracer over the kd-tree (pbrt-v4 style, GPU with CuPy or CPU with NumPy).

One sample pass traces one path per (pixel, sample) through a sequence of
stages, each a verb-named function over a queue of paths (pbrt-v4 section 15.3,
``WavefrontPathIntegrator::Render``)::

    generate_camera_rays
    for depth = 0, 1, ...:
        intersect_closest       closest hit of every live ray (kd-tree traversal)
        handle_escaped_rays     background radiance, path ends
        add_emission            emitted radiance at the hit (MIS-weighted); paths
                                that reached max_depth end here
        sample_lights           next-event estimation: a light triangle by power
                                (alias table) and a point on it, kept compact as
                                (triangle, barycentrics)
        trace_shadow_rays       expand the light samples into shadow rays, any-hit
                                test, add the unoccluded contributions
        sample_bsdf             Lambertian, cosine-weighted: the next ray
        russian_roulette        unbiased termination (survivors reweighted)
        compact_paths           stream compaction of the live paths
    accumulate_film             add the pass to the running sum

Modules, in the order of the pipeline: :mod:`.scene` (the scene on the
device: triangle records, light tables), :mod:`.queues` (the SoA queues),
:mod:`.sampling` (random numbers, MIS), :mod:`.tracers` (kd-tree and
brute-force ray casting), :mod:`.context` (what the stages share, kernel
launches), :mod:`.stages` (the stage functions, each a CUDA kernel of
``cuda/render.cu`` and its array-expression twin), :mod:`.compaction`
(stream compaction), :mod:`.integrator` (the loop, :class:`Renderer`,
:func:`render`), :mod:`.image` (tone mapping, PNG). Scenes and cameras are
:mod:`kdtree_gpu.scenes`.

The estimator
-------------
Direct light is estimated twice at every vertex, by light sampling and by
BSDF sampling, and the two are combined with the power heuristic (Veach
1997, beta = 2): a light sample with pdf ``p_light`` (solid angle) and BSDF
pdf ``p_bsdf`` for the same direction is weighted ``p_light^2 / (p_light^2 +
p_bsdf^2)``; an emitter hit by the BSDF-sampled ray gets ``p_bsdf^2 /
(p_light^2 + p_bsdf^2)``, where ``p_light`` is what light sampling would have
given that point. Camera rays take emission with weight 1, and so do escaped
rays (the background is not light-sampled). Reflection is two-sided (the
normal is turned toward the incoming ray); emission comes from the front face
only (the side of ``(v1 - v0) x (v2 - v0)``) unless the scene sets
``two_sided_emission``. Russian roulette starts at ``rr_start_depth``: a path
survives with probability ``min(1, max(throughput))`` and its throughput is
divided by it, which keeps the estimator unbiased (the furnace tests in
``tests/kdtree_gpu/render/test_integrator.py`` check this).

Depth follows pbrt-v4: ``max_depth = 0`` gives emission seen directly,
``max_depth = 1`` direct lighting, and so on; ``max_depth=None`` leaves path
length to Russian roulette alone.

Queues and compaction
---------------------
Queues are structures of arrays declared once (:class:`PathQueue`,
:class:`HitQueue`, :class:`LightSampleQueue`, :class:`ShadowQueue`), with
dtypes fixed in their field declarations. They are allocated once per render
(:class:`QueueBuffers`) at the size of one pass; a bounce works on views of
their first rows, so no bounce allocates a queue. With ``compaction=True`` the
live paths are moved to the front of the other of two path buffers after every
bounce (ping-pong; GAPT part 11, section 11.1, thread compaction), and the
shadow rays that carry light are moved to the front of their own buffer before
they are traced. On the GPU one compaction is two launches
(:meth:`Compactor.compact`: live rows per tile, then one kernel that ranks the
live rows and moves every field of the queue), and the number of live paths is
the loop's one device-to-host read per bounce; shadow rays need no read (the
dead rows are marked at the back of the buffer and the traversal runs over the
whole of it). With ``compaction=False`` the queue keeps its length, dead paths
stay in it masked (``path_alive = 0``, ray interval empty) and every kernel
still runs one thread for each of them.

Random numbers
--------------
Counter-based (:mod:`.sampling`): NumPy and CUDA compute the same bits, so
the same path makes the same choices on both backends until floating-point
rounding sends it elsewhere, and an image does not depend on how samples are
batched into passes.
"""

from ..scenes import Camera, Scene, SceneError, as_scene, mesh_scene
from .compaction import (COUNTER_LIVE_PATHS, COUNTER_SHADOW_RAYS, COUNTER_SHADOW_RAYS_TOTAL,
                         Compactor, compact_rows_xp, compaction_tiles, field_table)
from .context import RENDER_SOURCE, RenderContext, launch_kernel
from .image import encode_png, save_png, tonemap
from .integrator import (DEFAULT_RR_START_DEPTH, DEPTH_HARD_LIMIT, Renderer, RenderResult, render,
                         trace_paths)
from .queues import HitQueue, LightSampleQueue, PathQueue, QueueBuffers, ShadowQueue
from .sampling import (orthonormal_basis, path_keys, pcg_hash, pcg_hash_scalar, power_heuristic,
                       stream_salt, uniform_from_key)
from .scene import (DEFAULT_RAY_EPSILON, DeviceScene, build_alias_table, light_tables,
                    triangle_records, upload_scene)
from .stages import (accumulate_film, add_emission, compact_paths, compact_shadow_rays,
                     expand_light_samples, generate_camera_rays, handle_escaped_rays,
                     intersect_closest, russian_roulette, sample_bsdf, sample_lights,
                     trace_shadow_rays)
from .tracers import BruteForceTracer, KdTreeTracer

# The renderer's scene type before scenes were one type; the same class.
RenderScene = Scene

__all__ = [
    "render", "Renderer", "RenderResult", "RenderScene", "Scene", "Camera", "SceneError",
    "mesh_scene", "as_scene", "save_png", "tonemap", "encode_png", "PathQueue", "HitQueue",
    "LightSampleQueue", "ShadowQueue", "generate_camera_rays", "intersect_closest",
    "handle_escaped_rays", "add_emission", "sample_lights", "expand_light_samples",
    "trace_shadow_rays", "sample_bsdf", "russian_roulette", "compact_paths", "compact_shadow_rays",
    "accumulate_film", "trace_paths", "QueueBuffers", "Compactor", "compaction_tiles",
    "field_table", "compact_rows_xp", "KdTreeTracer", "BruteForceTracer", "RenderContext",
    "launch_kernel", "DeviceScene", "upload_scene", "light_tables", "triangle_records",
    "build_alias_table",
]

"""The stages of the wavefront path tracer, in pipeline order (pbrt-v4 section 15.3).

Each stage is one verb-named function over the queues of
:mod:`kdtree_gpu.render.queues`; with ``ctx.use_kernels`` it is one launch of
its kernel in ``cuda/render.cu`` (``kd_render_<stage>``), else its
array-expression twin on NumPy or CuPy (the oracle of the kernel in the
tests, and the CPU path). Both compute the same arithmetic in float32 and
draw the same random numbers (:mod:`kdtree_gpu.render.sampling`). The loop
that calls them is :func:`kdtree_gpu.render.integrator.trace_paths`; the
estimator is described in :mod:`kdtree_gpu.render`.
"""

from __future__ import annotations

import math

import numpy as np

from ..encoding import SHADOW_TMAX_SCALE
from .compaction import (COUNTER_LIVE_PATHS, COUNTER_SHADOW_RAYS, COUNTER_SHADOW_RAYS_TOTAL,
                         compact_rows_xp)
from .context import RenderContext, f32, i32
from .queues import HitQueue, LightSampleQueue, PathQueue, ShadowQueue
from .sampling import (DIM_BSDF_PHI, DIM_BSDF_R, DIM_LIGHT_SELECT, DIM_LIGHT_U, DIM_LIGHT_V,
                       DIM_PIXEL_X, DIM_PIXEL_Y, DIM_ROULETTE, INV_PI, orthonormal_basis,
                       path_keys, power_heuristic, seed_hash, stream_salt, uniform_from_key)


# --- the geometry the stages share (twins of render.cu's device functions) ---------------
def scatter_add_rows(xp, target, index, values) -> None:
    """``target[index[i]] += values[i]`` with repeated indices summed (``kd_add_radiance``).

    Parameters
    ----------
    target : (num_rows, 3) float32
    index : (k,) int
    values : (k, 3) float
    """
    if index.shape[0] == 0:
        return
    if xp is np:
        for c in range(target.shape[1]):
            target[:, c] += np.bincount(index, weights=values[:, c],
                                        minlength=target.shape[0]).astype(np.float32)
    else:
        # ufunc.at: in every CuPy the project accepts (>= 13); cupyx.scatter_add is deprecated
        xp.add.at(target, index, values.astype(np.float32))


def surface(ctx: RenderContext, tri, u, v, direction):
    """Hit point and unit geometric normal facing against ``direction`` (k rows; ``kd_surface``)."""
    xp = ctx.xp
    corners = ctx.scene.tri_vertex[tri]  # (k, 3, 4)
    v0 = corners[:, 0, :3]
    point = v0 + u[:, None] * (corners[:, 1, :3] - v0) + v[:, None] * (corners[:, 2, :3] - v0)
    normal = ctx.scene.tri_normal[tri, :3]
    facing = xp.where(xp.sum(normal * direction, axis=1) < 0, np.float32(1), np.float32(-1))
    return point.astype(np.float32), (normal * facing[:, None]).astype(np.float32)


def offset_origin(ctx: RenderContext, point, normal):
    """Origin of a ray leaving ``point``: pushed along ``normal`` by a scale-relative epsilon.

    The twin of ``kd_offset_origin``. The offset grows with the magnitude of
    the coordinates (the rounding error of a float32 hit point does), with a
    floor of ``min_scale`` near the origin; a fixed fraction of the scene
    size would bias small details of large scenes.
    """
    xp = ctx.xp
    sc = ctx.scene
    scale = xp.maximum(xp.max(xp.abs(point), axis=1), f32(sc.min_scale))
    return (point + (f32(sc.ray_epsilon) * scale)[:, None] * normal).astype(np.float32)


def emitter_cosine(ctx: RenderContext, normal, direction):
    """Cosine at an emitter toward the receiver; <= 0 on the back of a one-sided emitter.

    The twin of ``kd_emitter_cosine``; ``direction`` is that of the ray
    arriving at the emitter (k rows).
    """
    c = -ctx.xp.sum(normal * direction, axis=1)
    return ctx.xp.abs(c) if ctx.scene.two_sided else c


def normalize_rows(xp, a):
    """Rows of ``a`` scaled to unit length (float32; ``kd_normalize``)."""
    return (a / xp.sqrt(xp.sum(a * a, axis=1))[:, None]).astype(np.float32)


def end_paths(queue: PathQueue, rows) -> None:
    """End the paths ``rows``: dead, with an empty ray interval (the traversal returns at once).

    The kernels end a path the same way (``path_alive[i] = 0; ray_tmax[i] = -1``).
    """
    queue.path_alive[rows] = 0
    queue.ray_tmax[rows] = -1


# --- stages --------------------------------------------------------------------------
def generate_camera_rays(ctx: RenderContext, first_sample: int, num_samples: int) -> PathQueue:
    """One camera ray per (pixel, sample) for samples ``first_sample ...``.

    Path ``i`` belongs to pixel ``i % num_pixels`` and sample
    ``first_sample + i // num_pixels``; the ray goes through a uniformly
    jittered point of the pixel.

    Returns
    -------
    PathQueue
        ``num_pixels * num_samples`` live paths, throughput 1, depth 0: a
        view of the first path buffer.
    """
    xp = ctx.xp
    n = ctx.num_pixels * num_samples
    ctx.buffers.current = 0
    queue = ctx.buffers.paths[0].prefix(n)
    if ctx.use_kernels:
        ctx.launch("render: generate camera rays", "kd_render_generate_camera_rays", n, (
            i32(n), i32(ctx.width), i32(ctx.height), i32(first_sample), seed_hash(ctx.seed),
            stream_salt(0, DIM_PIXEL_X), stream_salt(0, DIM_PIXEL_Y), ctx.scene.camera_frame,
            queue.ray_origin, queue.ray_direction, queue.ray_tmax, queue.path_throughput,
            queue.path_bsdf_pdf, queue.path_pixel, queue.path_key, queue.path_depth,
            queue.path_alive))
        return queue
    with ctx.stage("render: generate camera rays"):
        path = xp.arange(n, dtype=np.int64)
        pixel = (path % ctx.num_pixels).astype(np.int32)
        sample = (first_sample + path // ctx.num_pixels).astype(np.uint32)
        key = path_keys(xp, ctx.seed, sample, pixel)
        jitter_x = uniform_from_key(xp, key, stream_salt(0, DIM_PIXEL_X))
        jitter_y = uniform_from_key(xp, key, stream_salt(0, DIM_PIXEL_Y))
        px = (pixel % ctx.width).astype(np.float32)
        py = (pixel // ctx.width).astype(np.float32)
        sx = (px + jitter_x) * f32(2.0 / ctx.width) - f32(1.0)
        sy = f32(1.0) - (py + jitter_y) * f32(2.0 / ctx.height)
        frame = ctx.scene.camera_frame
        direction = (frame[3][None, :] + sx[:, None] * frame[1][None, :]
                     + sy[:, None] * frame[2][None, :])
        queue.ray_origin[:] = frame[0][None, :]
        queue.ray_direction[:] = normalize_rows(xp, direction)
        queue.ray_tmax[:] = np.inf
        queue.path_throughput[:] = 1
        queue.path_bsdf_pdf[:] = 0
        queue.path_pixel[:] = pixel
        queue.path_key[:] = key
        queue.path_depth[:] = 0
        queue.path_alive[:] = 1
    return queue


def intersect_closest(ctx: RenderContext, queue: PathQueue) -> HitQueue:
    """Closest hit of every ray of the queue (dead paths have an empty interval).

    Returns
    -------
    HitQueue
    """
    tmin = ctx.buffers.ray_tmin[:queue.size]
    with ctx.tracer_stage("render: intersect closest"):
        return ctx.tracer.intersect(queue.ray_origin, queue.ray_direction, tmin, queue.ray_tmax)


def handle_escaped_rays(ctx: RenderContext, queue: PathQueue, hit: HitQueue) -> None:
    """Add the background to live paths that hit nothing, and end them."""
    xp = ctx.xp
    bg = ctx.scene.background
    if ctx.use_kernels:
        ctx.launch("render: handle escaped rays", "kd_render_handle_escaped_rays", queue.size, (
            i32(queue.size), hit.hit_tri, f32(bg[0]), f32(bg[1]), f32(bg[2]),
            queue.path_throughput, queue.path_pixel, queue.path_alive, queue.ray_tmax,
            ctx.pass_radiance))
        return
    with ctx.stage("render: handle escaped rays"):
        escaped = xp.flatnonzero((queue.path_alive != 0) & (hit.hit_tri < 0))
        if max(bg) > 0:
            radiance = queue.path_throughput[escaped] * xp.asarray(bg, dtype=np.float32)[None, :]
            scatter_add_rows(xp, ctx.pass_radiance, queue.path_pixel[escaped], radiance)
        end_paths(queue, escaped)


def add_emission(ctx: RenderContext, queue: PathQueue, hit: HitQueue, depth: int) -> None:
    """Add emitted radiance at each live path's hit; end paths at ``max_depth``.

    At depth 0 the weight is 1; later the power-heuristic weight of BSDF
    sampling against light sampling (the estimator in :mod:`kdtree_gpu.render`).
    """
    xp = ctx.xp
    sc = ctx.scene
    last = ctx.max_depth is not None and depth >= ctx.max_depth
    if ctx.use_kernels:
        ctx.launch("render: add emission", "kd_render_add_emission", queue.size, (
            i32(queue.size), i32(depth), i32(1 if last else 0), i32(sc.two_sided),
            hit.hit_t, hit.hit_tri,
            queue.ray_direction, queue.path_throughput, queue.path_bsdf_pdf, queue.path_pixel,
            sc.tri_normal, sc.tri_material, sc.material_emission, sc.tri_light_pmf,
            queue.path_alive, queue.ray_tmax, ctx.pass_radiance))
        return
    with ctx.stage("render: add emission"):
        live = xp.flatnonzero(queue.path_alive != 0)
        tri = hit.hit_tri[live]
        emission = sc.material_emission[sc.tri_material[tri], :3]
        normal = sc.tri_normal[tri]
        cos_light = emitter_cosine(ctx, normal[:, :3], queue.ray_direction[live])
        emits = xp.flatnonzero((xp.max(emission, axis=1) > 0) & (cos_light > 0))
        if emits.shape[0]:
            rows = live[emits]
            tri_e = tri[emits]
            if depth == 0:
                weight = xp.ones(rows.shape[0], dtype=np.float32)
            else:
                t = hit.hit_t[rows]
                area = normal[emits, 3]
                ok = area > 0
                pdf_light = xp.where(ok, sc.tri_light_pmf[tri_e] * t * t
                                     / xp.where(ok, area * cos_light[emits], 1),
                                     np.inf).astype(np.float32)
                weight = power_heuristic(xp, queue.path_bsdf_pdf[rows], pdf_light)
            radiance = queue.path_throughput[rows] * emission[emits] * weight[:, None]
            scatter_add_rows(xp, ctx.pass_radiance, queue.path_pixel[rows], radiance)
        if last:
            end_paths(queue, live)


def sample_lights(ctx: RenderContext, queue: PathQueue, hit: HitQueue,
                  depth: int) -> LightSampleQueue:
    """Pick a light triangle by power (alias table) and a uniform point on it.

    Paths that are dead, hit a black surface, or live in a scene without
    lights get ``light_tri = -1``.

    Returns
    -------
    LightSampleQueue
    """
    xp = ctx.xp
    sc = ctx.scene
    samples = ctx.buffers.light_samples.prefix(queue.size)
    num_lights = sc.num_lights
    if ctx.use_kernels:
        ctx.launch("render: sample lights", "kd_render_sample_lights", queue.size, (
            i32(queue.size), i32(num_lights), stream_salt(depth, DIM_LIGHT_SELECT),
            stream_salt(depth, DIM_LIGHT_U), stream_salt(depth, DIM_LIGHT_V), queue.path_alive,
            queue.path_key, hit.hit_tri, sc.tri_material, sc.material_albedo, sc.light_tri,
            sc.light_alias_prob, sc.light_alias_index, samples.light_tri, samples.light_u,
            samples.light_v))
        return samples
    with ctx.stage("render: sample lights"):
        samples.light_tri[:] = -1
        if num_lights == 0:
            return samples
        live = xp.flatnonzero(queue.path_alive != 0)
        albedo = sc.material_albedo[sc.tri_material[hit.hit_tri[live]], :3]
        live = live[xp.max(albedo, axis=1) > 0]
        key = queue.path_key[live]
        u_select = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_SELECT))
        r1 = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_U))
        r2 = uniform_from_key(xp, key, stream_salt(depth, DIM_LIGHT_V))
        scaled = u_select * f32(num_lights)
        bucket = xp.minimum(scaled.astype(np.int32), num_lights - 1)
        keep = (scaled - bucket.astype(np.float32)) < sc.light_alias_prob[bucket]
        chosen = xp.where(keep, bucket, sc.light_alias_index[bucket])
        su = xp.sqrt(r1)
        samples.light_tri[live] = sc.light_tri[chosen]
        samples.light_u[live] = su * (f32(1) - r2)
        samples.light_v[live] = su * r2
    return samples


def expand_light_samples(ctx: RenderContext, queue: PathQueue, hit: HitQueue,
                         samples: LightSampleQueue) -> ShadowQueue:
    """Turn compact light samples into shadow rays with their MIS-weighted radiance."""
    xp = ctx.xp
    sc = ctx.scene
    # the kernel sets shadow_tmax = -1 where it writes nothing else
    shadow = ctx.buffers.shadow.prefix(queue.size)
    if ctx.use_kernels:
        ctx.launch("render: expand light samples", "kd_render_expand_light_samples", queue.size, (
            i32(queue.size), f32(sc.ray_epsilon), f32(sc.min_scale), i32(sc.two_sided),
            hit.hit_tri, hit.hit_u, hit.hit_v,
            queue.ray_direction, queue.path_throughput, queue.path_pixel, samples.light_tri,
            samples.light_u, samples.light_v, sc.tri_vertex, sc.tri_normal, sc.tri_material,
            sc.material_albedo, sc.material_emission, sc.tri_light_pmf, shadow.shadow_origin,
            shadow.shadow_direction, shadow.shadow_tmax, shadow.shadow_radiance,
            shadow.shadow_pixel))
        return shadow
    with ctx.stage("render: expand light samples"):
        shadow.shadow_tmax[:] = -1
        rows = xp.flatnonzero(samples.light_tri >= 0)
        tri = hit.hit_tri[rows]
        point, normal = surface(ctx, tri, hit.hit_u[rows], hit.hit_v[rows],
                                queue.ray_direction[rows])
        origin = offset_origin(ctx, point, normal)
        light = samples.light_tri[rows]
        corners = sc.tri_vertex[light]
        lv0 = corners[:, 0, :3]
        target = (lv0 + samples.light_u[rows][:, None] * (corners[:, 1, :3] - lv0)
                  + samples.light_v[rows][:, None] * (corners[:, 2, :3] - lv0))
        to_light = target - origin
        distance = xp.sqrt(xp.sum(to_light * to_light, axis=1))
        safe_distance = xp.where(distance > 0, distance, 1)
        wi = (to_light / safe_distance[:, None]).astype(np.float32)
        cos_surface = xp.sum(normal * wi, axis=1)
        light_normal = sc.tri_normal[light]
        cos_light = emitter_cosine(ctx, light_normal[:, :3], wi)
        area = light_normal[:, 3]
        ok = (distance > 0) & (cos_surface > 0) & (cos_light > 0) & (area > 0)
        pdf_light = (sc.tri_light_pmf[light] * distance * distance
                     / xp.where(ok, area * cos_light, 1)).astype(np.float32)
        pdf_bsdf = (cos_surface * f32(INV_PI)).astype(np.float32)
        weight = power_heuristic(xp, pdf_light, pdf_bsdf)
        albedo = sc.material_albedo[sc.tri_material[tri], :3]
        emission = sc.material_emission[sc.tri_material[light], :3]
        scale = xp.where(ok, cos_surface * weight / xp.where(ok, pdf_light, 1) * f32(INV_PI), 0)
        shadow.shadow_origin[rows] = origin
        shadow.shadow_direction[rows] = wi
        shadow.shadow_tmax[rows] = xp.where(ok, distance * SHADOW_TMAX_SCALE, -1)
        shadow.shadow_radiance[rows] = (queue.path_throughput[rows] * albedo * emission
                                        * scale[:, None])
        shadow.shadow_pixel[rows] = queue.path_pixel[rows]
    return shadow


def trace_shadow_rays(ctx: RenderContext, queue: PathQueue, hit: HitQueue,
                      samples: LightSampleQueue) -> int:
    """Expand the light samples, test visibility (any hit), add what is unoccluded.

    Returns
    -------
    int
        Shadow rays traced as far as the host knows them: queue entries
        without compaction, the rays that carry light with compaction on the
        array-expression path, and 0 with compaction on the kernel path, where
        they are counted on the device (``COUNTER_SHADOW_RAYS_TOTAL``).
    """
    xp = ctx.xp
    shadow = expand_light_samples(ctx, queue, hit, samples)
    num_counted = shadow.size
    if ctx.compaction:
        shadow, num_counted = compact_shadow_rays(ctx, shadow)
    num_rays = shadow.size
    if num_rays == 0:
        return 0
    tmin = ctx.buffers.ray_tmin[:num_rays]
    with ctx.tracer_stage("render: trace shadow rays"):
        occluded = ctx.tracer.occluded(shadow.shadow_origin, shadow.shadow_direction, tmin,
                                       shadow.shadow_tmax)
    if ctx.use_kernels:
        ctx.launch("render: add unoccluded light", "kd_render_add_unoccluded", num_rays, (
            i32(num_rays), occluded.astype(bool, copy=False), shadow.shadow_tmax,
            shadow.shadow_radiance, shadow.shadow_pixel, ctx.pass_radiance))
    else:
        with ctx.stage("render: add unoccluded light"):
            visible = xp.flatnonzero(~occluded & (shadow.shadow_tmax > 0))
            scatter_add_rows(xp, ctx.pass_radiance, shadow.shadow_pixel[visible],
                             shadow.shadow_radiance[visible])
    return num_counted


def compact_shadow_rays(ctx: RenderContext, shadow: ShadowQueue):
    """Move the shadow rays that carry light (``shadow_tmax > 0``) to the front.

    With the kernels no count comes to the host: the returned queue keeps all
    ``shadow.size`` rows, the rays in front and rows marked dead
    (``shadow_tmax = -1``) behind them, so the traversal's dead threads are
    whole warps at the end that return at once.

    Returns
    -------
    shadow : ShadowQueue
        A view of the compacted buffer.
    num_counted : int
        The rays in front, or 0 when they are counted on the device.
    """
    b = ctx.buffers
    if ctx.use_kernels:
        b.compactor.compact("render: compact shadow rays", shadow, b.shadow_table,
                            b.shadow_compact, dead_to_back=True, total_slot=COUNTER_SHADOW_RAYS,
                            sum_slot=COUNTER_SHADOW_RAYS_TOTAL)
        return b.shadow_compact.prefix(shadow.size), 0
    with ctx.stage("render: compact shadow rays"):
        # device-to-host read on CuPy (the twin's count): it sizes the queue
        num_rays = compact_rows_xp(ctx.xp, shadow, b.shadow_compact)
    return b.shadow_compact.prefix(num_rays), num_rays


def sample_bsdf(ctx: RenderContext, queue: PathQueue, hit: HitQueue, depth: int) -> None:
    """Lambertian reflection, cosine-weighted: the next ray of every live path.

    The throughput is multiplied by the albedo (``f * cos / pdf``); paths on
    black surfaces end.
    """
    xp = ctx.xp
    sc = ctx.scene
    if ctx.use_kernels:
        ctx.launch("render: sample bsdf", "kd_render_sample_bsdf", queue.size, (
            i32(queue.size), f32(sc.ray_epsilon), f32(sc.min_scale),
            stream_salt(depth, DIM_BSDF_PHI),
            stream_salt(depth, DIM_BSDF_R), hit.hit_tri, hit.hit_u, hit.hit_v, sc.tri_vertex,
            sc.tri_normal, sc.tri_material, sc.material_albedo, queue.path_key, queue.ray_origin,
            queue.ray_direction, queue.ray_tmax, queue.path_throughput, queue.path_bsdf_pdf,
            queue.path_depth, queue.path_alive))
        return
    with ctx.stage("render: sample bsdf"):
        live = xp.flatnonzero(queue.path_alive != 0)
        tri = hit.hit_tri[live]
        albedo = sc.material_albedo[sc.tri_material[tri], :3]
        black = xp.max(albedo, axis=1) <= 0
        point, normal = surface(ctx, tri, hit.hit_u[live], hit.hit_v[live],
                                queue.ray_direction[live])
        key = queue.path_key[live]
        phi = uniform_from_key(xp, key, stream_salt(depth, DIM_BSDF_PHI)) * f32(2 * math.pi)
        r2 = uniform_from_key(xp, key, stream_salt(depth, DIM_BSDF_R))
        radius = xp.sqrt(r2)
        local_x = radius * xp.cos(phi)
        local_y = radius * xp.sin(phi)
        local_z = xp.sqrt(xp.maximum(f32(0), f32(1) - r2))
        tangent, bitangent = orthonormal_basis(xp, normal)
        direction = (local_x[:, None] * tangent + local_y[:, None] * bitangent
                     + local_z[:, None] * normal)
        queue.ray_origin[live] = offset_origin(ctx, point, normal)
        queue.ray_direction[live] = normalize_rows(xp, direction)
        queue.path_throughput[live] *= albedo
        queue.path_bsdf_pdf[live] = local_z * f32(INV_PI)
        queue.path_depth[live] += 1
        dead = live[black | (local_z <= 0)]
        end_paths(queue, dead)


def russian_roulette(ctx: RenderContext, queue: PathQueue, depth: int) -> None:
    """End paths at random once ``depth >= rr_start_depth``; reweight survivors.

    A path survives with probability ``q = min(1, max(throughput))`` and its
    throughput is divided by ``q``. ``depth`` is the depth of the paths'
    next vertex.
    """
    if depth < ctx.rr_start_depth:
        return
    xp = ctx.xp
    salt = stream_salt(depth, DIM_ROULETTE)
    if ctx.use_kernels:
        ctx.launch("render: russian roulette", "kd_render_russian_roulette", queue.size, (
            i32(queue.size), salt, queue.path_key, queue.path_throughput, queue.path_alive,
            queue.ray_tmax))
        return
    with ctx.stage("render: russian roulette"):
        live = xp.flatnonzero(queue.path_alive != 0)
        throughput = queue.path_throughput[live]
        survive = xp.minimum(xp.max(throughput, axis=1), f32(1))
        u = uniform_from_key(xp, queue.path_key[live], salt)
        dies = u >= survive
        queue.path_throughput[live] = throughput / xp.where(dies, f32(1), survive)[:, None]
        dead = live[dies]
        end_paths(queue, dead)


def compact_paths(ctx: RenderContext, queue: PathQueue):
    """Move the live paths to the front of the other path buffer, or count them (no compaction).

    Returns
    -------
    queue : PathQueue
        The compacted queue (a view of the other buffer), or the same one.
    num_live : int
        Live paths (a device-to-host read: the loop needs it to stop, and
        the next bounce's launches are sized by it).
    """
    xp = ctx.xp
    if not ctx.compaction:
        with ctx.stage("render: count live paths"):
            return queue, int(xp.count_nonzero(queue.path_alive))
    b = ctx.buffers
    source, target = b.current, 1 - b.current
    if ctx.use_kernels:
        b.compactor.compact("render: compact paths", queue, b.path_tables[source], b.paths[target],
                            total_slot=COUNTER_LIVE_PATHS)
        # device-to-host read of the count (the loop's one synchronization per bounce)
        num_live = int(b.compactor.read_counters()[COUNTER_LIVE_PATHS])
    else:
        with ctx.stage("render: compact paths"):
            num_live = compact_rows_xp(xp, queue, b.paths[target])
    b.current = target
    return b.paths[target].prefix(num_live), num_live


def accumulate_film(ctx: RenderContext) -> None:
    """Add the pass's radiance to the film sum and clear it for the next pass."""
    with ctx.stage("render: accumulate film"):
        ctx.film_sum += ctx.pass_radiance
        ctx.pass_radiance.fill(0)

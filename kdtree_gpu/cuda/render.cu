// Wavefront path tracer stages (kdtree_gpu/render/stages.py launches every
// kernel here and holds its NumPy twin; kdtree_gpu/render/__init__.py
// documents the estimator).
//
// One thread per queue entry. Queues are structures of arrays: (n, 3) float
// fields are read as three floats, (n,) fields as one value. Triangle and
// material records are float4 (16-byte loads). Dead paths (path_alive == 0)
// return at once; with compaction off they still take a thread.
//
// Random numbers: kd_uniform(key, salt) = 24 high bits of pcg(key + salt),
// bit-identical to kdtree_gpu.render.sampling.uniform_from_key.


__device__ __forceinline__ unsigned int kd_pcg(unsigned int x)
{
    unsigned int state = x * 747796405u + 2891336453u;
    unsigned int word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

__device__ __forceinline__ float kd_uniform(unsigned int key, unsigned int salt)
{
    return (float)(kd_pcg(key + salt) >> 8) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ float3 kd_load3(const float* a, int i)
{
    return make_float3(a[3 * i], a[3 * i + 1], a[3 * i + 2]);
}

__device__ __forceinline__ void kd_store3(float* a, int i, float3 v)
{
    a[3 * i] = v.x;
    a[3 * i + 1] = v.y;
    a[3 * i + 2] = v.z;
}

__device__ __forceinline__ float3 kd_xyz(float4 v) { return make_float3(v.x, v.y, v.z); }
__device__ __forceinline__ float3 kd_add(float3 a, float3 b) { return make_float3(a.x + b.x, a.y + b.y, a.z + b.z); }
__device__ __forceinline__ float3 kd_sub(float3 a, float3 b) { return make_float3(a.x - b.x, a.y - b.y, a.z - b.z); }
__device__ __forceinline__ float3 kd_mul(float3 a, float3 b) { return make_float3(a.x * b.x, a.y * b.y, a.z * b.z); }
__device__ __forceinline__ float3 kd_scale(float3 a, float s) { return make_float3(a.x * s, a.y * s, a.z * s); }
__device__ __forceinline__ float kd_dot(float3 a, float3 b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
__device__ __forceinline__ float kd_max3(float3 a) { return fmaxf(a.x, fmaxf(a.y, a.z)); }

__device__ __forceinline__ float3 kd_normalize(float3 a)
{
    return kd_scale(a, rsqrtf(kd_dot(a, a)));
}

__device__ __forceinline__ void kd_add_radiance(float* pass_radiance, int pixel, float3 v)
{
    // several paths of one pass may share a pixel (samples batched per pass)
    atomicAdd(pass_radiance + 3 * pixel, v.x);
    atomicAdd(pass_radiance + 3 * pixel + 1, v.y);
    atomicAdd(pass_radiance + 3 * pixel + 2, v.z);
}

// Hit point and unit geometric normal turned against the incoming direction.
__device__ __forceinline__ void kd_surface(const float4* __restrict__ tri_vertex,
                                           const float4* __restrict__ tri_normal, int tri,
                                           float u, float v, float3 direction, float3* point,
                                           float3* normal)
{
    float3 v0 = kd_xyz(tri_vertex[3 * tri]);
    float3 v1 = kd_xyz(tri_vertex[3 * tri + 1]);
    float3 v2 = kd_xyz(tri_vertex[3 * tri + 2]);
    *point = kd_add(v0, kd_add(kd_scale(kd_sub(v1, v0), u), kd_scale(kd_sub(v2, v0), v)));
    float3 n = kd_xyz(tri_normal[tri]);
    *normal = kd_dot(n, direction) < 0.0f ? n : kd_scale(n, -1.0f);
}

// Origin of a ray leaving `point`: pushed along `normal` by ray_epsilon times
// the point's largest coordinate magnitude (at least min_scale).
__device__ __forceinline__ float3 kd_offset_origin(float3 point, float3 normal, float ray_epsilon,
                                                   float min_scale)
{
    float scale = fmaxf(fmaxf(fabsf(point.x), fabsf(point.y)), fmaxf(fabsf(point.z), min_scale));
    return kd_add(point, kd_scale(normal, ray_epsilon * scale));
}

// Cosine at an emitter between its normal and the direction toward the
// receiver (-direction of the ray that reaches it); <= 0 when the ray meets the
// back of a one-sided emitter, which emits nothing there.
__device__ __forceinline__ float kd_emitter_cosine(float3 normal, float3 direction, int two_sided)
{
    float c = -kd_dot(normal, direction);
    return two_sided ? fabsf(c) : c;
}

// Solid-angle density with which light sampling picks a point of emitter
// `light` (of the given area) at `distance`, seen at cosine cos_light > 0;
// +inf for a degenerate emitter, which light sampling cannot pick (BSDF
// sampling then takes all the weight).
__device__ __forceinline__ float kd_light_pdf(const float* __restrict__ tri_light_pmf, int light,
                                              float area, float distance, float cos_light)
{
    return area > 0.0f ? tri_light_pmf[light] * distance * distance / (area * cos_light)
                       : __int_as_float(0x7f800000);
}

__device__ __forceinline__ float kd_power_heuristic(float pdf_a, float pdf_b)
{
    float a2 = pdf_a * pdf_a;
    float total = a2 + pdf_b * pdf_b;
    return total > 0.0f ? a2 / total : 0.0f;
}

// Generate camera rays: path i is pixel i % num_pixels, sample first_sample + i / num_pixels.
// camera: eye, right * half_width, up * half_height, forward (12 floats).
extern "C" __global__ void kd_render_generate_camera_rays(
    int n, int width, int height, int first_sample, unsigned int seed_hash,
    unsigned int salt_x, unsigned int salt_y, const float* __restrict__ camera,
    float* __restrict__ ray_origin, float* __restrict__ ray_direction,
    float* __restrict__ ray_tmax, float* __restrict__ path_throughput,
    float* __restrict__ path_bsdf_pdf, int* __restrict__ path_pixel,
    unsigned int* __restrict__ path_key, int* __restrict__ path_depth,
    unsigned char* __restrict__ path_alive)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int num_pixels = width * height;
    int pixel = i % num_pixels;
    unsigned int sample = (unsigned int)(first_sample + i / num_pixels);
    unsigned int key = kd_pcg(kd_pcg(sample + seed_hash) + (unsigned int)pixel);
    float jitter_x = kd_uniform(key, salt_x);
    float jitter_y = kd_uniform(key, salt_y);
    float sx = ((float)(pixel % width) + jitter_x) * (2.0f / (float)width) - 1.0f;
    float sy = 1.0f - ((float)(pixel / width) + jitter_y) * (2.0f / (float)height);
    float3 eye = make_float3(camera[0], camera[1], camera[2]);
    float3 right = make_float3(camera[3], camera[4], camera[5]);
    float3 up = make_float3(camera[6], camera[7], camera[8]);
    float3 forward = make_float3(camera[9], camera[10], camera[11]);
    float3 direction = kd_normalize(kd_add(forward, kd_add(kd_scale(right, sx), kd_scale(up, sy))));
    kd_store3(ray_origin, i, eye);
    kd_store3(ray_direction, i, direction);
    ray_tmax[i] = __int_as_float(0x7f800000);  // +inf
    kd_store3(path_throughput, i, make_float3(1.0f, 1.0f, 1.0f));
    path_bsdf_pdf[i] = 0.0f;
    path_pixel[i] = pixel;
    path_key[i] = key;
    path_depth[i] = 0;
    path_alive[i] = 1;
}

// Handle escaped rays: background radiance (weight 1: not light-sampled), path ends.
extern "C" __global__ void kd_render_handle_escaped_rays(
    int n, const int* __restrict__ hit_tri, float background_r, float background_g,
    float background_b, const float* __restrict__ path_throughput,
    const int* __restrict__ path_pixel, unsigned char* __restrict__ path_alive,
    float* __restrict__ ray_tmax, float* __restrict__ pass_radiance)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !path_alive[i] || hit_tri[i] >= 0) return;
    float3 background = make_float3(background_r, background_g, background_b);
    if (kd_max3(background) > 0.0f) {
        kd_add_radiance(pass_radiance, path_pixel[i], kd_mul(kd_load3(path_throughput, i), background));
    }
    path_alive[i] = 0;
    ray_tmax[i] = -1.0f;
}

// Add emission at the hit, MIS-weighted against light sampling after depth 0;
// end every path when this is the last depth.
extern "C" __global__ void kd_render_add_emission(
    int n, int depth, int last, int two_sided, const float* __restrict__ hit_t,
    const int* __restrict__ hit_tri,
    const float* __restrict__ ray_direction, const float* __restrict__ path_throughput,
    const float* __restrict__ path_bsdf_pdf, const int* __restrict__ path_pixel,
    const float4* __restrict__ tri_normal, const int* __restrict__ tri_material,
    const float4* __restrict__ material_emission, const float* __restrict__ tri_light_pmf,
    unsigned char* __restrict__ path_alive, float* __restrict__ ray_tmax,
    float* __restrict__ pass_radiance)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !path_alive[i]) return;
    int tri = hit_tri[i];
    float3 emission = kd_xyz(material_emission[tri_material[tri]]);
    float4 normal = tri_normal[tri];
    float cos_light = kd_emitter_cosine(kd_xyz(normal), kd_load3(ray_direction, i), two_sided);
    if (kd_max3(emission) > 0.0f && cos_light > 0.0f) {
        float weight = 1.0f;
        if (depth > 0) {
            float pdf_light = kd_light_pdf(tri_light_pmf, tri, normal.w, hit_t[i], cos_light);
            weight = kd_power_heuristic(path_bsdf_pdf[i], pdf_light);
        }
        float3 radiance = kd_scale(kd_mul(kd_load3(path_throughput, i), emission), weight);
        kd_add_radiance(pass_radiance, path_pixel[i], radiance);
    }
    if (last) {
        path_alive[i] = 0;
        ray_tmax[i] = -1.0f;
    }
}

// Sample lights: a light triangle from the alias table, a uniform point on it
// (barycentrics sqrt(r1) (1 - r2), sqrt(r1) r2).
extern "C" __global__ void kd_render_sample_lights(
    int n, int num_lights, unsigned int salt_select, unsigned int salt_u, unsigned int salt_v,
    const unsigned char* __restrict__ path_alive, const unsigned int* __restrict__ path_key,
    const int* __restrict__ hit_tri, const int* __restrict__ tri_material,
    const float4* __restrict__ material_albedo, const int* __restrict__ light_tri,
    const float* __restrict__ light_alias_prob, const int* __restrict__ light_alias_index,
    int* __restrict__ sample_tri, float* __restrict__ sample_u, float* __restrict__ sample_v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    sample_tri[i] = -1;
    if (!path_alive[i] || num_lights == 0) return;
    if (kd_max3(kd_xyz(material_albedo[tri_material[hit_tri[i]]])) <= 0.0f) return;
    unsigned int key = path_key[i];
    float scaled = kd_uniform(key, salt_select) * (float)num_lights;
    int bucket = min((int)scaled, num_lights - 1);
    int chosen = (scaled - (float)bucket) < light_alias_prob[bucket] ? bucket : light_alias_index[bucket];
    float r1 = kd_uniform(key, salt_u);
    float r2 = kd_uniform(key, salt_v);
    float su = sqrtf(r1);
    sample_tri[i] = light_tri[chosen];
    sample_u[i] = su * (1.0f - r2);
    sample_v[i] = su * r2;
}

// Expand light samples into shadow rays carrying their MIS-weighted radiance.
extern "C" __global__ void kd_render_expand_light_samples(
    int n, float ray_epsilon, float min_scale, int two_sided, const int* __restrict__ hit_tri,
    const float* __restrict__ hit_u,
    const float* __restrict__ hit_v, const float* __restrict__ ray_direction,
    const float* __restrict__ path_throughput, const int* __restrict__ path_pixel,
    const int* __restrict__ sample_tri, const float* __restrict__ sample_u,
    const float* __restrict__ sample_v, const float4* __restrict__ tri_vertex,
    const float4* __restrict__ tri_normal, const int* __restrict__ tri_material,
    const float4* __restrict__ material_albedo, const float4* __restrict__ material_emission,
    const float* __restrict__ tri_light_pmf, float* __restrict__ shadow_origin,
    float* __restrict__ shadow_direction, float* __restrict__ shadow_tmax,
    float* __restrict__ shadow_radiance, int* __restrict__ shadow_pixel)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    shadow_tmax[i] = -1.0f;
    int light = sample_tri[i];
    if (light < 0) return;
    int tri = hit_tri[i];
    float3 point, normal;
    kd_surface(tri_vertex, tri_normal, tri, hit_u[i], hit_v[i], kd_load3(ray_direction, i), &point,
               &normal);
    float3 origin = kd_offset_origin(point, normal, ray_epsilon, min_scale);
    float3 l0 = kd_xyz(tri_vertex[3 * light]);
    float3 l1 = kd_xyz(tri_vertex[3 * light + 1]);
    float3 l2 = kd_xyz(tri_vertex[3 * light + 2]);
    float3 target = kd_add(l0, kd_add(kd_scale(kd_sub(l1, l0), sample_u[i]),
                                      kd_scale(kd_sub(l2, l0), sample_v[i])));
    float3 to_light = kd_sub(target, origin);
    float distance = sqrtf(kd_dot(to_light, to_light));
    if (!(distance > 0.0f)) return;
    float3 wi = kd_scale(to_light, 1.0f / distance);
    float cos_surface = kd_dot(normal, wi);
    float4 light_normal = tri_normal[light];
    float cos_light = kd_emitter_cosine(kd_xyz(light_normal), wi, two_sided);
    float area = light_normal.w;
    if (!(cos_surface > 0.0f && cos_light > 0.0f && area > 0.0f)) return;
    float pdf_light = kd_light_pdf(tri_light_pmf, light, area, distance, cos_light);
    float pdf_bsdf = cos_surface * KD_INV_PI;
    float weight = kd_power_heuristic(pdf_light, pdf_bsdf);
    float3 albedo = kd_xyz(material_albedo[tri_material[tri]]);
    float3 emission = kd_xyz(material_emission[tri_material[light]]);
    float scale = cos_surface * weight / pdf_light * KD_INV_PI;
    kd_store3(shadow_origin, i, origin);
    kd_store3(shadow_direction, i, wi);
    shadow_tmax[i] = distance * KD_SHADOW_TMAX_SCALE;
    kd_store3(shadow_radiance, i,
              kd_scale(kd_mul(kd_mul(kd_load3(path_throughput, i), albedo), emission), scale));
    shadow_pixel[i] = path_pixel[i];
}

// Add the radiance of shadow rays that reached their light.
extern "C" __global__ void kd_render_add_unoccluded(
    int n, const bool* __restrict__ occluded, const float* __restrict__ shadow_tmax,
    const float* __restrict__ shadow_radiance, const int* __restrict__ shadow_pixel,
    float* __restrict__ pass_radiance)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || occluded[i] || !(shadow_tmax[i] > 0.0f)) return;
    kd_add_radiance(pass_radiance, shadow_pixel[i], kd_load3(shadow_radiance, i));
}

// Sample the Lambertian BSDF (cosine-weighted): next ray, throughput *= albedo.
// Tangent frame: Duff et al. 2017, "Building an orthonormal basis, revisited".
extern "C" __global__ void kd_render_sample_bsdf(
    int n, float ray_epsilon, float min_scale, unsigned int salt_phi, unsigned int salt_r,
    const int* __restrict__ hit_tri, const float* __restrict__ hit_u,
    const float* __restrict__ hit_v, const float4* __restrict__ tri_vertex,
    const float4* __restrict__ tri_normal, const int* __restrict__ tri_material,
    const float4* __restrict__ material_albedo, const unsigned int* __restrict__ path_key,
    float* __restrict__ ray_origin, float* __restrict__ ray_direction,
    float* __restrict__ ray_tmax, float* __restrict__ path_throughput,
    float* __restrict__ path_bsdf_pdf, int* __restrict__ path_depth,
    unsigned char* __restrict__ path_alive)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !path_alive[i]) return;
    int tri = hit_tri[i];
    float3 albedo = kd_xyz(material_albedo[tri_material[tri]]);
    float3 point, normal;
    kd_surface(tri_vertex, tri_normal, tri, hit_u[i], hit_v[i], kd_load3(ray_direction, i), &point,
               &normal);
    unsigned int key = path_key[i];
    // sincospif(2u) = sin, cos of 2 pi u without the local-memory range
    // reduction that sinf/cosf carry for large arguments
    float sin_phi, cos_phi;
    sincospif(2.0f * kd_uniform(key, salt_phi), &sin_phi, &cos_phi);
    float r2 = kd_uniform(key, salt_r);
    float radius = sqrtf(r2);
    float local_x = radius * cos_phi;
    float local_y = radius * sin_phi;
    float local_z = sqrtf(fmaxf(0.0f, 1.0f - r2));
    float sign = normal.z >= 0.0f ? 1.0f : -1.0f;
    float a = -1.0f / (sign + normal.z);
    float b = normal.x * normal.y * a;
    float3 tangent = make_float3(1.0f + sign * normal.x * normal.x * a, sign * b, -sign * normal.x);
    float3 bitangent = make_float3(b, sign + normal.y * normal.y * a, -normal.y);
    float3 direction = kd_normalize(kd_add(kd_add(kd_scale(tangent, local_x), kd_scale(bitangent, local_y)),
                                           kd_scale(normal, local_z)));
    kd_store3(ray_origin, i, kd_offset_origin(point, normal, ray_epsilon, min_scale));
    kd_store3(ray_direction, i, direction);
    kd_store3(path_throughput, i, kd_mul(kd_load3(path_throughput, i), albedo));
    path_bsdf_pdf[i] = local_z * KD_INV_PI;
    path_depth[i] += 1;
    if (kd_max3(albedo) <= 0.0f || local_z <= 0.0f) {
        path_alive[i] = 0;
        ray_tmax[i] = -1.0f;
    }
}

// Russian roulette: survive with q = min(1, max(throughput)), throughput /= q.
extern "C" __global__ void kd_render_russian_roulette(
    int n, unsigned int salt, const unsigned int* __restrict__ path_key,
    float* __restrict__ path_throughput, unsigned char* __restrict__ path_alive,
    float* __restrict__ ray_tmax)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !path_alive[i]) return;
    float3 throughput = kd_load3(path_throughput, i);
    float survive = fminf(kd_max3(throughput), 1.0f);
    if (kd_uniform(path_key[i], salt) >= survive) {
        path_alive[i] = 0;
        ray_tmax[i] = -1.0f;
        return;
    }
    kd_store3(path_throughput, i, kd_scale(throughput, 1.0f / survive));
}

// --- Stream compaction of a queue (GAPT part 11, section 11.1) ----------------------
// (driven by kdtree_gpu/render/compaction.py: Compactor; its twin is compact_rows_xp)
// Two launches over tiles of `tile_size` consecutive rows, one block per tile:
//   kd_render_count_live_tiles   live rows of each tile
//   kd_render_compact_rows       each block adds up the counts of the tiles
//                                before it (a few KB, from L2), ranks its live
//                                rows with a block scan, and moves every field
//                                of each live row to its rank, in order
// The fields are described by a table of (source, destination, bytes per row)
// for all of them, so one launch moves a whole SoA queue. Source and
// destination must not overlap (the queues ping-pong between two buffers).
// A row is live when flag[i] != 0 (uint8 flag) or flag[i] > 0 (float flag).

__device__ __forceinline__ int kd_row_is_live(const void* flag, int flag_kind, int i)
{
    return flag_kind == KD_COMPACT_FLAG_U8 ? (((const unsigned char*)flag)[i] != 0)
                                           : (((const float*)flag)[i] > 0.0f);
}

// Live rows of each tile: tile_count[blockIdx.x].
extern "C" __global__ void kd_render_count_live_tiles(
    int n, int tile_size, const void* __restrict__ flag, int flag_kind,
    int* __restrict__ tile_count)
{
    int start = blockIdx.x * tile_size;
    int end = min(n, start + tile_size);
    int count = 0;
    // the loop bound is the same for the whole block: every thread reaches the barrier
    for (int base = start; base < end; base += blockDim.x) {
        int i = base + threadIdx.x;
        count += __syncthreads_count(i < end && kd_row_is_live(flag, flag_kind, i));
    }
    if (threadIdx.x == 0) tile_count[blockIdx.x] = count;
}

// Move the live rows of every field to their rank among the live rows (order
// kept). field_table holds 3 * num_fields values: source address, destination
// address, bytes per row. With dead_to_back, the flag of dead row number r
// (in order) is set to dead (0, or -1.0f) at destination row n - 1 - r, so
// rows [num_live, n) of the destination are all dead: a later launch over n
// rows needs no count from the host. The last tile writes the number of live
// rows to counters[total_slot] and, when sum_slot >= 0, adds it to
// counters[sum_slot].
extern "C" __global__ void kd_render_compact_rows(
    int n, int tile_size, int num_tiles, const void* __restrict__ flag, int flag_kind,
    const int* __restrict__ tile_count, int num_fields, const long long* __restrict__ field_table,
    int dead_to_back, void* __restrict__ flag_out, long long* __restrict__ counters,
    int total_slot, int sum_slot)
{
    __shared__ long long table[3 * KD_COMPACT_MAX_FIELDS];
    __shared__ int warp_live[KD_COMPACT_MAX_WARPS];
    __shared__ int tile_base;
    int tile = blockIdx.x;
    for (int k = threadIdx.x; k < 3 * num_fields; k += blockDim.x) table[k] = field_table[k];
    if (threadIdx.x == 0) tile_base = 0;
    __syncthreads();
    // live rows before this tile
    int before = 0;
    for (int t = threadIdx.x; t < tile; t += blockDim.x) before += tile_count[t];
    if (before) atomicAdd(&tile_base, before);
    __syncthreads();

    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int num_warps = (blockDim.x + 31) >> 5;
    int running = tile_base;  // live rows before the current chunk
    int start = tile * tile_size;
    int end = min(n, start + tile_size);
    for (int base = start; base < end; base += blockDim.x) {
        int i = base + threadIdx.x;
        int live = i < end && kd_row_is_live(flag, flag_kind, i);
        unsigned int ballot = __ballot_sync(0xffffffffu, live);
        if (lane == 0) warp_live[warp] = __popc(ballot);
        __syncthreads();
        // live rows before row i: earlier chunks, earlier warps, earlier lanes
        int rank = running + __popc(ballot & ((1u << lane) - 1u));
        int chunk_live = 0;
        for (int w = 0; w < num_warps; ++w) {
            int c = warp_live[w];
            rank += w < warp ? c : 0;
            chunk_live += c;
        }
        __syncthreads();  // warp_live is written again by the next chunk
        if (live) {
            for (int f = 0; f < num_fields; ++f) {
                const char* src = (const char*)table[3 * f];
                char* dst = (char*)table[3 * f + 1];
                long long row_bytes = table[3 * f + 2];
                if ((row_bytes & 3) == 0) {
                    const unsigned int* s = (const unsigned int*)(src + (long long)i * row_bytes);
                    unsigned int* d = (unsigned int*)(dst + (long long)rank * row_bytes);
                    for (long long w = 0; w < (row_bytes >> 2); ++w) d[w] = s[w];
                } else {
                    const char* s = src + (long long)i * row_bytes;
                    char* d = dst + (long long)rank * row_bytes;
                    for (long long b = 0; b < row_bytes; ++b) d[b] = s[b];
                }
            }
        } else if (dead_to_back && i < end) {
            int slot = n - 1 - (i - rank);
            if (flag_kind == KD_COMPACT_FLAG_U8) {
                ((unsigned char*)flag_out)[slot] = 0;
            } else {
                ((float*)flag_out)[slot] = -1.0f;
            }
        }
        running += chunk_live;
    }
    if (tile == num_tiles - 1 && threadIdx.x == 0) {
        counters[total_slot] = running;
        if (sum_slot >= 0) counters[sum_slot] += running;
    }
}

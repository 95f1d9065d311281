// gpusnap dirty-chunk fingerprint: the GPU side of gpusnap/device/fingerprint.py, whose
// docstring is the definition; this file must give the same 16 bytes per chunk, bit for bit.
//
// Launch order (gpusnap/device/cuda.py): a chunk table in device memory (per chunk: its device
// address and its length in bytes, two u64), `acc` zeroed (2 u64 per chunk), then
// gpusnap_fp_accumulate over grid (blocks_per_chunk * chunks), then gpusnap_fp_finalize over
// the chunks, in place. One launch covers every chunk of every range of a device, wherever they
// lie. Compiled by NVRTC; no headers, so it builds with nothing but NVRTC.

typedef unsigned long long u64;

#define GPUSNAP_K0 0x9E3779B97F4A7C15ull
#define GPUSNAP_C1 0xBF58476D1CE4E5B9ull
#define GPUSNAP_C2 0x94D049BB133111EBull
// Words each thread reads per tile; loads are issued before the arithmetic so several are in
// flight per thread, which is what keeps HBM busy.
#define GPUSNAP_WORDS_PER_THREAD 8

__device__ __forceinline__ u64 gpusnap_fin(u64 x) {
    x ^= x >> 33;
    x *= GPUSNAP_C2;
    x ^= x >> 29;
    x *= GPUSNAP_C1;
    x ^= x >> 32;
    return x;
}

// Word `i` of a chunk starting at `p` with `n` bytes: little-endian, zero-padded past n.
__device__ __forceinline__ u64 gpusnap_word(const unsigned char* p, u64 n, u64 i, bool aligned) {
    u64 at = i * 8;
    if (aligned && at + 8 <= n) {
        return *(const u64*)(p + at);
    }
    u64 w = 0;
    for (int b = 0; b < 8; ++b) {
        if (at + b < n) w |= (u64)p[at + b] << (8 * b);
    }
    return w;
}

__device__ __forceinline__ u64 gpusnap_warp_sum(u64 v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

extern "C" __global__ void gpusnap_fp_accumulate(
    const u64* table, u64 chunks, unsigned int blocks_per_chunk, u64* acc) {
    const u64 chunk = blockIdx.x / blocks_per_chunk;
    const u64 tile = blockIdx.x % blocks_per_chunk;
    if (chunk >= chunks) return;  // the same for every thread of the block
    const unsigned char* p = (const unsigned char*)table[2 * chunk];
    const u64 n = table[2 * chunk + 1];
    const bool aligned = (((u64)p) & 7) == 0;
    const u64 words = (n + 7) / 8;
    const u64 tile_words = (u64)blockDim.x * GPUSNAP_WORDS_PER_THREAD;

    u64 a = 0, b = 0;
    // Grid-stride over the chunk's tiles, so any blocks_per_chunk covers every word.
    for (u64 first = tile * tile_words; first < words; first += (u64)blocks_per_chunk * tile_words) {
        u64 w[GPUSNAP_WORDS_PER_THREAD];
#pragma unroll
        for (int j = 0; j < GPUSNAP_WORDS_PER_THREAD; ++j) {
            u64 i = first + (u64)j * blockDim.x + threadIdx.x;
            w[j] = (i < words) ? gpusnap_word(p, n, i, aligned) : 0;
        }
#pragma unroll
        for (int j = 0; j < GPUSNAP_WORDS_PER_THREAD; ++j) {
            u64 i = first + (u64)j * blockDim.x + threadIdx.x;
            if (i < words) {
                u64 m = (w[j] ^ ((i + 1) * GPUSNAP_K0)) * GPUSNAP_C1;
                m ^= m >> 31;
                a += m;
                b += ((m << 27) | (m >> 37)) * GPUSNAP_C2;
            }
        }
    }

    // Sums modulo 2^64 are order-free: reduce per warp, per block, then one atomic per block.
    __shared__ u64 sa[32], sb[32];
    a = gpusnap_warp_sum(a);
    b = gpusnap_warp_sum(b);
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const unsigned int warps = (blockDim.x + 31) / 32;
        a = (lane < warps) ? sa[lane] : 0;
        b = (lane < warps) ? sb[lane] : 0;
        a = gpusnap_warp_sum(a);
        b = gpusnap_warp_sum(b);
        if (lane == 0) {
            atomicAdd(&acc[2 * chunk], a);
            atomicAdd(&acc[2 * chunk + 1], b);
        }
    }
}

// acc[2c], acc[2c+1] become the chunk's fingerprint (lo, hi): on a little-endian device the
// array's bytes are then exactly the reference's 16 bytes per chunk.
extern "C" __global__ void gpusnap_fp_finalize(const u64* table, u64 chunks, u64* acc) {
    const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    const u64 n = table[2 * c + 1];
    acc[2 * c] = gpusnap_fin(acc[2 * c] ^ n);
    acc[2 * c + 1] = gpusnap_fin(acc[2 * c + 1] + n * GPUSNAP_K0);
}

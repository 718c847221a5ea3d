"""The floor for the backward's gathers: warps summing 256-byte fp16 rows picked at random from
an L2-resident table (documents: 128 x 300 rows, 9.8 MB; queries: 4,096 rows, 1 MB), 524,288
rows in all, the count each gradient of the ColBERT in-batch step gathers; rows in flight per
warp and rows per warp vary. Nothing but the loads, a shift to widen each element (bf16-style,
cheaper than fp16's convert) and adds: what the dQ and dD kernels' gathers are read against.

    python bench/gather_floor.py > bench/results/gather-floor-<date>-<commit>.txt
"""
import cupy as cp
import numpy as np

KERNEL = r'''
extern "C" __global__ void __launch_bounds__(256) gather(const unsigned short* table, const int* rows, int per_warp,
                                                       float* out) {
    const int lane = threadIdx.x & 31;
    const long warp = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    const int* my = rows + warp * per_warp;
    float acc[4] = {0, 0, 0, 0};
    for (int j0 = 0; j0 < per_warp; j0 += 32) {
        const int mine = my[j0 + lane];
        for (int u0 = 0; u0 < 32; u0 += INFLIGHT) {
            uint2 v[INFLIGHT];
#pragma unroll
            for (int u = 0; u < INFLIGHT; ++u) {
                const int r = __shfl_sync(0xffffffffu, mine, u0 + u);
                v[u] = *(const uint2*)(table + (long)r * 128 + lane * 4);
            }
#pragma unroll
            for (int u = 0; u < INFLIGHT; ++u) {
                acc[0] += __uint_as_float(v[u].x << 16); acc[1] += __uint_as_float(v[u].x & 0xffff0000u);
                acc[2] += __uint_as_float(v[u].y << 16); acc[3] += __uint_as_float(v[u].y & 0xffff0000u);
            }
        }
    }
    out[warp * 32 + lane] = acc[0] + acc[1] + acc[2] + acc[3];
}
'''
ROWS = 524_288  # 128 x 32 query tokens x 128 documents: one gradient's gathers


def main() -> int:
    rng = np.random.default_rng(0)
    print("| table | rows per warp | in flight | ms | TB/s of rows |")
    for name, table_rows in (("D 9.8 MB", 128 * 300), ("Q 1 MB", 4096)):
        table = cp.asarray(rng.standard_normal((table_rows, 128)).astype(np.float16)).view(cp.uint16)
        rows = cp.asarray(rng.integers(0, table_rows, ROWS).astype(np.int32))
        for inflight in (4, 8, 16):
            kernel = cp.RawKernel(KERNEL, "gather", options=(f"-DINFLIGHT={inflight}",))
            for per_warp in (32, 64, 128):
                warps = ROWS // per_warp
                out = cp.empty(warps * 32, cp.float32)
                args, grid = (table, rows, np.int32(per_warp), out), (warps * 32 // 256,)
                for _ in range(3):
                    kernel(grid, (256,), args)
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                best = float("inf")
                for _ in range(5):
                    start.record()
                    for _ in range(10):
                        kernel(grid, (256,), args)
                    stop.record()
                    stop.synchronize()
                    best = min(best, cp.cuda.get_elapsed_time(start, stop) / 10)
                print(f"| {name} | {per_warp} | {inflight} | {best:.4f} | {ROWS * 256 / best / 1e9:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

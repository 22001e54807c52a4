/* Decode's matrix products on the CPU: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for a few rows m of x,
 * reading the weight in the layout oneDNN packed it into for its bf16 matmul (see cpu_gemv.py, which checks
 * that layout, and its block height B, before this kernel is used):
 *
 *     w[n, k] lives at ((n / B) * (k_padded / 2) + k / 2) * 2B + (n % B) * 2 + k % 2
 *
 * i.e. blocks of B output rows; inside a block, for each pair of k, the B rows' two values side by side
 * (zeros pad n up to a multiple of B and k up to k_padded). oneDNN picks B = 32 where the CPU has AMX and
 * B = 64 on AVX512-BF16 without it. One 64-byte load is the (k, k+1) pair of 16 rows, and AVX512-BF16's
 * vdpbf16ps multiplies it by the broadcast pair (x[k], x[k+1]) into 16 float32 sums at once: no horizontal
 * reductions, and the weight streams once, in order, per thread.
 *
 * With one to eight rows of x the product is bound by reading w. Each output element is summed in float32
 * over k pairs in increasing order by one accumulator lane and rounded to bf16 (nearest even) once, so its
 * bits depend only on x's row and w's row: not on how many rows x has, the thread count, B or which thread
 * computed it. Batched and single-lane decode therefore give the same bits.
 *
 * Threads: OpenMP, linked against the runtime torch loaded (same soname), so it shares torch's pool.
 */
#include <immintrin.h>
#include <stdint.h>

#include "cpu_simd.h"

#define MAX_GROUPS 4   /* 16-row groups in a block: 2 (B = 32) or 4 (B = 64) */
#define MAX_X_ROWS 8   /* rows of x per pass over a block: groups * rows accumulators must fit 32 registers */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif

static inline __attribute__((always_inline)) void block_product(const uint16_t *x, int64_t x_stride, int count,
                                                                int groups, const uint16_t *block,
                                                                int64_t k_pairs,
                                                                __m512 acc[MAX_GROUPS][MAX_X_ROWS]) {
    for (int g = 0; g < groups; g++)
        for (int m = 0; m < count; m++) acc[g][m] = _mm512_setzero_ps();
    const int64_t pair_elements = 32 * groups; /* one k pair of the block's rows: groups * 64 bytes */
    const char *ahead = (const char *)block + PREFETCH_BYTES;
    for (int64_t j = 0; j < k_pairs; j++) {
        __m512bh w[MAX_GROUPS];
        for (int g = 0; g < groups; g++) {
            _mm_prefetch(ahead + (j * groups + g) * 64, _MM_HINT_T0);
            w[g] = (__m512bh)_mm512_loadu_si512((const void *)(block + j * pair_elements + g * 32));
        }
        for (int m = 0; m < count; m++) {
            __m512bh pair = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(x + m * x_stride + 2 * j));
            for (int g = 0; g < groups; g++) acc[g][m] = _mm512_dpbf16_ps(acc[g][m], w[g], pair);
        }
    }
}

static inline void store_rows(__m512 sums, const uint16_t *bias, uint16_t *out, int64_t valid) {
    __mmask16 mask = first_lanes(valid);
    if (bias) sums = _mm512_add_ps(sums, widen(_mm256_maskz_loadu_epi16(mask, (const void *)bias)));
    __m256i rounded = (__m256i)_mm512_cvtneps_pbh(sums);
    _mm256_mask_storeu_epi16((void *)out, mask, rounded);
}

/* A literal (count, groups) per call lets the compiler unroll the inner loops and keep every accumulator in
 * a register. */
#define CASE(COUNT, GROUPS) \
    case COUNT: block_product(xs, x_stride, COUNT, GROUPS, block, k_pairs, acc); break;

static void product_blocks(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *w,
                           const uint16_t *bias, uint16_t *y, int64_t y_stride, int64_t n, int64_t k_pairs,
                           int64_t pair_stride, int groups, int64_t first_block, int64_t last_block) {
    __m512 acc[MAX_GROUPS][MAX_X_ROWS];
    const int64_t block_rows = 16 * groups, pass_rows = groups == 2 ? 8 : 4;
    for (int64_t b = first_block; b < last_block; b++) {
        const uint16_t *block = w + b * pair_stride * 2 * block_rows;
        int64_t n0 = b * block_rows;
        for (int64_t m0 = 0; m0 < rows; m0 += pass_rows) {
            int count = (int)(rows - m0 < pass_rows ? rows - m0 : pass_rows);
            const uint16_t *xs = x + m0 * x_stride;
            if (groups == 2) {
                switch (count) {
                CASE(1, 2) CASE(2, 2) CASE(3, 2) CASE(4, 2) CASE(5, 2) CASE(6, 2) CASE(7, 2)
                default: block_product(xs, x_stride, 8, 2, block, k_pairs, acc); break;
                }
            } else {
                switch (count) {
                CASE(1, 4) CASE(2, 4) CASE(3, 4)
                default: block_product(xs, x_stride, 4, 4, block, k_pairs, acc); break;
                }
            }
            for (int m = 0; m < count; m++) {
                uint16_t *out = y + (m0 + m) * y_stride + n0;
                for (int g = 0; g < groups; g++) {
                    int64_t valid = n - (n0 + 16 * g);
                    if (valid <= 0) break;
                    store_rows(acc[g][m], bias ? bias + n0 + 16 * g : 0, out + 16 * g, valid);
                }
            }
        }
    }
}

/* y[rows, n] (row stride y_stride) = x[rows, k] (row stride x_stride, k even) times the packed weight w of
 * block_rows (32 or 64) rows per block and k_padded (even) columns, plus bias when not null. `threads` OpenMP
 * threads take contiguous runs of blocks. */
void hc_packed_gemv_bf16(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *w,
                         const uint16_t *bias, uint16_t *y, int64_t y_stride, int64_t n, int64_t k,
                         int64_t k_padded, int64_t block_rows, int threads) {
    int groups = block_rows == 64 ? 4 : 2;
    int64_t blocks = (n + 16 * groups - 1) / (16 * groups);
    int64_t k_pairs = k / 2; /* pairs past k hold zeros in w; x has no values there, so they are skipped */
    int64_t pair_stride = k_padded / 2;
#pragma omp parallel num_threads(threads)
    {
        extern int omp_get_thread_num(void);
        extern int omp_get_num_threads(void);
        int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        int64_t first = blocks * me / team, last = blocks * (me + 1) / team;
        if (first < last)
            product_blocks(x, x_stride, rows, w, bias, y, y_stride, n, k_pairs, pair_stride, groups, first, last);
    }
}

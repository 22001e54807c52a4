/* Decode's matrix products on the CPU: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for a few rows m of x,
 * reading the weight in the layout oneDNN packed it into for its bf16 matmul (see cpu_gemv.py, which checks
 * that layout before this kernel is used):
 *
 *     w[n, k] lives at ((n / 32) * (k_padded / 2) + k / 2) * 64 + (n % 32) * 2 + k % 2
 *
 * i.e. blocks of 32 output rows; inside a block, for each pair of k, the 32 rows' two values side by side
 * (zeros pad n up to a multiple of 32 and k up to k_padded). One 64-byte load is then the (k, k+1) pair of
 * 16 rows, and AVX512-BF16's vdpbf16ps multiplies it by the broadcast pair (x[k], x[k+1]) into 16 float32
 * sums at once: no horizontal reductions, and the weight streams once, in order, per thread.
 *
 * With one to eight rows of x the product is bound by reading w. Each output element is summed in float32
 * over k pairs in increasing order by one accumulator lane and rounded to bf16 (nearest even) once, so its
 * bits depend only on x's row and w's row: not on how many rows x has, the thread count or which thread
 * computed it. Batched and single-lane decode therefore give the same bits.
 *
 * Threads: OpenMP, linked against the runtime torch loaded (same soname), so it shares torch's pool.
 */
#include <immintrin.h>
#include <stdint.h>

#define BLOCK_ROWS 32
#define MAX_X_ROWS 8
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif

static inline __attribute__((always_inline)) void block_product(const uint16_t *x, int64_t x_stride, int count,
                                                                const uint16_t *block, int64_t k_pairs,
                                                                __m512 acc[2][MAX_X_ROWS]) {
    for (int m = 0; m < MAX_X_ROWS; m++) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
    const char *ahead = (const char *)block + PREFETCH_BYTES;
    for (int64_t j = 0; j < k_pairs; j++) {
        _mm_prefetch(ahead + j * 128, _MM_HINT_T0);
        _mm_prefetch(ahead + j * 128 + 64, _MM_HINT_T0);
        __m512bh low = (__m512bh)_mm512_loadu_si512((const void *)(block + j * 64));
        __m512bh high = (__m512bh)_mm512_loadu_si512((const void *)(block + j * 64 + 32));
        for (int m = 0; m < count; m++) {
            __m512bh pair = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(x + m * x_stride + 2 * j));
            acc[0][m] = _mm512_dpbf16_ps(acc[0][m], low, pair);
            acc[1][m] = _mm512_dpbf16_ps(acc[1][m], high, pair);
        }
    }
}

static inline void store_rows(__m512 sums, const uint16_t *bias, uint16_t *out, int64_t valid) {
    __mmask16 mask = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
    if (bias) {
        __m256i raw = _mm256_maskz_loadu_epi16(mask, (const void *)bias);
        sums = _mm512_add_ps(sums, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)));
    }
    __m256i rounded = (__m256i)_mm512_cvtneps_pbh(sums);
    _mm256_mask_storeu_epi16((void *)out, mask, rounded);
}

static void product_blocks(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *w,
                           const uint16_t *bias, uint16_t *y, int64_t y_stride, int64_t n, int64_t k_pairs,
                           int64_t pair_stride, int64_t first_block, int64_t last_block) {
    __m512 acc[2][MAX_X_ROWS];
    for (int64_t b = first_block; b < last_block; b++) {
        const uint16_t *block = w + b * pair_stride * 64;
        int64_t n0 = b * BLOCK_ROWS;
        for (int64_t m0 = 0; m0 < rows; m0 += MAX_X_ROWS) {
            int count = (int)(rows - m0 < MAX_X_ROWS ? rows - m0 : MAX_X_ROWS);
            const uint16_t *xs = x + m0 * x_stride;
            /* A literal count per call lets the compiler keep every accumulator in a register. */
            switch (count) {
            case 1: block_product(xs, x_stride, 1, block, k_pairs, acc); break;
            case 2: block_product(xs, x_stride, 2, block, k_pairs, acc); break;
            case 3: block_product(xs, x_stride, 3, block, k_pairs, acc); break;
            case 4: block_product(xs, x_stride, 4, block, k_pairs, acc); break;
            case 5: block_product(xs, x_stride, 5, block, k_pairs, acc); break;
            case 6: block_product(xs, x_stride, 6, block, k_pairs, acc); break;
            case 7: block_product(xs, x_stride, 7, block, k_pairs, acc); break;
            default: block_product(xs, x_stride, 8, block, k_pairs, acc); break;
            }
            for (int m = 0; m < count; m++) {
                uint16_t *out = y + (m0 + m) * y_stride + n0;
                for (int half = 0; half < 2; half++) {
                    int64_t valid = n - (n0 + 16 * half);
                    if (valid <= 0) break;
                    store_rows(acc[half][m], bias ? bias + n0 + 16 * half : 0, out + 16 * half, valid);
                }
            }
        }
    }
}

/* y[rows, n] (row stride y_stride) = x[rows, k] (row stride x_stride, k even) times the packed weight w with
 * k_padded (even) columns, plus bias when not null. `threads` OpenMP threads take contiguous runs of blocks. */
void hc_packed_gemv_bf16(const uint16_t *x, int64_t x_stride, int64_t rows, const uint16_t *w,
                         const uint16_t *bias, uint16_t *y, int64_t y_stride, int64_t n, int64_t k,
                         int64_t k_padded, int threads) {
    int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    int64_t k_pairs = k / 2; /* pairs past k hold zeros in w; x has no values there, so they are skipped */
    int64_t pair_stride = k_padded / 2;
#pragma omp parallel num_threads(threads)
    {
        extern int omp_get_thread_num(void);
        extern int omp_get_num_threads(void);
        int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        int64_t first = blocks * me / team, last = blocks * (me + 1) / team;
        if (first < last) product_blocks(x, x_stride, rows, w, bias, y, y_stride, n, k_pairs, pair_stride, first, last);
    }
}

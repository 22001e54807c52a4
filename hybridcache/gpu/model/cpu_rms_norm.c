/* RMSNorm of bf16 rows on the CPU: y = x * (1 / sqrt(mean(x^2) + eps)) * scale, computed in float32 and
 * rounded to bf16 (nearest even) once, as `norm.rms_norm` defines it.
 *
 * torch computes the same in three dispatched ops (to float32, the fused norm, back to bf16), about 20 us
 * for one 1024-wide row, and 60-100 us right after a decode product; decode runs 61 of them per step on
 * `small`. Each row is summed in one fixed order (16 float32 lanes, then their sum), so a row's result does
 * not depend on how many rows share the call or on the thread count: prefill and decode may both use it
 * and a resumed pass still computes what a cold one does.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "cpu_simd.h"

#define PARALLEL_ROWS 64

static inline __m512 load_bf16(const uint16_t *p, __mmask16 mask) {
    return widen(_mm256_maskz_loadu_epi16(mask, (const void *)p));
}

static void norm_row(const uint16_t *x, const float *scale, float eps, uint16_t *y, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __m512 v = load_bf16(x + j, first_lanes(n - j));
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    __m512 inverse = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 mask = first_lanes(n - j);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(load_bf16(x + j, mask), inverse), _mm512_maskz_loadu_ps(mask, scale + j));
        _mm256_mask_storeu_epi16((void *)(y + j), mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
}

/* x, y: [rows, n] bf16, contiguous; scale: [n] float32. */
void hc_rms_norm_bf16(const uint16_t *x, int64_t rows, int64_t n, const float *scale, float eps, uint16_t *y,
                      int threads) {
    if (rows < PARALLEL_ROWS) {
        for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, scale, eps, y + r * n, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, scale, eps, y + r * n, n);
}

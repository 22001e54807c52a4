/* Vector helpers shared by the CPU kernels (AVX-512). Header-only: every kernel inlines its own copy. */
#ifndef HYBRIDCACHE_CPU_SIMD_H
#define HYBRIDCACHE_CPU_SIMD_H

#include <immintrin.h>

/* exp(x) for 16 floats: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 Taylor polynomial of exp(r)
 * (error below 1e-8 relative), scaled by 2^n with scalef (so overflow gives inf and underflow 0). */
static inline __m512 exp_lanes(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 16 bf16 values as float32 (exact: a bf16 is the high half of a float32). */
static inline __m512 widen(__m256i bf16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

/* The mask of the first min(left, 16) lanes (left >= 1): the tail of a row that is not a multiple of 16. */
static inline __mmask16 first_lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

#endif

/* Decode's attention on the CPU: one lane's new query heads over its whole context of bf16 keys and values.
 *
 *     out[h, j] = sum_t softmax_t(scale * q[h, j] . k[t, h]) v[t, h]
 *
 * for each KV head h and its `group` query rows j, over the context rows t (a run of consecutive rows of the
 * flat planes, or a list of them when the lane's pages are not consecutive). torch's CPU flash attention
 * took 1.8 ms per layer for 8,192 keys of the `small` shape (2 KV heads of 256, 2 threads), about six times
 * the time its 16 MiB of keys and values take to stream; here the keys and values are read once.
 *
 * The context is cut into blocks of BLOCK_KEYS rows. Per (head, block): the scores in float32 (bf16 products
 * summed exactly by vdpbf16ps, one fixed order), their maximum, the exponentials (exp_lanes), their sum and
 * the exponential-weighted sum of the values, all float32. The blocks of a head are then merged in block
 * order by the usual rescaling (the online softmax of flash attention), and each output rounded to bf16 once.
 * Threads take whole (head, block) items, so the bits depend only on the lane's query and context: not on the
 * thread count, on other lanes or on how the rows are laid out in pages.
 *
 * Threads: OpenMP, linked against the runtime torch loaded (same soname), so it shares torch's pool.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_simd.h"

#define BLOCK_KEYS 256
#define MAX_GROUP 8      /* query rows per KV head */
#define VALUE_LANES 32   /* value columns per pass over a block: 2 vectors x MAX_GROUP accumulators */
#define KEYS_AHEAD 8     /* the key row fetched while this one is scored (see attend_block) */

static inline const uint16_t *context_row(const uint16_t *plane, const int64_t *rows, int64_t first_row,
                                          int64_t t, int64_t row_elements) {
    return plane + (rows ? rows[t] : first_row + t) * row_elements;
}

/* One (head, block) item: its maximum score per query row, the sum of exp(score - max), and the sum of the
 * values weighted by them (float32, [group, head_dim]). */
static inline __attribute__((always_inline)) void
attend_block(const uint16_t *q, const uint16_t *k_plane, const uint16_t *v_plane, const int64_t *rows,
             int64_t first_row, int64_t length, int64_t start, int64_t count, int64_t head,
             int64_t kv_heads, int group, int64_t head_dim, float scale, float *block_max, float *block_sum,
             float *block_out) {
    float weights[MAX_GROUP][BLOCK_KEYS] __attribute__((aligned(64)));
    const int64_t row_elements = kv_heads * head_dim, pairs = head_dim / 32;
    const uint16_t *qh = q + head * group * head_dim;
    for (int64_t t = 0; t < count; t++) {
        const uint16_t *key = context_row(k_plane, rows, first_row, start + t, row_elements) + head * head_dim;
        /* Scoring a key is too short for the out-of-order window to reach the next rows' misses by itself, and
         * the hardware prefetchers lose the stream at every page: the key KEYS_AHEAD rows on is fetched now, and
         * this row's value into L2 for the value pass below. Twice the rate at 32k keys (9.6 -> 18.6 GiB/s
         * with the block-major order of the items, 2 threads, this machine's AMD EPYC). */
        if (start + t + KEYS_AHEAD < length) {
            const char *ahead =
                (const char *)(context_row(k_plane, rows, first_row, start + t + KEYS_AHEAD, row_elements) +
                               head * head_dim);
            for (int64_t byte = 0; byte < head_dim * 2; byte += 64) _mm_prefetch(ahead + byte, _MM_HINT_T0);
        }
        const char *value_row =
            (const char *)(context_row(v_plane, rows, first_row, start + t, row_elements) + head * head_dim);
        for (int64_t byte = 0; byte < head_dim * 2; byte += 64) _mm_prefetch(value_row + byte, _MM_HINT_T1);
        for (int j = 0; j < group; j++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t c = 0; c < pairs; c++) {
                __m512bh kc = (__m512bh)_mm512_loadu_si512((const void *)(key + 32 * c));
                __m512bh qc = (__m512bh)_mm512_loadu_si512((const void *)(qh + j * head_dim + 32 * c));
                acc = _mm512_dpbf16_ps(acc, kc, qc);
            }
            weights[j][t] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
    for (int j = 0; j < group; j++) {
        float top = weights[j][0];
        for (int64_t t = 1; t < count; t++) top = weights[j][t] > top ? weights[j][t] : top;
        __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(top);
        int64_t t = 0;
        for (; t + 16 <= count; t += 16) {
            __m512 e = exp_lanes(_mm512_sub_ps(_mm512_loadu_ps(&weights[j][t]), shift));
            _mm512_storeu_ps(&weights[j][t], e);
            sum = _mm512_add_ps(sum, e);
        }
        if (t < count) {
            __mmask16 mask = first_lanes(count - t);
            __m512 e = exp_lanes(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, &weights[j][t]), shift));
            e = _mm512_maskz_mov_ps(mask, e);
            _mm512_mask_storeu_ps(&weights[j][t], mask, e);
            sum = _mm512_add_ps(sum, e);
        }
        block_max[j] = top;
        block_sum[j] = _mm512_reduce_add_ps(sum);
    }
    for (int64_t d = 0; d < head_dim; d += VALUE_LANES) {
        __m512 acc[MAX_GROUP][2];
        for (int j = 0; j < group; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
        for (int64_t t = 0; t < count; t++) {
            const uint16_t *value =
                context_row(v_plane, rows, first_row, start + t, row_elements) + head * head_dim + d;
            __m512 low = widen(_mm256_loadu_si256((const __m256i *)value));
            __m512 high = widen(_mm256_loadu_si256((const __m256i *)(value + 16)));
            for (int j = 0; j < group; j++) {
                __m512 w = _mm512_set1_ps(weights[j][t]);
                acc[j][0] = _mm512_fmadd_ps(w, low, acc[j][0]);
                acc[j][1] = _mm512_fmadd_ps(w, high, acc[j][1]);
            }
        }
        for (int j = 0; j < group; j++) {
            _mm512_storeu_ps(block_out + j * head_dim + d, acc[j][0]);
            _mm512_storeu_ps(block_out + j * head_dim + d + 16, acc[j][1]);
        }
    }
}

#define CASE(GROUP)                                                                                      \
    case GROUP:                                                                                          \
        attend_block(q, k_plane, v_plane, rows, first_row, length, start, count, head, kv_heads, GROUP,   \
                     head_dim, scale, block_max, block_sum, block_out);                                  \
        break;

/* out [kv_heads, group, head_dim] bf16 = attention of q [kv_heads, group, head_dim] bf16 over `length` context
 * rows of the planes [rows, kv_heads, head_dim] bf16: rows[0..length) when `rows` is not null, else
 * first_row + 0..length. Returns 0; -1, with nothing written, unless length >= 1, head_dim is a multiple of
 * 32 and group at most MAX_GROUP, or when the scratch could not be allocated. */
int hc_decode_attention_bf16(const uint16_t *q, const uint16_t *k_plane, const uint16_t *v_plane,
                             const int64_t *rows, int64_t first_row, int64_t length, int64_t kv_heads,
                             int64_t group, int64_t head_dim, float scale, uint16_t *out, int threads) {
    if (length <= 0 || group > MAX_GROUP || head_dim % 32) return -1;
    const int64_t blocks = (length + BLOCK_KEYS - 1) / BLOCK_KEYS, items = kv_heads * blocks;
    float *maxima = malloc(sizeof(float) * items * group * (2 + head_dim));
    if (!maxima) return -1;
    float *sums = maxima + items * group, *partial = sums + items * group;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < items; item++) {
        /* Items go block by block, every head of a block in turn: the heads of a context row share its cache
         * lines (and the prefetchers fetch whole rows), so a thread that took one head per pass over the context
         * read every line twice from memory. */
        int64_t block = item / kv_heads, head = item % kv_heads, start = block * BLOCK_KEYS;
        int64_t count = length - start < BLOCK_KEYS ? length - start : BLOCK_KEYS;
        int64_t slot = head * blocks + block;
        float *block_max = maxima + slot * group, *block_sum = sums + slot * group;
        float *block_out = partial + slot * group * head_dim;
        /* A literal group per call lets the compiler unroll the query loops and keep the sums in registers. */
        switch (group) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7)
        default: attend_block(q, k_plane, v_plane, rows, first_row, length, start, count, head, kv_heads, 8,
                              head_dim, scale, block_max, block_sum, block_out); break;
        }
    }
    for (int64_t head = 0; head < kv_heads; head++) {
        for (int64_t j = 0; j < group; j++) {
            float top = maxima[head * blocks * group + j];
            for (int64_t b = 1; b < blocks; b++) {
                float m = maxima[(head * blocks + b) * group + j];
                top = m > top ? m : top;
            }
            float total = 0.0f;
            float factors[blocks];
            for (int64_t b = 0; b < blocks; b++) {
                int64_t at = (head * blocks + b) * group + j;
                factors[b] = _mm512_cvtss_f32(exp_lanes(_mm512_set1_ps(maxima[at] - top)));
                total += sums[at] * factors[b];
            }
            __m512 inverse = _mm512_set1_ps(1.0f / total);
            uint16_t *row_out = out + (head * group + j) * head_dim;
            for (int64_t d = 0; d < head_dim; d += 16) {
                __m512 acc = _mm512_setzero_ps();
                for (int64_t b = 0; b < blocks; b++) {
                    const float *p = partial + ((head * blocks + b) * group + j) * head_dim + d;
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(factors[b]), _mm512_loadu_ps(p), acc);
                }
                __m256i rounded = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc, inverse));
                _mm256_storeu_si256((__m256i *)(row_out + d), rounded);
            }
        }
    }
    free(maxima);
    return 0;
}

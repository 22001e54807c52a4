/* One decode token of a Gated DeltaNet layer after its input projection, for a batch of lanes: everything
 * between the input projection and the output projection, in one call.
 *
 * - the gates: decay = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b);
 * - the depthwise causal conv step (and its state shift), SiLU;
 * - the L2 norms of q and k;
 * - the gated delta rule on each lane's fp32 state in place:
 *
 *       S <- decay S + k (beta (v - decay S^T k))^T,    o = S^T q  (computed as decay S^T q + (q.k) delta)
 *
 * - the gated RMSNorm of o: w (o / rms(o)) silu(z), in bf16, ready for the output projection.
 *
 * The torch form of the same step (delta_rule.py, gated_deltanet.py, norm.py) dispatches about thirty small
 * ops per layer and passes over each state three times; here each state (dk x dv floats, 64 KiB for
 * 128 x 128) is read once from memory and updated while it sits in cache. The conv runs 16 channels per
 * vector instruction and its channels are split over the threads; the heads are split over the threads.
 *
 * Activations are bf16 (the model's dtype on a CPU), rounded where the torch form rounds them: the conv
 * output after its sum and after SiLU, beta, the delta-rule output, the normalized output and its weighted
 * form. Everything else is fp32. exp() is one polynomial (`exp_lanes`, the same for every channel and
 * every path), so each lane's and head's arithmetic is one fixed sequence: results do not depend on the
 * batch, the thread count or the lane order.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_simd.h"

#define CONV_BLOCK 512 /* channels per parallel conv item: 12 items for small's 6144 */

static inline float bf16_to_float(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float round_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

/* Round 16 floats to bf16 (nearest even, NaN kept quiet) and back: float_to_bf16 in vector form, so
 * denormals are kept (the BF16 conversion instruction would flush them). */
static inline __m512 round_bf16_lanes(__m512 value) {
    __m512i bits = _mm512_castps_si512(value);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline float exp_one(float x) { return _mm512_cvtss_f32(exp_lanes(_mm512_set1_ps(x))); }

static inline __m512 silu_lanes(__m512 x) {
    __m512 e = exp_lanes(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* The conv output of one channel (fp32 of bf16) from its past inputs, its new input and its weights. */
static float conv_channel(const uint16_t *history, const uint16_t *weight, uint16_t input, int64_t past) {
    float sum = 0.0f;
    for (int64_t t = 0; t < past; t++) sum += round_bf16(bf16_to_float(history[t]) * bf16_to_float(weight[t]));
    sum += round_bf16(bf16_to_float(input) * bf16_to_float(weight[past]));
    float pre = round_bf16(sum);
    return round_bf16(_mm512_cvtss_f32(silu_lanes(_mm512_set1_ps(pre))));
}

/* Channels [first, last) of one lane: conv_out (fp32 of bf16) and the shifted history. */
static void conv_range(const uint16_t *mixed, uint16_t *history, const uint16_t *weight, float *conv_out,
                       int64_t first, int64_t last, int64_t kernel) {
    int64_t past = kernel - 1, c = first;
    if (kernel == 4) {
        /* 16 channels at a time: their 3 past inputs (48 bf16, channel-major) and 4 weights (64 bf16) are
         * de-interleaved into one vector per tap with two-source permutes. */
        __m512i past_index[3], weight_index[4], shift_low, shift_high;
        uint16_t index[32], low[32], high[32];
        for (int t = 0; t < 4; t++) {
            for (int j = 0; j < 32; j++) index[j] = (uint16_t)((j < 16 ? j : 0) * 4 + t);
            weight_index[t] = _mm512_loadu_si512(index);
            if (t == 3) break;
            for (int j = 0; j < 32; j++) index[j] = (uint16_t)((j < 16 ? j : 0) * 3 + t);
            past_index[t] = _mm512_loadu_si512(index);
        }
        /* the new history: channel j's slots (3j, 3j+1, 3j+2) take its old (3j+1, 3j+2) and the input, which
         * sits at 48 + j of the (old[0..31], old[32..47] | input[0..15]) pair */
        for (int o = 0; o < 48; o++) {
            int j = o / 3, t = o % 3;
            uint16_t source = (uint16_t)(t < 2 ? 3 * j + t + 1 : 48 + j);
            if (o < 32) low[o] = source; else high[o - 32] = source;
        }
        for (int o = 16; o < 32; o++) high[o] = 0;
        shift_low = _mm512_loadu_si512(low);
        shift_high = _mm512_loadu_si512(high);
        for (; c + 16 <= last; c += 16) {
            uint16_t *h = history + c * past;
            const uint16_t *w = weight + c * kernel;
            __m512i old_low = _mm512_loadu_si512(h);
            __m256i input = _mm256_loadu_si256((const __m256i *)(mixed + c));
            __m512i old_high = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(h + 32))),
                                                  input, 1);
            __m512i w_low = _mm512_loadu_si512(w), w_high = _mm512_loadu_si512(w + 32);
            __m512 sum = _mm512_setzero_ps();
            for (int t = 0; t < 4; t++) {
                __m512 x = t < 3 ? widen(_mm512_castsi512_si256(_mm512_permutex2var_epi16(old_low, past_index[t], old_high)))
                                 : widen(input);
                __m512 wt = widen(_mm512_castsi512_si256(_mm512_permutex2var_epi16(w_low, weight_index[t], w_high)));
                sum = _mm512_add_ps(sum, round_bf16_lanes(_mm512_mul_ps(x, wt)));
            }
            _mm512_storeu_ps(conv_out + c, round_bf16_lanes(silu_lanes(round_bf16_lanes(sum))));
            _mm512_storeu_si512(h, _mm512_permutex2var_epi16(old_low, shift_low, old_high));
            _mm256_storeu_si256((__m256i *)(h + 32),
                                _mm512_castsi512_si256(_mm512_permutex2var_epi16(old_low, shift_high, old_high)));
        }
    }
    for (; c < last; c++) {
        uint16_t *h = history + c * past;
        conv_out[c] = conv_channel(h, weight + c * kernel, mixed[c], past);
        for (int64_t t = 0; t + 1 < past; t++) h[t] = h[t + 1];
        if (past > 0) h[past - 1] = mixed[c];
    }
}

static void l2_normalize(const float *x, float *y, int64_t n, float scale, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
    float factor = scale / sqrtf(sum + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * factor;
}

static void delta_rule_step(float *state, const float *q, const float *k, const float *v, float decay, float beta,
                            float *out, int64_t dk, int64_t dv) {
    float read_q[dv], read_k[dv], delta[dv];
    for (int64_t j = 0; j < dv; j++) read_q[j] = read_k[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        const float *row = state + i * dv;
        float qi = q[i], ki = k[i];
        for (int64_t j = 0; j < dv; j++) {
            read_q[j] += row[j] * qi;
            read_k[j] += row[j] * ki;
        }
    }
    float qk = 0.0f;
    for (int64_t i = 0; i < dk; i++) qk += q[i] * k[i];
    for (int64_t j = 0; j < dv; j++) {
        delta[j] = (v[j] - read_k[j] * decay) * beta;
        out[j] = read_q[j] * decay + qk * delta[j];
    }
    for (int64_t i = 0; i < dk; i++) {
        float *row = state + i * dv;
        float ki = k[i];
        for (int64_t j = 0; j < dv; j++) row[j] = row[j] * decay + ki * delta[j];
    }
}

/* normed[j] = bf16(bf16(w[j] * bf16(o[j] / rms(o))) * silu(z[j])) for one head; o is rounded to bf16 first. */
static void gated_norm(float *o, const uint16_t *z, const uint16_t *weight, float eps, uint16_t *normed,
                       int64_t dv) {
    float sum = 0.0f;
    for (int64_t j = 0; j < dv; j++) {
        o[j] = round_bf16(o[j]);
        sum += o[j] * o[j];
    }
    float inverse = 1.0f / sqrtf(sum / (float)dv + eps);
    int64_t j = 0;
    for (; j + 16 <= dv; j += 16) {
        __m512 x = round_bf16_lanes(_mm512_mul_ps(_mm512_loadu_ps(o + j), _mm512_set1_ps(inverse)));
        __m512 weighted = round_bf16_lanes(_mm512_mul_ps(widen(_mm256_loadu_si256((const __m256i *)(weight + j))), x));
        __m512 gate = silu_lanes(widen(_mm256_loadu_si256((const __m256i *)(z + j))));
        __m512 y = round_bf16_lanes(_mm512_mul_ps(weighted, gate));
        _mm256_storeu_si256((__m256i *)(normed + j),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(y), 16)));
    }
    for (; j < dv; j++) {
        float x = round_bf16(o[j] * inverse);
        float weighted = round_bf16(bf16_to_float(weight[j]) * x);
        float gate = _mm512_cvtss_f32(silu_lanes(_mm512_set1_ps(bf16_to_float(z[j]))));
        normed[j] = float_to_bf16(weighted * gate);
    }
}

/* projected [lanes, conv_dim + Hv dv + 2 Hv] bf16 (row stride projected_stride): the q k v, z, b and a
 * columns of the input projection; conv_plane [slots, conv_dim, kernel - 1] bf16; conv_weight
 * [conv_dim, kernel] bf16; neg_a [Hv] fp32 (-exp(A_log)); dt_bias [Hv] bf16; norm_weight [dv] bf16;
 * state_plane [slots, Hv, dk, dv] fp32; slots [lanes]; scratch [lanes, conv_dim] fp32;
 * normed [lanes, Hv dv] bf16 (the output). conv_dim = 2 Hk dk + Hv dv: q, k, v in that order. */
void hc_gdn_decode_step(const uint16_t *projected, int64_t projected_stride, uint16_t *conv_plane,
                        const uint16_t *conv_weight, const float *neg_a, const uint16_t *dt_bias,
                        const uint16_t *norm_weight, float *state_plane, const int64_t *slots, float *scratch,
                        uint16_t *normed, int64_t lanes, int64_t key_heads, int64_t value_heads, int64_t dk,
                        int64_t dv, int64_t kernel, float l2_eps, float norm_eps, int threads) {
    int64_t conv_dim = 2 * key_heads * dk + value_heads * dv;
    int64_t value_dim = value_heads * dv;
    int64_t group = value_heads / key_heads;
    int64_t blocks = (conv_dim + CONV_BLOCK - 1) / CONV_BLOCK;
    float query_scale = 1.0f / sqrtf((float)dk);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < lanes * blocks; item++) {
            int64_t lane = item / blocks, first = (item % blocks) * CONV_BLOCK;
            int64_t last = first + CONV_BLOCK < conv_dim ? first + CONV_BLOCK : conv_dim;
            conv_range(projected + lane * projected_stride, conv_plane + slots[lane] * conv_dim * (kernel - 1),
                       conv_weight, scratch + lane * conv_dim, first, last, kernel);
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < lanes * value_heads; item++) {
            int64_t lane = item / value_heads, h = item % value_heads;
            const uint16_t *row = projected + lane * projected_stride;
            const float *conv_out = scratch + lane * conv_dim;
            float q[dk], k[dk], out[dv];
            l2_normalize(conv_out + (h / group) * dk, q, dk, query_scale, l2_eps);
            l2_normalize(conv_out + (key_heads + h / group) * dk, k, dk, 1.0f, l2_eps);
            const float *v = conv_out + 2 * key_heads * dk + h * dv;
            float a = bf16_to_float(row[conv_dim + value_dim + value_heads + h]) + bf16_to_float(dt_bias[h]);
            float softplus = a > 20.0f ? a : log1pf(exp_one(a));
            float decay = exp_one(neg_a[h] * softplus);
            float b = bf16_to_float(row[conv_dim + value_dim + h]);
            float beta = round_bf16(1.0f / (1.0f + exp_one(-b)));
            float *state = state_plane + (slots[lane] * value_heads + h) * dk * dv;
            delta_rule_step(state, q, k, v, decay, beta, out, dk, dv);
            gated_norm(out, row + conv_dim + h * dv, norm_weight, norm_eps, normed + lane * value_dim + h * dv, dv);
        }
    }
}

/* One decode token of a Gated DeltaNet layer after its input projection, for a batch of lanes, in one pass:
 * the depthwise causal conv step (and its state shift), SiLU, the L2 norms of q and k, and the gated delta
 * rule on each lane's fp32 state in place:
 *
 *     S <- exp(g) S + k (beta (v - exp(g) S^T k))^T,    o = S^T q  (computed as exp(g) S^T q + (q.k) delta)
 *
 * The torch form of the same step (delta_rule.py, gated_deltanet.py) dispatches about twenty small ops per
 * layer and passes over each state three times; here each state (dk x dv floats, 64 KiB for 128 x 128) is
 * read once from memory and updated while it sits in cache.
 *
 * Activations are bf16 (the model's dtype on a CPU), rounded where the torch form rounds them: the conv
 * output after its sum and after SiLU. Everything after is fp32. Each lane's and head's arithmetic is one
 * fixed sequence, so results do not depend on the batch, the thread count or the lane order.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* conv_out[c] (fp32 of bf16) for one lane, shifting its conv history (channels x (kernel - 1), bf16). */
static void conv_step(const uint16_t *mixed, uint16_t *history, const uint16_t *weight, float *conv_out,
                      int64_t channels, int64_t kernel) {
    int64_t past = kernel - 1;
    for (int64_t c = 0; c < channels; c++) {
        uint16_t *h = history + c * past;
        const uint16_t *w = weight + c * kernel;
        float sum = 0.0f;
        for (int64_t t = 0; t < past; t++) sum += round_bf16(bf16_to_float(h[t]) * bf16_to_float(w[t]));
        sum += round_bf16(bf16_to_float(mixed[c]) * bf16_to_float(w[past]));
        float pre = round_bf16(sum);
        conv_out[c] = round_bf16(pre / (1.0f + expf(-pre)));
        for (int64_t t = 0; t + 1 < past; t++) h[t] = h[t + 1];
        if (past > 0) h[past - 1] = mixed[c];
    }
}

static void l2_normalize(float *x, int64_t n, float scale, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
    float factor = scale / sqrtf(sum + eps);
    for (int64_t i = 0; i < n; i++) x[i] *= factor;
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

/* mixed [lanes, conv_dim] bf16 (row stride mixed_stride); conv_plane [slots, conv_dim, kernel - 1] bf16;
 * conv_weight [conv_dim, kernel] bf16; state_plane [slots, Hv, dk, dv] fp32; slots [lanes];
 * log_decay, beta [lanes, Hv] fp32; scratch [lanes, conv_dim] fp32; out [lanes, Hv, dv] fp32.
 * conv_dim = 2 Hk dk + Hv dv: q, k, v in that order. */
void hc_gdn_decode_step(const uint16_t *mixed, int64_t mixed_stride, uint16_t *conv_plane,
                        const uint16_t *conv_weight, float *state_plane, const int64_t *slots,
                        const float *log_decay, const float *beta, float *scratch, float *out, int64_t lanes,
                        int64_t key_heads, int64_t value_heads, int64_t dk, int64_t dv, int64_t kernel,
                        float eps, int threads) {
    int64_t conv_dim = 2 * key_heads * dk + value_heads * dv;
    int64_t group = value_heads / key_heads;
    float query_scale = 1.0f / sqrtf((float)dk);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t lane = 0; lane < lanes; lane++) {
            float *conv_out = scratch + lane * conv_dim;
            conv_step(mixed + lane * mixed_stride, conv_plane + slots[lane] * conv_dim * (kernel - 1), conv_weight,
                      conv_out, conv_dim, kernel);
            for (int64_t h = 0; h < key_heads; h++) {
                l2_normalize(conv_out + h * dk, dk, query_scale, eps);
                l2_normalize(conv_out + (key_heads + h) * dk, dk, 1.0f, eps);
            }
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < lanes * value_heads; item++) {
            int64_t lane = item / value_heads, h = item % value_heads;
            const float *conv_out = scratch + lane * conv_dim;
            const float *q = conv_out + (h / group) * dk;
            const float *k = conv_out + (key_heads + h / group) * dk;
            const float *v = conv_out + 2 * key_heads * dk + h * dv;
            float *state = state_plane + (slots[lane] * value_heads + h) * dk * dv;
            float decay = expf(log_decay[item]);
            delta_rule_step(state, q, k, v, decay, beta[item], out + item * dv, dk, dv);
        }
    }
}

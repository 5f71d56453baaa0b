/* int4 KV codes expanded to float32 on the CPU, in one pass over the output.
 *
 * The layout and the arithmetic are quant.py's (dequantize_into): a code is read as
 * code * scale + minimum in float32, channel c of a head's first half in a byte's low nibble and
 * c + dim / 2 in its high one; the widest key channels add their low bits, low * (scale / 16).
 * Built with -ffp-contract=off, so each product and sum rounds as torch's path rounds them: the
 * two write the same bits (tests/unit/test_int4_native.py).
 *
 * Shapes (C order, elements): keys' codes [L, T, H, D/2]; scale and minimum [L, H, D] (one per
 * channel over the entry's tokens); fine [L, T, H, W/2] (the wide channels' low 4 bits, two a
 * byte: slot s < W/2 in byte s's low nibble, else in byte s - W/2's high one); slot [L, H, D]
 * (a channel's slot among the wide ones, 255: none). Values' codes [L, T, H, Dv/2]; scale and
 * minimum [L, T, H, G], G groups of Dv/G channels. Tokens [start, end) are written; token t of
 * layer l, head h starts at out + l*ls + (t - start)*ts + h*hs, its channels contiguous.
 * Each returns 0, or -1 for a shape it does not take (nothing is written then).
 */
#include <stdint.h>

#define MAX_WIDE 4096 /* wide channels of one layer, all heads: 8 heads of 128 take 128 */

int int4_keys(const uint8_t *restrict codes, const float *restrict scale,
              const float *restrict zero, const uint8_t *restrict fine,
              const uint8_t *restrict slot, int64_t layers, int64_t tokens, int64_t heads,
              int64_t dim, int64_t wide, int64_t start, int64_t end, float *restrict out,
              int64_t ls, int64_t ts, int64_t hs) {
    const int64_t half = dim / 2, wide_half = wide / 2;
    int16_t chan[MAX_WIDE], at[MAX_WIDE]; /* a layer's wide channels, head by head */
    if (dim % 2 || dim > 32767 || wide % 2 || heads * wide > MAX_WIDE || start < 0 ||
        end > tokens)
        return -1;
    for (int64_t l = 0; l < layers; l++) {
        for (int64_t h = 0; h < heads && wide; h++) {
            const uint8_t *sl = slot + (l * heads + h) * dim;
            int64_t n = 0;
            for (int64_t c = 0; c < dim; c++)
                if (sl[c] != 255) {
                    if (n == wide || sl[c] >= wide) return -1;
                    chan[h * wide + n] = (int16_t)c;
                    at[h * wide + n++] = sl[c];
                }
            if (n != wide) return -1;
        }
        for (int64_t t = start; t < end; t++) {
            for (int64_t h = 0; h < heads; h++) {
                const float *s = scale + (l * heads + h) * dim, *z = zero + (l * heads + h) * dim;
                const uint8_t *code = codes + ((l * tokens + t) * heads + h) * half;
                float *o = out + l * ls + (t - start) * ts + h * hs;
                for (int64_t c = 0; c < half; c++) {
                    o[c] = (float)(code[c] & 15) * s[c] + z[c];
                    o[c + half] = (float)(code[c] >> 4) * s[c + half] + z[c + half];
                }
                if (!wide) continue;
                const uint8_t *low = fine + ((l * tokens + t) * heads + h) * wide_half;
                for (int64_t i = h * wide; i < (h + 1) * wide; i++) {
                    const int64_t c = chan[i], a = at[i];
                    const int bits = a < wide_half ? low[a] & 15 : low[a - wide_half] >> 4;
                    o[c] = o[c] + (float)bits * (s[c] / 16.0f);
                }
            }
        }
    }
    return 0;
}

int int4_values(const uint8_t *restrict codes, const float *restrict scale,
                const float *restrict zero, int64_t layers, int64_t tokens, int64_t heads,
                int64_t dim, int64_t groups, int64_t start, int64_t end, float *restrict out,
                int64_t ls, int64_t ts, int64_t hs) {
    const int64_t half = dim / 2;
    if (dim % 2 || groups < 1 || dim % groups || start < 0 || end > tokens) return -1;
    const int64_t size = dim / groups;
    for (int64_t l = 0; l < layers; l++) {
        for (int64_t t = start; t < end; t++) {
            for (int64_t h = 0; h < heads; h++) {
                const int64_t row = (l * tokens + t) * heads + h;
                const uint8_t *code = codes + row * half;
                const float *s = scale + row * groups, *z = zero + row * groups;
                float *o = out + l * ls + (t - start) * ts + h * hs;
                if (groups == 1) {
                    const float s0 = s[0], z0 = z[0];
                    for (int64_t c = 0; c < half; c++) {
                        o[c] = (float)(code[c] & 15) * s0 + z0;
                        o[c + half] = (float)(code[c] >> 4) * s0 + z0;
                    }
                } else {
                    for (int64_t c = 0; c < half; c++) {
                        const int64_t g = c / size, g2 = (c + half) / size;
                        o[c] = (float)(code[c] & 15) * s[g] + z[g];
                        o[c + half] = (float)(code[c] >> 4) * s[g2] + z[g2];
                    }
                }
            }
        }
    }
    return 0;
}

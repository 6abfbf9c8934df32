/* MERIT's matrix step on CPU, float32, row-major (R, C): two passes over the matrix instead of ~20.
 *
 * Built and loaded by worker/optim/_merit_cpu.py (gcc -O3 -march=native -fopenmp, cached); the Python
 * side computes the small ratio vectors between the passes with torch, as the eager step does.
 *
 * pass 1: m = b1*m + (1-b1)*g ; v = b2*v + (1-b2)*g*g ; u = m / (sqrt(v) + eps) + wd*w   (into u)
 *         and the max-norms max_j|w_ij|, max_j|u_ij| (rows), max_i|w_ij|, max_i|u_ij| (columns).
 *         Returns 1 when any |w| or |u| is NaN or inf (or a row's sum of them overflows): the caller then
 *         takes the norms from u with torch, whose max propagates NaN the way the authors' code does.
 * pass 2: r_ij = max(row_ratio_i, col_ratio_j), 1 where row i or column j is flagged;
 *         w -= lr * clamp(u * r, -1, 1)   (the clamp only when `clip`).
 *
 * Every loop over a row is `omp simd` (vectorised; gcc reports it with -fopt-info-vec). Its max
 * reductions, `a > b ? a : b`, drop NaN; NaN and inf are caught by the row sums instead (see pass 1).
 */
#include <math.h>
#include <stdint.h>
#include <omp.h>

static inline float max_(float a, float b) { return a > b ? a : b; }

int merit_pass1(int64_t R, int64_t C, const float *w, const float *g, float *m, float *v, float *u,
                float beta1, float beta2, float eps, float wd,
                float *row_w, float *row_u, float *col_w, float *col_u,
                float *partial, /* (n_threads, 2, C): each thread's column maxima of |w| and |u| */
                int n_threads)
{
    const float one_b1 = 1.0f - beta1, one_b2 = 1.0f - beta2;
    int not_finite = 0;
#pragma omp parallel num_threads(n_threads) reduction(| : not_finite)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        float *cw = partial + (int64_t)t * 2 * C, *cu = cw + C;
        for (int64_t j = 0; j < C; j++) cw[j] = cu[j] = 0.0f; /* |x| >= 0: 0 is max's identity */
        const int64_t r0 = R * t / n, r1 = R * (t + 1) / n;  /* whole rows per thread */
        for (int64_t i = r0; i < r1; i++) {
            const float *wi = w + i * C, *gi = g + i * C;
            float *mi = m + i * C, *vi = v + i * C, *ui = u + i * C;
            float row_max_w = 0.0f, row_max_u = 0.0f, row_sum = 0.0f;
#pragma omp simd reduction(max : row_max_w, row_max_u) reduction(+ : row_sum)
            for (int64_t j = 0; j < C; j++) {
                const float gj = gi[j], wj = wi[j];
                const float mj = mi[j] * beta1 + one_b1 * gj;
                const float vj = vi[j] * beta2 + one_b2 * gj * gj;
                const float uj = mj / (sqrtf(vj) + eps) + wd * wj;
                mi[j] = mj;
                vi[j] = vj;
                ui[j] = uj;
                const float aw = fabsf(wj), au = fabsf(uj);
                row_max_w = max_(aw, row_max_w);
                row_max_u = max_(au, row_max_u);
                cw[j] = max_(aw, cw[j]);
                cu[j] = max_(au, cu[j]);
                row_sum += aw + au; /* NaN or inf anywhere makes the sum non-finite */
            }
            row_w[i] = row_max_w;
            row_u[i] = row_max_u;
            not_finite |= !isfinite(row_sum);
        }
#pragma omp barrier
        /* combine the threads' column maxima, each thread a slice of the columns */
        const int64_t c0 = C * t / n, c1 = C * (t + 1) / n;
        for (int64_t j = c0; j < c1; j++) {
            float mw = 0.0f, mu = 0.0f;
            for (int s = 0; s < n; s++) {
                mw = max_(partial[(int64_t)s * 2 * C + j], mw);
                mu = max_(partial[(int64_t)s * 2 * C + C + j], mu);
            }
            col_w[j] = mw;
            col_u[j] = mu;
        }
    }
    return not_finite;
}

void merit_pass2(int64_t R, int64_t C, float *w, const float *u,
                 const float *row_ratio, const float *col_ratio,
                 const uint8_t *row_flag, const float *col_flag, /* 1: a zero max-norm, the ratio is 1 */
                 int masked, int clip, float lr, int n_threads)
{
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < R; i++) {
        float *wi = w + i * C;
        const float *ui = u + i * C;
        const float rr = row_ratio[i];
        if (masked && row_flag[i]) { /* the whole row's ratio is 1 */
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                float x = ui[j];
                if (clip) x = x > 1.0f ? 1.0f : (x < -1.0f ? -1.0f : x);
                wi[j] -= lr * x;
            }
        } else if (masked) {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                const float r = col_flag[j] != 0.0f ? 1.0f : max_(rr, col_ratio[j]);
                float x = ui[j] * r;
                if (clip) x = x > 1.0f ? 1.0f : (x < -1.0f ? -1.0f : x);
                wi[j] -= lr * x;
            }
        } else if (clip) {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                float x = ui[j] * max_(rr, col_ratio[j]);
                x = x > 1.0f ? 1.0f : (x < -1.0f ? -1.0f : x);
                wi[j] -= lr * x;
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) wi[j] -= lr * (ui[j] * max_(rr, col_ratio[j]));
        }
    }
}

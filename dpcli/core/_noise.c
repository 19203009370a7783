/*
 * dpcli.core._noise: the compiled path of dpcli's exact integer noise (noise stream v2).
 *
 * The reference is the numpy code in dpcli/core/noise_stream.py; this file computes the same
 * function, sample for sample, and tests/test_noise_stream.py checks that they agree. The
 * definition (docs/accounting.md, "Randomness and noise"):
 *
 *   - Sample j of a draw reads 32-bit words from its own ChaCha20 stream (RFC 8439 block
 *     function; key = the draw's 32-byte key, nonce = (j mod 2^32, j div 2^32, 0), block counter
 *     0, 1, 2, ...; words in order within a block). No two samples share a word, so a sample is
 *     a pure function of (key, j): samples can be drawn in any order, or only some of them.
 *   - uniform_below(m): for m <= 2^32 one word u, x = u*m, accepted when x mod 2^32 >= 2^32 mod m,
 *     then x div 2^32 (Lemire); for larger m two words (low first), accepted below the largest
 *     multiple of m that fits in 2^64, then u mod m.
 *   - Bernoulli(exp(-num/den)): one word u is the leading 32 bits of a uniform real V in [0, 1);
 *     the trial succeeds when V < exp(-num/den). Floats only decide when V's interval
 *     [u, u+1)/2^32 lies clearly (relative margin 2^-36) on one side of exp(-num/den); otherwise
 *     V's further bits come from the word's extension stream (nonce (j mod 2^32, j div 2^32,
 *     2^31 + i), i = the word's index in sample j's stream) and the comparison is decided in exact
 *     arithmetic by a Python callable. The result is the exact V < p, whatever the floats did.
 *   - discrete Laplace (CKS 2020, Algorithm 2) with scale t/s, its geometric part drawn as
 *     floor(-ln W) from one word (and for t = 1 no draw for U = 0 and its sure trial), and discrete Gaussian (Algorithm 3, proposal scale t,
 *     acceptance exp(-(q|Y| - p)^2 / (2tpq))), as in the reference.
 *
 * Built by pip (setup.py) as an optional extension: without a C compiler dpcli uses the
 * reference, which gives the same numbers more slowly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define HAVE_PTHREADS 1
#endif

typedef struct {
    uint32_t key[8];
    uint64_t j;          /* the sample's index */
    uint32_t block[16];  /* the current block of the sample's stream */
    uint32_t counter;    /* index of the next block to compute */
    uint32_t pos;        /* words of the stream consumed so far */
    PyObject *exact;     /* exact(j, i, u, num, den) -> bool */
    int failed;          /* a Python error is pending (or, in a worker, kept in err_*) */
    int threaded;        /* running without the GIL: take it around the callback */
    int exhausted;       /* the sample reached WORD_LIMIT words (failed is set too) */
    PyObject *err_type, *err_value, *err_tb; /* a worker's error, restored by the caller */
} Sample;

#define ROTL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))
#define QR(a, b, c, d)                                                                              \
    a += b; d ^= a; d = ROTL(d, 16);                                                                \
    c += d; b ^= c; b = ROTL(b, 12);                                                                \
    a += b; d ^= a; d = ROTL(d, 8);                                                                 \
    c += d; b ^= c; b = ROTL(b, 7);

/* The RFC 8439 block function: 16 output words for (key, counter, nonce). */
static void chacha20_block(const uint32_t key[8], uint32_t counter, uint32_t n0, uint32_t n1, uint32_t n2,
                           uint32_t out[16]) {
    uint32_t s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
                      key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
                      counter, n0, n1, n2};
    uint32_t x[16];
    memcpy(x, s, sizeof x);
    for (int r = 0; r < 10; r++) {
        QR(x[0], x[4], x[8], x[12]) QR(x[1], x[5], x[9], x[13])
        QR(x[2], x[6], x[10], x[14]) QR(x[3], x[7], x[11], x[15])
        QR(x[0], x[5], x[10], x[15]) QR(x[1], x[6], x[11], x[12])
        QR(x[2], x[7], x[8], x[13]) QR(x[3], x[4], x[9], x[14])
    }
    for (int i = 0; i < 16; i++) out[i] = x[i] + s[i];
}

/* Consecutive samples' first blocks at once, in vector registers (GCC/Clang vector extensions;
 * the same words as one chacha20_block call per sample). Eight lanes everywhere; on x86-64 with
 * GCC, an AVX2 clone of the eight-lane version and, on CPUs with AVX-512, sixteen lanes. */
#define MAX_LANES 16
#define FIRST_BLOCKS_BODY(V, N)                                                                     \
    static const uint32_t sigma[4] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u};        \
    V x[16], s[16];                                                                                 \
    for (int w = 0; w < 4; w++) s[w] = (V){0} + sigma[w];                                           \
    for (int w = 0; w < 8; w++) s[4 + w] = (V){0} + key[w];                                         \
    s[12] = s[15] = (V){0};                                                                         \
    for (int l = 0; l < (N); l++) {                                                                 \
        uint64_t j = j0 + (uint64_t)l;                                                              \
        s[13][l] = (uint32_t)j;                                                                     \
        s[14][l] = (uint32_t)(j >> 32);                                                             \
    }                                                                                               \
    for (int w = 0; w < 16; w++) x[w] = s[w];                                                       \
    for (int r = 0; r < 10; r++) {                                                                  \
        QR(x[0], x[4], x[8], x[12]) QR(x[1], x[5], x[9], x[13])                                     \
        QR(x[2], x[6], x[10], x[14]) QR(x[3], x[7], x[11], x[15])                                   \
        QR(x[0], x[5], x[10], x[15]) QR(x[1], x[6], x[11], x[12])                                   \
        QR(x[2], x[7], x[8], x[13]) QR(x[3], x[4], x[9], x[14])                                     \
    }                                                                                               \
    for (int w = 0; w < 16; w++) {                                                                  \
        V y = x[w] + s[w];                                                                          \
        for (int l = 0; l < (N); l++) out[l][w] = y[l];                                             \
    }

typedef uint32_t v8 __attribute__((vector_size(32)));
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define X86_DISPATCH 1
__attribute__((target_clones("avx2", "default")))
#endif
static void chacha20_first_blocks8(const uint32_t key[8], uint64_t j0, uint32_t out[MAX_LANES][16]) {
    FIRST_BLOCKS_BODY(v8, 8)
}

#ifdef X86_DISPATCH
typedef uint32_t v16 __attribute__((vector_size(64)));
__attribute__((target("avx512f")))
static void chacha20_first_blocks16(const uint32_t key[8], uint64_t j0, uint32_t out[MAX_LANES][16]) {
    FIRST_BLOCKS_BODY(v16, 16)
}
#endif

/* 16 when the CPU has AVX-512 (set at import; set_lanes(8) in tests exercises the other path). */
static int LANES = 8;

static void chacha20_first_blocks(const uint32_t key[8], uint64_t j0, uint32_t out[MAX_LANES][16]) {
#ifdef X86_DISPATCH
    if (LANES == 16) {
        chacha20_first_blocks16(key, j0, out);
        return;
    }
#endif
    chacha20_first_blocks8(key, j0, out);
}

/* Words one sample may read: its word indices i stay below 2^31, so the extension nonces 2^31 + i never
 * wrap round onto the sample's own stream (nonce word 0) and the block counter never wraps. A sample
 * that needs more (only for parameters whose acceptance is hopeless) fails; each trial checks the
 * limit first and reads fewer than 64 words. set_word_limit() lowers it in tests. */
#define MAX_WORD_LIMIT ((1u << 31) - 64u)
static uint32_t WORD_LIMIT = MAX_WORD_LIMIT;

static inline int out_of_words(Sample *S) {
    if (S->pos < WORD_LIMIT) return 0;
    S->failed = S->exhausted = 1;
    return 1;
}

static inline uint32_t next_word(Sample *S) {
    if (S->pos >= 16u * S->counter) {
        chacha20_block(S->key, S->counter, (uint32_t)S->j, (uint32_t)(S->j >> 32), 0u, S->block);
        S->counter++;
    }
    return S->block[S->pos++ & 15u];
}

/* uniform_below(m) with its rejection threshold precomputed. m <= 2^32 (Lemire's method, no division
 * per word): one word u, x = u*m, accepted when x mod 2^32 >= 2^32 mod m, then x div 2^32. Larger m
 * use two words (low first), accepted below 2^64 - (2^64 mod m), then u mod m. */
typedef struct {
    uint64_t m, limit; /* narrow: 2^32 mod m; wide: 2^64 - (2^64 mod m), or 0 when m divides 2^64 */
    int wide;
} Uniform;

static Uniform uniform_for(uint64_t m) {
    Uniform U = {m, 0, m > (1ull << 32)};
    if (!U.wide) U.limit = (1ull << 32) % m;
    else if ((0ull - m) % m) U.limit = 0ull - ((0ull - m) % m); /* (2^64 - m) mod m = 2^64 mod m */
    return U;
}

static inline uint64_t uniform_below(Sample *S, const Uniform *U) {
    for (;;) {
        if (out_of_words(S)) return 0;
        uint64_t u = next_word(S);
        if (!U->wide) {
            uint64_t x = u * U->m;
            if ((x & 0xffffffffull) >= U->limit) return x >> 32;
            continue;
        }
        u |= (uint64_t)next_word(S) << 32;
        if (U->limit == 0 || u < U->limit) return u % U->m;
    }
}

static PyObject *int128_to_py(__int128 v) {
    /* v >= 0 here: build it from two 64-bit halves. */
    unsigned __int128 u = (unsigned __int128)v;
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(u >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)u);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *res = NULL;
    if (hi && lo && shift) {
        PyObject *shifted = PyNumber_Lshift(hi, shift);
        if (shifted) {
            res = PyNumber_Or(shifted, lo);
            Py_DECREF(shifted);
        }
    }
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    return res;
}

static double MARGIN = 1.4551915228366852e-11; /* 2^-36; tests widen it (set_margin) to exercise the exact path */
static const double TWO_M32 = 2.3283064365386963e-10; /* 2^-32 */
static const double SLACK = 3.552713678800501e-15;    /* 2^-48 */

/* Is V < exp(-num/den) (num >= 0, den >= 1), where V's leading 32 bits are the word u at index i of
 * the sample's stream? gamma is num/den in floats (to within a few ulps), f = exp(-gamma) when the
 * caller knows it (else negative). Floats decide only when certain; else the Python callable does. */
static int less_than_exp(Sample *S, uint32_t i, uint32_t u, __int128 num, __int128 den, double gamma, double f) {
    if (num == 0) return 1;
    double v_lo = (double)u * TWO_M32, v_hi = ((double)u + 1.0) * TWO_M32; /* exact */
    if (gamma > 700.0) {
        if (u >= 1) return 0; /* V >= 2^-32 > exp(-700) */
    } else {
        if (f < 0) f = exp(-gamma);
        if (v_hi <= f * (1.0 - MARGIN)) return 1;
        if (v_lo >= f * (1.0 + MARGIN)) return 0;
    }
    if (S->failed) return 0;
    PyGILState_STATE gil = PyGILState_UNLOCKED;
    if (S->threaded) gil = PyGILState_Ensure();
    PyObject *pn = int128_to_py(num), *pd = int128_to_py(den);
    PyObject *r = NULL;
    if (pn && pd)
        r = PyObject_CallFunction(S->exact, "KIIOO", (unsigned long long)S->j, (unsigned int)i, (unsigned int)u,
                                  pn, pd);
    Py_XDECREF(pn);
    Py_XDECREF(pd);
    int ok = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (ok < 0) {
        S->failed = 1;
        if (S->threaded) PyErr_Fetch(&S->err_type, &S->err_value, &S->err_tb);
    }
    if (S->threaded) PyGILState_Release(gil);
    return ok > 0;
}

/* Bernoulli(exp(-num/den)): one word. */
static inline int bernoulli_exp(Sample *S, __int128 num, __int128 den, double gamma) {
    uint32_t i = S->pos;
    uint32_t u = next_word(S);
    return less_than_exp(S, i, u, num, den, gamma, -1.0);
}

/* exp(-k) for k = 0 .. 63 (filled at import; floats only decide with the margin). */
static double EXP_MINUS[64];

/* The geometric part of Algorithm 2, floor(-ln W) for one uniform real W (one word and its
 * extension): the number of k >= 1 with W < exp(-k), P[>= k] = exp(-k). */
static int64_t geometric_e(Sample *S) {
    uint32_t i = S->pos;
    uint32_t u = next_word(S);
    int64_t k = 0;
    while (less_than_exp(S, i, u, k + 1, 1, (double)(k + 1), k + 1 < 64 ? EXP_MINUS[k + 1] : -1.0)) k++;
    return k;
}

/* CKS Algorithm 2: discrete Laplace with scale t/s (t >= 1, s >= 1; t <= 2^62 / 2^18). */
static int64_t laplace_one(Sample *S, const Uniform *U, int64_t s) {
    int64_t t = (int64_t)U->m;
    double inv_t = 1.0 / (double)t;
    for (;;) {
        if (out_of_words(S)) return 0;
        int64_t u = 0; /* t = 1: U = 0 and the first trial always succeeds, so neither is drawn */
        if (t > 1) {
            u = (int64_t)uniform_below(S, U);
            if (S->failed) return 0;
            /* Bernoulli(exp(-u/t)), usually decided without exp: 1 - g <= exp(-g) <= 1 - g + g^2/2
             * for g = u/t in [0, 1), whose float value is within 2^-53 of the truth; an absolute
             * slack of 2^-48 covers that and the rounding of the bounds. Undecided: less_than_exp. */
            uint32_t i = S->pos;
            uint32_t w = next_word(S);
            double g = (double)u * inv_t, v_lo = (double)w * TWO_M32, v_hi = v_lo + TWO_M32;
            int accept;
            if (v_hi + SLACK <= 1.0 - g) accept = 1;
            else if (v_lo >= 1.0 - g + 0.5 * g * g + SLACK) accept = 0;
            else accept = less_than_exp(S, i, w, u, t, g, -1.0);
            if (!accept) {
                if (S->failed) return 0;
                continue;
            }
        }
        int64_t v = geometric_e(S);
        if (S->failed) return 0;
        if (v >= (INT64_C(1) << 62) / t) { /* probability below exp(-2^18) */
            if (S->threaded) { /* a worker runs without the GIL: raise under it and keep the error */
                PyGILState_STATE gil = PyGILState_Ensure();
                PyErr_SetString(PyExc_OverflowError, "geometric part out of range");
                PyErr_Fetch(&S->err_type, &S->err_value, &S->err_tb);
                PyGILState_Release(gil);
            } else {
                PyErr_SetString(PyExc_OverflowError, "geometric part out of range");
            }
            S->failed = 1;
            return 0;
        }
        int64_t y = s == 1 ? u + t * v : (u + t * v) / s; /* no division for integer scales */
        uint32_t b = next_word(S) >> 31;
        if (b && y == 0) continue;
        return b ? -y : y;
    }
}

/* CKS Algorithm 3 with proposal scale t and sigma^2 rounded to t*p/q. */
static int64_t gaussian_one(Sample *S, const Uniform *U, int64_t p, int64_t q) {
    int64_t t = (int64_t)U->m;
    __int128 den = (__int128)2 * t * p * q;
    double inv_den = 1.0 / ((double)2 * (double)t * (double)p * (double)q);
    for (;;) {
        if (out_of_words(S)) return 0;
        int64_t y = laplace_one(S, U, 1);
        if (S->failed) return 0;
        __int128 d = (__int128)q * (y < 0 ? -(__int128)y : (__int128)y) - p;
        double dd = (double)q * fabs((double)y) - (double)p;
        /* Bernoulli(exp(-g)), g = d^2/den, usually decided without exp: 1 - g <= exp(-g) <= 1/(1 + g);
         * g's float value is within 2^-51 * max(g, 1) of the truth, and both bounds move by less than
         * 2^-50 for that (slope <= 1), so the absolute slack 2^-48 covers them. */
        double g = dd * dd * inv_den;
        uint32_t i = S->pos;
        uint32_t w = next_word(S);
        double v_lo = (double)w * TWO_M32, v_hi = v_lo + TWO_M32;
        int accept;
        if (g < 1.0 && v_hi + SLACK <= 1.0 - g) accept = 1;
        else if (v_lo >= 1.0 / (1.0 + g) + SLACK) accept = 0;
        else accept = less_than_exp(S, i, w, d * d, den, g, -1.0);
        if (accept) return y;
        if (S->failed) return 0;
    }
}

typedef struct {
    Py_buffer key, idx, out;
} Buffers;

static void release_buffers(Buffers *b) {
    if (b->key.obj) PyBuffer_Release(&b->key);
    if (b->idx.obj) PyBuffer_Release(&b->idx);
    if (b->out.obj) PyBuffer_Release(&b->out);
}

/* idx is None (samples first, first + 1, ... for each element of out) or a uint64 buffer. */
static int get_buffers(PyObject *key, PyObject *idx, PyObject *out, Buffers *b) {
    memset(b, 0, sizeof *b);
    if (PyObject_GetBuffer(key, &b->key, PyBUF_SIMPLE) < 0) return -1;
    if (idx != Py_None && PyObject_GetBuffer(idx, &b->idx, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(out, &b->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (b->key.len != 32) {
        PyErr_SetString(PyExc_ValueError, "key must be 32 bytes");
        return -1;
    }
    if (b->out.len % 8 || (idx != Py_None && b->out.len != b->idx.len)) {
        PyErr_SetString(PyExc_ValueError, "idx (uint64) and out (int64) must have the same length");
        return -1;
    }
    return 0;
}

typedef int64_t (*sampler_fn)(Sample *, const Uniform *, int64_t, int64_t);
static int64_t laplace_fn(Sample *S, const Uniform *U, int64_t s, int64_t unused) { (void)unused; return laplace_one(S, U, s); }
static int64_t gaussian_fn(Sample *S, const Uniform *U, int64_t p, int64_t q) { return gaussian_one(S, U, p, q); }

/* One thread's share of a draw: the samples at positions lo .. hi - 1 of the request. */
typedef struct {
    Sample S;
    const Uniform *U;
    sampler_fn fn;
    int64_t b, c;
    const uint64_t *js; /* sample indices, or NULL for first, first + 1, ... */
    uint64_t first;
    int64_t *res;
    Py_ssize_t lo, hi;
} Job;

static void *run_job(void *arg) {
    Job *job = (Job *)arg;
    Sample *S = &job->S;
#define J(k) (job->js ? job->js[k] : job->first + (uint64_t)(k))
    uint32_t blocks[MAX_LANES][16];
    Py_ssize_t k = job->lo, n = job->hi;
    while (k < n && !S->failed) {
        /* Runs of consecutive indices get their first blocks LANES at a time. */
        int lanes = k + LANES <= n;
        for (int l = 1; lanes && l < LANES; l++)
            if (J(k + l) != J(k) + (uint64_t)l) lanes = 0;
        if (lanes) chacha20_first_blocks(S->key, J(k), blocks);
        int m = lanes ? LANES : 1;
        for (int l = 0; l < m && !S->failed; l++, k++) {
            S->j = J(k);
            S->pos = 0;
            if (lanes) {
                memcpy(S->block, blocks[l], sizeof S->block);
                S->counter = 1;
            } else {
                S->counter = 0;
            }
            job->res[k] = job->fn(S, job->U, job->b, job->c);
        }
    }
#undef J
    return NULL;
}

/* Threads a large draw is split over (samples are independent: the values do not depend on it),
 * and the fewest samples per thread. set_threads() changes both; 1 thread keeps the GIL. */
#define MAX_THREADS 16
static int THREADS = 1;
static Py_ssize_t MIN_PER_THREAD = 1 << 15;

static PyObject *run(PyObject *args, sampler_fn fn, int three) {
    PyObject *key, *idx, *out, *exact, *first_obj;
    long long a, b, c = 0;
    int ok = three ? PyArg_ParseTuple(args, "OLLLOOOO", &key, &a, &b, &c, &first_obj, &idx, &out, &exact)
                   : PyArg_ParseTuple(args, "OLLOOOO", &key, &a, &b, &first_obj, &idx, &out, &exact);
    if (!ok) return NULL;
    /* Not "K": it takes 2^64 + j as j without a word, and sample j's noise would be read twice. */
    unsigned long long first = PyLong_AsUnsignedLongLong(first_obj);
    if (first == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (a < 1 || b < 1 || (three && c < 1) || a > (INT64_C(1) << 44)) {
        PyErr_SetString(PyExc_ValueError, "parameters must be positive (and t <= 2^44)");
        return NULL;
    }
    Uniform U = uniform_for((uint64_t)a);
    Buffers bufs;
    if (get_buffers(key, idx, out, &bufs) < 0) {
        release_buffers(&bufs);
        return NULL;
    }
    Py_ssize_t n = bufs.out.len / 8;
    if (idx == Py_None && n > 0 && first > UINT64_MAX - (uint64_t)(n - 1)) { /* the range must not wrap round */
        release_buffers(&bufs);
        PyErr_SetString(PyExc_OverflowError, "sample indices beyond 2^64 - 1");
        return NULL;
    }
    int threads = THREADS;
    if (threads > 1 && n / threads < MIN_PER_THREAD) threads = (int)(n / MIN_PER_THREAD);
    if (threads < 1) threads = 1;
    Job jobs[MAX_THREADS];
    memset(jobs, 0, sizeof jobs);
    const unsigned char *kb = (const unsigned char *)bufs.key.buf;
    for (int t = 0; t < threads; t++) {
        Job *job = &jobs[t];
        for (int w = 0; w < 8; w++)
            job->S.key[w] = (uint32_t)kb[4 * w] | (uint32_t)kb[4 * w + 1] << 8 | (uint32_t)kb[4 * w + 2] << 16 |
                            (uint32_t)kb[4 * w + 3] << 24;
        job->S.exact = exact;
        job->S.threaded = threads > 1;
        job->U = &U;
        job->fn = fn;
        job->b = b;
        job->c = c;
        job->js = bufs.idx.obj ? (const uint64_t *)bufs.idx.buf : NULL;
        job->first = first;
        job->res = (int64_t *)bufs.out.buf;
        job->lo = n * t / threads;
        job->hi = n * (t + 1) / threads;
    }
    if (threads == 1) {
        run_job(&jobs[0]);
    } else {
#ifdef HAVE_PTHREADS
        pthread_t ids[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        Py_BEGIN_ALLOW_THREADS
        for (int t = 1; t < threads; t++) started[t] = pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
        run_job(&jobs[0]);
        for (int t = 1; t < threads; t++) {
            if (started[t]) pthread_join(ids[t], NULL);
            else run_job(&jobs[t]); /* no thread: do its share here */
        }
        Py_END_ALLOW_THREADS
#endif
    }
    release_buffers(&bufs);
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        Sample *S = &jobs[t].S;
        if (!S->failed) continue;
        if (!failed && S->err_type) PyErr_Restore(S->err_type, S->err_value, S->err_tb);
        else {
            Py_XDECREF(S->err_type);
            Py_XDECREF(S->err_value);
            Py_XDECREF(S->err_tb);
        }
        failed = 1;
    }
    if (failed) {
        int exhausted = 0;
        for (int t = 0; t < threads; t++) exhausted |= jobs[t].S.exhausted;
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, exhausted ? "a noise sample needs more words than its stream has "
                                                            "(parameters with a hopeless acceptance rate)"
                                                          : "noise sampling failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_laplace(PyObject *self, PyObject *args) { (void)self; return run(args, laplace_fn, 0); }
static PyObject *py_gaussian(PyObject *self, PyObject *args) { (void)self; return run(args, gaussian_fn, 1); }

static PyObject *py_block(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer key;
    unsigned int counter, n0, n1, n2;
    if (!PyArg_ParseTuple(args, "y*IIII", &key, &counter, &n0, &n1, &n2)) return NULL;
    if (key.len != 32) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "key must be 32 bytes");
        return NULL;
    }
    uint32_t kw[8], out[16];
    const unsigned char *kb = (const unsigned char *)key.buf;
    for (int w = 0; w < 8; w++)
        kw[w] = (uint32_t)kb[4 * w] | (uint32_t)kb[4 * w + 1] << 8 | (uint32_t)kb[4 * w + 2] << 16 |
                (uint32_t)kb[4 * w + 3] << 24;
    PyBuffer_Release(&key);
    chacha20_block(kw, counter, n0, n1, n2, out);
    unsigned char bytes[64];
    for (int w = 0; w < 16; w++)
        for (int i = 0; i < 4; i++) bytes[4 * w + i] = (unsigned char)(out[w] >> (8 * i));
    return PyBytes_FromStringAndSize((const char *)bytes, 64);
}

static PyObject *py_set_margin(PyObject *self, PyObject *args) {
    (void)self;
    double m;
    if (!PyArg_ParseTuple(args, "d", &m)) return NULL;
    if (!(m >= 1.4551915228366852e-11 && m < 0.5)) {
        PyErr_SetString(PyExc_ValueError, "margin must be in [2^-36, 1/2)");
        return NULL;
    }
    double old = MARGIN;
    MARGIN = m;
    return PyFloat_FromDouble(old);
}

static PyObject *py_set_lanes(PyObject *self, PyObject *args) {
    (void)self;
    int lanes;
    if (!PyArg_ParseTuple(args, "i", &lanes)) return NULL;
    int ok = lanes == 8;
#ifdef X86_DISPATCH
    __builtin_cpu_init();
    ok = ok || (lanes == 16 && __builtin_cpu_supports("avx512f"));
#endif
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "lanes must be 8, or 16 on a CPU with AVX-512");
        return NULL;
    }
    int old = LANES;
    LANES = lanes;
    return PyLong_FromLong(old);
}

static PyObject *py_set_word_limit(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long limit;
    if (!PyArg_ParseTuple(args, "k", &limit)) return NULL;
    if (limit < 64 || limit > MAX_WORD_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "the word limit must be in [64, 2^31 - 64]");
        return NULL;
    }
    unsigned long old = WORD_LIMIT;
    WORD_LIMIT = (uint32_t)limit;
    return PyLong_FromUnsignedLong(old);
}

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    (void)self;
    int threads;
    Py_ssize_t min_per_thread = MIN_PER_THREAD;
    if (!PyArg_ParseTuple(args, "i|n", &threads, &min_per_thread)) return NULL;
    if (threads < 1 || threads > MAX_THREADS || min_per_thread < 1) {
        PyErr_SetString(PyExc_ValueError, "threads must be in 1 .. 16 and the minimum share >= 1");
        return NULL;
    }
#ifndef HAVE_PTHREADS
    threads = 1;
#endif
    int old = THREADS;
    THREADS = threads;
    MIN_PER_THREAD = min_per_thread;
    return PyLong_FromLong(old);
}

static PyMethodDef methods[] = {
    {"set_threads", py_set_threads, METH_VARARGS,
     "set_threads(n[, min_per_thread]) -> old: threads for large draws (default: the CPUs, at most 16)."},
    {"set_lanes", py_set_lanes, METH_VARARGS,
     "set_lanes(n) -> old: samples whose first blocks are computed together (8, or 16 with AVX-512; tests)."},
    {"set_word_limit", py_set_word_limit, METH_VARARGS,
     "set_word_limit(n) -> old: the words one sample may read before it fails (default 2^31 - 64; tests lower it)."},
    {"set_margin", py_set_margin, METH_VARARGS,
     "set_margin(m) -> old: the float decisions' relative margin (tests widen it so the exact path runs often)."},
    {"laplace", py_laplace, METH_VARARGS,
     "laplace(key, t, s, first, idx, out, exact): discrete Laplace (scale t/s) into out (int64) for the samples idx (uint64), or first, first + 1, ... when idx is None."},
    {"gaussian", py_gaussian, METH_VARARGS,
     "gaussian(key, t, p, q, first, idx, out, exact): discrete Gaussian (sigma^2 = t*p/q), samples as for laplace."},
    {"block", py_block, METH_VARARGS, "block(key, counter, n0, n1, n2): one ChaCha20 block (64 bytes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_noise", "Exact integer noise, compiled (noise stream v2).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__noise(void) {
    for (int k = 0; k < 64; k++) EXP_MINUS[k] = exp(-(double)k);
#ifdef X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) LANES = 16;
#endif
#ifdef HAVE_PTHREADS
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    THREADS = cpus < 1 ? 1 : (cpus > MAX_THREADS ? MAX_THREADS : (int)cpus);
#endif
    return PyModule_Create(&module);
}

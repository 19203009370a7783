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
 * How it is computed (none of it changes a sample): samples go in batches of 8 or 16 whose first
 * blocks are computed together in vector registers; a sample that reads past its first block (a few
 * in a thousand for the Laplace, up to a fifth for the Gaussian at small sigma) is put off and redrawn
 * from its first word in a batch whose first two, then three, blocks are computed together. Most
 * Bernoulli trials are decided by integer thresholds on the word (the geometric part's e^-k always;
 * Algorithm 2's first trial and Algorithm 3's acceptance from tables built for large draws at small
 * scales), the others by floats with bounds or a fast exp(-g); exact_less decides every trial they
 * cannot settle.
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

/* Words of the first blocks computed together are kept word-major: word w of lane l at
 * [w * MAX_LANES + l], so a sample reads its words with the stride MAX_LANES. */
#define MAX_LANES 16
#define BLOCK_WORDS (16 * MAX_LANES)

/* Blocks of a sample's stream available to it: BLOCKS_AT_ONCE at most from the batches
 * (block c at blocks[c]), the later ones computed one at a time when the sample is lazy. */
#define BLOCKS_AT_ONCE 3

enum { STOP_FAILED = 1, STOP_DEFERRED = 2 };

typedef struct {
    uint32_t key[8];
    uint64_t j;          /* the sample's index */
    uint32_t pos;        /* words of the stream consumed so far */
    uint32_t avail;      /* blocks 0 .. avail - 1 are in blocks[] */
    const uint32_t *blocks[BLOCKS_AT_ONCE]; /* word w of block c at blocks[c][w * MAX_LANES] */
    int lazy;            /* past them: compute the block here (else stop with STOP_DEFERRED) */
    uint32_t own_counter; /* the block in own[] */
    uint32_t own[16];
    PyObject *exact;     /* exact(j, i, u, num, den) -> bool */
    int stop;            /* STOP_FAILED: a Python error is pending (or, in a worker, kept in err_*);
                            STOP_DEFERRED: the sample ran out of the words at hand */
    int threaded;        /* running without the GIL: take it around the callback */
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

/* Block `counter` of several samples' streams at once (samples js[0 .. N-1]), in vector registers
 * (GCC/Clang vector extensions; the same words as one chacha20_block call per sample), stored
 * word-major. Eight lanes everywhere; on x86-64 with GCC, an AVX2 clone of the eight-lane version
 * and, on CPUs with AVX-512, sixteen lanes. */
#define BLOCKS_BODY(V, N)                                                                           \
    static const uint32_t sigma[4] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u};        \
    V x[16], s[16];                                                                                 \
    for (int w = 0; w < 4; w++) s[w] = (V){0} + sigma[w];                                           \
    for (int w = 0; w < 8; w++) s[4 + w] = (V){0} + key[w];                                         \
    s[12] = (V){0} + counter;                                                                       \
    s[15] = (V){0};                                                                                 \
    for (int l = 0; l < (N); l++) {                                                                 \
        s[13][l] = (uint32_t)js[l];                                                                 \
        s[14][l] = (uint32_t)(js[l] >> 32);                                                         \
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
        memcpy(out + w * MAX_LANES, &y, sizeof y);                                                  \
    }

typedef uint32_t v8 __attribute__((vector_size(32)));
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define X86_DISPATCH 1
__attribute__((target_clones("avx2", "default")))
#endif
static void chacha20_blocks8(const uint32_t key[8], uint32_t counter, const uint64_t js[8], uint32_t *out) {
    BLOCKS_BODY(v8, 8)
}

#ifdef X86_DISPATCH
typedef uint32_t v16 __attribute__((vector_size(64)));
__attribute__((target("avx512f")))
static void chacha20_blocks16(const uint32_t key[8], uint32_t counter, const uint64_t js[16], uint32_t *out) {
    BLOCKS_BODY(v16, 16)
}
#endif

/* 16 when the CPU has AVX-512 (set at import; set_lanes(8) in tests exercises the other path). */
static int LANES = 8;

/* Block `counter` of the streams of samples js[0 .. LANES-1], word-major into out[BLOCK_WORDS]. */
static void chacha20_blocks(const uint32_t key[8], uint32_t counter, const uint64_t js[MAX_LANES], uint32_t *out) {
#ifdef X86_DISPATCH
    if (LANES == 16) {
        chacha20_blocks16(key, counter, js, out);
        return;
    }
#endif
    chacha20_blocks8(key, counter, js, out);
}

/* Word `p` >= 16 of the sample's stream (rare: most samples read fewer than 16 words). */
static __attribute__((noinline)) uint32_t later_word(Sample *S, uint32_t p) {
    uint32_t c = p >> 4;
    if (c < S->avail) return S->blocks[c][(p & 15u) * MAX_LANES];
    if (!S->lazy) {
        S->stop |= STOP_DEFERRED; /* redrawn later with more blocks at hand; until then, any word */
        return 0xffffffffu;
    }
    if (S->own_counter != c) {
        chacha20_block(S->key, c, (uint32_t)S->j, (uint32_t)(S->j >> 32), 0u, S->own);
        S->own_counter = c;
    }
    return S->own[p & 15u];
}

static inline uint32_t next_word(Sample *S) {
    uint32_t p = S->pos++;
    if (__builtin_expect(p < 16u, 1)) return S->blocks[0][p * MAX_LANES];
    return later_word(S, p);
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

static inline int out_of_words(Sample *S);

static inline uint64_t uniform_below(Sample *S, const Uniform *U) {
    for (;;) {
        if (out_of_words(S)) return 0;
        uint64_t u = next_word(S);
        if (!U->wide) {
            uint64_t x = u * U->m;
            if (__builtin_expect((x & 0xffffffffull) >= U->limit, 1)) return x >> 32;
            continue;
        }
        u |= (uint64_t)next_word(S) << 32;
        if (U->limit == 0 || u < U->limit) return u % U->m;
        if (S->stop) return 0;
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

/* exp(-k) for k = 0 .. 63, exp(-i/64) for i = 0 .. 64 (libm, filled at import; floats only decide
 * with the margin). */
static double EXP_MINUS[64];
static double EXP_MINUS_64THS[65];

/* exp(-g) for 0 <= g < 32 with a relative error below 2^-45 (plus that of g itself), instead of
 * libm's exp: exp(-n) exp(-i/64) exp(-h) with n = floor(g), i = floor(64 (g - n)), h = g - n - i/64
 * in [0, 1/64) (exact subtractions), exp(-h) from its Taylor polynomial of degree 5 (alternating
 * series: error <= h^6/720 < 2^-45.49, relative to exp(-h) > 0.98), the two table entries within
 * an ulp each and a few roundings (measured: at most 2^-45.4 over 2*10^8 g). The decisions it feeds
 * keep the relative margin MARGIN >= 2^-36, and the exact comparison decides inside it. */
static inline double exp_neg(double g) {
    int n = (int)g;
    double r = g - (double)n;
    int i = (int)(r * 64.0);
    double h = r - (double)i * 0.015625;
    double p = 1.0 - h * (1.0 - h * (0.5 - h * (1.0 / 6 - h * (1.0 / 24 - h * (1.0 / 120)))));
    return EXP_MINUS[n] * EXP_MINUS_64THS[i] * p;
}

/* The exact comparison, by the Python callable (rare): V < exp(-num/den). */
static __attribute__((noinline)) int exact_less(Sample *S, uint32_t i, uint32_t u, __int128 num, __int128 den) {
    if (S->stop) return 0;
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
        S->stop |= STOP_FAILED;
        if (S->threaded) PyErr_Fetch(&S->err_type, &S->err_value, &S->err_tb);
    }
    if (S->threaded) PyGILState_Release(gil);
    return ok > 0;
}

/* Sets a Python error for the sample's draw (a worker thread takes the GIL and keeps it in err_*). */
static __attribute__((noinline)) void fail(Sample *S, PyObject *type, const char *message) {
    PyGILState_STATE gil = PyGILState_UNLOCKED;
    if (S->threaded) gil = PyGILState_Ensure();
    PyErr_SetString(type, message);
    S->stop |= STOP_FAILED;
    if (S->threaded) {
        PyErr_Fetch(&S->err_type, &S->err_value, &S->err_tb);
        PyGILState_Release(gil);
    }
}

/* Words one sample may read: its word indices i stay below 2^31, so the extension nonces 2^31 + i never
 * wrap round onto the sample's own stream (nonce word 0) and the block counter never wraps. A sample
 * that needs more (only for parameters whose acceptance is hopeless) fails; each trial checks the
 * limit first and reads fewer than 64 words. set_word_limit() lowers it in tests. A sample already
 * deferred (reading words not at hand) stops without failing: it is redrawn with its real words. */
#define MAX_WORD_LIMIT ((1u << 31) - 64u)
static uint32_t WORD_LIMIT = MAX_WORD_LIMIT;

static inline int out_of_words(Sample *S) {
    if (__builtin_expect(S->pos < WORD_LIMIT, 1)) return 0;
    if (!S->stop)
        fail(S, PyExc_RuntimeError, "a noise sample needs more words than its stream has "
                                    "(parameters with a hopeless acceptance rate)");
    return 1;
}

/* Is V < exp(-num/den) (num >= 0, den >= 1), where V's leading 32 bits are the word u at index i of
 * the sample's stream? gamma is num/den in floats (to within a few ulps), f = exp(-gamma) when the
 * caller knows it (else negative). Floats decide only when certain; else the Python callable does. */
static inline int less_than_exp(Sample *S, uint32_t i, uint32_t u, __int128 num, __int128 den, double gamma, double f) {
    if (num == 0) return 1;
    double v_lo = (double)u * TWO_M32, v_hi = ((double)u + 1.0) * TWO_M32; /* exact */
    if (gamma > 700.0) {
        if (u >= 1) return 0; /* V >= 2^-32 > exp(-700) */
    } else {
        if (f < 0) f = gamma < 32.0 ? exp_neg(gamma) : exp(-gamma);
        if (v_hi <= f * (1.0 - MARGIN)) return 1;
        if (v_lo >= f * (1.0 + MARGIN)) return 0;
    }
    return exact_less(S, i, u, num, den);
}

/* The geometric part's comparisons W < exp(-k) as integer thresholds on W's word u, the same
 * decisions as less_than_exp's floats: u < GEO_ACCEPT[k] iff (u + 1) 2^-32 <= exp(-k) (1 - MARGIN),
 * u >= GEO_REJECT[k] iff u 2^-32 >= exp(-k) (1 + MARGIN). Recomputed when the margin changes. */
#define GEO_K 24 /* exp(-24) (1 - MARGIN) < 2^-32: GEO_ACCEPT[24] = 0 */
static uint64_t GEO_ACCEPT[GEO_K + 2], GEO_REJECT[GEO_K + 2];

static void geometric_thresholds(void) {
    for (int k = 1; k <= GEO_K; k++) {
        double lo = EXP_MINUS[k] * (1.0 - MARGIN), hi = EXP_MINUS[k] * (1.0 + MARGIN);
        uint64_t a = 0, b = 1ull << 32; /* the first u (in [0, 2^32]) where the predicate fails */
        while (a < b) {
            uint64_t mid = (a + b) / 2;
            if (((double)mid + 1.0) * TWO_M32 <= lo) a = mid + 1;
            else b = mid;
        }
        GEO_ACCEPT[k] = a;
        a = 0, b = 1ull << 32; /* the first u where u 2^-32 >= hi, or 2^32 */
        while (a < b) {
            uint64_t mid = (a + b) / 2;
            if ((double)mid * TWO_M32 >= hi) b = mid;
            else a = mid + 1;
        }
        GEO_REJECT[k] = a;
    }
    GEO_ACCEPT[GEO_K + 1] = 0;
    GEO_REJECT[GEO_K + 1] = (1ull << 32) + 1; /* never decided here */
}

/* The geometric part of Algorithm 2, the loop in full: the number of k >= 1 with W < exp(-k). */
static __attribute__((noinline)) int64_t geometric_loop(Sample *S, uint32_t i, uint32_t u) {
    int64_t k = 0;
    while (less_than_exp(S, i, u, k + 1, 1, (double)(k + 1), k + 1 < 64 ? EXP_MINUS[k + 1] : -1.0)) k++;
    return k;
}

/* floor(-ln W) for one uniform real W (one word and its extension): the number of k >= 1 with
 * W < exp(-k), P[>= k] = exp(-k). Usually from the thresholds without a branch on W; when one
 * of the comparisons is too close for them, geometric_loop. */
static inline int64_t geometric_e(Sample *S) {
    uint32_t i = S->pos;
    uint64_t u = next_word(S);
    int c = (u < GEO_ACCEPT[1]) + (u < GEO_ACCEPT[2]) + (u < GEO_ACCEPT[3]) + (u < GEO_ACCEPT[4]);
    if (__builtin_expect(c == 4, 0))
        while (c <= GEO_K && u < GEO_ACCEPT[c + 1]) c++;
    /* W < exp(-k) decided for k <= c (the thresholds decrease); W >= exp(-(c + 1)) too? */
    if (__builtin_expect(u < GEO_REJECT[c + 1], 0)) return geometric_loop(S, i, (uint32_t)u);
    return c;
}

/* A Bernoulli(exp(-num/den)) trial with known f = exp(-num/den) (to within the float shortcut's
 * error) as integer thresholds on its word u: the same decisions as less_than_exp's floats,
 * u < accept iff (u + 1) 2^-32 <= f (1 - MARGIN) and u > reject_above iff u 2^-32 >= f (1 + MARGIN)
 * (both sides exact: scaling by 2^32 and floor/ceil of a double). Between them: less_than_exp. */
typedef struct {
    uint32_t accept, reject_above;
} Thresholds;

static Thresholds thresholds_for(double f, int sure) {
    Thresholds T = {UINT32_MAX, UINT32_MAX}; /* sure (num = 0): only u = 2^32 - 1 goes to less_than_exp */
    if (sure) return T;
    double lo = f * (1.0 - MARGIN) * 4294967296.0, hi = f * (1.0 + MARGIN) * 4294967296.0;
    double a = floor(lo), r = ceil(hi);
    T.accept = a <= 0.0 ? 0u : a >= 4294967295.0 ? UINT32_MAX : (uint32_t)a;
    T.reject_above = r <= 1.0 ? 0u : r > 4294967296.0 ? UINT32_MAX : (uint32_t)(r - 1.0);
    return T;
}

/* A draw's parameters, and tables of thresholds built for large draws at small scales. */
typedef struct {
    Uniform U;
    int64_t t, s, p, q;
    double inv_t, inv_den;
    __int128 den;              /* 2tpq */
    const Thresholds *trial;   /* Algorithm 2's first trial, by U (t entries), or NULL */
    const Thresholds *accept;  /* Algorithm 3's acceptance, by |Y| < n_accept, or NULL */
    int64_t n_accept;
} Params;

static const double SLACK = 3.552713678800501e-15; /* 2^-48 */

/* CKS Algorithm 2: discrete Laplace with scale t/s (t >= 1, s >= 1; t <= 2^62 / 2^18). */
static inline __attribute__((always_inline)) int64_t laplace_one(Sample *S, const Params *P, int64_t s) {
    int64_t t = P->t;
    for (;;) {
        if (out_of_words(S)) return 0;
        int64_t u = 0; /* t = 1: U = 0 and the first trial always succeeds, so neither is drawn */
        if (t > 1) {
            u = (int64_t)uniform_below(S, &P->U);
            if (S->stop) return 0;
            uint32_t i = S->pos;
            uint32_t w = next_word(S);
            int accept;
            if (P->trial) {
                Thresholds T = P->trial[u];
                if (w < T.accept) accept = 1;
                else if (w > T.reject_above) accept = 0;
                else accept = less_than_exp(S, i, w, u, t, (double)u * P->inv_t, -1.0);
            } else {
                /* Bernoulli(exp(-u/t)), usually decided without exp: 1 - g <= exp(-g) <= 1 - g + g^2/2
                 * for g = u/t in [0, 1), whose float value is within 2^-52 of the truth; an absolute
                 * slack of 2^-48 covers that and the rounding of the bounds. Undecided: less_than_exp. */
                double g = (double)u * P->inv_t, v_lo = (double)w * TWO_M32, v_hi = v_lo + TWO_M32;
                if (v_hi + SLACK <= 1.0 - g) accept = 1;
                else if (v_lo >= 1.0 - g + 0.5 * g * g + SLACK) accept = 0;
                else accept = less_than_exp(S, i, w, u, t, g, -1.0);
            }
            if (!accept) {
                if (S->stop) return 0;
                continue;
            }
        }
        int64_t v = geometric_e(S);
        if (__builtin_expect(v >= (INT64_C(1) << 62) / t, 0)) { /* probability below exp(-2^18) */
            if (S->stop) return 0;
            fail(S, PyExc_OverflowError, "geometric part out of range");
            return 0;
        }
        int64_t y = s == 1 ? u + t * v : (u + t * v) / s; /* no division for integer scales */
        uint32_t b = next_word(S) >> 31;
        if (b && y == 0) {
            if (S->stop) return 0;
            continue;
        }
        return b ? -y : y;
    }
}

/* CKS Algorithm 3 with proposal scale t and sigma^2 rounded to t*p/q. */
static inline __attribute__((always_inline)) int64_t gaussian_one(Sample *S, const Params *P) {
    int64_t p = P->p, q = P->q;
    for (;;) {
        if (out_of_words(S)) return 0;
        int64_t y = laplace_one(S, P, 1);
        if (S->stop) return 0;
        int64_t ay = y < 0 ? -y : y;
        uint32_t i = S->pos;
        uint32_t w = next_word(S);
        __int128 d = (__int128)q * ay - p;
        double dd = (double)q * (double)ay - (double)p;
        /* Bernoulli(exp(-g)), g = d^2/den; g's float value is within 2^-51 max(g, 1) of the truth */
        double g = dd * dd * P->inv_den;
        int accept;
        if (ay < P->n_accept) {
            Thresholds T = P->accept[ay];
            if (w < T.accept) accept = 1;
            else if (w > T.reject_above) accept = 0;
            else accept = less_than_exp(S, i, w, d * d, P->den, g, -1.0);
        } else {
            /* usually decided without exp: 1 - g <= exp(-g) <= 1/(1 + g); both bounds move by less than
             * 2^-50 for g's error (slope <= 1), so the absolute slack 2^-48 covers them. */
            double v_lo = (double)w * TWO_M32, v_hi = v_lo + TWO_M32;
            if (g < 1.0 && v_hi + SLACK <= 1.0 - g) accept = 1;
            else if (v_lo >= 1.0 / (1.0 + g) + SLACK) accept = 0;
            else accept = less_than_exp(S, i, w, d * d, P->den, g, -1.0);
        }
        if (accept) return y;
        if (S->stop) return 0;
    }
}

/* When a draw gets tables: 1 = where they pay for their exp calls (large draws at small scales),
 * 0 = never, 2 = always (the last two for tests: set_tables). */
static int TABLES = 1;

/* The tables of a draw of n samples (freed by free_tables). */
static int build_tables(Params *P, Py_ssize_t n, int gaussian) {
    Thresholds *trial = NULL, *accept = NULL;
    if (P->t > 1 && P->t <= 4096 && (TABLES == 2 || (TABLES == 1 && n >= 16 * P->t))) {
        trial = PyMem_Malloc(sizeof *trial * (size_t)P->t);
        if (!trial) return -1;
        for (int64_t u = 0; u < P->t; u++) {
            double g = (double)u * P->inv_t;
            trial[u] = thresholds_for(exp_neg(g), u == 0);
        }
    }
    P->trial = trial;
    P->n_accept = 0;
    if (gaussian) {
        int64_t m = 16 * P->t < 4096 ? 16 * P->t : 4096;
        if (TABLES == 2 || (TABLES == 1 && n >= 16 * m)) {
            accept = PyMem_Malloc(sizeof *accept * (size_t)m);
            if (!accept) return -1;
            for (int64_t ay = 0; ay < m; ay++) {
                double dd = (double)P->q * (double)ay - (double)P->p, g = dd * dd * P->inv_den;
                int sure = (__int128)P->q * ay == P->p; /* d = 0 */
                accept[ay] = thresholds_for(g > 700.0 ? 0.0 : g < 32.0 ? exp_neg(g) : exp(-g), sure);
            }
            P->n_accept = m;
        }
    }
    P->accept = accept;
    return 0;
}

static void free_tables(Params *P) {
    PyMem_Free((void *)P->trial);
    PyMem_Free((void *)P->accept);
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

/* One thread's share of a draw: the samples at positions lo .. hi - 1 of the request. */
typedef struct {
    Sample S;
    const Params *P;
    int sampler;
    const uint64_t *js; /* sample indices, or NULL for first, first + 1, ... */
    uint64_t first;
    int64_t *res;
    Py_ssize_t lo, hi;
} Job;

/* A batch of up to LANES samples (their positions in the request and their indices) whose first
 * `level` + 1 blocks are computed together; the samples that need more are put off to the next
 * level's batch (redrawn from their first word: a sample is a pure function of key and index), and
 * those of the last level compute their further blocks one by one. */
typedef struct {
    int n;
    Py_ssize_t k[MAX_LANES];
    uint64_t j[MAX_LANES];
} Batch;

#define SAMPLER_LAPLACE 0
#define SAMPLER_GAUSSIAN 1

static inline __attribute__((always_inline)) int64_t draw(Job *job, int sampler) {
    if (sampler == SAMPLER_LAPLACE) return laplace_one(&job->S, job->P, job->P->s);
    return gaussian_one(&job->S, job->P);
}

/* The samples of batches[level], their first level + 1 blocks computed together. */
static inline __attribute__((always_inline)) void batch_body(Job *job, Batch *batches, int level, int sampler,
                                                             void (*self)(Job *, Batch *, int)) {
    Batch *B = &batches[level];
    Sample *S = &job->S;
    uint32_t words[BLOCKS_AT_ONCE][BLOCK_WORDS] __attribute__((aligned(64)));
    for (int l = B->n; l < LANES; l++) B->j[l] = B->j[0]; /* unused lanes */
    for (int c = 0; c <= level; c++) chacha20_blocks(S->key, (uint32_t)c, B->j, words[c]);
    int n = B->n;
    B->n = 0;
    for (int l = 0; l < n; l++) {
        S->avail = (uint32_t)level + 1; /* per sample: a batch of the next level may run in between */
        S->lazy = level == BLOCKS_AT_ONCE - 1;
        for (int c = 0; c <= level; c++) S->blocks[c] = words[c] + l;
        S->j = B->j[l];
        S->pos = 0;
        S->own_counter = UINT32_MAX;
        int64_t y = draw(job, sampler);
        if (__builtin_expect(S->stop != 0, 0)) {
            if (S->stop & STOP_FAILED) return;
            S->stop = 0; /* STOP_DEFERRED: redrawn in the next level's batch */
            Batch *next = &batches[level + 1];
            next->k[next->n] = B->k[l];
            next->j[next->n++] = B->j[l];
            if (next->n == LANES) {
                self(job, batches, level + 1);
                if (S->stop) return;
            }
            continue;
        }
        job->res[B->k[l]] = y;
    }
}

static void laplace_batch(Job *job, Batch *batches, int level) {
    batch_body(job, batches, level, SAMPLER_LAPLACE, laplace_batch);
}

static void gaussian_batch(Job *job, Batch *batches, int level) {
    batch_body(job, batches, level, SAMPLER_GAUSSIAN, gaussian_batch);
}

static void *run_job(void *arg) {
    Job *job = (Job *)arg;
    void (*batch)(Job *, Batch *, int) = job->sampler == SAMPLER_GAUSSIAN ? gaussian_batch : laplace_batch;
    Batch batches[BLOCKS_AT_ONCE];
    for (int level = 0; level < BLOCKS_AT_ONCE; level++) batches[level].n = 0;
    Batch *B = &batches[0];
    for (Py_ssize_t k = job->lo; k < job->hi && !job->S.stop; k++) {
        B->k[B->n] = k;
        B->j[B->n++] = job->js ? job->js[k] : job->first + (uint64_t)k;
        if (B->n == LANES) batch(job, batches, 0);
    }
    for (int level = 0; level < BLOCKS_AT_ONCE && !job->S.stop; level++)
        if (batches[level].n) batch(job, batches, level);
    return NULL;
}

/* Threads a large draw is split over (samples are independent: the values do not depend on it),
 * and the fewest samples per thread. set_threads() changes both; 1 thread keeps the GIL. */
#define MAX_THREADS 16
static int THREADS = 1;
static Py_ssize_t MIN_PER_THREAD = 1 << 15;

static PyObject *run(PyObject *args, int sampler) {
    int three = sampler == SAMPLER_GAUSSIAN;
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
    Params P;
    memset(&P, 0, sizeof P);
    P.U = uniform_for((uint64_t)a);
    P.t = a;
    P.inv_t = 1.0 / (double)a;
    if (three) {
        P.s = 1, P.p = b, P.q = c;
        P.den = (__int128)2 * a * b * c;
        P.inv_den = 1.0 / ((double)2 * (double)a * (double)b * (double)c);
    } else {
        P.s = b;
    }
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
    if (build_tables(&P, n, three) < 0) {
        free_tables(&P);
        release_buffers(&bufs);
        return PyErr_NoMemory();
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
        job->P = &P;
        job->sampler = sampler;
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
    free_tables(&P);
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        Sample *S = &jobs[t].S;
        if (!(S->stop & STOP_FAILED)) continue;
        if (!failed && S->err_type) PyErr_Restore(S->err_type, S->err_value, S->err_tb);
        else {
            Py_XDECREF(S->err_type);
            Py_XDECREF(S->err_value);
            Py_XDECREF(S->err_tb);
        }
        failed = 1;
    }
    if (failed) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "noise sampling failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_laplace(PyObject *self, PyObject *args) { (void)self; return run(args, SAMPLER_LAPLACE); }
static PyObject *py_gaussian(PyObject *self, PyObject *args) { (void)self; return run(args, SAMPLER_GAUSSIAN); }

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
    geometric_thresholds();
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

static PyObject *py_set_tables(PyObject *self, PyObject *args) {
    (void)self;
    int mode;
    if (!PyArg_ParseTuple(args, "i", &mode)) return NULL;
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "mode must be 0 (never), 1 (large draws) or 2 (always)");
        return NULL;
    }
    int old = TABLES;
    TABLES = mode;
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
    {"set_tables", py_set_tables, METH_VARARGS,
     "set_tables(mode) -> old: threshold tables for the Bernoulli trials, 1 = for large draws at small scales (default), 0 = never, 2 = always (tests)."},
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
    for (int i = 0; i <= 64; i++) EXP_MINUS_64THS[i] = exp(-(double)i / 64.0);
    geometric_thresholds();
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

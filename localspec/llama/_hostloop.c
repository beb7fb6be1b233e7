/* localspec.llama._hostloop: the few host steps of a speculative cycle that run right after a
 * llama.cpp compute, in C. After a decode has streamed the model's weights through every cache
 * level, each Python or numpy call runs cold (a ctypes call ~60 us, numpy's argmax ~45 us on a
 * 2-core EPYC, against ~10 us for this file's argmax): docs/speculation.md, "The host loop in C".
 *
 * It links against nothing: llama.cpp's functions come in as addresses (bind), taken from the
 * library llama-cpp-python loaded, so this module needs only a C compiler and Python's headers
 * at install. Where it could not be built, localspec.llama.hostloop falls back to numpy. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HOSTLOOP_SSE2 1
/* floats ahead that a row's scan asks the cache for (8 KB, two pages), so that the next page's
 * TLB walk and first lines are under way before the scan reaches it (logits are cold after a decode) */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2048
#endif
#endif

/* Up to this many rows a drafter decode marks every row an output (speculation.drafter's
 * ALL_OUTPUT_ROWS, which the module's constant of the same name is checked against). */
#define ALL_OUTPUT_ROWS 16

/* llama.h's struct llama_batch, passed by value to llama_decode */
typedef struct {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} batch_t;

typedef int32_t (*decode_fn)(void *ctx, batch_t batch);
typedef float *(*row_fn)(void *ctx, int32_t i);
typedef float *(*all_fn)(void *ctx);

static decode_fn llama_decode_p = NULL;
static decode_fn llama_encode_p = NULL;
static row_fn llama_get_logits_ith_p = NULL;
typedef int32_t (*piece_fn)(const void *vocab, int32_t token, char *buf, int32_t length, int32_t lstrip, _Bool special);
static piece_fn llama_token_to_piece_p = NULL;
typedef _Bool (*seq_rm_fn)(void *mem, int32_t seq, int32_t p0, int32_t p1);
typedef int32_t (*pos_max_fn)(void *mem, int32_t seq);
static seq_rm_fn llama_memory_seq_rm_p = NULL;
static pos_max_fn llama_memory_seq_pos_max_p = NULL;

/* The largest of n floats (n > 0), SIMD where there is SSE2; *nan set where one is a NaN. */
static float block_max(const float *x, int32_t n, int *nan) {
    int32_t i = 0;
    float m = x[0];
#ifdef HOSTLOOP_SSE2
    if (n >= 16) {
        __m128 a = _mm_loadu_ps(x), b = _mm_loadu_ps(x + 4), c = _mm_loadu_ps(x + 8), d = _mm_loadu_ps(x + 12);
        __m128 u = _mm_or_ps(_mm_cmpunord_ps(a, b), _mm_cmpunord_ps(c, d));
        for (i = 16; i + 16 <= n; i += 16) {
            _mm_prefetch((const char *)(x + i + PREFETCH_AHEAD), _MM_HINT_T0);
            __m128 xa = _mm_loadu_ps(x + i), xb = _mm_loadu_ps(x + i + 4);
            __m128 xc = _mm_loadu_ps(x + i + 8), xd = _mm_loadu_ps(x + i + 12);
            u = _mm_or_ps(u, _mm_or_ps(_mm_cmpunord_ps(xa, xb), _mm_cmpunord_ps(xc, xd)));
            a = _mm_max_ps(a, xa); b = _mm_max_ps(b, xb); c = _mm_max_ps(c, xc); d = _mm_max_ps(d, xd);
        }
        a = _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d));
        float lanes[4];
        _mm_storeu_ps(lanes, a);
        m = lanes[0];
        for (int j = 1; j < 4; j++) m = lanes[j] > m ? lanes[j] : m;
        if (_mm_movemask_ps(u)) *nan = 1;
    }
#endif
    for (; i < n; i++) {
        if (x[i] != x[i]) *nan = 1;
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

#if defined(HOSTLOOP_SSE2) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define HOSTLOOP_AVX2 1
/* block_max in 8-wide AVX2 (half the instructions a row), for CPUs that have it (chosen at import:
 * the module itself is built for any x86-64). */
__attribute__((target("avx2"))) static float block_max_avx2(const float *x, int32_t n, int *nan) {
    int32_t i = 0;
    float m = x[0];
    if (n >= 32) {
        __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8), c = _mm256_loadu_ps(x + 16), d = _mm256_loadu_ps(x + 24);
        __m256 u = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
        for (i = 32; i + 32 <= n; i += 32) {
            _mm_prefetch((const char *)(x + i + PREFETCH_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(x + i + PREFETCH_AHEAD + 16), _MM_HINT_T0);
            __m256 xa = _mm256_loadu_ps(x + i), xb = _mm256_loadu_ps(x + i + 8);
            __m256 xc = _mm256_loadu_ps(x + i + 16), xd = _mm256_loadu_ps(x + i + 24);
            u = _mm256_or_ps(u, _mm256_or_ps(_mm256_cmp_ps(xa, xb, _CMP_UNORD_Q), _mm256_cmp_ps(xc, xd, _CMP_UNORD_Q)));
            a = _mm256_max_ps(a, xa); b = _mm256_max_ps(b, xb); c = _mm256_max_ps(c, xc); d = _mm256_max_ps(d, xd);
        }
        a = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
        float lanes[8];
        _mm256_storeu_ps(lanes, a);
        m = lanes[0];
        for (int j = 1; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
        if (_mm256_movemask_ps(u)) *nan = 1;
    }
    for (; i < n; i++) {
        if (x[i] != x[i]) *nan = 1;
        m = x[i] > m ? x[i] : m;
    }
    return m;
}
#endif

typedef float (*block_max_fn)(const float *x, int32_t n, int *nan);
static block_max_fn block_max_best = block_max;   /* block_max_avx2 where the CPU has AVX2 (module init) */

/* The softmax's denominator at its top: the sum over the row of exp(x[i] - top), ``top`` the row's
 * largest value (finite). 1 / it is the top token's probability, what a drafter's confidence test
 * reads (model_source.top1_probability). Scalar: libm's expf, summed in double. */
static double exp_sum(const float *x, int32_t n, float top) {
    double s = 0.0;
    for (int32_t i = 0; i < n; i++) s += (double)expf(x[i] - top);
    return s;
}

#ifdef HOSTLOOP_AVX2
/* e^(x - top) of 8 values (see exp_sum_avx2). */
__attribute__((target("avx2"))) static inline __m256 exp8(__m256 x, __m256 top) {
    const __m256 lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 magic = _mm256_set1_ps(12582912.0f);   /* 1.5 * 2^23: adding it rounds to an integer */
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 v = _mm256_max_ps(_mm256_sub_ps(x, top), lo);
    __m256 km = _mm256_add_ps(_mm256_mul_ps(v, log2e), magic);   /* k in its low mantissa bits */
    __m256 k = _mm256_sub_ps(km, magic);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(v, _mm256_mul_ps(k, ln2_hi)), _mm256_mul_ps(k, ln2_lo));
    __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(1.9875691500e-4f), r), _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(y, r), r), r), _mm256_set1_ps(1.0f));
    /* 2^k: k + 127 into the exponent field (k >= -126 as v >= -87) */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(km), _mm256_set1_epi32(127 - 0x4B400000)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* exp_sum 8-wide: e^v = 2^k e^r, k = round(v log2 e), r = v - k ln 2 (in two parts), e^r by the
 * Cephes single-precision polynomial (within ~2 ulp of expf); v clamped at -87 (e^-87 ~ 1.6e-38:
 * nothing the sum can hold). Each block of 256 values summed in float (two accumulators), the
 * blocks in double: within ~1e-7 of numpy's float32 exp and pairwise sum. */
__attribute__((target("avx2"))) static double exp_sum_avx2(const float *x, int32_t n, float top) {
    const __m256 t = _mm256_set1_ps(top);
    __m256d total = _mm256_setzero_pd();
    int32_t i = 0;
    while (i + 16 <= n) {
        __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        int32_t end = i + 256 <= n ? i + 256 : n - (n - i) % 16;
        for (; i < end; i += 16) {
            _mm_prefetch((const char *)(x + i + PREFETCH_AHEAD), _MM_HINT_T0);
            a = _mm256_add_ps(a, exp8(_mm256_loadu_ps(x + i), t));
            b = _mm256_add_ps(b, exp8(_mm256_loadu_ps(x + i + 8), t));
        }
        a = _mm256_add_ps(a, b);
        total = _mm256_add_pd(total, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                                                   _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, total);
    double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    return s + exp_sum(x + i, n - i, top);
}
#endif

typedef double (*exp_sum_fn)(const float *x, int32_t n, float top);
static exp_sum_fn exp_sum_best = exp_sum;   /* exp_sum_avx2 with block_max_avx2 (simd, module init) */

/* The index of the largest value, the first of equal ones, as numpy's argmax; a NaN counts as
 * the largest (numpy's rule): its first index. One pass by blocks, then a scan of the first
 * block that holds the maximum. */
static int32_t argmax_f32(const float *x, int32_t n) {
    enum { BLOCK = 256 };
    float best = 0.0f;
    int32_t at = 0;
    int nan = 0;
    for (int32_t s = 0; s < n; s += BLOCK) {
        float m = block_max_best(x + s, n - s < BLOCK ? n - s : BLOCK, &nan);
        if (s == 0 || m > best) { best = m; at = s; }
    }
    if (nan) {
        for (int32_t j = 0; j < n; j++) if (x[j] != x[j]) return j;
    }
    for (int32_t j = at; j < n; j++) if (x[j] == best) return j;
    return at;
}

#ifdef _WIN32
#include <windows.h>
static double seconds_now(void) {
    LARGE_INTEGER t, f;
    QueryPerformanceCounter(&t);
    QueryPerformanceFrequency(&f);
    return (double)t.QuadPart / (double)f.QuadPart;
}
static double thread_seconds(void) { return 0.0; }
#else
static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
#endif

/* every decode this module ran, for benches that time llama.cpp's compute (clock()); the thread's
 * CPU time only once a bench asks (count_cpu): a thread clock is a system call, not a vDSO read */
static double clock_seconds = 0.0, clock_cpu = 0.0;
static long long clock_calls = 0;
static int clock_cpu_on = 0;

/* One llama_decode / llama_encode of ``batch``, timed (its wall seconds added to *spent). */
static int32_t run_timed(decode_fn fn, void *ctx, batch_t *batch, double *spent) {
    double t0 = seconds_now(), c0 = clock_cpu_on ? thread_seconds() : 0.0;
    int32_t rc;
    Py_BEGIN_ALLOW_THREADS   /* as ctypes does: the server's event loop runs meanwhile */
    rc = fn(ctx, *batch);
    Py_END_ALLOW_THREADS
    double dt = seconds_now() - t0;
    *spent += dt;
    clock_seconds += dt;
    if (clock_cpu_on) clock_cpu += thread_seconds() - c0;
    clock_calls++;
    return rc;
}

static PyObject *hl_clock(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return Py_BuildValue("(ddL)", clock_seconds, clock_cpu, clock_calls);
}

static PyObject *hl_count_cpu(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    clock_cpu_on = v;
    Py_RETURN_NONE;
}

/* simd(wide): the argmax's SIMD width in use ("avx2" or "sse2"); wide False: SSE2 from now on (tests
 * check both paths), True: AVX2 again where the CPU has it. */
static PyObject *hl_simd(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n > 1) { PyErr_SetString(PyExc_TypeError, "simd([wide])"); return NULL; }
    if (n == 1) {
        int wide = PyObject_IsTrue(args[0]);
        if (wide < 0) return NULL;
        block_max_best = block_max;
        exp_sum_best = exp_sum;
#ifdef HOSTLOOP_AVX2
        if (wide && __builtin_cpu_supports("avx2")) {
            block_max_best = block_max_avx2;
            exp_sum_best = exp_sum_avx2;
        }
#endif
    }
#ifdef HOSTLOOP_AVX2
    if (block_max_best == block_max_avx2) return PyUnicode_FromString("avx2");
#endif
    return PyUnicode_FromString("sse2");
}

static int as_pointer(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return !(*out == NULL && PyErr_Occurred());
}

/* A float32 buffer of at least ``n`` items, writable where asked (a numpy array, C-contiguous). */
static int float_buffer(PyObject *o, Py_buffer *b, Py_ssize_t n, int writable) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return 0;
    /* "f", or "<f" / "=f" (a numpy view over ctypes memory says its byte order); never ">f" */
    const char *f = b->format;
    int native_float = f && (strcmp(f, "f") == 0 || strcmp(f, "=f") == 0 || strcmp(f, "@f") == 0
                             || (strcmp(f, "<f") == 0 && PY_LITTLE_ENDIAN));
    if (b->itemsize != 4 || !native_float || b->len < n * 4) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "hostloop: a float32 buffer too small or of another type");
        return 0;
    }
    return 1;
}

static PyObject *hl_bind(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *decode, *encode, *logits, *piece, *seq_rm, *pos_max;
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError, "bind(decode, encode, get_logits_ith, token_to_piece, memory_seq_rm, memory_seq_pos_max)");
        return NULL;
    }
    if (!as_pointer(args[0], &decode) || !as_pointer(args[1], &encode) || !as_pointer(args[2], &logits)
        || !as_pointer(args[3], &piece) || !as_pointer(args[4], &seq_rm) || !as_pointer(args[5], &pos_max)) return NULL;
    llama_decode_p = (decode_fn)decode;
    llama_encode_p = (decode_fn)encode;
    llama_get_logits_ith_p = (row_fn)logits;
    llama_token_to_piece_p = (piece_fn)piece;
    llama_memory_seq_rm_p = (seq_rm_fn)seq_rm;
    llama_memory_seq_pos_max_p = (pos_max_fn)pos_max;
    Py_RETURN_NONE;
}

/* seq_rm(memory, seq, p0, p1): llama_memory_seq_rm, whether it could; seq_pos_max(memory, seq).
 * Run once or twice a cycle (a verify's rejected rows, a drafter's), each a cold ctypes call
 * otherwise. Their loops over the cells are short: no GIL released, as no compute runs there. */
static PyObject *hl_seq_rm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *mem;
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "seq_rm(memory, seq, p0, p1)"); return NULL; }
    if (!as_pointer(args[0], &mem)) return NULL;
    long seq = PyLong_AsLong(args[1]), p0 = PyLong_AsLong(args[2]), p1 = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!llama_memory_seq_rm_p || !mem) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    return PyBool_FromLong(llama_memory_seq_rm_p(mem, (int32_t)seq, (int32_t)p0, (int32_t)p1));
}

static PyObject *hl_seq_pos_max(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *mem;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "seq_pos_max(memory, seq)"); return NULL; }
    if (!as_pointer(args[0], &mem)) return NULL;
    long seq = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (!llama_memory_seq_pos_max_p || !mem) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    return PyLong_FromLong(llama_memory_seq_pos_max_p(mem, (int32_t)seq));
}

/* One token's bytes (llama_token_to_piece; special: a control token as its text), a new reference. */
static PyObject *piece_of(void *vocab, int32_t token, int special) {
    char small[128];
    int32_t got = llama_token_to_piece_p(vocab, token, small, (int32_t)sizeof small, 0, special != 0);
    if (got >= 0) return PyBytes_FromStringAndSize(small, got);
    PyObject *out = PyBytes_FromStringAndSize(NULL, -got);   /* its length, as llama.cpp asked */
    if (!out) return NULL;
    int32_t again = llama_token_to_piece_p(vocab, token, PyBytes_AS_STRING(out), -got, 0, special != 0);
    if (again < 0 || again > -got) { Py_DECREF(out); return PyBytes_FromStringAndSize("", 0); }
    if (again < -got && _PyBytes_Resize(&out, again) < 0) return NULL;
    return out;
}

/* pieces(vocab, n_vocab, special): every token's bytes, a list by token id. Built once per model:
 * a token's first piece, looked up after a decode, costs ~35 us of cold tokenizer tables (0.2 warm) */
static PyObject *hl_pieces(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *vocab;
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "pieces(vocab, n_vocab, special)"); return NULL; }
    if (!as_pointer(args[0], &vocab)) return NULL;
    long nv = PyLong_AsLong(args[1]);
    int special = PyObject_IsTrue(args[2]);
    if ((nv == -1 && PyErr_Occurred()) || special < 0) return NULL;
    if (!llama_token_to_piece_p || !vocab || nv < 0) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    PyObject *out = PyList_New(nv);
    if (!out) return NULL;
    for (long t = 0; t < nv; t++) {
        PyObject *p = piece_of(vocab, (int32_t)t, special);
        if (!p) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, t, p);
    }
    return out;
}

/* A llama.cpp getter of an output row (it waits for the backend: a GPU's compute ends there),
 * called with the GIL released as ctypes calls it. */
static const float *row_of(row_fn fn, void *ctx, int32_t i) {
    const float *row = NULL;
    if (!fn) return NULL;
    Py_BEGIN_ALLOW_THREADS
    row = fn(ctx, i);
    Py_END_ALLOW_THREADS
    return row;
}

static const float *logits_row(void *ctx, int32_t i) {
    const float *row = row_of(llama_get_logits_ith_p, ctx, i);
    if (row == NULL) PyErr_SetString(PyExc_RuntimeError, "llama.cpp returned no logits");
    return row;
}

/* argmax_ith(ctx, i, n_vocab): the argmax of output row i of the last decode (llama_get_logits_ith) */
static PyObject *hl_argmax_ith(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *ctx;
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "argmax_ith(ctx, i, n_vocab)"); return NULL; }
    if (!as_pointer(args[0], &ctx)) return NULL;
    long i = PyLong_AsLong(args[1]), nv = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    const float *row = logits_row(ctx, (int32_t)i);
    return row ? PyLong_FromLong(argmax_f32(row, (int32_t)nv)) : NULL;
}

/* argmax_rows' trim: (memory, seq, p0, always); ``accepted`` of ``n_drafts`` drafts were. */
static int trim_verified(PyObject *trim, Py_ssize_t accepted, Py_ssize_t n_drafts) {
    void *mem;
    if (!PyTuple_Check(trim) || PyTuple_GET_SIZE(trim) != 4 || n_drafts < 0) {
        PyErr_SetString(PyExc_TypeError, "argmax_rows: trim, (memory, seq, p0, always) after drafts");
        return 0;
    }
    if (!as_pointer(PyTuple_GET_ITEM(trim, 0), &mem)) return 0;
    long seq = PyLong_AsLong(PyTuple_GET_ITEM(trim, 1)), p0 = PyLong_AsLong(PyTuple_GET_ITEM(trim, 2));
    int always = PyObject_IsTrue(PyTuple_GET_ITEM(trim, 3));
    if (PyErr_Occurred() || always < 0) return 0;
    if (!llama_memory_seq_rm_p || !mem) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return 0; }
    if ((accepted < n_drafts || always)
        && !llama_memory_seq_rm_p(mem, (int32_t)seq, (int32_t)(p0 + accepted), -1)) {
        PyErr_SetString(PyExc_RuntimeError, "could not trim the KV cache");
        return 0;
    }
    return 1;
}

/* argmax_rows(ctx, rows, n_vocab[, drafts[, trim]]): argmax_ith of each output row in the tuple
 * ``rows``, a list; with ``drafts`` (a greedy verify) only until the first row whose argmax is not
 * its draft. ``trim``: None, or (memory, seq, p0, always): then the rejected drafts' cells go in
 * this call too (llama_memory_seq_rm of ``seq`` from position p0 + the drafts accepted), where a
 * draft was rejected or ``always`` (filler rows followed the drafts). */
static PyObject *hl_argmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *ctx;
    if (n < 3 || n > 5) { PyErr_SetString(PyExc_TypeError, "argmax_rows(ctx, rows, n_vocab[, drafts[, trim]])"); return NULL; }
    if (!as_pointer(args[0], &ctx)) return NULL;
    PyObject *rows = args[1], *drafts = n >= 4 ? args[3] : Py_None;
    long nv = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(rows) || (drafts != Py_None && !PyTuple_Check(drafts))) {
        PyErr_SetString(PyExc_TypeError, "argmax_rows: rows and drafts, tuples");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(rows);
    Py_ssize_t n_drafts = drafts == Py_None ? -1 : PyTuple_GET_SIZE(drafts);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t r = 0; r < count; r++) {
        long i = PyLong_AsLong(PyTuple_GET_ITEM(rows, r));
        if (i == -1 && PyErr_Occurred()) { Py_DECREF(out); return NULL; }
        const float *row = logits_row(ctx, (int32_t)i);
        if (!row) { Py_DECREF(out); return NULL; }
        int32_t best = argmax_f32(row, (int32_t)nv);
        PyObject *t = PyLong_FromLong(best);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
        Py_DECREF(t);
        if (n_drafts >= 0) {   /* a greedy verify: the rows after the first disagreement are never read */
            if (r >= n_drafts) break;
            long d = PyLong_AsLong(PyTuple_GET_ITEM(drafts, r));
            if (d == -1 && PyErr_Occurred()) { Py_DECREF(out); return NULL; }
            if (d != best) break;
        }
    }
    if (n == 5 && args[4] != Py_None && !trim_verified(args[4], PyList_GET_SIZE(out) - 1, n_drafts)) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The fed-back state of EAGLE-3.1: out = norm * h / sqrt(mean(h*h) + eps), the products in
 * float32 as numpy's, the sum of squares in double (numpy's float32 dot rounds otherwise in the
 * last bits: one of the two runs per install, see localspec.llama.hostloop). */
static void normed_state(float *out, const float *h, const float *norm, int32_t n, double eps) {
    double ss = 0.0;
    for (int32_t j = 0; j < n; j++) ss += (double)h[j] * (double)h[j];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int32_t j = 0; j < n; j++) out[j] = (h[j] * norm[j]) * scale;
}

/* normed_state(out, h, norm_address, eps): normed_state of the float32 row ``h`` into ``out`` (as
 * wide), ``norm`` at an address (EagleKind.out_norm, kept alive by its owner) */
static PyObject *hl_normed_state(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *norm;
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "normed_state(out, h, norm, eps)"); return NULL; }
    if (!as_pointer(args[2], &norm)) return NULL;
    double eps = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!norm) { PyErr_SetString(PyExc_ValueError, "normed_state: no norm"); return NULL; }
    Py_buffer out, h;
    if (!float_buffer(args[1], &h, 1, 0)) return NULL;
    if (!float_buffer(args[0], &out, h.len / 4, 1)) { PyBuffer_Release(&h); return NULL; }
    normed_state((float *)out.buf, (const float *)h.buf, (const float *)norm, (int32_t)(h.len / 4), eps);
    PyBuffer_Release(&out);
    PyBuffer_Release(&h);
    Py_RETURN_NONE;
}

/* The fed-back state of output row ``i`` into ``out``: state_fn(ctx, i), normed by ``norm``
 * unless it is NULL. 0 and an error set where llama.cpp returned none. */
static int state_into(float *out, row_fn state_fn, void *ctx, int32_t i, const float *norm, long n_embd, double eps) {
    const float *h = row_of(state_fn, ctx, i);
    if (!h) { PyErr_SetString(PyExc_RuntimeError, "the drafter returned no hidden state"); return 0; }
    if (norm) normed_state(out, h, norm, (int32_t)n_embd, eps);
    else memcpy(out, h, sizeof(float) * (size_t)n_embd);
    return 1;
}

/* A greedy chain's decodes: ``steps`` decodes of the one-row ``batch`` (row 0 filled for the
 * first), each one's argmax appended to ``drafts``; after each but the last, row 0 refilled with
 * that draft, its state and the position positions[first + s]. 0 and an error set on a failure. */
static int chain_steps(void *ctx, batch_t *batch, row_fn state_fn, const float *norm, long n_embd, double eps,
                       long nv, PyObject *positions, Py_ssize_t first, Py_ssize_t steps, PyObject *drafts, double *spent) {
    for (Py_ssize_t s = 0; s < steps; s++) {
        int32_t rc = run_timed(llama_decode_p, ctx, batch, spent);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "the drafter failed (llama_decode code %d)", (int)rc);
            return 0;
        }
        const float *row = logits_row(ctx, 0);
        if (!row) return 0;
        int32_t tok = argmax_f32(row, (int32_t)nv);
        PyObject *t = PyLong_FromLong(tok);
        if (!t || PyList_Append(drafts, t) < 0) { Py_XDECREF(t); return 0; }
        Py_DECREF(t);
        if (s + 1 == steps) break;
        if (!state_into(batch->embd, state_fn, ctx, 0, norm, n_embd, eps)) return 0;
        long p = PyLong_AsLong(PyTuple_GET_ITEM(positions, first + s));
        if (p == -1 && PyErr_Occurred()) return 0;
        batch->token[0] = tok;
        batch->pos[0] = (int32_t)p;
    }
    return 1;
}

/* The arguments a greedy chain's and the slots' rounds share: (ctx, batch, state_fn, norm or
 * None, n_embd, eps, n_vocab), checked bound. */
typedef struct {
    void *ctx, *batch, *state_fn, *norm;
    long n_embd, nv;
    double eps;
} chain_args;

static int parse_chain_args(PyObject *const *args, chain_args *c) {
    if (!as_pointer(args[0], &c->ctx) || !as_pointer(args[1], &c->batch) || !as_pointer(args[2], &c->state_fn)
        || !(args[3] == Py_None ? (c->norm = NULL, 1) : as_pointer(args[3], &c->norm)))
        return 0;
    c->n_embd = PyLong_AsLong(args[4]);
    c->eps = PyFloat_AsDouble(args[5]);
    c->nv = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return 0;
    if (!llama_decode_p || !c->state_fn || !c->ctx || !c->batch) {
        PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound");
        return 0;
    }
    return 1;
}

/* trim: None, or (memory, p0s): after a chain's decodes, sequence seqs[i]'s drafted pairs from
 * position p0s[i] on go (llama_memory_seq_rm), in this call, rather than through Python's calls
 * at the next catch-up. 0 and an error set on a failure. */
static int trim_after(PyObject *trim, const long *seqs, Py_ssize_t m) {
    if (trim == Py_None) return 1;
    void *mem;
    if (!PyTuple_Check(trim) || PyTuple_GET_SIZE(trim) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(trim, 1))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(trim, 1)) != m) {
        PyErr_SetString(PyExc_TypeError, "trim: None or (memory, a position per sequence)");
        return 0;
    }
    if (!as_pointer(PyTuple_GET_ITEM(trim, 0), &mem)) return 0;
    if (!llama_memory_seq_rm_p || !mem) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return 0; }
    for (Py_ssize_t i = 0; i < m; i++) {
        long p0 = PyLong_AsLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(trim, 1), i));
        if (p0 == -1 && PyErr_Occurred()) return 0;
        if (!llama_memory_seq_rm_p(mem, (int32_t)seqs[i], (int32_t)p0, -1)) {
            PyErr_SetString(PyExc_RuntimeError, "could not trim the drafter's cache");
            return 0;
        }
    }
    return 1;
}

/* Row ``next`` of the chains' batch refilled for a chain's next step: its draft ``tok``, the state
 * of output row ``j`` (llama.cpp's, normed), the position positions_i[at], sequence ``seq``, an
 * output. 0 and an error set on a failure. */
static int refill_row(chain_args *c, Py_ssize_t next, int32_t j, int32_t tok, long seq, PyObject *positions_i,
                      Py_ssize_t at) {
    batch_t *batch = (batch_t *)c->batch;
    if (!state_into(batch->embd + (size_t)next * (size_t)c->n_embd, (row_fn)c->state_fn, c->ctx, j,
                    (const float *)c->norm, c->n_embd, c->eps))
        return 0;
    long p = PyLong_AsLong(PyTuple_GET_ITEM(positions_i, at));
    if (p == -1 && PyErr_Occurred()) return 0;
    batch->token[next] = tok;
    batch->pos[next] = (int32_t)p;
    batch->n_seq_id[next] = 1;
    batch->seq_id[next][0] = (int32_t)seq;
    batch->logits[next] = 1;
    return 1;
}

/* The rounds of several greedy chains (greedy_rounds, catch_up_rounds): the batch's first ``rows``
 * rows hold chain active[j]'s next step each (every row an output). Each round one decode; each
 * row's argmax appended to its chain's list in ``drafts``, and where the chain has a step left
 * (steps[i] decodes in all) its row refilled (moved up past the chains that ended) with that
 * draft, its state and its next position, positions[i][r + offset] after round r. Each round's
 * seconds are shared among its rows (spent[i]). 0 and an error set on a failure. */
static int run_rounds(chain_args *c, const long *seq_of, const Py_ssize_t *steps, Py_ssize_t *active,
                      Py_ssize_t rows, PyObject *positions, Py_ssize_t offset, PyObject *drafts, double *spent) {
    batch_t *batch = (batch_t *)c->batch;
    for (Py_ssize_t r = 0; rows > 0; r++) {
        batch->n_tokens = (int32_t)rows;
        double dt = 0.0;
        int32_t rc = run_timed(llama_decode_p, c->ctx, batch, &dt);
        if (rc != 0) {
            PyErr_Format(PyExc_RuntimeError, "the drafter failed (llama_decode code %d)", (int)rc);
            return 0;
        }
        Py_ssize_t next = 0;
        for (Py_ssize_t j = 0; j < rows; j++) {   /* row j is chain active[j]; the rows left move up */
            Py_ssize_t i = active[j];
            spent[i] += dt / (double)rows;
            const float *row = logits_row(c->ctx, (int32_t)j);
            if (!row) return 0;
            int32_t tok = argmax_f32(row, (int32_t)c->nv);
            PyObject *t = PyLong_FromLong(tok);
            if (!t || PyList_Append(PyList_GET_ITEM(drafts, i), t) < 0) { Py_XDECREF(t); return 0; }
            Py_DECREF(t);
            if (r + 1 >= steps[i]) continue;   /* its last step: no state read */
            if (!refill_row(c, next, (int32_t)j, tok, seq_of[i], PyTuple_GET_ITEM(positions, i), r + offset)) return 0;
            active[next++] = i;
        }
        rows = next;
    }
    return 1;
}

/* m lists, a new list; NULL and an error set on a failure. */
static PyObject *lists(Py_ssize_t m) {
    PyObject *out = PyList_New(m);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *l = PyList_New(0);
        if (!l) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, l);
    }
    return out;
}

/* (drafts, per chain its seconds as a list of floats), stealing ``drafts``; NULL on a failure. */
static PyObject *drafts_and_seconds(PyObject *drafts, const double *spent, Py_ssize_t m) {
    PyObject *seconds = PyList_New(m);
    if (!seconds) { Py_DECREF(drafts); return NULL; }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *f = PyFloat_FromDouble(spent[i]);
        if (!f) { Py_DECREF(drafts); Py_DECREF(seconds); return NULL; }
        PyList_SET_ITEM(seconds, i, f);
    }
    return Py_BuildValue("(NN)", drafts, seconds);
}

/* greedy_rounds(ctx, batch, state_fn, norm, n_embd, eps, n_vocab, seqs, positions[, trim])
 * The greedy draft chains of several sequences (a scheduler's slots), their steps decoded
 * together: one decode a round of every chain that has a step left. The batch (a llama_batch at
 * address ``batch``, rows 0..m-1 filled with each chain's first draft, its sequence, position and
 * state, every row with its output) is decoded; each row's argmax is that chain's next draft, and
 * where the chain has a step left its row is refilled (moved up past the chains that ended) with
 * that draft, its state (state_fn of that row, normed by ``norm`` unless None) and its next
 * position. ``positions[i]``: chain i's positions after its first step (a tuple; its length + 1
 * is the chain's number of steps). Each round's seconds are shared among that round's chains.
 * ``trim``: see trim_after. Returns (per chain the list of its drafts after the first, per chain
 * its seconds), or raises on a failed decode. */
static PyObject *hl_greedy_rounds(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    chain_args c;
    if (n != 9 && n != 10) { PyErr_SetString(PyExc_TypeError, "greedy_rounds takes 9 or 10 arguments"); return NULL; }
    if (!parse_chain_args(args, &c)) return NULL;
    PyObject *seqs = args[7], *positions = args[8];
    if (!PyTuple_Check(seqs) || !PyTuple_Check(positions) || PyTuple_GET_SIZE(seqs) != PyTuple_GET_SIZE(positions)) {
        PyErr_SetString(PyExc_TypeError, "greedy_rounds: seqs and positions, tuples of one length");
        return NULL;
    }
    Py_ssize_t m = PyTuple_GET_SIZE(seqs);
    if (m < 1) { PyErr_SetString(PyExc_ValueError, "greedy_rounds: no chains"); return NULL; }
    long *seq_of = PyMem_Calloc((size_t)m, sizeof(long));
    Py_ssize_t *steps = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t)), *active = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t));
    double *spent = PyMem_Calloc((size_t)m, sizeof(double));
    PyObject *drafts = NULL, *result = NULL;
    if (!seq_of || !steps || !active || !spent) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *pos_i = PyTuple_GET_ITEM(positions, i);
        if (!PyTuple_Check(pos_i)) { PyErr_SetString(PyExc_TypeError, "greedy_rounds: each chain's positions, a tuple"); goto done; }
        steps[i] = PyTuple_GET_SIZE(pos_i) + 1;
        seq_of[i] = PyLong_AsLong(PyTuple_GET_ITEM(seqs, i));
        if (seq_of[i] == -1 && PyErr_Occurred()) goto done;
        active[i] = i;
    }
    drafts = lists(m);
    if (!drafts || !run_rounds(&c, seq_of, steps, active, m, positions, 0, drafts, spent)
        || (n == 10 && !trim_after(args[9], seq_of, m))) {
        Py_XDECREF(drafts);
        goto done;
    }
    result = drafts_and_seconds(drafts, spent, m);
done:
    PyMem_Free(seq_of); PyMem_Free(steps); PyMem_Free(active); PyMem_Free(spent);
    return result;
}

/* greedy_chain(ctx, batch, state_fn, norm, n_embd, eps, n_vocab, positions)
 * A greedy draft chain of one sequence after its first draft: the batch (a one-row
 * llama_batch at address ``batch`` whose token, pos and embd arrays localspec owns, row 0 filled
 * with the first draft, its position and state) is decoded, its argmax is the next draft, and
 * that row's state (state_fn(ctx, 0): the drafter's hidden state, normed by ``norm`` unless it is
 * None) is written into the row with the next draft and position; once per entry of ``positions``
 * (the positions of the steps after the first). Returns (the drafts after the first, seconds inside
 * llama_decode), or raises on a failed decode (its code in the message). */
static PyObject *hl_greedy_chain(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    chain_args c;
    if (n != 8) { PyErr_SetString(PyExc_TypeError, "greedy_chain takes 8 arguments"); return NULL; }
    if (!parse_chain_args(args, &c)) return NULL;
    void *ctx = c.ctx, *batch_at = c.batch, *state_at = c.state_fn, *norm_at = c.norm;
    long n_embd = c.n_embd, nv = c.nv;
    double eps = c.eps;
    PyObject *positions = args[7];
    if (!PyTuple_Check(positions)) { PyErr_SetString(PyExc_TypeError, "positions: a tuple"); return NULL; }
    PyObject *drafts = PyList_New(0);
    if (!drafts) return NULL;
    double spent = 0.0;
    /* decodes: the first draft's, then each later one's */
    if (!chain_steps(ctx, (batch_t *)batch_at, (row_fn)state_at, (const float *)norm_at, n_embd, eps, nv, positions, 0,
                     PyTuple_GET_SIZE(positions) + 1, drafts, &spent)) {
        Py_DECREF(drafts);
        return NULL;
    }
    return Py_BuildValue("(Nd)", drafts, spent);
}

/* gather_rows(out, layer_fn, ctx, layers, width, lo, n, rows, eps)
 * The inputs of target ``layers`` (layer_fn(ctx, layer): llama.cpp's buffer of that layer's rows,
 * ``width`` wide) for the batch rows ``rows`` (a tuple or list of indices) or, where rows is None, the
 * ``n`` rows from ``lo``: side by side per row in ``out`` (n_out x len(layers) * width). Where
 * ``eps`` >= 0 each block is divided by its RMS (EAGLE-3.1's fc_norm, its weight folded into fc). */
static PyObject *hl_gather_rows(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *layer_at, *ctx;
    if (n != 9) { PyErr_SetString(PyExc_TypeError, "gather_rows takes 9 arguments"); return NULL; }
    if (!as_pointer(args[1], &layer_at) || !as_pointer(args[2], &ctx)) return NULL;
    PyObject *layers = args[3], *rows = args[7];
    long width = PyLong_AsLong(args[4]), lo = PyLong_AsLong(args[5]), count = PyLong_AsLong(args[6]);
    double eps = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(layers) || (rows != Py_None && !PyTuple_Check(rows) && !PyList_Check(rows)) || width < 1
        || lo < 0 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "gather_rows: bad arguments");
        return NULL;
    }
    Py_ssize_t n_layers = PyTuple_GET_SIZE(layers), n_out = rows == Py_None ? count : PySequence_Fast_GET_SIZE(rows);
    Py_ssize_t stride = n_layers * width;
    long *at = PyMem_Malloc(sizeof(long) * (size_t)(n_out > 0 ? n_out : 1));   /* read before the GIL is let go */
    if (!at) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < n_out; r++) {
        at[r] = rows == Py_None ? lo + r : PyLong_AsLong(PySequence_Fast_GET_ITEM(rows, r));   /* a tuple or a list */
        if (at[r] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "gather_rows: a negative row");
            PyMem_Free(at);
            return NULL;
        }
    }
    Py_buffer out;
    if (!float_buffer(args[0], &out, n_out * stride, 1)) { PyMem_Free(at); return NULL; }
    float *dst = (float *)out.buf;
    row_fn layer_of = (row_fn)layer_at;
    for (Py_ssize_t k = 0; k < n_layers; k++) {
        long lid = PyLong_AsLong(PyTuple_GET_ITEM(layers, k));
        if (lid == -1 && PyErr_Occurred()) { PyBuffer_Release(&out); PyMem_Free(at); return NULL; }
        const float *src = row_of(layer_of, ctx, (int32_t)lid);
        if (!src) {
            PyBuffer_Release(&out);
            PyMem_Free(at);
            return PyErr_Format(PyExc_RuntimeError, "llama.cpp extracted no inputs of target layer %ld", lid);
        }
        for (Py_ssize_t r = 0; r < n_out; r++) {
            float *block = dst + r * stride + k * width;
            memcpy(block, src + (size_t)at[r] * (size_t)width, sizeof(float) * (size_t)width);
            if (eps >= 0.0) {   /* four sums, not one chain of dependent adds (3x faster over 576) */
                double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
                long j = 0;
                for (; j + 4 <= width; j += 4) {
                    s0 += (double)block[j] * (double)block[j];
                    s1 += (double)block[j + 1] * (double)block[j + 1];
                    s2 += (double)block[j + 2] * (double)block[j + 2];
                    s3 += (double)block[j + 3] * (double)block[j + 3];
                }
                for (; j < width; j++) s0 += (double)block[j] * (double)block[j];
                double ss = (s0 + s1) + (s2 + s3);
                float scale = (float)(1.0 / sqrt(ss / width + eps));
                for (long j = 0; j < width; j++) block[j] *= scale;
            }
        }
    }
    PyBuffer_Release(&out);
    PyMem_Free(at);
    Py_RETURN_NONE;
}

/* decode(ctx, batch, n_tokens) / encode(...): llama_decode / llama_encode of the first n_tokens
 * rows of the llama_batch at address ``batch``; llama.cpp's return code. One C call where ctypes
 * copies the batch struct by value through its converters (~15% of a plain step's host time). */
static PyObject *run_batch(decode_fn fn, PyObject *const *args, Py_ssize_t n) {
    void *ctx, *batch;
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "decode(ctx, batch, n_tokens)"); return NULL; }
    if (!as_pointer(args[0], &ctx) || !as_pointer(args[1], &batch)) return NULL;
    long rows = PyLong_AsLong(args[2]);
    if (rows == -1 && PyErr_Occurred()) return NULL;
    if (!fn || !ctx || !batch) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    ((batch_t *)batch)->n_tokens = (int32_t)rows;
    double spent = 0.0;
    return PyLong_FromLong(run_timed(fn, ctx, (batch_t *)batch, &spent));
}

/* decode_tokens(ctx, batch, tokens, start, all_logits): rows tokens[i] at positions start + i of
 * the batch's sequence (its seq_id rows as they are), logits for every row or the last only,
 * then llama_decode; llama.cpp's code. A verify's or a plain step's rows without numpy's calls. */
static PyObject *hl_decode_tokens(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *ctx, *batch_at;
    if (n != 5) { PyErr_SetString(PyExc_TypeError, "decode_tokens(ctx, batch, tokens, start, all_logits)"); return NULL; }
    if (!as_pointer(args[0], &ctx) || !as_pointer(args[1], &batch_at)) return NULL;
    PyObject *tokens = PySequence_Fast(args[2], "decode_tokens: tokens, a sequence");
    if (!tokens) return NULL;
    long start = PyLong_AsLong(args[3]);
    int all = PyObject_IsTrue(args[4]);
    if ((start == -1 && PyErr_Occurred()) || all < 0) { Py_DECREF(tokens); return NULL; }
    if (!llama_decode_p || !ctx || !batch_at) { Py_DECREF(tokens); PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    batch_t *batch = (batch_t *)batch_at;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(tokens);
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    for (Py_ssize_t i = 0; i < count; i++) {
        long t = PyLong_AsLong(items[i]);
        if (t == -1 && PyErr_Occurred()) { Py_DECREF(tokens); return NULL; }
        if (t < INT32_MIN || t > INT32_MAX || start + i > INT32_MAX) {   /* never wrapped into another id */
            Py_DECREF(tokens);
            PyErr_Format(PyExc_OverflowError, "decode_tokens: token %ld at position %ld is out of range", t, start + (long)i);
            return NULL;
        }
        batch->token[i] = (int32_t)t;
        batch->pos[i] = (int32_t)(start + i);
        batch->logits[i] = (int8_t)(all || i == count - 1);
    }
    Py_DECREF(tokens);
    batch->n_tokens = (int32_t)count;
    double spent = 0.0;
    return PyLong_FromLong(run_timed(llama_decode_p, ctx, batch, &spent));
}

/* decode_rows(ctx, batch, tokens, positions, seqs, outputs): row i is tokens[i] at positions[i] of
 * sequence seqs[i], logits where outputs[i] (four sequences of one length, at most the batch's
 * rows), then llama_decode; each row's sequence is 0 again after it (decode_tokens' rows). The
 * scheduler's step of several slots without numpy's and ctypes' calls a row. llama.cpp's code. */
static PyObject *hl_decode_rows(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *ctx, *batch_at;
    if (n != 6) { PyErr_SetString(PyExc_TypeError, "decode_rows(ctx, batch, tokens, positions, seqs, outputs)"); return NULL; }
    if (!as_pointer(args[0], &ctx) || !as_pointer(args[1], &batch_at)) return NULL;
    if (!llama_decode_p || !ctx || !batch_at) { PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound"); return NULL; }
    PyObject *cols[4] = {NULL, NULL, NULL, NULL};
    PyObject *result = NULL;
    Py_ssize_t count = -1;
    for (int c = 0; c < 4; c++) {
        cols[c] = PySequence_Fast(args[2 + c], "decode_rows: tokens, positions, seqs and outputs, sequences");
        if (!cols[c]) goto done;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(cols[c]);
        if (count >= 0 && len != count) { PyErr_SetString(PyExc_ValueError, "decode_rows: sequences of one length"); goto done; }
        count = len;
    }
    batch_t *batch = (batch_t *)batch_at;
    for (Py_ssize_t i = 0; i < count; i++) {
        long t = PyLong_AsLong(PySequence_Fast_GET_ITEM(cols[0], i));
        long p = PyLong_AsLong(PySequence_Fast_GET_ITEM(cols[1], i));
        long q = PyLong_AsLong(PySequence_Fast_GET_ITEM(cols[2], i));
        int o = PyObject_IsTrue(PySequence_Fast_GET_ITEM(cols[3], i));
        if (PyErr_Occurred() || o < 0) goto reset;
        if (t < INT32_MIN || t > INT32_MAX || p < INT32_MIN || p > INT32_MAX || q < INT32_MIN || q > INT32_MAX) {   /* never wrapped */
            PyErr_Format(PyExc_OverflowError, "decode_rows: row %ld (token %ld, position %ld, sequence %ld) is out of range",
                         (long)i, t, p, q);
            goto reset;
        }
        batch->token[i] = (int32_t)t;
        batch->pos[i] = (int32_t)p;
        batch->seq_id[i][0] = (int32_t)q;
        batch->logits[i] = (int8_t)o;
    }
    batch->n_tokens = (int32_t)count;
    double spent = 0.0;
    result = PyLong_FromLong(run_timed(llama_decode_p, ctx, batch, &spent));
reset:
    for (Py_ssize_t i = 0; i < count; i++) batch->seq_id[i][0] = 0;
done:
    for (int c = 0; c < 4; c++) Py_XDECREF(cols[c]);
    return result;
}

static PyObject *hl_decode(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return run_batch(llama_decode_p, args, n);
}

static PyObject *hl_encode(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return run_batch(llama_encode_p, args, n);
}

/* argmax(row): the argmax of a float32 array (numpy's, see argmax_f32) */
static PyObject *hl_argmax(PyObject *self, PyObject *row) {
    Py_buffer b;
    if (!float_buffer(row, &b, 1, 0)) {   /* not a contiguous float32 row: numpy's own argmax */
        PyErr_Clear();
        PyObject *at = PyObject_CallMethod(row, "argmax", NULL);
        if (!at) return NULL;
        PyObject *i = PyNumber_Long(at);
        Py_DECREF(at);
        return i;
    }
    int32_t at = argmax_f32((const float *)b.buf, (int32_t)(b.len / 4));
    PyBuffer_Release(&b);
    return PyLong_FromLong(at);
}

/* top1(row): (the argmax of a float32 row, its softmax probability): a drafter's confidence test
 * (model_source.top1_probability) in one pass for the maximum and one for the exps, where numpy's
 * exp over a 49,152-wide row takes 120-200 µs here. A row whose top is not finite: NaN, as numpy's
 * sum of exps gives (a confidence test then stops). */
static PyObject *hl_top1(PyObject *self, PyObject *row) {
    Py_buffer b;
    if (!float_buffer(row, &b, 1, 0)) return NULL;
    int32_t n = (int32_t)(b.len / 4);
    const float *x = (const float *)b.buf;
    int32_t at = argmax_f32(x, n);
    float top = x[at];
    double p = isfinite(top) ? 1.0 / exp_sum_best(x, n, top) : NAN;
    PyBuffer_Release(&b);
    return Py_BuildValue("(id)", (int)at, p);
}

/* catch_up(ctx, enc_batch, dec_batch, g_fn, state_fn, norm, n_embd, eps, feats, width, tokens,
 *          enc_pos, dec_pos, seq, chunk, state)
 * A drafter sequence's catch-up, its rows n = len(tokens): up to ALL_OUTPUT_ROWS, ONE
 * llama_encode of the target features ``feats`` (n x width floats) at positions enc_pos.. (the
 * fc graph's g rows, g_fn(ctx): llama.cpp's output of all rows), then ONE llama_decode of the
 * pairs (tokens[i], g row i) at positions dec_pos.. of sequence ``seq``, every row an output.
 * More rows (a prompt's, a plain stretch's) go as ModelDrafter's Python path sends them: encodes
 * of ``chunk`` rows (the batches' capacity: the context's n_batch), decodes of ``chunk`` pairs
 * without outputs, then the last pair alone (run_long_catch_up). The last row's state (normed by
 * ``norm`` unless it is None) into ``state``. The batches are one-sequence llama_batch structs at
 * those addresses whose arrays localspec owns (ext_rows.DirectRows). Returns (the address of the
 * last row's logits, seconds inside llama.cpp).
 *
 * catch_up_chain(the same 15 first arguments, n_vocab, positions[, trim[, then]])
 * The catch-up, then the greedy chain from its last row (greedy_chain's steps): its argmax the
 * first draft and, for each entry of ``positions`` (the chain's positions from the first
 * draft's), one more decode of the last draft with the state before it; ``trim``: see
 * trim_after. Returns (the drafts, seconds inside llama.cpp). ``then`` (None: nothing): the
 * target decode that verifies the chain, run right after it with no Python between the drafter's
 * decodes and the target's: (run, tokens, start, all_logits, row, n), items row .. row + n - 1
 * of the list ``tokens`` set to the drafts, then the last draft again (filler rows), then
 * run(tokens, start, all_logits) (decode_tokens); returns (the drafts, seconds, run's result, its
 * wall seconds). */
typedef struct {
    void *ctx, *norm;
    batch_t *enc, *dec;
    all_fn g_of;
    row_fn state_of;
    long n_embd, width, enc_pos, dec_pos, seq, chunk;
    double eps;
    PyObject *tokens;
} catch_up_args;

static int parse_catch_up(PyObject *const *args, catch_up_args *a) {
    void *enc, *dec, *g, *st;
    a->norm = NULL;
    if (!as_pointer(args[0], &a->ctx) || !as_pointer(args[1], &enc) || !as_pointer(args[2], &dec)
        || !as_pointer(args[3], &g) || !as_pointer(args[4], &st)
        || (args[5] != Py_None && !as_pointer(args[5], &a->norm)))
        return 0;
    a->enc = (batch_t *)enc;
    a->dec = (batch_t *)dec;
    a->g_of = (all_fn)g;
    a->state_of = (row_fn)st;
    a->n_embd = PyLong_AsLong(args[6]);
    a->eps = PyFloat_AsDouble(args[7]);
    a->width = PyLong_AsLong(args[9]);
    a->tokens = args[10];
    a->enc_pos = PyLong_AsLong(args[11]);
    a->dec_pos = PyLong_AsLong(args[12]);
    a->seq = PyLong_AsLong(args[13]);
    a->chunk = PyLong_AsLong(args[14]);
    if (PyErr_Occurred()) return 0;
    if (!PyTuple_Check(a->tokens) || PyTuple_GET_SIZE(a->tokens) < 1 || a->n_embd < 1 || a->width < 1
        || a->chunk < ALL_OUTPUT_ROWS) {
        PyErr_SetString(PyExc_ValueError, "catch_up: bad arguments");
        return 0;
    }
    if (!llama_decode_p || !llama_encode_p || !llama_get_logits_ith_p || !g || !st) {
        PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound");
        return 0;
    }
    return 1;
}

/* One drafter batch of ``rows`` rows filled from row ``from`` of a catch-up (positions ``first``
 * + i of its sequence): the encoder's (``enc``: embedding rows alone, every row an output) or the
 * decoder's (the tokens, each row an output where ``out``). 0 and an error set on a bad token. */
static int catch_up_rows(catch_up_args *a, batch_t *b, int enc, Py_ssize_t from, Py_ssize_t rows, long first, int8_t out) {
    b->n_tokens = (int32_t)rows;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (!enc) {
            long tok = PyLong_AsLong(PyTuple_GET_ITEM(a->tokens, from + i));
            if (tok == -1 && PyErr_Occurred()) return 0;
            b->token[i] = (int32_t)tok;
        }
        b->pos[i] = (int32_t)(first + i);
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = (int32_t)a->seq;
        b->logits[i] = out;
    }
    return 1;
}

/* The encoder's g rows, after an encode (llama.cpp's output of all rows); NULL and an error set if none. */
static const float *encoded(catch_up_args *a) {
    const float *g = NULL;
    Py_BEGIN_ALLOW_THREADS
    g = a->g_of(a->ctx);
    Py_END_ALLOW_THREADS
    if (!g) PyErr_SetString(PyExc_RuntimeError, "the drafter encoder produced no output");
    return g;
}

static int ran(int32_t rc, const char *what) {
    if (rc != 0) PyErr_Format(PyExc_RuntimeError, "the drafter failed (%s code %d)", what, (int)rc);
    return rc == 0;
}

/* A catch-up of more rows than one decode marks every row of (a prompt's, or after a plain
 * stretch), as ModelDrafter's Python path runs it (EagleKind.encode_groups, then decode_groups'
 * _lead): the features encoded ``chunk`` rows an encode, each chunk at enc_pos.. (an encode writes
 * nothing), the pairs but the last decoded ``chunk`` rows a decode without outputs, then the last
 * pair alone, its output row 0. Its logits, or NULL and an error set. */
static const float *run_long_catch_up(catch_up_args *a, const float *feats, double *spent, int32_t *last) {
    Py_ssize_t rows = PyTuple_GET_SIZE(a->tokens), chunk = a->chunk;
    size_t g_row = (size_t)a->n_embd, f_row = (size_t)a->width;
    float *g = PyMem_Malloc(sizeof(float) * g_row * (size_t)rows);
    const float *out = NULL, *encoded_g;
    if (!g) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t s = 0; s < rows; s += chunk) {
        Py_ssize_t n = rows - s < chunk ? rows - s : chunk;
        catch_up_rows(a, a->enc, 1, s, n, a->enc_pos, 1);
        memcpy(a->enc->embd, feats + (size_t)s * f_row, sizeof(float) * f_row * (size_t)n);
        if (!ran(run_timed(llama_encode_p, a->ctx, a->enc, spent), "llama_encode") || !(encoded_g = encoded(a))) goto done;
        memcpy(g + (size_t)s * g_row, encoded_g, sizeof(float) * g_row * (size_t)n);
    }
    for (Py_ssize_t s = 0; s < rows - 1; s += chunk) {   /* the pairs but the last, without outputs */
        Py_ssize_t n = rows - 1 - s < chunk ? rows - 1 - s : chunk;
        if (!catch_up_rows(a, a->dec, 0, s, n, a->dec_pos + s, 0)) goto done;
        memcpy(a->dec->embd, g + (size_t)s * g_row, sizeof(float) * g_row * (size_t)n);
        if (!ran(run_timed(llama_decode_p, a->ctx, a->dec, spent), "llama_decode")) goto done;
    }
    if (!catch_up_rows(a, a->dec, 0, rows - 1, 1, a->dec_pos + rows - 1, 1)) goto done;   /* the last pair alone */
    memcpy(a->dec->embd, g + (size_t)(rows - 1) * g_row, sizeof(float) * g_row);
    if (!ran(run_timed(llama_decode_p, a->ctx, a->dec, spent), "llama_decode")) goto done;
    *last = 0;
    out = logits_row(a->ctx, 0);
done:
    PyMem_Free(g);
    return out;
}

/* The catch-up's encode and decode (catch_up above), ``feats`` the features' buffer; the last
 * row's logits (its output row into ``last``), or NULL and an error set. */
static const float *run_catch_up(catch_up_args *a, const float *feats, double *spent, int32_t *last) {
    Py_ssize_t rows = PyTuple_GET_SIZE(a->tokens);
    if (rows > ALL_OUTPUT_ROWS) return run_long_catch_up(a, feats, spent, last);
    if (!catch_up_rows(a, a->enc, 1, 0, rows, a->enc_pos, 1) || !catch_up_rows(a, a->dec, 0, 0, rows, a->dec_pos, 1))
        return NULL;
    memcpy(a->enc->embd, feats, sizeof(float) * (size_t)(rows * a->width));
    const float *g;
    if (!ran(run_timed(llama_encode_p, a->ctx, a->enc, spent), "llama_encode") || !(g = encoded(a))) return NULL;
    memcpy(a->dec->embd, g, sizeof(float) * (size_t)(rows * a->n_embd));
    if (!ran(run_timed(llama_decode_p, a->ctx, a->dec, spent), "llama_decode")) return NULL;
    *last = (int32_t)(rows - 1);
    return logits_row(a->ctx, *last);
}

static PyObject *hl_catch_up(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    catch_up_args a;
    if (n != 16) { PyErr_SetString(PyExc_TypeError, "catch_up takes 16 arguments"); return NULL; }
    if (!parse_catch_up(args, &a)) return NULL;
    Py_ssize_t rows = PyTuple_GET_SIZE(a.tokens);
    Py_buffer feats, state;
    if (!float_buffer(args[8], &feats, rows * a.width, 0)) return NULL;
    if (!float_buffer(args[15], &state, a.n_embd, 1)) { PyBuffer_Release(&feats); return NULL; }
    double spent = 0.0;
    int32_t last = 0;
    PyObject *result = NULL;
    const float *row = run_catch_up(&a, (const float *)feats.buf, &spent, &last);
    if (row && state_into((float *)state.buf, a.state_of, a.ctx, last, (const float *)a.norm, a.n_embd, a.eps))
        result = Py_BuildValue("(Nd)", PyLong_FromVoidPtr((void *)row), spent);
    PyBuffer_Release(&feats);
    PyBuffer_Release(&state);
    return result;
}

/* catch_up_chain's ``then``: the chain's drafts into the verify's rows of ``tokens``, then the
 * target's decode of them; (drafts, seconds, the decode's result, its wall seconds). Steals drafts. */
static PyObject *verify_after(PyObject *then, PyObject *drafts, double spent) {
    PyObject *tokens = PyTuple_GET_ITEM(then, 1);
    Py_ssize_t k = PyList_GET_SIZE(drafts);
    Py_ssize_t row = PyLong_AsSsize_t(PyTuple_GET_ITEM(then, 4)), rows = PyLong_AsSsize_t(PyTuple_GET_ITEM(then, 5));
    if (PyErr_Occurred()) { Py_DECREF(drafts); return NULL; }
    if (k < 1 || row < 0 || rows < k || row + rows > PyList_GET_SIZE(tokens)) {
        Py_DECREF(drafts);
        PyErr_SetString(PyExc_ValueError, "then: the drafts' rows are not inside the tokens");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < rows; i++) {
        PyObject *t = PyList_GET_ITEM(drafts, i < k ? i : k - 1);
        Py_INCREF(t);
        PyList_SetItem(tokens, row + i, t);   /* steals t, releases the placeholder */
    }
    PyObject *call[3] = {tokens, PyTuple_GET_ITEM(then, 2), PyTuple_GET_ITEM(then, 3)};
    double t0 = seconds_now();
    PyObject *rc = PyObject_Vectorcall(PyTuple_GET_ITEM(then, 0), call, 3, NULL);
    double wall = seconds_now() - t0;
    if (!rc) { Py_DECREF(drafts); return NULL; }
    return Py_BuildValue("(NdNd)", drafts, spent, rc, wall);
}

static PyObject *hl_catch_up_chain(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    catch_up_args a;
    if (n < 17 || n > 19) { PyErr_SetString(PyExc_TypeError, "catch_up_chain takes 17 to 19 arguments"); return NULL; }
    PyObject *then = n == 19 && args[18] != Py_None ? args[18] : NULL;
    if (then && (!PyTuple_Check(then) || PyTuple_GET_SIZE(then) != 6 || !PyList_Check(PyTuple_GET_ITEM(then, 1)))) {
        PyErr_SetString(PyExc_TypeError, "then: None or (run, a list of tokens, start, all_logits, row, n)");
        return NULL;
    }
    if (!parse_catch_up(args, &a)) return NULL;
    long nv = PyLong_AsLong(args[15]);
    PyObject *positions = args[16];
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(positions)) { PyErr_SetString(PyExc_TypeError, "positions: a tuple"); return NULL; }
    Py_ssize_t rows = PyTuple_GET_SIZE(a.tokens), more = PyTuple_GET_SIZE(positions);
    Py_buffer feats;
    if (!float_buffer(args[8], &feats, rows * a.width, 0)) return NULL;
    double spent = 0.0;
    PyObject *drafts = PyList_New(0), *result = NULL;
    int32_t last = 0;
    const float *row = drafts ? run_catch_up(&a, (const float *)feats.buf, &spent, &last) : NULL;
    PyBuffer_Release(&feats);
    if (!row) { Py_XDECREF(drafts); return NULL; }
    int32_t tok = argmax_f32(row, (int32_t)nv);
    PyObject *t = PyLong_FromLong(tok);
    if (!t || PyList_Append(drafts, t) < 0) { Py_XDECREF(t); Py_DECREF(drafts); return NULL; }
    Py_DECREF(t);
    if (more > 0) {   /* the chain's first step: the first draft with the catch-up's last state */
        batch_t *dec = a.dec;
        long p = PyLong_AsLong(PyTuple_GET_ITEM(positions, 0));
        if ((p == -1 && PyErr_Occurred())
            || !state_into(dec->embd, a.state_of, a.ctx, last, (const float *)a.norm, a.n_embd, a.eps)) {
            Py_DECREF(drafts);
            return NULL;
        }
        dec->n_tokens = 1;
        dec->token[0] = tok;
        dec->pos[0] = (int32_t)p;
        dec->seq_id[0][0] = (int32_t)a.seq;
        dec->logits[0] = 1;
        if (!chain_steps(a.ctx, dec, a.state_of, (const float *)a.norm, a.n_embd, a.eps, nv, positions, 1, more, drafts, &spent)) {
            Py_DECREF(drafts);
            return NULL;
        }
    }
    if (n >= 18 && !trim_after(args[17], &a.seq, 1)) { Py_DECREF(drafts); return NULL; }
    if (then) return verify_after(then, drafts, spent);
    result = Py_BuildValue("(Nd)", drafts, spent);
    return result;
}

/* catch_up_rounds(ctx, enc_batch, dec_batch, g_fn, state_fn, norm, n_embd, eps, n_vocab, width, memory,
 *                 max_rows, groups[, trim])
 * Several sequences' catch-ups and greedy chains (a scheduler's slots drafting together), in one
 * call: ONE llama_encode of every sequence's target features (each sequence's rows at positions
 * from seq_pos_max + 1 of ``memory``), ONE llama_decode of every pair (each its own sequence and
 * position, every row an output), each sequence's last row's argmax its first draft, then
 * greedy_rounds' rounds from those (the rows ModelDrafter.catch_ups, then greedy_rounds, decode).
 * ``groups``: per chain (seq, tokens, feats: len(tokens) x width floats, the first row's
 * position, positions: those of its k - 1 steps after the catch-up, the first draft's pair
 * first); all rows at most ``max_rows``. The catch-up's seconds are shared among the chains.
 * ``trim``: see trim_after. Returns (per chain its k drafts, per chain its seconds). */
static PyObject *hl_catch_up_rounds(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *enc_at, *dec_at, *g_at, *mem;
    chain_args c;
    c.norm = NULL;
    if (n != 13 && n != 14) { PyErr_SetString(PyExc_TypeError, "catch_up_rounds takes 13 or 14 arguments"); return NULL; }
    if (!as_pointer(args[0], &c.ctx) || !as_pointer(args[1], &enc_at) || !as_pointer(args[2], &dec_at)
        || !as_pointer(args[3], &g_at) || !as_pointer(args[4], &c.state_fn)
        || (args[5] != Py_None && !as_pointer(args[5], &c.norm)) || !as_pointer(args[10], &mem))
        return NULL;
    c.batch = dec_at;
    c.n_embd = PyLong_AsLong(args[6]);
    c.eps = PyFloat_AsDouble(args[7]);
    c.nv = PyLong_AsLong(args[8]);
    long width = PyLong_AsLong(args[9]), max_rows = PyLong_AsLong(args[11]);
    PyObject *groups = args[12];
    if (PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(groups) || PyTuple_GET_SIZE(groups) < 1 || c.n_embd < 1 || width < 1) {
        PyErr_SetString(PyExc_ValueError, "catch_up_rounds: bad arguments");
        return NULL;
    }
    if (!llama_decode_p || !llama_encode_p || !llama_get_logits_ith_p || !llama_memory_seq_pos_max_p || !g_at
        || !c.state_fn || !mem) {
        PyErr_SetString(PyExc_RuntimeError, "hostloop: not bound");
        return NULL;
    }
    batch_t *enc = (batch_t *)enc_at, *dec = (batch_t *)dec_at;
    Py_ssize_t m = PyTuple_GET_SIZE(groups);
    long *seq_of = PyMem_Calloc((size_t)m, sizeof(long));
    Py_ssize_t *steps = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t)), *active = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t));
    Py_ssize_t *last = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t));
    double *spent = PyMem_Calloc((size_t)m, sizeof(double));
    PyObject *positions = PyTuple_New(m), *drafts = NULL, *result = NULL;
    if (!seq_of || !steps || !active || !last || !spent || !positions) { PyErr_NoMemory(); goto done; }
    Py_ssize_t rows = 0;
    for (Py_ssize_t i = 0; i < m; i++) {   /* every group's rows into both batches */
        PyObject *g = PyTuple_GET_ITEM(groups, i);
        if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(g, 1))
            || !PyTuple_Check(PyTuple_GET_ITEM(g, 4))) {
            PyErr_SetString(PyExc_TypeError, "catch_up_rounds: a group is (seq, tokens, feats, position, positions)");
            goto done;
        }
        PyObject *tokens = PyTuple_GET_ITEM(g, 1), *pos_i = PyTuple_GET_ITEM(g, 4);
        Py_ssize_t n_i = PyTuple_GET_SIZE(tokens);   /* its catch-up's rows */
        seq_of[i] = PyLong_AsLong(PyTuple_GET_ITEM(g, 0));
        long dec_pos = PyLong_AsLong(PyTuple_GET_ITEM(g, 3));
        if (PyErr_Occurred()) goto done;
        if (n_i < 1 || rows + n_i > max_rows) {
            PyErr_SetString(PyExc_ValueError, "catch_up_rounds: no rows, or more than max_rows");
            goto done;
        }
        Py_INCREF(pos_i);
        PyTuple_SET_ITEM(positions, i, pos_i);
        steps[i] = PyTuple_GET_SIZE(pos_i);
        Py_buffer feats;
        if (!float_buffer(PyTuple_GET_ITEM(g, 2), &feats, n_i * width, 0)) goto done;
        memcpy(enc->embd + (size_t)rows * (size_t)width, feats.buf, sizeof(float) * (size_t)(n_i * width));
        PyBuffer_Release(&feats);
        long enc_pos = llama_memory_seq_pos_max_p(mem, (int32_t)seq_of[i]) + 1;
        for (Py_ssize_t r = 0; r < n_i; r++, rows++) {
            long tok = PyLong_AsLong(PyTuple_GET_ITEM(tokens, r));
            if (tok == -1 && PyErr_Occurred()) goto done;
            enc->pos[rows] = (int32_t)(enc_pos + r);
            enc->n_seq_id[rows] = dec->n_seq_id[rows] = 1;
            enc->seq_id[rows][0] = dec->seq_id[rows][0] = (int32_t)seq_of[i];
            enc->logits[rows] = dec->logits[rows] = 1;
            dec->token[rows] = (int32_t)tok;
            dec->pos[rows] = (int32_t)(dec_pos + r);
        }
        last[i] = rows - 1;
    }
    double dt = 0.0;
    enc->n_tokens = dec->n_tokens = (int32_t)rows;
    int32_t rc = run_timed(llama_encode_p, c.ctx, enc, &dt);
    if (rc != 0) { PyErr_Format(PyExc_RuntimeError, "the drafter failed (llama_encode code %d)", (int)rc); goto done; }
    const float *gs = NULL;
    Py_BEGIN_ALLOW_THREADS
    gs = ((all_fn)g_at)(c.ctx);
    Py_END_ALLOW_THREADS
    if (!gs) { PyErr_SetString(PyExc_RuntimeError, "the drafter encoder produced no output"); goto done; }
    memcpy(dec->embd, gs, sizeof(float) * (size_t)rows * (size_t)c.n_embd);
    rc = run_timed(llama_decode_p, c.ctx, dec, &dt);
    if (rc != 0) { PyErr_Format(PyExc_RuntimeError, "the drafter failed (llama_decode code %d)", (int)rc); goto done; }
    drafts = lists(m);
    if (!drafts) goto done;
    Py_ssize_t next = 0;
    for (Py_ssize_t i = 0; i < m; i++) {   /* each first draft; the chains with steps left refill the rows */
        spent[i] = dt / (double)m;
        const float *row = logits_row(c.ctx, (int32_t)last[i]);
        if (!row) goto fail;
        int32_t tok = argmax_f32(row, (int32_t)c.nv);
        PyObject *t = PyLong_FromLong(tok);
        if (!t || PyList_Append(PyList_GET_ITEM(drafts, i), t) < 0) { Py_XDECREF(t); goto fail; }
        Py_DECREF(t);
        if (steps[i] < 1) continue;   /* k = 1: the catch-up's draft alone */
        /* the state comes from llama.cpp's outputs: refilling the batch's rows from row 0 reads none of them */
        if (!refill_row(&c, next, (int32_t)last[i], tok, seq_of[i], PyTuple_GET_ITEM(positions, i), 0)) goto fail;
        active[next++] = i;
    }
    if (!run_rounds(&c, seq_of, steps, active, next, positions, 1, drafts, spent)
        || (n == 14 && !trim_after(args[13], seq_of, m)))
        goto fail;
    result = drafts_and_seconds(drafts, spent, m);
    drafts = NULL;
fail:
    Py_XDECREF(drafts);
done:
    PyMem_Free(seq_of); PyMem_Free(steps); PyMem_Free(active); PyMem_Free(last); PyMem_Free(spent);
    Py_XDECREF(positions);
    return result;
}

static PyMethodDef methods[] = {
    {"catch_up", (PyCFunction)(void (*)(void))hl_catch_up, METH_FASTCALL, "a drafter sequence's catch-up: one encode, one decode"},
    {"catch_up_chain", (PyCFunction)(void (*)(void))hl_catch_up_chain, METH_FASTCALL, "a catch-up, then a greedy chain from it[, its drafted pairs trimmed[, then the target's decode that verifies it]]"},
    {"decode_tokens", (PyCFunction)(void (*)(void))hl_decode_tokens, METH_FASTCALL, "decode_tokens(ctx, batch, tokens, start, all_logits): fill the rows, then llama_decode"},
    {"decode_rows", (PyCFunction)(void (*)(void))hl_decode_rows, METH_FASTCALL, "decode_rows(ctx, batch, tokens, positions, seqs, outputs): several sequences' rows, then llama_decode"},
    {"decode", (PyCFunction)(void (*)(void))hl_decode, METH_FASTCALL, "decode(ctx, batch, n_tokens): llama_decode, its code"},
    {"encode", (PyCFunction)(void (*)(void))hl_encode, METH_FASTCALL, "encode(ctx, batch, n_tokens): llama_encode, its code"},
    {"argmax", (PyCFunction)hl_argmax, METH_O, "argmax(row): a float32 array's argmax, as numpy's"},
    {"top1", (PyCFunction)hl_top1, METH_O, "top1(row): (a float32 row's argmax, its softmax probability)"},
    {"gather_rows", (PyCFunction)(void (*)(void))hl_gather_rows, METH_FASTCALL, "the target's layer inputs of a batch's rows"},
    {"bind", (PyCFunction)(void (*)(void))hl_bind, METH_FASTCALL, "bind(decode, encode, get_logits_ith, token_to_piece, memory_seq_rm, memory_seq_pos_max): llama.cpp's functions by address"},
    {"seq_rm", (PyCFunction)(void (*)(void))hl_seq_rm, METH_FASTCALL, "seq_rm(memory, seq, p0, p1): llama_memory_seq_rm"},
    {"seq_pos_max", (PyCFunction)(void (*)(void))hl_seq_pos_max, METH_FASTCALL, "seq_pos_max(memory, seq)"},
    {"pieces", (PyCFunction)(void (*)(void))hl_pieces, METH_FASTCALL, "pieces(vocab, n_vocab, special): every token's bytes"},
    {"argmax_ith", (PyCFunction)(void (*)(void))hl_argmax_ith, METH_FASTCALL, "argmax_ith(ctx, i, n_vocab)"},
    {"argmax_rows", (PyCFunction)(void (*)(void))hl_argmax_rows, METH_FASTCALL, "argmax_rows(ctx, rows, n_vocab[, drafts[, trim]]): each row's argmax (with drafts: until one differs; trim: the rejected cells dropped)"},
    {"simd", (PyCFunction)(void (*)(void))hl_simd, METH_FASTCALL, "simd([wide]): the argmax's SIMD width (avx2, sse2); wide False: SSE2"},
    {"count_cpu", (PyCFunction)hl_count_cpu, METH_O, "count_cpu(on): clock() adds the decodes' thread CPU time from now on"},
    {"clock", (PyCFunction)(void (*)(void))hl_clock, METH_FASTCALL, "clock(): (seconds, thread CPU seconds, calls) of the decodes run here"},
    {"normed_state", (PyCFunction)(void (*)(void))hl_normed_state, METH_FASTCALL, "normed_state(out, h, norm, eps)"},
    {"greedy_chain", (PyCFunction)(void (*)(void))hl_greedy_chain, METH_FASTCALL, "a greedy EAGLE draft chain"},
    {"greedy_rounds", (PyCFunction)(void (*)(void))hl_greedy_rounds, METH_FASTCALL, "several sequences' greedy chains, a decode a round"},
    {"catch_up_rounds", (PyCFunction)(void (*)(void))hl_catch_up_rounds, METH_FASTCALL, "several sequences' catch-ups, then their greedy chains' rounds"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hostloop", "localspec's host loop in C", -1, methods};

PyMODINIT_FUNC PyInit__hostloop(void) {
#ifdef HOSTLOOP_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        block_max_best = block_max_avx2;
        exp_sum_best = exp_sum_avx2;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ALL_OUTPUT_ROWS", ALL_OUTPUT_ROWS) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
